//! A real etcd and kube-apiserver on loopback, started for tests and the demo.
//!
//! The API server is the one a cluster runs, built from the Kubernetes Go
//! modules, with RBAC on and a client-certificate admin. What it lacks is
//! everything that runs *beside* it in a cluster: no kubelet (pods never run;
//! the runner simulator plays that part), no scheduler, and no
//! controller-manager, so owner-reference garbage collection and namespace
//! finalization never happen. arcwright must not rely on either for anything
//! it needs done, and these tests are where that shows.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::HarnessError;
use crate::binaries;
use crate::certs::Certificates;
use crate::process::{self, Supervised};

/// Keeps the data directory (certificates, etcd data, logs) after stopping,
/// for a person debugging a failure.
pub const KEEP_ENV: &str = "ARCWRIGHT_KEEP_CONTROL_PLANE";

/// How long etcd and the API server get to become ready. A warm start takes a
/// few seconds; the bound only keeps a broken binary from hanging a test run.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// Data directories are named `<prefix><pid>-<n>` under the system temp dir,
/// so a later run can tell which ones belong to processes that are gone.
const DIR_PREFIX: &str = "arcwright-control-plane-";

/// A running etcd + kube-apiserver pair.
///
/// Dropping it stops both processes and removes their data, including when
/// a test panics; if the thread is panicking, the tails of both logs are
/// printed first so the failure can be read next to the test's own output.
pub struct ControlPlane {
    dir: PathBuf,
    /// The API server first: it is stopped before its storage goes away.
    processes: Mutex<Vec<Supervised>>,
    config: kube::Config,
    kubeconfig_path: PathBuf,
    server: String,
    pids: Vec<u32>,
    started_in: Duration,
    /// How the API server was started, so that it can be started again on
    /// the same port over the same etcd.
    apiserver_command: (PathBuf, Vec<String>),
    apiserver_starts: AtomicU32,
}

