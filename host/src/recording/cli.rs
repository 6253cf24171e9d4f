//! `arcwright recording`: getting a trace, from the controller that
//! recorded it ([`fetch`]) or made from a job history kept elsewhere
//! ([`from_csv`], [`from_history`]). Whatever the source, what is written
//! has been read back with [`super::read`], so a trace this command wrote
//! is one `arcwright policy replay` and `simulate` accept.
//!
//! # Reaching the controller
//!
//! With `--url`, the recording API is called directly, with the token in
//! `Authorization` (what `kubectl port-forward` to the controller's pod or
//! Service gives). With `--service`, the call goes through the API
//! server's service proxy with the kubeconfig's credentials: the API
//! server authenticates the caller with them and authorises `get` on
//! `services/proxy`, then deletes `Authorization` before forwarding, so
//! the token for the controller travels in [`TOKEN_HEADER`] instead, which
//! the proxy passes. Either way the controller reviews the token itself.
//!
//! The token is `--token-file`'s, and it must be made for arcwright
//! (`kubectl create token ACCOUNT --audience arcwright`), as the controller
//! accepts no other ([`crate::access::AUDIENCE`]). The kubeconfig's own
//! token is never sent: it is a credential for the whole API server, and
//! the controller has no business holding one of its callers'.
//!
//! The token crosses the network only encrypted unless the user says
//! otherwise twice: a plain `http://` URL to another host than this one, a
//! Service port reached without `https:`, and `--insecure-skip-tls-verify`
//! are each refused without `--allow-insecure` too. A port forwarded to
//! this host (`kubectl port-forward`, `http://localhost:PORT`) is not on
//! the network: it goes through the API server's TLS tunnel.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};

use super::api::{VERB, path as recording_path};
use super::import::{self, FakeHistory};
use crate::access::TOKEN_HEADER;

/// `arcwright recording`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RecordingCommand {
    /// Fetch a scale set's recording from the controller (the recording
    /// API; the token's user needs the verb `read-recording` on the
    /// AutoscalingRunnerSet).
    Fetch(FetchArgs),
    /// Make a trace from a CSV of workflow jobs (GitHub's
    /// `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs`, one row per
    /// job: `id`, `created_at`, `started_at`, `completed_at`, `conclusion`,
    /// optionally `labels`).
    FromCsv(FromCsvArgs),
    /// Make a trace from the fake Actions service's job history (its
    /// `/_fake/history`), for demos and tests.
    FromHistory(FromHistoryArgs),
}

/// `arcwright recording fetch`'s arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).args(["url", "service"])))]
pub struct FetchArgs {
    /// The scale set, NAMESPACE/NAME.
    #[arg(value_parser = parse_scale_set, value_name = "NAMESPACE/NAME")]
    pub scale_set: ScaleSetRef,
    /// The controller's address, e.g. `http://localhost:8080` from
    /// `kubectl port-forward` (its `--debug-listen-address` port when it
    /// has one).
    #[arg(long)]
    pub url: Option<url::Url>,
    /// Through the API server's service proxy: the controller's Service,
    /// NAMESPACE/NAME:PORT (`NAMESPACE/https:NAME:PORT` for a TLS port).
    #[arg(long, value_parser = parse_service, value_name = "NAMESPACE/NAME:PORT")]
    pub service: Option<ServiceRef>,
    /// A file holding the bearer token to send, made for the audience
    /// `arcwright` (`kubectl create token ACCOUNT -n NAMESPACE --audience
    /// arcwright > token`).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The kubeconfig (default: `$KUBECONFIG`, `~/.kube/config`, or the
    /// pod's service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// With `--url https://...`, trust this CA bundle (PEM) too.
    #[arg(long, value_name = "PATH", requires = "url")]
    pub ca_file: Option<PathBuf>,
    /// With `--url https://...`, skip verifying the certificate (a port
    /// forwarded to `localhost` does not match the certificate's names).
    /// Needs `--allow-insecure` too.
    #[arg(long, requires = "url")]
    pub insecure_skip_tls_verify: bool,
    /// Send the token where it could be read on the way: over plain HTTP
    /// to another host (a `http://` URL, a Service port without `https:`),
    /// or with `--insecure-skip-tls-verify`.
    #[arg(long)]
    pub allow_insecure: bool,
    /// Write the trace here instead of to standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `arcwright recording from-csv`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct FromCsvArgs {
    /// The CSV; `-` reads standard input.
    pub file: PathBuf,
    /// The namespace the trace's header names.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The scale set the trace's header names (default: the file's name
    /// without its extension).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the trace here instead of to standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `arcwright recording from-history`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct FromHistoryArgs {
    /// The fake Actions service's root URL.
    #[arg(long)]
    pub url: url::Url,
    /// Only this scale set's jobs (its id at the fake).
    #[arg(long, value_name = "ID")]
    pub scale_set: Option<u64>,
    /// The namespace the trace's header names.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The scale set the trace's header names (default: `scale-set-ID`, or
    /// `fake-actions` for every scale set's jobs).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the trace here instead of to standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// A scale set, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSetRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A Service port the API server can proxy to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// `[https:]NAME:PORT`, as the proxy path takes it.
    pub target: String,
}

