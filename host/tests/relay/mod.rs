//! Relays that stand between the Actions client and the fake for tests of
//! what goes on the wire: a recording HTTP proxy (forward requests and
//! CONNECT tunnels) and a TLS terminator with its own certificate authority.
//!
//! Small blocking relays, one request per connection (they force
//! `Connection: close`), which is all it takes to see every request whole.
//! Each test binary uses some of them.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use arcwright::actions::{ClientOptions, RetryPolicy};

/// One HTTP/1.1 request as it crossed a relay.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method (`CONNECT` for a tunnel).
    pub method: String,
    /// The request target: absolute form through a proxy, `host:port` for
    /// a tunnel.
    pub target: String,
    /// The HTTP version.
    pub version: String,
    /// The headers as sent.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Reads one request: the head up to the blank line, then a
    /// `Content-Length` body. `None` when the peer closed first.
    pub fn read(stream: &mut impl Read) -> io::Result<Option<Request>> {
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
    pub fn write(&self, stream: &mut impl Write) -> io::Result<()> {
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
pub fn relay(request: &Request, upstream: SocketAddr, client: &mut impl Write) -> io::Result<()> {
    let mut server = TcpStream::connect(upstream)?;
    request.write(&mut server)?;
    let mut response = Vec::new();
    server.read_to_end(&mut response)?;
    client.write_all(&response)?;
    client.flush()
}

/// An HTTP proxy that records every request it carries: forward requests
/// (absolute form) are relayed one per connection, and `CONNECT` opens a
/// tunnel to the target, recorded as the `CONNECT` request.
pub fn start_proxy() -> (SocketAddr, Arc<Mutex<Vec<Request>>>) {
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
                if request.method == "CONNECT" {
                    tunnel(stream, &request.target);
                    return;
                }
                // Absolute form in, origin form out.
                // A request in origin form was meant for a server, not a
                // proxy (a test using the relay as a recording server).
                let Ok(url) = url::Url::parse(&request.target) else {
                    let _ =
                        stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
                    return;
                };
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

/// Answers a `CONNECT` and copies bytes both ways until either side closes.
fn tunnel(mut client: TcpStream, target: &str) {
    let Ok(upstream) = TcpStream::connect(target) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let (Ok(mut client_reader), Ok(mut upstream_writer)) =
        (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let upload = thread::spawn(move || {
        let _ = io::copy(&mut client_reader, &mut upstream_writer);
        let _ = upstream_writer.shutdown(Shutdown::Write);
    });
    let mut upstream_reader = upstream;
    let _ = io::copy(&mut upstream_reader, &mut client);
    let _ = client.shutdown(Shutdown::Write);
    let _ = upload.join();
}

/// A certificate authority and a server certificate for `localhost` it
/// signed.
pub struct Pki {
    /// The CA certificate, to trust.
    pub ca_pem: String,
    /// A server configuration presenting the `localhost` certificate.
    pub server: rustls::ServerConfig,
}

pub fn pki() -> Pki {
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
pub fn start_tls_terminator(
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

/// Client options for tests through the relays: the production shape with
/// retries fast enough for tests.
pub fn options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            ..RetryPolicy::default()
        },
        allow_plain_http: true,
        ..ClientOptions::default()
    }
}
