//! The hold API and Slack's interactivity endpoint on a listener of their
//! own (`--debug-listen-address`), with TLS when a certificate is given.
//!
//! Both take credentials over the wire (a Kubernetes bearer token; a
//! request Slack signed), and both face further than the probes and
//! `/metrics`, which only the cluster scrapes: Slack must reach the
//! interactivity URL, people and bots reach the hold API. On their own port
//! they can be exposed (an Ingress, a LoadBalancer) without exposing the
//! metrics, and with TLS no token crosses the network in clear text.
//! Without `--debug-listen-address` they stay on the main listener, as
//! before.
//!
//! TLS handshakes run beside the accept loop, each bounded by
//! [`HANDSHAKE_TIMEOUT`], so a client that opens a connection and sends
//! nothing holds up no one else.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::RuntimeError;
use super::options::HttpOptions;

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bound listener of the hold API and Slack, and its TLS, if any.
pub struct DebugEndpoint {
    pub(super) listener: TcpListener,
    pub(super) tls: Option<Arc<rustls::ServerConfig>>,
}

impl DebugEndpoint {
    /// Binds the endpoint `options` ask for, if they ask for one, and
    /// reads its certificate: a bad address, certificate or key stops the
    /// process at start-up with a sentence saying which.
    pub async fn bind(options: &HttpOptions) -> Result<Option<Self>, RuntimeError> {
        let Some(address) = options.debug_listen_address else {
            return Ok(None);
        };
        let tls = match (&options.debug_tls_cert_file, &options.debug_tls_key_file) {
            (Some(cert), Some(key)) => Some(Arc::new(server_config(cert, key)?)),
            (None, None) => None,
            _ => {
                return Err(RuntimeError::DebugTls(
                    "--debug-tls-cert-file and --debug-tls-key-file go together".into(),
                ));
            }
        };
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| RuntimeError::Bind { address, source })?;
        Ok(Some(Self { listener, tls }))
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The TLS configuration from a PEM certificate chain and private key.
fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, RuntimeError> {
    let shown = |path: &Path, what: &str, error: &dyn std::fmt::Display| {
        RuntimeError::DebugTls(format!("{what} {} cannot be read: {error}", path.display()))
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| shown(cert, "the certificate file", &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| shown(cert, "the certificate file", &e))?;
    if chain.is_empty() {
        return Err(RuntimeError::DebugTls(format!(
            "the certificate file {} holds no PEM certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| shown(key, "the key file", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| RuntimeError::DebugTls(format!("the certificate and key cannot be used: {e}")))
}

/// A listener handing out connections whose TLS handshake is done.
pub(super) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` and shakes hands with `config`, each
    /// connection in a task of its own; a failed or slow handshake is
    /// logged and dropped.
    pub(super) fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, ready) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = ready.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "a TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "a TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Self { ready, local }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for crate::debug::api::ClientAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task ends only once nothing receives: never
            // while the server runs.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