/// Kubernetes names: a DNS subdomain (lowercase letters, digits, `-`, `.`).
/// Checked so a name cannot add segments to the path it is put in.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Parses `NAMESPACE/NAME`.
pub fn parse_scale_set(text: &str) -> Result<ScaleSetRef, String> {
    match text.split_once('/') {
        Some((namespace, name)) if is_name(namespace) && is_name(name) => Ok(ScaleSetRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        _ => Err(format!(
            "expected NAMESPACE/NAME (lowercase Kubernetes names), got {text:?}"
        )),
    }
}

/// Parses `NAMESPACE/[SCHEME:]NAME:PORT`.
pub fn parse_service(text: &str) -> Result<ServiceRef, String> {
    let refused =
        || format!("expected NAMESPACE/NAME:PORT (or NAMESPACE/https:NAME:PORT), got {text:?}");
    let (namespace, target) = text.split_once('/').ok_or_else(refused)?;
    let parts: Vec<&str> = target.split(':').collect();
    let (scheme, name, port) = match parts[..] {
        [name, port] => (None, name, port),
        [scheme, name, port] => (Some(scheme), name, port),
        _ => return Err(refused()),
    };
    let port_ok = !port.is_empty()
        && port
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !is_name(namespace)
        || !is_name(name)
        || !port_ok
        || scheme.is_some_and(|s| s != "http" && s != "https")
    {
        return Err(refused());
    }
    Ok(ServiceRef {
        namespace: namespace.to_owned(),
        target: target.to_owned(),
    })
}

impl RecordingCommand {
    /// Runs the subcommand: the trace goes to standard output or `-o`.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let (text, output) = match self {
            Self::Fetch(args) => (runtime.block_on(fetch(&args))?, args.output),
            Self::FromCsv(args) => (from_csv(&args)?, args.output),
            Self::FromHistory(args) => (runtime.block_on(from_history(&args))?, args.output),
        };
        write_out(&text, output.as_deref())?;
        Ok(ExitCode::SUCCESS)
    }
}

fn write_out(text: &str, output: Option<&Path>) -> anyhow::Result<()> {
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .context("writing standard output")
        }
    }
}