impl ControlPlane {
    /// Builds the binaries if this machine has never built them, then starts
    /// etcd and kube-apiserver on free loopback ports and waits for `/readyz`.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with_apiserver_args(Vec::new()).await
    }

    /// [`ControlPlane::start`], with `extra` flags appended to the API
    /// server's command line: what a caller measuring the server needs (an
    /// audit log with its policy, `--audit-log-path=...`), without the
    /// harness having to know every flag. A flag given twice is the API
    /// server's to resolve (the last one wins for most), so `extra` can
    /// override the defaults too; the caller owns that choice.
    pub async fn start_with_apiserver_args(extra: Vec<String>) -> Result<Self, HarnessError> {
        let bin = tokio::task::spawn_blocking(|| {
            binaries::ensure_built(&|line| eprintln!("arcwright-harness: {line}"))
        })
        .await
        .map_err(|e| HarnessError::Start(format!("building the control plane panicked: {e}")))??;

        // Free ports are found by binding port 0 and letting go, so another
        // process can take one in between. That is rare and shows up as
        // "address already in use"; a fresh set of ports fixes it.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_with(&bin, &extra).await {
                Err(HarnessError::Start(message))
                    if attempt < 3 && message.contains("address already in use") =>
                {
                    continue;
                }
                other => return other,
            }
        }
    }

    async fn start_with(bin: &Path, extra: &[String]) -> Result<Self, HarnessError> {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        let started = Instant::now();
        let temp = std::env::temp_dir();
        process::sweep_stale(&temp, DIR_PREFIX);
        let dir = temp.join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        let certs_dir = dir.join("certs");
        fs::create_dir_all(&certs_dir).map_err(|source| HarnessError::Io {
            path: certs_dir.clone(),
            source,
        })?;

        // From here on a failure must not leave the directory behind.
        let mut plane = PartialPlane {
            dir: dir.clone(),
            processes: Vec::new(),
        };

        let certs = Certificates::generate()?;
        let write = |name: &str, text: &str| -> Result<PathBuf, HarnessError> {
            let path = certs_dir.join(name);
            fs::write(&path, text).map_err(|source| HarnessError::Io {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        };
        let ca = write("ca.crt", &certs.ca_cert)?;
        let serving_cert = write("apiserver.crt", &certs.serving_cert)?;
        let serving_key = write("apiserver.key", &certs.serving_key)?;
        let admin_cert = write("admin.crt", &certs.admin_cert)?;
        let admin_key = write("admin.key", &certs.admin_key)?;
        let sa_key = write("sa.key", &certs.service_account_key)?;
        let sa_pub = write("sa.pub", &certs.service_account_public)?;

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let api_port = free_port()?;

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_args = vec![
            "--name=arcwright".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=arcwright={peer_url}"),
            // Test data is disposable; fsync only makes every write slower.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut etcd =
            Supervised::start("etcd", &bin.join("etcd"), &etcd_args, dir.join("etcd.log"))?;
        wait_for_port(&mut etcd, etcd_client, started + START_TIMEOUT).await?;
        plane.processes.push(etcd);

        let server = format!("https://127.0.0.1:{api_port}");
        let api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--cert-dir={}", certs_dir.display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca.display()),
            "--authorization-mode=RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            // The ServiceAccount admission plugin wants a default service
            // account in every namespace, which only the controller-manager
            // creates.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            format!("--service-account-issuer=https://127.0.0.1:{api_port}/"),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            // There are no endpoints to keep for the `kubernetes` service.
            "--endpoint-reconciler-type=none".to_owned(),
            "--profiling=false".to_owned(),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect::<Vec<_>>();
        let apiserver_command = (bin.join("kube-apiserver"), api_args);
        let apiserver = Supervised::start(
            "kube-apiserver",
            &apiserver_command.0,
            &apiserver_command.1,
            dir.join("kube-apiserver.log"),
        )?;
        plane.processes.insert(0, apiserver);

        let kubeconfig_text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: arcwright-test
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: arcwright-admin
  user:
    client-certificate: {admin_cert}
    client-key: {admin_key}
contexts:
- name: arcwright-test
  context:
    cluster: arcwright-test
    user: arcwright-admin
current-context: arcwright-test
",
            ca = ca.display(),
            admin_cert = admin_cert.display(),
            admin_key = admin_key.display(),
        );
        let kubeconfig_path = dir.join("kubeconfig");
        fs::write(&kubeconfig_path, &kubeconfig_text).map_err(|source| HarnessError::Io {
            path: kubeconfig_path.clone(),
            source,
        })?;
        let kubeconfig = Kubeconfig::from_yaml(&kubeconfig_text)
            .map_err(|e| HarnessError::Start(format!("generated kubeconfig is invalid: {e}")))?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| HarnessError::Start(format!("loading the kubeconfig: {e}")))?;
        config.read_timeout = Some(Duration::from_secs(60));

        wait_for_ready(&mut plane, &config, started + START_TIMEOUT).await?;

        let pids = plane.processes.iter().map(Supervised::pid).collect();
        let processes = std::mem::take(&mut plane.processes);
        std::mem::forget(plane);
        Ok(Self {
            dir,
            processes: Mutex::new(processes),
            config,
            kubeconfig_path,
            server,
            pids,
            started_in: started.elapsed(),
            apiserver_command,
            apiserver_starts: AtomicU32::new(1),
        })
    }

    /// Stops the API server (SIGTERM, as a rolling restart does) and leaves
    /// etcd running: clients see connections refused until
    /// [`ControlPlane::start_apiserver`]. Watches end, and what a client
    /// resumes from afterwards is the same etcd's history.
    pub fn stop_apiserver(&self) {
        let mut processes = self
            .processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(apiserver) = processes.first_mut() {
            apiserver.stop(Duration::from_secs(10));
        }
    }

    /// Starts the API server again, on the same port with the same flags
    /// and storage (a log file of its own per start), and waits for
    /// `/readyz`. [`ControlPlane::pids`] keeps naming the first start's.
    pub async fn start_apiserver(&self) -> Result<(), HarnessError> {
        let n = self.apiserver_starts.fetch_add(1, Ordering::Relaxed);
        let (program, args) = &self.apiserver_command;
        let fresh = Supervised::start(
            "kube-apiserver",
            program,
            args,
            self.dir.join(format!("kube-apiserver.{n}.log")),
        )?;
        {
            let mut processes = self
                .processes
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match processes.first_mut() {
                Some(old) => *old = fresh,
                None => return Err(HarnessError::Start("the control plane is shut down".into())),
            }
        }
        let client = self.client();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let exited = {
                let mut processes = self
                    .processes
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                processes.first_mut().map(|p| p.ensure_running())
            };
            if let Some(Err(error)) = exited {
                return Err(error);
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request is valid");
            let answer =
                tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await;
            if matches!(&answer, Ok(Ok(body)) if body.trim() == "ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Start(format!(
                    "kube-apiserver was not ready again in time: {answer:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new client with admin rights. Each test should take its own: a
    /// client is bound to the tokio runtime it was made in.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config.clone())
            .expect("a client for the local control plane (call this inside a tokio runtime)")
    }

    /// The client configuration, for code that builds its own client.
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// The API server's address, for a relay to stand in front of.
    pub fn address(&self) -> std::net::SocketAddr {
        self.server()
            .trim_start_matches("https://")
            .parse()
            .expect("the local API server is served on an IP address")
    }

    /// A new admin client that reaches the API server through `relay`
    /// (its certificate names the loopback address, whatever the port).
    pub fn client_via(&self, relay: std::net::SocketAddr) -> kube::Client {
        let mut config = self.config.clone();
        config.cluster_url = format!("https://{relay}")
            .parse()
            .expect("a relay address is a URL authority");
        kube::Client::try_from(config)
            .expect("a client for the local control plane (call this inside a tokio runtime)")
    }

    /// A kubeconfig file for the admin identity (for `kubectl`-like tools and
    /// child processes such as the controller in end-to-end tests).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Process ids of the API server and etcd, to check they are gone after a
    /// stop.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// The data directory (certificates, etcd data, logs).
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// How long the start took, binaries already built.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The last lines of both logs, API server first.
    pub fn log_tails(&self, lines: usize) -> String {
        let processes = self
            .processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        processes
            .iter()
            .map(|p| {
                format!(
                    "----- {} log (last {lines} lines) -----\n{}",
                    p.name(),
                    p.log_tail(lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops both processes and removes the data directory. Idempotent; also
    /// what `Drop` does.
    pub fn shutdown(&self) {
        let mut processes = self
            .processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for process in processes.iter_mut() {
            process.stop(Duration::from_secs(5));
        }
        processes.clear();
        if std::env::var_os(KEEP_ENV).is_some() {
            eprintln!(
                "arcwright-harness: kept the control plane's data in {}",
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(60));
        }
        self.shutdown();
    }
}

/// A control plane that has not finished starting: dropping it stops what
/// did start and removes the directory.
struct PartialPlane {
    dir: PathBuf,
    processes: Vec<Supervised>,
}

impl Drop for PartialPlane {
    fn drop(&mut self) {
        for process in &mut self.processes {
            process.stop(Duration::from_secs(2));
        }
        self.processes.clear();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| HarnessError::Start(format!("no free loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| HarnessError::Start(format!("no free loopback port: {e}")))
}

async fn wait_for_port(
    process: &mut Supervised,
    port: u16,
    deadline: Instant,
) -> Result<(), HarnessError> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        process.ensure_running()?;
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Start(format!(
                "{} did not listen on {address} in time; last lines of its log:\n{}",
                process.name(),
                process.log_tail(40)
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn wait_for_ready(
    plane: &mut PartialPlane,
    config: &kube::Config,
    deadline: Instant,
) -> Result<(), HarnessError> {
    let client = kube::Client::try_from(config.clone())
        .map_err(|e| HarnessError::Start(format!("building a client: {e}")))?;
    let mut last: String;
    loop {
        for process in &mut plane.processes {
            process.ensure_running()?;
        }
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a static request is valid");
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => last = body,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "readyz timed out".into(),
        }
        if Instant::now() > deadline {
            let tails = plane
                .processes
                .iter()
                .map(|p| format!("----- {} -----\n{}", p.name(), p.log_tail(40)))
                .collect::<Vec<_>>()
                .join("\n");
            return Err(HarnessError::Start(format!(
                "kube-apiserver was not ready in time (last answer: {last})\n{tails}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
