//! The runner's half: what a runner process says to the Actions service with
//! its JIT config, against the fake's runner-facing endpoints.

use std::time::Duration;

use fake_actions::RunnerJob;
use reqwest::StatusCode;
use serde_json::json;

use crate::SimulatorError;

/// Talks to the fake as runners do. The JIT config is the only credential.
#[derive(Clone)]
pub(crate) struct RunnerClient {
    http: reqwest::Client,
    base: String,
}

/// What one call got.
enum Reply {
    Ok(serde_json::Value),
    Empty,
    Gone,
}

impl RunnerClient {
    pub fn new(base: &str) -> Result<RunnerClient, SimulatorError> {
        // reqwest is built without a default TLS provider; plain HTTP needs
        // none, but the builder wants one installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            // Longer than any long poll the fake is configured with.
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(SimulatorError::HttpClient)?;
        Ok(RunnerClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// The service's root URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A client for `base` as a runner's pod configures it: through
    /// `proxy` (an `http://[user:password@]host:port` URL, the credentials
    /// sent as `Proxy-Authorization` as a runner's HTTP stack sends them)
    /// and trusting `ca` (PEM) beside the system's roots.
    pub fn configured(
        base: &str,
        proxy: Option<&str>,
        ca: Option<&[u8]>,
    ) -> Result<RunnerClient, SimulatorError> {
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(120));
        if let Some(proxy) = proxy {
            builder =
                builder.proxy(reqwest::Proxy::all(proxy).map_err(SimulatorError::HttpClient)?);
        }
        if let Some(ca) = ca {
            let certificate =
                reqwest::Certificate::from_pem(ca).map_err(SimulatorError::HttpClient)?;
            builder = builder.add_root_certificate(certificate);
        }
        Ok(RunnerClient {
            http: builder.build().map_err(SimulatorError::HttpClient)?,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    async fn call(&self, what: &str, jit: &str) -> Result<Reply, SimulatorError> {
        let response = self
            .http
            .post(format!("{}/_runner/{what}", self.base))
            .json(&json!({"jitConfig": jit}))
            .send()
            .await
            .map_err(|source| SimulatorError::Unreachable {
                call: what.to_owned(),
                source,
            })?;
        let status = response.status();
        match status {
            StatusCode::NO_CONTENT => Ok(Reply::Empty),
            StatusCode::NOT_FOUND => Ok(Reply::Gone),
            s if s.is_success() => {
                let body = response
                    .json()
                    .await
                    .map_err(|source| SimulatorError::Unreachable {
                        call: what.to_owned(),
                        source,
                    })?;
                Ok(Reply::Ok(body))
            }
            s => Err(SimulatorError::Refused {
                call: what.to_owned(),
                status: s.as_u16(),
                transient: s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS,
            }),
        }
    }

    /// Presents the JIT config; `false` when the registration no longer exists.
    pub async fn connect(&self, jit: &str) -> Result<bool, SimulatorError> {
        Ok(!matches!(self.call("connect", jit).await?, Reply::Gone))
    }

    /// One long poll for the assigned job. `Ok(Err(()))` means the
    /// registration was removed while waiting.
    pub async fn next_job(
        &self,
        jit: &str,
    ) -> Result<Result<Option<RunnerJob>, ()>, SimulatorError> {
        match self.call("job", jit).await? {
            Reply::Ok(body) => serde_json::from_value(body)
                .map(|job| Ok(Some(job)))
                .map_err(|e| SimulatorError::BadAnswer(e.to_string())),
            Reply::Empty => Ok(Ok(None)),
            Reply::Gone => Ok(Err(())),
        }
    }

    /// Reports the job done.
    pub async fn complete(&self, jit: &str) -> Result<(), SimulatorError> {
        self.call("complete", jit).await.map(drop)
    }

    /// Tells the service the runner is gone.
    pub async fn vanished(&self, jit: &str) -> Result<(), SimulatorError> {
        self.call("vanished", jit).await.map(drop)
    }
}