/// Installs rustls' ring provider unless one is already: reqwest and kube
/// are built without a default one.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The scale set's trace from the controller, checked to read back and to
/// be the scale set asked for.
pub async fn fetch(args: &FetchArgs) -> anyhow::Result<String> {
    ensure_crypto_provider();
    let set = &args.scale_set;
    let path = recording_path(&set.namespace, &set.name);
    check_transport(args)?;
    let token = token(args)?;
    let (status, retry_after, body, via) = match (&args.url, &args.service) {
        (Some(url), _) => {
            let target = format!("{}{path}", url.as_str().trim_end_matches('/'));
            let response = http_client(args)?
                .get(&target)
                .bearer_auth(&token)
                .send()
                .await
                .with_context(|| format!("calling {target}"))?;
            let status = response.status().as_u16();
            let retry_after = header_text(response.headers(), "retry-after");
            let body = response
                .text()
                .await
                .with_context(|| format!("reading the answer of {target}"))?;
            (status, retry_after, body, Via::Url)
        }
        (None, Some(service)) => {
            let config = load_config(args.kubeconfig.as_deref()).await?;
            let client =
                kube::Client::try_from(config).context("building the Kubernetes client")?;
            let proxied = format!(
                "/api/v1/namespaces/{}/services/{}/proxy{path}",
                service.namespace, service.target
            );
            let request = http::Request::get(&proxied)
                .header(TOKEN_HEADER, format!("Bearer {token}"))
                .body(kube::client::Body::empty())
                .context("building the request")?;
            let response = client.send(request).await.with_context(|| {
                format!(
                    "calling the API server's proxy to the Service {}/{}",
                    service.namespace, service.target
                )
            })?;
            let status = response.status().as_u16();
            let retry_after = header_text(response.headers(), "retry-after");
            let body = response
                .into_body()
                .collect_bytes()
                .await
                .context("reading the answer through the API server's proxy")?;
            (
                status,
                retry_after,
                String::from_utf8_lossy(&body).into_owned(),
                Via::Service,
            )
        }
        (None, None) => bail!("give --url or --service"),
    };
    interpret(set, status, retry_after.as_deref(), &body, via)
}

fn header_text(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn http_client(args: &FetchArgs) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        // A redirect would carry the token to wherever it points.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(120));
    if let Some(path) = &args.ca_file {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("reading the CA bundle {}", path.display()))?;
        if certs.is_empty() {
            bail!("{} holds no PEM certificate", path.display());
        }
        builder = builder.tls_certs_merge(certs);
    }
    if args.insecure_skip_tls_verify {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    builder.build().context("building the HTTP client")
}

/// The kubeconfig's configuration: `path`'s, or inferred.
async fn load_config(path: Option<&Path>) -> anyhow::Result<kube::Config> {
    ensure_crypto_provider();
    match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration found for the API server's proxy (give --kubeconfig, or use --url)",
        ),
    }
}

/// The token to send: `--token-file`'s, which is required.
fn token(args: &FetchArgs) -> anyhow::Result<String> {
    match &args.token_file {
        Some(file) => read_token(file),
        None => bail!(
            "give --token-file with a token made for the controller: \
             `kubectl create token SERVICE_ACCOUNT -n NAMESPACE --audience {} > token` \
             (the kubeconfig's own credentials are never sent to it)",
            crate::access::AUDIENCE
        ),
    }
}

/// Refuses to send the token where it could be read, unless
/// `--allow-insecure` says so (see the module's documentation).
fn check_transport(args: &FetchArgs) -> anyhow::Result<()> {
    if args.allow_insecure {
        return Ok(());
    }
    if args.insecure_skip_tls_verify {
        bail!(
            "--insecure-skip-tls-verify lets whoever answers read the token: \
             give --allow-insecure too if that is meant, or --ca-file"
        );
    }
    if let Some(url) = &args.url
        && url.scheme() == "http"
        && !is_this_host(url)
    {
        bail!(
            "{url} is plain HTTP to another host, where the token can be read on the way: \
             use https, a port forwarded to localhost, or give --allow-insecure too"
        );
    }
    if let Some(service) = &args.service
        && !service.target.starts_with("https:")
    {
        bail!(
            "the Service port {}/{} is reached over plain HTTP from the API server, where the \
             token can be read on the way: name it NAMESPACE/https:NAME:PORT (the controller's \
             debug endpoint with a TLS Secret), or give --allow-insecure too",
            service.namespace,
            service.target
        );
    }
    Ok(())
}

/// Whether `url` names this host (loopback), where plain HTTP crosses no
/// network.
fn is_this_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// How the answer came: it decides what a 404 or a 403 can mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Straight from the controller.
    Url,
    /// Through the API server's service proxy, which answers some errors
    /// itself.
    Service,
}

