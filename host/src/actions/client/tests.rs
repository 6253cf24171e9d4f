//! The client's own pieces, without a service: URLs, the `User-Agent`,
//! redaction, and the HTTP client's TLS and proxy set-up.

use super::*;

#[test]
fn api_version_is_added_once() {
    let url = with_api_version(Url::parse("https://s.example/t/_apis/x?name=a").unwrap());
    assert_eq!(
        url.as_str(),
        "https://s.example/t/_apis/x?name=a&api-version=6.0-preview"
    );
    let url = with_api_version(Url::parse("https://s.example/x?api-version=7.0").unwrap());
    assert_eq!(url.as_str(), "https://s.example/x?api-version=7.0");
}

#[test]
fn user_agent_is_json_with_kind_scaleset() {
    let info = SystemInfo {
        system: "arcwright".into(),
        version: "1.2.3".into(),
        commit_sha: "abc".into(),
        scale_set_id: 42,
        subsystem: "listener".into(),
    };
    let agent: serde_json::Value = serde_json::from_str(&info.user_agent()).unwrap();
    assert_eq!(
        agent,
        serde_json::json!({"system":"arcwright","version":"1.2.3","commit_sha":"abc","scale_set_id":42,
            "subsystem":"listener","build_version":"1.2.3","build_commit_sha":"abc","kind":"scaleset"})
    );
}

#[test]
fn names_are_percent_encoded() {
    assert_eq!(encode("my set/å&x"), "my%20set%2F%C3%A5%26x");
}

#[test]
fn decode_errors_of_secret_responses_do_not_quote_the_body() {
    let response = Response {
        status: 200,
        body: br#"{"runner":"jit-secret-value","encodedJITConfig":"x"}"#.to_vec(),
    };
    let err = response
        .json::<JitConfig>(Operation::GenerateJitConfig)
        .expect_err("runner is not an object");
    assert!(!err.to_string().contains("jit-secret-value"), "{err}");
    assert!(err.to_string().contains("line 1"), "{err}");
    let err = response
        .json::<JitConfig>(Operation::GetRunner)
        .expect_err("same body");
    assert!(err.to_string().contains("jit-secret-value"), "{err}");
}

#[test]
fn echoed_secrets_are_scrubbed() {
    let token = Secret::new("ghs_supersecret");
    let out = scrub(br#"{"message":"token ghs_supersecret is bad"}"#, &[&token]);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"message":"token [redacted] is bad"}"#
    );
}

#[test]
fn custom_ca_bundle_is_validated() {
    let options = ClientOptions {
        root_ca_pem: Some("not a certificate".into()),
        ..Default::default()
    };
    let err = build_http(&options).expect_err("no certificate");
    assert!(matches!(err, ActionsError::ClientSetup(_)), "{err}");

    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let options = ClientOptions {
        root_ca_pem: Some(cert.cert.pem()),
        ..Default::default()
    };
    build_http(&options).expect("a valid CA is accepted");
}

#[test]
fn proxy_settings_are_applied_and_never_shown() {
    let proxy = ProxyConfig {
        http: Some("http://proxy.example:3128".into()),
        https: Some("http://user:inline-pass@proxy.example:3128".into()),
        no_proxy: vec!["10.0.0.0/8".into(), ".internal".into()],
        http_auth: Some(ProxyAuth::new("proxy-user", "proxy-pass")),
        https_auth: Some(ProxyAuth::new("other-user", "other-pass")),
    };
    let shown = format!("{proxy:?}");
    assert!(
        !shown.contains("proxy-pass")
            && !shown.contains("other-pass")
            && !shown.contains("inline-pass"),
        "{shown}"
    );
    build_http(&ClientOptions {
        proxy: Some(proxy),
        ..Default::default()
    })
    .expect("proxy accepted");

    let bad = ProxyConfig {
        http: Some("::not a url::".into()),
        ..Default::default()
    };
    let err = build_http(&ClientOptions {
        proxy: Some(bad),
        ..Default::default()
    })
    .expect_err("bad proxy");
    assert!(matches!(err, ActionsError::ClientSetup(_)));
}
