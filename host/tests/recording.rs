//! The recording API and `arcwright recording fetch` against the real API
//! server: tokens reviewed by it, the verb `read-recording` granted by a
//! Role, the trace served as recorded (and bounded as recorded), and the
//! same trace fetched straight and through the API server's service proxy,
//! which removes the caller's `Authorization` before forwarding.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use arcwright::access::ClientAddr;
use arcwright::policy::types::ScalingInput;
use arcwright::recording::api::{CONTENT_TYPE, VERB, router};
use arcwright::recording::cli::{FetchArgs, ServiceRef, fetch, parse_scale_set, parse_service};
use arcwright::recording::{Decision, Entry, Job, JobEvent, Limits, Recordings, read};
use arcwright_harness::TestEnv;
use kube::api::{Api, PostParams};
use serde_json::json;

struct World {
    env: TestEnv,
    base: String,
    addr: SocketAddr,
    _server: tokio::task::JoinHandle<()>,
}

impl World {
    /// The recording API over the recordings `record` makes for the test's
    /// namespace, served on every address of this host (the service proxy
    /// test reaches it on a non-loopback one).
    async fn new(name: &str, record: impl FnOnce(&str) -> Recordings) -> World {
        let env = TestEnv::new(name).await;
        // Not needed by the reviews (RBAC names resources, installed or
        // not), but what a cluster running the controller has.
        common::install_crds(env.client()).await;
        let app = router(env.client(), record(env.namespace()));
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let base = format!("http://127.0.0.1:{}", addr.port());
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<ClientAddr>(),
            )
            .await
            .unwrap();
        });
        World {
            env,
            base,
            addr,
            _server: server,
        }
    }

    fn ns(&self) -> &str {
        self.env.namespace()
    }

    /// GETs the recording of `name` in the test namespace.
    async fn get(&self, name: &str, token: Option<&str>) -> (u16, Option<String>, String) {
        let url = format!(
            "{}/api/v1/namespaces/{}/autoscalingrunnersets/{name}/recording",
            self.base,
            self.ns()
        );
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let kind = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, kind, response.text().await.unwrap())
    }

    /// A ServiceAccount and a token for it, bound to a Role of `rules`
    /// (none: no Role).
    async fn account(&self, name: &str, rules: serde_json::Value) -> String {
        common::service_account_with_rules(self.env.client(), self.ns(), name, rules).await
    }

    /// A reader: allowed `read-recording` on the scale sets of the namespace.
    async fn reader(&self, name: &str) -> String {
        self.account(
            name,
            json!([{"apiGroups": ["arcwright.dev"], "resources": ["autoscalingrunnersets"], "verbs": [VERB]}]),
        )
        .await
    }

    /// A file holding `token` (the account `name`'s, for arcwright), and a
    /// kubeconfig whose user is the same account with a token for the API
    /// server of the test.
    async fn credentials(&self, name: &str, token: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let general = common::token_for(self.env.client(), self.ns(), name, &[]).await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let plane = self.env.control_plane();
        let ca = plane.data_dir().join("certs").join("ca.crt");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {}
    certificate-authority: {}
users:
- name: reader
  user:
    token: {general}
contexts:
- name: test
  context: {{cluster: test, user: reader}}
current-context: test
",
                plane.server(),
                ca.display()
            ),
        )
        .unwrap();
        (dir, token_file, kubeconfig)
    }

    fn fetch_args(&self, name: &str) -> FetchArgs {
        FetchArgs {
            scale_set: parse_scale_set(&format!("{}/{name}", self.ns())).unwrap(),
            url: None,
            service: None,
            token_file: None,
            kubeconfig: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            allow_insecure: false,
            output: None,
        }
    }
}

