//! Proxies from the environment: with no proxy configured, the Actions
//! client uses `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` (upper or lower case),
//! as a controller deployed behind a corporate proxy needs; a configured
//! proxy replaces them.
//!
//! Environment variables belong to the whole process, so this binary holds
//! one test, which sets them before building each client and removes them
//! at the end; no other test can see them.

mod relay;

use arcwright::actions::{
    ActionsClient, ClientOptions, ConfigUrl, Credentials, ProxyConfig, Secret,
};
use base64::Engine as _;
use fake_actions::{Endpoint, FakeActions, FakeConfig};
use relay::{Request, options, pki, start_proxy, start_tls_terminator};

const PROXY_VARIABLES: [&str; 8] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Sets the proxy variables to exactly `vars`, removing the others.
fn set_environment(vars: &[(&str, String)]) {
    for name in PROXY_VARIABLES {
        // SAFETY: this binary runs a single test, which changes the
        // environment only between its own steps, while no other thread of
        // the test reads it (reqwest reads it when a client is built, which
        // happens after this returns).
        unsafe { std::env::remove_var(name) };
    }
    for (name, value) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(name, value) };
    }
}

/// Takes what the proxy has recorded since the last call.
fn take(seen: &std::sync::Mutex<Vec<Request>>) -> Vec<Request> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[tokio::test]
async fn proxies_come_from_the_environment_unless_configured() {
    // GitHub's API behind TLS at https://localhost, the Actions service the
    // fake names at http://127.0.0.1: a CONNECT tunnel for the first, a
    // forward request for the second.
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    assert!(
        fake.url().starts_with("http://127.0.0.1:"),
        "{}",
        fake.url()
    );
    let pki = pki();
    let (tls, _) = start_tls_terminator(pki.server, fake.addr(), fake.url().to_string());
    let config_url =
        ConfigUrl::parse(&format!("https://localhost:{}/octo-org", tls.port())).unwrap();
    let (env_proxy, env_seen) = start_proxy();
    let (configured_proxy, configured_seen) = start_proxy();
    let client = |proxy: Option<ProxyConfig>| {
        ActionsClient::new(
            config_url.clone(),
            Credentials::Token(Secret::new(fake.pat())),
            ClientOptions {
                root_ca_pem: Some(pki.ca_pem.clone()),
                proxy,
                ..options()
            },
        )
        .unwrap()
    };
    let github = format!("localhost:{}", tls.port());
    // A bootstrap makes two calls to GitHub's API, and the TLS terminator
    // closes each connection after one request: two tunnels.
    let bootstrap_tunnels = vec![github.clone(); 2];
    let connects = |seen: &[Request]| -> Vec<String> {
        seen.iter()
            .filter(|r| r.method == "CONNECT")
            .map(|r| r.target.clone())
            .collect()
    };
    let forwarded = |seen: &[Request]| -> usize {
        seen.iter()
            .filter(|r| r.target.starts_with(fake.url()))
            .count()
    };
    let service_calls = || {
        let counters = fake.control().counters();
        counters.total_calls()
            - counters.calls(Endpoint::RegistrationToken)
            - counters.calls(Endpoint::RunnerRegistration)
    };

    // The environment's proxies, the HTTPS one with credentials in its URL
    // and the HTTP one in lower case.
    set_environment(&[
        (
            "HTTPS_PROXY",
            format!("http://env-user:env-pass@{env_proxy}"),
        ),
        ("http_proxy", format!("http://{env_proxy}")),
    ]);
    let from_env = client(None);
    from_env
        .get_runner_group_by_name("Default")
        .await
        .expect("through the environment's proxy");
    from_env.get_runner_scale_set(1, "none").await.unwrap();
    let seen = take(&env_seen);
    assert_eq!(connects(&seen), bootstrap_tunnels);
    let proxy_auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("env-user:env-pass")
    );
    for connect in seen.iter().filter(|r| r.method == "CONNECT") {
        assert_eq!(
            connect.header("proxy-authorization"),
            Some(proxy_auth.as_str())
        );
    }
    assert_eq!(forwarded(&seen) as u64, service_calls());
    assert_eq!(service_calls(), 2, "both service calls were forwarded");

    // NO_PROXY sends the service's host direct; GitHub's API still tunnels.
    set_environment(&[
        ("https_proxy", format!("http://{env_proxy}")),
        ("HTTP_PROXY", format!("http://{env_proxy}")),
        ("NO_PROXY", "127.0.0.1".to_string()),
    ]);
    let before = service_calls();
    let bypassing = client(None);
    bypassing.get_runner_group_by_name("Default").await.unwrap();
    let seen = take(&env_seen);
    assert_eq!(service_calls() - before, 1);
    assert_eq!(forwarded(&seen), 0, "the service was reached directly");
    assert_eq!(connects(&seen), bootstrap_tunnels);

    // A configured proxy replaces the environment's.
    set_environment(&[
        ("HTTPS_PROXY", format!("http://{env_proxy}")),
        ("HTTP_PROXY", format!("http://{env_proxy}")),
    ]);
    let configured = client(Some(ProxyConfig {
        http: Some(format!("http://{configured_proxy}")),
        https: Some(format!("http://{configured_proxy}")),
        ..ProxyConfig::default()
    }));
    configured
        .get_runner_group_by_name("Default")
        .await
        .unwrap();
    assert!(
        take(&env_seen).is_empty(),
        "the environment's proxy was used"
    );
    let seen = take(&configured_seen);
    assert_eq!(connects(&seen), bootstrap_tunnels);
    assert_eq!(forwarded(&seen), 1);

    // An empty configuration means no proxy at all.
    let direct = client(Some(ProxyConfig::default()));
    direct.get_runner_group_by_name("Default").await.unwrap();
    assert!(take(&env_seen).is_empty());
    assert!(take(&configured_seen).is_empty());
    assert_eq!(
        fake.control()
            .counters()
            .calls(Endpoint::RunnerRegistration),
        4,
        "every client bootstrapped"
    );

    set_environment(&[]);
}
