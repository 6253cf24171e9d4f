//! The Actions client's transport: what goes on the wire (headers, query,
//! authorisation schemes), through an authenticating HTTP proxy, and over
//! TLS to a server whose certificate only a custom CA vouches for; and what
//! a hostile server named in a tenant's `githubConfigUrl` cannot do: fill
//! the host's memory, hold a call forever, receive a token over plain http
//! or a proxy's password.
//!
//! The proxy and the TLS terminator in front of the fake are the small
//! blocking relays of the `relay` module.

mod relay;

use std::sync::atomic::Ordering;
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ActionsError, ClientOptions, ConfigUrl, Credentials, Label, ProxyAuth,
    ProxyConfig, RetryPolicy, RunnerScaleSet, Secret,
};
use arcwright_harness::hostile::{Hostile, hostile_server, rss_bytes};
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
                http_auth: Some(ProxyAuth::new("proxy-user", "proxy-pass")),
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

/// A client of the organisation `hostile` on `addr` (a GitHub Enterprise
/// Server URL, so its first call, the registration token, goes there).
fn client_of(addr: std::net::SocketAddr, options: ClientOptions) -> ActionsClient {
    ActionsClient::new(
        ConfigUrl::parse(&format!("http://{addr}/hostile")).unwrap(),
        Credentials::Token(Secret::new("ghp_tenant_token")),
        options,
    )
    .unwrap()
}

#[tokio::test]
async fn a_body_is_read_to_its_calls_limit_and_no_further() {
    let before = rss_bytes();
    for how in [Hostile::Endless, Hostile::Huge] {
        let (addr, sent) = hostile_server(how).await;
        let err = client_of(addr, options())
            .get_runner_group_by_name("Default")
            .await
            .expect_err("no token in an endless body");
        let shown = err.to_string();
        assert!(
            shown.contains("longer than the 1048576 bytes"),
            "a size error, not a timeout or a decode error: {shown}"
        );
        // Nothing is retried: the next answer would be as long.
        let sent = sent.load(Ordering::Relaxed);
        assert!(sent < 64 * 1024 * 1024, "{sent} bytes were drawn");
    }
    // An error's body is cut where its message stops being useful, and the
    // 500 is still reported as the service's answer.
    let (addr, _) = hostile_server(Hostile::EndlessError).await;
    let quick = ClientOptions {
        retry: RetryPolicy {
            max_retries: 1,
            ..options().retry
        },
        ..options()
    };
    let err = client_of(addr, quick)
        .get_runner_group_by_name("Default")
        .await
        .expect_err("a 500");
    let shown = err.to_string();
    assert!(
        shown.contains("answered 500"),
        "{}",
        &shown[..shown.len().min(300)]
    );
    assert!(
        shown.len() < 80 * 1024,
        "a message of {} bytes",
        shown.len()
    );
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 256 * 1024 * 1024,
        "the resident set grew by {} MiB",
        grown / (1024 * 1024)
    );
}

#[tokio::test]
async fn a_body_dribbled_a_byte_at_a_time_ends_at_the_calls_timeout() {
    let (addr, _) = hostile_server(Hostile::Dribble).await;
    let client = client_of(
        addr,
        ClientOptions {
            timeout: Duration::from_secs(1),
            retry: RetryPolicy {
                max_retries: 0,
                ..options().retry
            },
            ..options()
        },
    );
    let err = client
        .get_runner_group_by_name("Default")
        .await
        .expect_err("no answer");
    assert!(
        err.to_string().contains("no response within 1s"),
        "a timeout, whatever the body's progress: {err}"
    );
}

#[tokio::test]
async fn no_token_is_sent_over_plain_http_unless_allowed() {
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    let strict = ClientOptions {
        allow_plain_http: false,
        ..options()
    };
    // A plain-http configuration URL is refused before anything is sent.
    let err = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        strict.clone(),
    )
    .expect_err("plain http refused");
    assert!(err.to_string().contains("plain http"), "{err}");
    assert_eq!(fake.control().counters().total_calls(), 0);

    // Over https, a service URL the answer points at plain http (the fake
    // knows only its own http address) is not called with the admin token.
    let pki = pki();
    let (tls, _) = start_tls_terminator(pki.server, fake.addr(), fake.url().to_string());
    let client = ActionsClient::new(
        ConfigUrl::parse(&format!("https://localhost:{}/octo-org", tls.port())).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        ClientOptions {
            root_ca_pem: Some(pki.ca_pem.clone()),
            ..strict
        },
    )
    .unwrap();
    match client.get_runner_group_by_name("Default").await {
        Err(ActionsError::PlainHttpRefused { url, .. }) => {
            assert!(url.starts_with("http://127.0.0.1"), "{url}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let counters = fake.control().counters();
    assert_eq!(counters.calls(Endpoint::RunnerRegistration), 1);
    assert_eq!(counters.calls(Endpoint::GetRunnerGroupByName), 0);
}

#[tokio::test]
async fn each_proxy_is_sent_its_own_credentials_and_no_one_else_is() {
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    let (http_proxy, http_seen) = start_proxy();
    let (https_proxy, https_seen) = start_proxy();
    let pki = pki();
    let (tls, _) = start_tls_terminator(pki.server, fake.addr(), fake.url().to_string());
    let proxies = ProxyConfig {
        http: Some(format!("http://{http_proxy}")),
        https: Some(format!("http://{https_proxy}")),
        http_auth: Some(ProxyAuth::new("http-user", "http-pass")),
        https_auth: Some(ProxyAuth::new("https-user", "https-pass")),
        ..ProxyConfig::default()
    };
    // GitHub over https (through the https proxy, a CONNECT tunnel), the
    // service the fake names over http (through the http proxy).
    let client = ActionsClient::new(
        ConfigUrl::parse(&format!("https://localhost:{}/octo-org", tls.port())).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        ClientOptions {
            root_ca_pem: Some(pki.ca_pem.clone()),
            proxy: Some(proxies.clone()),
            ..options()
        },
    )
    .unwrap();
    client.get_runner_group_by_name("Default").await.unwrap();
    let basic = |user: &str, pass: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let auth_of = |seen: &std::sync::Mutex<Vec<Request>>| -> Vec<(String, Option<String>)> {
        seen.lock()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.method.clone(),
                    r.header("proxy-authorization").map(str::to_owned),
                )
            })
            .collect()
    };
    let tunnels = auth_of(&https_seen);
    assert!(!tunnels.is_empty());
    for (method, auth) in &tunnels {
        assert_eq!(method, "CONNECT");
        assert_eq!(
            auth.as_deref(),
            Some(basic("https-user", "https-pass").as_str())
        );
    }
    let forwarded = auth_of(&http_seen);
    assert!(!forwarded.is_empty());
    for (method, auth) in &forwarded {
        assert_ne!(method, "CONNECT");
        assert_eq!(
            auth.as_deref(),
            Some(basic("http-user", "http-pass").as_str())
        );
    }

    // A host reached directly (no_proxy) gets no proxy's credentials.
    let (direct, direct_seen) = start_proxy();
    let bypassing = ActionsClient::new(
        ConfigUrl::parse(&format!("http://{direct}/octo-org")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        ClientOptions {
            proxy: Some(ProxyConfig {
                no_proxy: vec!["127.0.0.1".into()],
                ..proxies
            }),
            ..options()
        },
    )
    .unwrap();
    let _ = bypassing.get_runner_group_by_name("Default").await;
    let reached = auth_of(&direct_seen);
    assert!(!reached.is_empty(), "the direct host was called");
    assert!(
        reached.iter().all(|(_, auth)| auth.is_none()),
        "{reached:?}"
    );
}