fn decision(desired: u32) -> Entry {
    Entry::Decision(Decision {
        input: ScalingInput {
            current_desired: desired.saturating_sub(1),
            now: Some("2026-12-04T10:00:00Z".to_owned()),
            ..ScalingInput::default()
        },
        desired,
        reason: format!("{desired} jobs waiting"),
        state_out: None,
        policy: "builtin:default".to_owned(),
        sha256: Some("ab".repeat(32)),
        fallback_reason: None,
    })
}

fn job(id: i64, event: JobEvent) -> Entry {
    Entry::Job(Job {
        at: "2026-12-04T10:00:01Z".to_owned(),
        event,
        runner_request_id: id,
        labels: vec!["linux".to_owned()],
        queue_time: Some("2026-12-04T09:59:00Z".to_owned()),
        scale_set_assign_time: None,
        runner_assign_time: None,
        finish_time: None,
        result: None,
    })
}

/// Recordings of `namespace/name` holding `entries`, each set bounded by
/// `limits`.
fn recorded(namespace: &str, name: &str, limits: Limits, entries: &[Entry]) -> Recordings {
    let recordings = Recordings::new(limits, 1 << 20);
    let recording = recordings.open(namespace, name).unwrap();
    let mut recording = recording.lock().unwrap();
    for entry in entries {
        recording.push(entry);
    }
    drop(recording);
    recordings
}

fn roomy() -> Limits {
    Limits {
        entries: 1000,
        bytes: 1 << 20,
    }
}

fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["message"]
        .as_str()
        .unwrap_or_else(|| panic!("a JSON message: {body}"))
        .to_owned()
}

