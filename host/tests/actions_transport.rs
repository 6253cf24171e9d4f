//! The Actions client's transport: what goes on the wire (headers, query,
//! authorisation schemes), through an authenticating HTTP proxy, and over
//! TLS to a server whose certificate only a custom CA vouches for.
//!
//! The proxy and the TLS terminator in front of the fake are the small
//! blocking relays of the `relay` module.

mod relay;

use std::sync::atomic::Ordering;
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ActionsError, ClientOptions, ConfigUrl, Credentials, Label, ProxyConfig,
    RunnerScaleSet, Secret,
};
use base64::Engine as _;
use fake_actions::{Endpoint, FakeActions, FakeConfig, JobSpec};
use relay::{Request, options, pki, start_proxy, start_tls_terminator};

#[tokio::test]
async fn every_call_goes_through_the_proxy_with_the_protocols_headers() {
    let fake = FakeActions::start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await
    .unwrap();
    let (proxy, seen) = start_proxy();
    let client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        ClientOptions {
            proxy: Some(ProxyConfig {
                http: Some(format!("http://{proxy}")),
                username: Some("proxy-user".into()),
                password: Some(Secret::new("proxy-pass")),
                ..ProxyConfig::default()
            }),
            ..options()
        },
    )
    .unwrap();

    let set = client
        .create_runner_scale_set(&RunnerScaleSet {
            name: "wire-set".into(),
            runner_group_id: 1,
            labels: vec![Label::system("wire-set")],
            ..RunnerScaleSet::default()
        })
        .await
        .unwrap();
    fake.control().enqueue_jobs(JobSpec::new(1, &["wire-set"]));
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    let message = session.get_message(0, 7).await.unwrap().expect("a message");
    session.delete_message(message.id).await.unwrap();
    let ids: Vec<i64> = message
        .jobs
        .iter()
        .filter_map(|j| j.job().map(|j| j.runner_request_id))
        .collect();
    session.acquire_jobs(&ids).await.unwrap();
    let _ = session.get_message(message.id, 7).await.unwrap();
    let queue_token = session
        .session()
        .message_queue_access_token
        .expose()
        .to_string();
    session.close().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len() as u64,
        fake.control().counters().total_calls(),
        "every call went through the proxy"
    );
    let proxy_auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("proxy-user:proxy-pass")
    );
    for request in &seen {
        let what = format!("{} {}", request.method, request.target);
        assert_eq!(
            request.header("proxy-authorization"),
            Some(proxy_auth.as_str()),
            "{what}"
        );
        let agent: serde_json::Value =
            serde_json::from_str(request.header("user-agent").expect("User-Agent"))
                .expect("JSON User-Agent");
        assert_eq!(
            (agent["system"].as_str(), agent["kind"].as_str()),
            (Some("arcwright"), Some("scaleset")),
            "{what}"
        );
        let url = url::Url::parse(&request.target).unwrap();
        let api_version = url
            .query_pairs()
            .find(|(k, _)| k == "api-version")
            .map(|(_, v)| v.into_owned());
        if url.path().starts_with("/tenant/") {
            assert_eq!(api_version.as_deref(), Some("6.0-preview"), "{what}");
            assert!(
                request
                    .header("authorization")
                    .is_some_and(|a| a.starts_with("Bearer ")),
                "{what}"
            );
        }
    }

    let find = |suffix: &str, method: &str| -> Vec<&Request> {
        seen.iter()
            .filter(|r| {
                r.method == method && url::Url::parse(&r.target).unwrap().path().ends_with(suffix)
            })
            .collect()
    };
    let registration = find("/actions/runner-registration", "POST");
    assert_eq!(registration.len(), 1);
    assert!(
        registration[0]
            .header("authorization")
            .unwrap()
            .starts_with("RemoteAuth ")
    );
    let body: serde_json::Value = serde_json::from_slice(&registration[0].body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"url": fake.org_url("octo-org"), "runner_event": "register"})
    );
    let token = find("/registration-token", "POST");
    assert_eq!(
        token[0].header("content-type"),
        Some("application/vnd.github.v3+json")
    );

    let polls = find("/messages", "GET");
    assert_eq!(polls.len(), 2);
    for poll in &polls {
        assert_eq!(poll.header("x-scalesetmaxcapacity"), Some("7"));
        assert_eq!(
            poll.header("accept"),
            Some("application/json; api-version=6.0-preview")
        );
    }
    let last_ids: Vec<Option<String>> = polls
        .iter()
        .map(|p| {
            url::Url::parse(&p.target)
                .unwrap()
                .query_pairs()
                .find(|(k, _)| k == "lastMessageId")
                .map(|(_, v)| v.into_owned())
        })
        .collect();
    assert_eq!(
        last_ids,
        [None, Some(message.id.to_string())],
        "lastMessageId only after the first message"
    );
    let acquire = find("/acquirejobs", "POST");
    let acquired: Vec<i64> = serde_json::from_slice(&acquire[0].body).unwrap();
    assert_eq!(acquired, ids);
    assert_eq!(
        acquire[0]
            .header("authorization")
            .map(|a| a.trim_start_matches("Bearer ")),
        Some(queue_token.as_str()),
        "acquire-jobs uses the queue token, not the admin token"
    );
}

#[tokio::test]
async fn a_custom_ca_is_trusted_and_required() {
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    let pki = pki();
    let (tls, connections) = start_tls_terminator(pki.server, fake.addr(), fake.url().to_string());
    let config_url = format!("https://localhost:{}/octo-org", tls.port());

    let trusting = ActionsClient::new(
        ConfigUrl::parse(&config_url).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        ClientOptions {
            root_ca_pem: Some(pki.ca_pem.clone()),
            ..options()
        },
    )
    .unwrap();
    let group = trusting
        .get_runner_group_by_name("Default")
        .await
        .expect("bootstrap over TLS");
    assert_eq!(group.id, 1);
    let counters = fake.control().counters();
    assert_eq!(counters.calls(Endpoint::RegistrationToken), 1);
    assert_eq!(counters.calls(Endpoint::RunnerRegistration), 1);

    // Without the CA the handshake fails and nothing reaches the service. A
    // rejected certificate is a configuration error, so it is reported at
    // once rather than retried: one more connection, not five.
    let before = connections.load(Ordering::SeqCst);
    let untrusting = ActionsClient::new(
        ConfigUrl::parse(&config_url).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        options(),
    )
    .unwrap();
    match untrusting.get_runner_group_by_name("Default").await {
        Err(err @ ActionsError::Transport { retries: 0, .. }) => {
            let chain = format!("{:?}", std::error::Error::source(&err));
            assert!(chain.contains("UnknownIssuer"), "{chain}");
        }
        other => panic!("expected an unretried certificate error, got {other:?}"),
    }
    assert_eq!(connections.load(Ordering::SeqCst) - before, 1);
    assert_eq!(
        fake.control().counters().calls(Endpoint::RegistrationToken),
        1
    );
}
