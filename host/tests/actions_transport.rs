//! The Actions client's transport: what goes on the wire (headers, query,
//! authorisation schemes), through an authenticating HTTP proxy, and over
//! TLS to a server whose certificate only a custom CA vouches for.
//!
//! The proxy and the TLS terminator in front of the fake are small blocking
//! relays written here, one request per connection (they force
//! `Connection: close`), which is all it takes to see every request whole.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ActionsError, ClientOptions, ConfigUrl, Credentials, Label, ProxyConfig,
    RetryPolicy, RunnerScaleSet, Secret,
};
use base64::Engine as _;
use fake_actions::{Endpoint, FakeActions, FakeConfig, JobSpec};

/// One HTTP/1.1 request as it crossed a relay.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Reads one request: the head up to the blank line, then a
    /// `Content-Length` body. `None` when the peer closed first.
    fn read(stream: &mut impl Read) -> io::Result<Option<Request>> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte)? == 0 {
                return Ok(None);
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or_default().split(' ');
        let (method, target, version) = (
            first.next().unwrap_or_default().to_string(),
            first.next().unwrap_or_default().to_string(),
            first.next().unwrap_or_default().to_string(),
        );
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let mut request = Request {
            method,
            target,
            version,
            headers,
            body: Vec::new(),
        };
        let length: usize = request
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        request.body = vec![0; length];
        stream.read_exact(&mut request.body)?;
        Ok(Some(request))
    }

    /// Writes the request for a one-shot upstream connection.
    fn write(&self, stream: &mut impl Write) -> io::Result<()> {
        let mut out = format!("{} {} {}\r\n", self.method, self.target, self.version);
        for (name, value) in &self.headers {
            let skip = ["connection", "content-length", "proxy-authorization"];
            if !skip.iter().any(|s| name.eq_ignore_ascii_case(s)) {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        out.push_str(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            self.body.len()
        ));
        stream.write_all(out.as_bytes())?;
        stream.write_all(&self.body)?;
        stream.flush()
    }
}

/// Sends `request` to `upstream` and copies the whole response back.
fn relay(request: &Request, upstream: SocketAddr, client: &mut impl Write) -> io::Result<()> {
    let mut server = TcpStream::connect(upstream)?;
    request.write(&mut server)?;
    let mut response = Vec::new();
    server.read_to_end(&mut response)?;
    client.write_all(&response)?;
    client.flush()
}

/// An HTTP forward proxy that records every request it carries.
fn start_proxy() -> (SocketAddr, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let record = record.clone();
            thread::spawn(move || {
                let Ok(Some(mut request)) = Request::read(&mut stream) else {
                    return;
                };
                record.lock().unwrap().push(request.clone());
                // Absolute form in, origin form out.
                let url = url::Url::parse(&request.target).expect("absolute-form target");
                let upstream: SocketAddr =
                    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap())
                        .parse()
                        .unwrap();
                request.target = match url.query() {
                    Some(q) => format!("{}?{q}", url.path()),
                    None => url.path().to_string(),
                };
                let _ = relay(&request, upstream, &mut stream);
            });
        }
    });
    (addr, seen)
}

fn options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            ..RetryPolicy::default()
        },
        ..ClientOptions::default()
    }
}

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

/// A certificate authority and a server certificate for `localhost` it
/// signed.
struct Pki {
    ca_pem: String,
    server: rustls::ServerConfig,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "arcwright test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server,
    }
}

/// Terminates TLS in front of the fake. The fake knows only its own
/// plain-HTTP address, so the configuration URL in request bodies is
/// rewritten to it on the way through.
fn start_tls_terminator(
    server: rustls::ServerConfig,
    fake: SocketAddr,
    fake_url: String,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let public_url = format!("https://localhost:{}", addr.port());
    let server = Arc::new(server);
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let (server, public_url, fake_url) =
                (server.clone(), public_url.clone(), fake_url.clone());
            thread::spawn(move || {
                let connection = rustls::ServerConnection::new(server).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let Ok(Some(mut request)) = Request::read(&mut tls) else {
                    return;
                };
                let body = String::from_utf8_lossy(&request.body).replace(&public_url, &fake_url);
                request.body = body.into_bytes();
                let _ = relay(&request, fake, &mut tls);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (addr, connections)
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