/// The trace in an answer of the recording API, or the error the answer
/// says, in words a person can act on.
pub fn interpret(
    set: &ScaleSetRef,
    status: u16,
    retry_after: Option<&str>,
    body: &str,
    via: Via,
) -> anyhow::Result<String> {
    let ScaleSetRef { namespace, name } = set;
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.trim().chars().take(500).collect());
    match status {
        200 => {
            let trace = super::read(body).context("the controller's answer is not a trace")?;
            if (&trace.header.namespace, &trace.header.name) != (namespace, name) {
                bail!(
                    "the controller answered the recording of {}/{}, not {namespace}/{name}",
                    trace.header.namespace,
                    trace.header.name
                );
            }
            Ok(body.to_owned())
        }
        401 if via == Via::Service && !message.contains("token") => {
            bail!("the API server refused the kubeconfig's credentials (401): {message}")
        }
        401 => bail!(
            "the controller refused the token (401): {message}; give a valid one with \
             --token-file (`kubectl create token ACCOUNT -n NAMESPACE --audience {}`)",
            crate::access::AUDIENCE
        ),
        403 if via == Via::Service && message.contains("services/proxy") => bail!(
            "the API server refused the proxy (403): {message}; the kubeconfig's user needs \
             `get` on `services/proxy` in the Service's namespace"
        ),
        403 => bail!(
            "not allowed (403): {message}; the token's user needs the verb {VERB} on \
             autoscalingrunnersets.{} {namespace}/{name} (docs/recording.md has a ClusterRole)",
            crate::api::GROUP
        ),
        404 => bail!("no recording (404): {message}"),
        429 => bail!(
            "the controller is refusing token reviews from this client (429); try again in {} s",
            retry_after.unwrap_or("a few")
        ),
        _ => bail!("the answer was {status}: {message}"),
    }
}

/// A trace from the CSV `args.file` names.
pub fn from_csv(args: &FromCsvArgs) -> anyhow::Result<String> {
    let stdin = args.file.as_os_str() == "-";
    let text = if stdin {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let entries =
        import::from_csv(&text).with_context(|| format!("reading {}", args.file.display()))?;
    let name = match &args.name {
        Some(name) => name.clone(),
        None if stdin => "imported".to_owned(),
        None => args
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "imported".to_owned()),
    };
    checked(import::trace(&args.namespace, &name, 0, entries))
}