#[tokio::test]
async fn the_recording_is_served_to_those_allowed_to_read_it_and_to_no_one_else() {
    let entries = [
        decision(2),
        job(7, JobEvent::Available),
        job(7, JobEvent::Assigned),
        decision(3),
    ];
    let world = World::new("recording-api", |ns| {
        recorded(ns, "linux", roomy(), &entries)
    })
    .await;
    let reader = world.reader("reader").await;
    // `get` on the scale set is not the verb: the recording shows more.
    let getter = world
        .account(
            "getter",
            json!([{"apiGroups": ["arcwright.dev"], "resources": ["autoscalingrunnersets"], "verbs": ["get", "list"]}]),
        )
        .await;
    let stranger = world.account("stranger", json!([])).await;

    let (status, _, body) = world.get("linux", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(message(&body).contains("bearer token"), "{body}");
    let (status, _, body) = world.get("linux", Some("not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    for (who, token) in [("getter", &getter), ("stranger", &stranger)] {
        let (status, _, body) = world.get("linux", Some(token)).await;
        assert_eq!(status, 403, "{who}: {body}");
        let said = message(&body);
        assert!(
            said.contains(who) && said.contains(VERB) && said.contains("linux"),
            "{said}"
        );
    }
    // Authorised before looked up: a stranger cannot tell which sets exist.
    let (status, _, _) = world.get("absent", Some(&stranger)).await;
    assert_eq!(status, 403);

    let (status, kind, body) = world.get("linux", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(kind.as_deref(), Some(CONTENT_TYPE));
    let trace = read(&body).unwrap();
    assert_eq!(
        (trace.header.namespace.as_str(), trace.header.name.as_str()),
        (world.ns(), "linux")
    );
    assert_eq!(trace.header.dropped, 0);
    assert_eq!(trace.entries, entries);

    let (status, _, body) = world.get("absent", Some(&reader)).await;
    assert_eq!(status, 404, "{body}");
    let said = message(&body);
    assert!(
        said.contains(&format!("{}/absent", world.ns())) && said.contains("not listened"),
        "{said}"
    );
}

#[tokio::test]
async fn a_recording_over_its_entry_limit_serves_the_newest_and_counts_the_dropped() {
    let limits = Limits {
        entries: 3,
        bytes: 1 << 20,
    };
    let entries: Vec<Entry> = (1..=5).map(decision).collect();
    let world = World::new("recording-bound", |ns| {
        recorded(ns, "linux", limits, &entries)
    })
    .await;
    let reader = world.reader("reader").await;
    let (status, _, body) = world.get("linux", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let trace = read(&body).unwrap();
    assert_eq!(trace.entries, entries[2..]);
    assert_eq!(trace.header.dropped, 2);
}

#[tokio::test]
async fn with_recording_off_the_answer_says_so() {
    let world = World::new("recording-off", |_| Recordings::off()).await;
    let reader = world.reader("reader").await;
    let (status, _, body) = world.get("linux", Some(&reader)).await;
    assert_eq!(status, 404, "{body}");
    assert!(message(&body).contains("recording is off"), "{body}");
}

#[tokio::test]
async fn fetch_with_a_url_writes_the_trace_and_says_why_it_cannot() {
    let entries = [decision(1), job(3, JobEvent::Available)];
    let world = World::new("recording-fetch", |ns| {
        recorded(ns, "linux", roomy(), &entries)
    })
    .await;
    let reader = world.reader("reader").await;
    let stranger = world.account("stranger", json!([])).await;
    let (_dir, token_file, kubeconfig) = world.credentials("reader", &reader).await;
    let url: url::Url = world.base.parse().unwrap();

    let by_file = fetch(&FetchArgs {
        url: Some(url.clone()),
        token_file: Some(token_file),
        ..world.fetch_args("linux")
    })
    .await
    .unwrap();
    assert_eq!(read(&by_file).unwrap().entries, entries);

    // No token file: the kubeconfig's credentials are never sent.
    let error = fetch(&FetchArgs {
        url: Some(url.clone()),
        kubeconfig: Some(kubeconfig.clone()),
        ..world.fetch_args("linux")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("--token-file"), "{error}");

    let (_dir, token_file, _) = world.credentials("reader", &reader).await;
    let error = fetch(&FetchArgs {
        url: Some(url.clone()),
        token_file: Some(token_file),
        ..world.fetch_args("absent")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("no recording (404)"), "{error}");

    let (_dir, stranger_file, _) = world.credentials("stranger", &stranger).await;
    let error = fetch(&FetchArgs {
        url: Some(url.clone()),
        token_file: Some(stranger_file),
        ..world.fetch_args("linux")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("not allowed (403)") && error.contains(VERB),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("token");
    std::fs::write(&bad, "made-up\n").unwrap();
    let error = fetch(&FetchArgs {
        url: Some(url),
        token_file: Some(bad),
        ..world.fetch_args("linux")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("the controller refused the token (401)"),
        "{error}"
    );
}

/// An address of this host other than loopback: the API server proxies
/// only to Pod addresses, and an EndpointSlice refuses loopback ones. The
/// route to a documentation address names it without sending anything.
fn host_address() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("203.0.113.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test]
async fn fetch_through_the_service_proxy_carries_the_token_past_the_api_server() {
    let entries = [decision(4), job(9, JobEvent::Started)];
    let world = World::new("recording-proxy", |ns| {
        recorded(ns, "linux", roomy(), &entries)
    })
    .await;
    let Some(ip) = host_address() else {
        eprintln!("SKIPPED: this host has no address but loopback for the API server to proxy to");
        return;
    };
    let ns = world.ns().to_owned();
    let client = world.env.client();
    let port = world.addr.port();

    // A Service whose one endpoint is a Pod at this host's address: what
    // the API server checks before it proxies, without a kubelet.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "controller"},
            "spec": {"containers": [{"name": "arcwright", "image": "arcwright:test"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    pods.patch_status(
        "controller",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {
            "phase": "Running",
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
        }})),
    )
    .await
    .unwrap();
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "arcwright"},
                "spec": {"ports": [{"name": "debug", "port": 8443, "targetPort": port}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), &ns);
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "arcwright-1", "labels": {"kubernetes.io/service-name": "arcwright"}},
                "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
                "endpoints": [{
                    "addresses": [ip.to_string()],
                    "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "name": "controller", "namespace": ns},
                }],
                "ports": [{"name": "debug", "port": port, "protocol": "TCP"}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    // The reader may read the recording and go through the proxy.
    let reader = world
        .account(
            "reader",
            json!([
                {"apiGroups": ["arcwright.dev"], "resources": ["autoscalingrunnersets"], "verbs": [VERB]},
                {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]},
            ]),
        )
        .await;
    let (_dir, token_file, kubeconfig) = world.credentials("reader", &reader).await;
    let as_reader = {
        let text = std::fs::read_to_string(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&text).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    };

    // What the proxy forwards: the caller's own Authorization authenticated
    // them at the API server and was removed; the controller saw none.
    let proxied = format!(
        "/api/v1/namespaces/{ns}/services/arcwright:debug/proxy/api/v1/namespaces/{ns}/autoscalingrunnersets/linux/recording"
    );
    let (status, body) = arcwright_harness::eventually(
        "the API server proxies to the Service (its EndpointSlice seen)",
        std::time::Duration::from_secs(30),
        || async {
            let request = http::Request::get(&proxied)
                .body(kube::client::Body::empty())
                .unwrap();
            let response = as_reader.send(request).await.ok()?;
            let status = response.status().as_u16();
            let body = response.into_body().collect_bytes().await.ok()?;
            (status != 503).then(|| (status, String::from_utf8_lossy(&body).into_owned()))
        },
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        message(&body).contains("bearer token is required"),
        "{body}"
    );

    // The token in the header the proxy passes: the trace, as recorded.
    // The test's port is plain HTTP, so the fetch says it means that.
    let service: ServiceRef = parse_service(&format!("{ns}/arcwright:debug")).unwrap();
    let text = fetch(&FetchArgs {
        service: Some(service.clone()),
        kubeconfig: Some(kubeconfig.clone()),
        token_file: Some(token_file.clone()),
        allow_insecure: true,
        ..world.fetch_args("linux")
    })
    .await
    .unwrap();
    let trace = read(&text).unwrap();
    assert_eq!(trace.entries, entries);
    assert_eq!(trace.header.name, "linux");

    // The API server's own refusal is told apart from the controller's.
    let outsider = world
        .account(
            "outsider",
            json!([{"apiGroups": ["arcwright.dev"], "resources": ["autoscalingrunnersets"], "verbs": [VERB]}]),
        )
        .await;
    let (_dir, outsider_file, outsider_kubeconfig) = world.credentials("outsider", &outsider).await;
    let error = fetch(&FetchArgs {
        service: Some(service),
        kubeconfig: Some(outsider_kubeconfig),
        token_file: Some(outsider_file),
        allow_insecure: true,
        ..world.fetch_args("linux")
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("`get` on `services/proxy`"), "{error}");
}

/// Plays the runner holding `jit` at the fake: `what` is `connect`, `job`
/// or `complete`.
async fn runner_call(
    fake: &fake_actions::FakeActions,
    what: &str,
    jit: &arcwright::actions::Secret,
) {
    let response = reqwest::Client::new()
        .post(format!("{}/_runner/{what}", fake.url()))
        .json(&json!({"jitConfig": jit.expose()}))
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{what}: {}",
        response.status()
    );
}

#[tokio::test]
async fn from_history_makes_the_trace_a_listener_would_have_recorded() {
    use arcwright::actions::{
        ActionsClient, ConfigUrl, Credentials, JitRunnerSetting, RunnerScaleSet, Secret,
    };
    use arcwright::recording::cli::{FromHistoryArgs, from_history};
    use fake_actions::{FakeActions, FakeConfig, JobOutcome, JobSpec};

    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    let client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        common::fast_client_options(),
    )
    .unwrap();
    let set = client
        .create_runner_scale_set(&RunnerScaleSet::new("linux", 1, &[]))
        .await
        .unwrap();
    // Offered the windows jobs, which a filter by scale set leaves out.
    let _windows = client
        .create_runner_scale_set(&RunnerScaleSet::new("windows", 1, &[]))
        .await
        .unwrap();
    let jit = client
        .generate_jit_runner_config(
            set.id,
            &JitRunnerSetting {
                name: "linux-runner".into(),
                work_folder: String::new(),
            },
        )
        .await
        .unwrap();
    runner_call(&fake, "connect", &jit.encoded_jit_config).await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    let ids = fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &["linux"]).ending(JobOutcome::Failed));
    fake.control().enqueue_jobs(JobSpec::new(2, &["windows"]));
    let message = session
        .get_message(0, 1)
        .await
        .unwrap()
        .expect("the job offered");
    session.delete_message(message.id).await.unwrap();
    let id = i64::try_from(ids[0]).unwrap();
    assert_eq!(session.acquire_jobs(&[id]).await.unwrap(), [id]);
    runner_call(&fake, "job", &jit.encoded_jit_config).await;
    runner_call(&fake, "complete", &jit.encoded_jit_config).await;

    let text = from_history(&FromHistoryArgs {
        url: fake.url().parse().unwrap(),
        scale_set: Some(u64::try_from(set.id).unwrap()),
        namespace: "ci".into(),
        name: Some("linux".into()),
        output: None,
    })
    .await
    .unwrap();
    let trace = read(&text).unwrap();
    assert_eq!(
        (trace.header.namespace.as_str(), trace.header.name.as_str()),
        ("ci", "linux")
    );
    let seen: Vec<(i64, JobEvent)> = trace
        .entries
        .iter()
        .map(|e| match e {
            Entry::Job(j) => (j.runner_request_id, j.event),
            Entry::Decision(_) => panic!("a decision from a job history"),
        })
        .collect();
    assert_eq!(
        seen,
        [
            (id, JobEvent::Available),
            (id, JobEvent::Assigned),
            (id, JobEvent::Started),
            (id, JobEvent::Completed),
        ],
        "the other scale set's jobs are left out"
    );
    let Some(Entry::Job(completed)) = trace.entries.last() else {
        unreachable!()
    };
    assert_eq!(completed.result.as_deref(), Some("failed"));
    assert_eq!(completed.labels, ["linux"]);
    assert!(completed.runner_assign_time.is_some() && completed.finish_time.is_some());

    let everything = from_history(&FromHistoryArgs {
        url: fake.url().parse().unwrap(),
        scale_set: None,
        namespace: "ci".into(),
        name: None,
        output: None,
    })
    .await
    .unwrap();
    let everything = read(&everything).unwrap();
    assert_eq!(everything.header.name, "fake-actions");
    assert_eq!(
        everything.entries.len(),
        4 + 2,
        "and the windows jobs' offers"
    );
}

#[test]
fn from_csv_writes_a_trace_named_after_the_file() {
    use arcwright::recording::cli::{FromCsvArgs, from_csv};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nightly.csv");
    std::fs::write(
        &file,
        "id,created_at,started_at,completed_at,conclusion,labels\n\
         1,2026-12-04T10:00:00Z,2026-12-04T10:01:00Z,2026-12-04T10:09:00Z,success,linux\n",
    )
    .unwrap();
    let args = FromCsvArgs {
        file: file.clone(),
        namespace: "ci".into(),
        name: None,
        output: None,
    };
    let trace = read(&from_csv(&args).unwrap()).unwrap();
    assert_eq!(trace.header.name, "nightly");
    assert_eq!(trace.entries.len(), 4);

    std::fs::write(&file, "id,created_at\n1,2026-12-04T10:00:00Z\n").unwrap();
    let error = format!("{:#}", from_csv(&args).unwrap_err());
    assert!(
        error.contains("nightly.csv") && error.contains("line 1 of the CSV"),
        "{error}"
    );
}