/// A trace from the fake Actions service's job history.
pub async fn from_history(args: &FromHistoryArgs) -> anyhow::Result<String> {
    ensure_crypto_provider();
    let target = format!("{}/_fake/history", args.url.as_str().trim_end_matches('/'));
    let response = reqwest::Client::new()
        .get(&target)
        .send()
        .await
        .with_context(|| format!("calling {target}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("{target} answered {status}: is it the fake Actions service?");
    }
    let history: FakeHistory = response
        .json()
        .await
        .with_context(|| format!("reading the job history from {target}"))?;
    let entries = import::history_entries(&history, args.scale_set)?;
    let name = match (&args.name, args.scale_set) {
        (Some(name), _) => name.clone(),
        (None, Some(id)) => format!("scale-set-{id}"),
        (None, None) => "fake-actions".to_owned(),
    };
    checked(import::trace(
        &args.namespace,
        &name,
        history.dropped,
        entries,
    ))
}

/// `trace` written, after checking it reads back as itself.
fn checked(trace: super::Trace) -> anyhow::Result<String> {
    let text = import::render(&trace).context("writing the trace")?;
    let back = super::read(&text).context("the trace written does not read back")?;
    if back != trace {
        bail!("the trace written does not read back as it was made");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> ScaleSetRef {
        parse_scale_set("ci/linux").unwrap()
    }

    fn args(url: Option<&str>, service: Option<&str>) -> FetchArgs {
        FetchArgs {
            scale_set: set(),
            url: url.map(|u| u.parse().unwrap()),
            service: service.map(|s| parse_service(s).unwrap()),
            token_file: None,
            kubeconfig: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            allow_insecure: false,
            output: None,
        }
    }

    #[test]
    fn the_token_goes_unencrypted_over_a_network_only_when_said_twice() {
        for sent in [
            args(Some("https://arcwright.example:8443"), None),
            args(Some("http://localhost:8080"), None),
            args(Some("http://127.0.0.1:8080"), None),
            args(Some("http://[::1]:8080"), None),
            args(None, Some("arcwright-system/https:arcwright:8443")),
        ] {
            check_transport(&sent).unwrap();
        }
        let insecure = FetchArgs {
            insecure_skip_tls_verify: true,
            ..args(Some("https://localhost:8443"), None)
        };
        for (refused, says) in [
            (args(Some("http://10.0.0.7:8080"), None), "plain HTTP"),
            (
                args(None, Some("arcwright-system/arcwright:debug")),
                "https:",
            ),
            (insecure, "--allow-insecure"),
        ] {
            let error = check_transport(&refused).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
            check_transport(&FetchArgs {
                allow_insecure: true,
                ..refused
            })
            .unwrap();
        }
        // No token file is no token: the kubeconfig's is never sent.
        let error = token(&args(Some("https://localhost"), None))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--audience arcwright"), "{error}");
    }

    #[test]
    fn scale_sets_and_services_are_parsed_and_paths_cannot_be_smuggled() {
        assert_eq!(
            set(),
            ScaleSetRef {
                namespace: "ci".into(),
                name: "linux".into()
            }
        );
        for refused in [
            "ci",
            "ci/",
            "/linux",
            "ci/linux/x",
            "ci/../x",
            "CI/linux",
            "ci/a?b",
        ] {
            assert!(parse_scale_set(refused).is_err(), "{refused}");
        }
        assert_eq!(
            parse_service("arcwright-system/arcwright-metrics:debug").unwrap(),
            ServiceRef {
                namespace: "arcwright-system".into(),
                target: "arcwright-metrics:debug".into()
            }
        );
        assert_eq!(
            parse_service("ns/https:svc:8443").unwrap().target,
            "https:svc:8443"
        );
        for refused in [
            "svc:80",
            "ns/svc",
            "ns/ftp:svc:80",
            "ns/svc:80/x",
            "ns/a:b:c:d",
        ] {
            assert!(parse_service(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn answers_become_the_trace_or_an_error_saying_what_to_do() {
        let trace = import::render(&import::trace("ci", "linux", 0, Vec::new())).unwrap();
        assert_eq!(
            interpret(&set(), 200, None, &trace, Via::Url).unwrap(),
            trace
        );
        let other = import::render(&import::trace("ci", "windows", 0, Vec::new())).unwrap();
        let error = interpret(&set(), 200, None, &other, Via::Url).unwrap_err();
        assert!(error.to_string().contains("ci/windows"), "{error}");
        let error = interpret(&set(), 200, None, "<html>", Via::Url).unwrap_err();
        assert!(format!("{error:#}").contains("not a trace"), "{error:#}");

        let said = |status: u16, body: &str, via: Via| {
            interpret(&set(), status, Some("7"), body, via)
                .unwrap_err()
                .to_string()
        };
        let text = said(401, r#"{"message": "the token is not valid"}"#, Via::Url);
        assert!(
            text.contains("the token is not valid") && text.contains("--token-file"),
            "{text}"
        );
        let text = said(
            403,
            r#"{"message": "bob may not read-recording ..."}"#,
            Via::Url,
        );
        assert!(
            text.contains("bob may not") && text.contains(VERB),
            "{text}"
        );
        let status = r#"{"kind":"Status","message":"services \"x\" is forbidden: User \"bob\" cannot get resource \"services/proxy\""}"#;
        let text = said(403, status, Via::Service);
        assert!(text.contains("`get` on `services/proxy`"), "{text}");
        let text = said(
            401,
            r#"{"kind":"Status","message":"Unauthorized"}"#,
            Via::Service,
        );
        assert!(text.contains("kubeconfig's credentials"), "{text}");
        let text = said(
            404,
            r#"{"message": "this replica has no recording"}"#,
            Via::Url,
        );
        assert!(text.contains("this replica has no recording"), "{text}");
        let text = said(429, "{}", Via::Url);
        assert!(text.contains("7 s"), "{text}");
        let text = said(502, "bad gateway", Via::Url);
        assert!(text.contains("502: bad gateway"), "{text}");
    }
}
