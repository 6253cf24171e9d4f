//! `arcwright run` as a process against the local API server: ready once
//! its components are, policy metrics on `/metrics`, a clean exit on
//! SIGTERM.

mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use arcwright_harness::{TestEnv, eventually, eventually_explained};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The binary, started with `args`, its stderr read line by line into the
/// returned channel (and so never left to fill its pipe).
fn start(args: &[&str]) -> (Child, mpsc::UnboundedReceiver<String>) {
    start_as("arcwright-test", args)
}

/// [`start`] as the pod named `hostname` (what the host names its message
/// sessions and its Lease identity after).
fn start_as(hostname: &str, args: &[&str]) -> (Child, mpsc::UnboundedReceiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arcwright"))
        .arg("run")
        .args(args)
        .env("HOSTNAME", hostname)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the arcwright binary starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let child_name = hostname.to_owned();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("arcwright[{}]: {line}", child_name);
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for the JSON log line whose message is `message`.
async fn log_line(lines: &mut mpsc::UnboundedReceiver<String>, message: &str) -> serde_json::Value {
    let wait = async {
        while let Some(line) = lines.recv().await {
            let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
                panic!("a log line that is not JSON: {line}");
            };
            if json["message"] == message {
                return json;
            }
        }
        panic!("arcwright exited before logging {message:?}");
    };
    tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .unwrap_or_else(|_| panic!("arcwright never logged {message:?}"))
}

/// Waits for the process to exit non-zero; returns everything it logged.
async fn refused(mut child: Child, mut lines: mpsc::UnboundedReceiver<String>) -> String {
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("arcwright exits")
        .unwrap();
    assert!(!status.success(), "{status}");
    let mut stderr = String::new();
    while let Some(line) = lines.recv().await {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    stderr
}

#[tokio::test]
async fn run_becomes_ready_serves_policy_metrics_and_exits_cleanly_on_sigterm() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = TestEnv::new("run-command").await;
    common::install_crds(env.client()).await;
    let kubeconfig = env.control_plane().kubeconfig_path().to_str().unwrap();
    let files = tempfile::tempdir().unwrap();
    let signing_secret = files.path().join("signing-secret");
    // With the newline a mounted Secret often ends in.
    std::fs::write(&signing_secret, "run-command-secret\n").unwrap();
    let default_policies = files.path().join("default-policies.yaml");
    std::fs::write(
        &default_policies,
        "scaling:\n  builtin: buffered\n  settings:\n    idle: 1\n",
    )
    .unwrap();
    let (mut child, mut lines) = start(&[
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        env.namespace(),
        "--listen-address",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--log-level",
        "info",
        "--slack-signing-secret-file",
        signing_secret.to_str().unwrap(),
        "--default-policies",
        default_policies.to_str().unwrap(),
    ]);

    let serving = log_line(
        &mut lines,
        "serving /healthz, /readyz, /metrics and the hold API",
    )
    .await;
    assert_eq!(serving["slack_interactions"], true, "{serving}");
    let base = format!("http://{}", serving["address"].as_str().unwrap());
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Ready once the API server answered, the bundled policies compiled and
    // every controller listed its objects.
    log_line(&mut lines, "bundled policies compiled").await;
    let not_ready = std::sync::Mutex::new(String::new());
    eventually_explained(
        "/readyz says ready",
        Duration::from_secs(60),
        || async {
            let response = http.get(format!("{base}/readyz")).send().await.unwrap();
            if response.status() == 200 {
                return Some(());
            }
            *not_ready.lock().unwrap() = response.text().await.unwrap_or_default();
            None
        },
        || format!("/readyz still says {:?}", not_ready.lock().unwrap()),
    )
    .await;

    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (types, samples) = common::parse_exposition(&text);
    for (family, kind) in [
        ("arcwright_policy_decisions", "counter"),
        ("arcwright_policy_decision_duration_seconds", "histogram"),
        ("arcwright_build", "info"),
        ("arcwright_reconcile_duration_seconds", "histogram"),
        ("arcwright_reconciles", "counter"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(kind),
            "{family} in {text}"
        );
    }
    // The bundled defaults' series exist, at zero, before any decision.
    for (kind, policy) in [
        ("scaling", "builtin:default"),
        ("deregistration", "builtin:exit-code"),
        ("pod-validation", "builtin:default"),
    ] {
        let labels: BTreeMap<String, String> = [
            ("kind".into(), kind.into()),
            ("policy".into(), policy.into()),
        ]
        .into();
        assert!(
            samples.contains(&common::Sample {
                name: "arcwright_policy_decisions_total".into(),
                labels: labels.clone(),
                value: 0.0,
            }),
            "{kind} in {text}"
        );
        assert!(
            samples.iter().any(|sample| {
                sample.name == "arcwright_policy_decision_duration_seconds_count"
                    && sample.labels == labels
            }),
            "{kind} in {text}"
        );
    }
    // Every controller's reconcile series exist from the start.
    for controller in [
        "ephemeral-runner",
        "ephemeral-runner-set",
        "autoscaling-runner-set",
    ] {
        let labels: BTreeMap<String, String> = [("controller".into(), controller.into())].into();
        assert!(
            samples.contains(&common::Sample {
                name: "arcwright_reconciles_total".into(),
                labels,
                value: 0.0,
            }),
            "{controller} in {text}"
        );
    }
    assert!(
        samples.contains(&common::Sample {
            name: "arcwright_build_info".into(),
            labels: [("version".into(), env!("CARGO_PKG_VERSION").into())].into(),
            value: 1.0,
        }),
        "{text}"
    );

    // The hold API is served, and refuses a caller with no token.
    let hold = http
        .post(format!(
            "{base}/api/v1/namespaces/{}/ephemeralrunners/absent/hold",
            env.namespace()
        ))
        .json(&serde_json::json!({"duration": "10m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(hold.status(), 401);
    // Slack's buttons are served with the file's secret (trimmed): a press
    // signed with it reaches the runner lookup (there is no such runner),
    // one signed with another secret is refused before anything is read.
    let interactions = format!("{base}/slack/interactions");
    let press = fake_slack::Interaction::press(
        arcwright::slack::message::EXTEND,
        &format!("{}/absent", env.namespace()),
        "run-command-secret",
    );
    assert_eq!(press.send(&interactions).await.unwrap(), 409);
    let forged = press.signed_with("another-secret");
    assert_eq!(forged.send(&interactions).await.unwrap(), 401);

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("arcwright exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    log_line(&mut lines, "shut down cleanly").await;
}

/// With `--debug-listen-address` and a certificate, the hold API and
/// Slack's endpoint move to a TLS listener of their own: there they are
/// served over TLS only, and the main listener serves neither.
#[tokio::test]
async fn the_hold_api_can_be_served_alone_over_tls() {
    let env = TestEnv::new("run-debug-tls").await;
    let kubeconfig = env.control_plane().kubeconfig_path().to_str().unwrap();
    let files = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = files.path().join("tls.crt");
    let key = files.path().join("tls.key");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let signing_secret = files.path().join("signing-secret");
    std::fs::write(&signing_secret, "run-command-secret").unwrap();
    let (mut child, mut lines) = start(&[
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        env.namespace(),
        "--listen-address",
        "127.0.0.1:0",
        "--debug-listen-address",
        "127.0.0.1:0",
        "--debug-tls-cert-file",
        cert.to_str().unwrap(),
        "--debug-tls-key-file",
        key.to_str().unwrap(),
        "--slack-signing-secret-file",
        signing_secret.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    let debug = log_line(&mut lines, "serving the hold API and Slack interactions").await;
    assert_eq!(debug["tls"], true, "{debug}");
    let serving = log_line(
        &mut lines,
        "serving /healthz, /readyz, /metrics and the hold API",
    )
    .await;
    let port = debug["address"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let hold = |base: &str| {
        format!(
            "{base}/api/v1/namespaces/{}/ephemeralrunners/absent/hold",
            env.namespace()
        )
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let trusting = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap()])
        .build()
        .unwrap();
    // Over TLS: served, and the caller checked (no token, 401).
    let answer = trusting
        .post(hold(&format!("https://localhost:{port}")))
        .json(&serde_json::json!({"duration": "10m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    // Slack's endpoint is there too: an unsigned press is refused.
    let press = trusting
        .post(format!("https://localhost:{port}/slack/interactions"))
        .send()
        .await
        .unwrap();
    assert_eq!(press.status(), 401);
    // In clear text: no answer at all from the TLS port.
    let plain = reqwest::Client::new()
        .post(hold(&format!("http://127.0.0.1:{port}")))
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // The main listener serves neither any more.
    let base = format!("http://{}", serving["address"].as_str().unwrap());
    let http = reqwest::Client::new();
    let main = http.post(hold(&base)).send().await.unwrap();
    assert_eq!(main.status(), 404);
    let main = http
        .post(format!("{base}/slack/interactions"))
        .send()
        .await
        .unwrap();
    assert_eq!(main.status(), 404);
    child.kill().await.unwrap();
}

/// A default policy that cannot be configured stops the process at
/// start-up with its reason, rather than applying to no scale set quietly.
#[tokio::test]
async fn run_refuses_a_default_policy_it_cannot_use() {
    let env = TestEnv::new("run-bad-defaults").await;
    let kubeconfig = env.control_plane().kubeconfig_path().to_str().unwrap();
    let files = tempfile::tempdir().unwrap();
    let default_policies = files.path().join("default-policies.yaml");
    std::fs::write(&default_policies, "scaling:\n  builtin: no-such-policy\n").unwrap();
    let (child, lines) = start(&[
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        env.namespace(),
        "--listen-address",
        "127.0.0.1:0",
        "--default-policies",
        default_policies.to_str().unwrap(),
    ]);
    let stderr = refused(child, lines).await;
    assert!(
        stderr.contains("the default scaling policy cannot be used")
            && stderr.contains("no-such-policy"),
        "{stderr}"
    );
    // The controllers, stopped while still listing, did not wait out the
    // shutdown bound for a list nobody needed any more.
    assert!(
        !stderr.contains("after shutdown began"),
        "components were abandoned: {stderr}"
    );
    // Text log lines into a pipe, not a terminal: no colour codes.
    assert!(stderr.contains(" INFO "), "text log lines: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in a pipe: {stderr}"
    );
}

#[tokio::test]
async fn run_refuses_a_kubeconfig_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("kubeconfig");
    let (child, lines) = start(&[
        "--kubeconfig",
        missing.to_str().unwrap(),
        "--listen-address",
        "127.0.0.1:0",
    ]);
    let stderr = refused(child, lines).await;
    assert!(
        stderr.contains(&format!(
            "the kubeconfig {} cannot be used",
            missing.display()
        )),
        "{stderr}"
    );
}

/// The arguments of a host of the test's namespace electing its leader
/// there on a 3 s Lease, then `extra`.
fn leader_args(env: &TestEnv, extra: &[&str]) -> Vec<String> {
    let kubeconfig = env.control_plane().kubeconfig_path();
    let ns = env.namespace();
    [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        ns,
        "--listen-address",
        "127.0.0.1:0",
        "--leader-elect",
        "--leader-election-namespace",
        ns,
        "--lease-duration",
        "3s",
    ]
    .iter()
    .chain(extra)
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// Two replicas with `--leader-elect`: the leader is killed (SIGKILL, no
/// clean-up) in the middle of a burst, the standby takes the Lease once it
/// runs out, listens as soon as the service let the dead leader's session go,
/// and every job completes with nothing leaked.
#[tokio::test]
async fn a_standby_takes_over_from_a_killed_leader() {
    use fake_actions::{Endpoint, FakeActions, FakeConfig, JobPhase, JobSpec};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, PostParams};

    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = TestEnv::new("crashed-leader").await;
    common::install_crds(env.client()).await;
    let ns = env.namespace().to_owned();
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    common::github_secret(env.client(), &ns, fake.pat()).await;
    let _sim = runner_simulator::Simulator::start(
        env.client(),
        fake.url(),
        runner_simulator::SimulatorConfig::namespaced(&ns),
    )
    .unwrap();
    // The fake speaks plain http, on loopback.
    let args = leader_args(
        &env,
        &["--allow-plain-http", "--actions-hosts", "127.0.0.1"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let leases: Api<Lease> = Api::namespaced(env.client(), &ns);
    let holder = || async {
        leases
            .get_opt("arcwright-controller")
            .await
            .unwrap()
            .and_then(|lease| lease.spec?.holder_identity)
            .unwrap_or_default()
    };
    let leads = |host: &'static str| {
        eventually(
            format!("{host} holds the Lease"),
            Duration::from_secs(120),
            move || async move {
                holder()
                    .await
                    .starts_with(&format!("{host}-"))
                    .then_some(())
            },
        )
    };

    let (mut leader, _leader_lines) = start_as("host-a", &args);
    leads("host-a").await;
    let (_standby, _standby_lines) = start_as("host-b", &args);

    let set: arcwright::api::AutoscalingRunnerSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "linux"},
        "spec": {
            "githubConfigUrl": fake.org_url("octo"),
            "githubConfigSecret": "github-auth",
            "minRunners": 0,
            "maxRunners": 3,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0"}],
            }},
        },
    }))
    .unwrap();
    Api::<arcwright::api::AutoscalingRunnerSet>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    let control = fake.control();
    control.enqueue_jobs(JobSpec::new(4, &["linux"]).lasting(Duration::from_secs(2)));
    control
        .wait_until(Duration::from_secs(120), |s| {
            s.jobs.iter().any(|job| job.phase == JobPhase::Running)
        })
        .await
        .unwrap_or_else(|s| panic!("no job started under the leader: {:?}", s.ledger));
    let scale_set = control.scale_sets()[0].id;
    assert!(control.has_session(scale_set));
    assert_eq!(control.counters().calls(Endpoint::CreateSession), 1);

    // The leader dies with its session, its Lease and jobs in flight.
    leader.start_kill().unwrap();
    leader.wait().await.unwrap();
    leads("host-b").await;
    // The new leader's listener meets the dead one's session (a conflict:
    // never two sessions), until the service lets it go, as the real one
    // does when nobody polls it; then the new leader listens.
    control
        .wait_until(Duration::from_secs(120), |s| {
            s.counters.calls(Endpoint::CreateSession) >= 2
        })
        .await
        .unwrap_or_else(|s| panic!("the new leader never asked for a session: {:?}", s.counters));
    assert!(control.drop_session(scale_set), "the dead leader's session");
    control
        .wait_until(Duration::from_secs(120), |s| {
            s.counters.calls(Endpoint::CreateSession) >= 3
        })
        .await
        .unwrap_or_else(|s| panic!("the new leader never listened: {:?}", s.counters));
    assert!(control.has_session(scale_set));

    control.enqueue_jobs(JobSpec::new(2, &["linux"]).lasting(Duration::from_millis(500)));
    let done = control
        .wait_until(Duration::from_secs(120), |s| {
            s.ledger.jobs_succeeded == 6 && s.ledger.still_registered == 0
        })
        .await
        .unwrap_or_else(|s| {
            panic!(
                "the jobs did not all run, or runners stayed: {:?}",
                s.ledger
            )
        });
    assert_eq!(done.ledger.jobs_cancelled, 0, "{:?}", done.ledger);
    assert_eq!(
        done.ledger.jobs_cancelled_runner_vanished, 0,
        "{:?}",
        done.ledger
    );
}

/// With `--kube-qps`, a burst of the controllers' requests queues behind
/// the limit; the Lease's renewals go around it, so the leader keeps its
/// Lease renewed all through the burst instead of stepping down.
#[tokio::test]
async fn a_leader_held_to_kube_qps_renews_its_lease_through_a_burst() {
    use arcwright::api::{EphemeralRunner, EphemeralRunnerSpec};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, PostParams};

    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = TestEnv::new("leader-qps").await;
    common::install_crds(env.client()).await;
    let ns = env.namespace().to_owned();
    let lease_duration = Duration::from_secs(3);
    let args = leader_args(&env, &["--kube-qps", "1", "--kube-burst", "1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_host, _lines) = start_as("host-qps", &args);
    let leases: Api<Lease> = Api::namespaced(env.client(), &ns);
    let renewed = || async {
        leases
            .get_opt("arcwright-controller")
            .await
            .unwrap()
            .and_then(|lease| lease.spec)
            .filter(|spec| {
                spec.holder_identity
                    .as_deref()
                    .is_some_and(|h| h.starts_with("host-qps-"))
            })
            .and_then(|spec| spec.renew_time)
            .map(|time| time.0)
    };
    eventually("host-qps leads", Duration::from_secs(120), || async {
        renewed().await.map(|_| ())
    })
    .await;

    // Runners whose credentials Secret does not exist: each reconcile adds
    // a finalizer, reads its pod, Secret and credentials, fails and comes
    // back, several requests a runner every few seconds at one a second.
    let runners: Api<EphemeralRunner> = Api::namespaced(env.client(), &ns);
    let count = 20;
    for i in 0..count {
        let spec: EphemeralRunnerSpec = serde_json::from_value(serde_json::json!({
            "githubConfigUrl": "https://github.com/octo",
            "githubConfigSecret": "absent",
            "runnerScaleSetId": 1,
            "spec": {"restartPolicy": "Never", "containers": [{"name": "runner", "image": "runner:test"}]},
        }))
        .unwrap();
        let runner = common::owned_by_a_set(
            env.client(),
            &ns,
            "set",
            EphemeralRunner::new(&format!("r-{i}"), spec),
        )
        .await;
        runners
            .create(&PostParams::default(), &runner)
            .await
            .unwrap();
    }
    let finalized = || async {
        runners
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|r| !r.metadata.finalizers.clone().unwrap_or_default().is_empty())
            .count()
    };
    // Watch the renewals over four lease durations of the burst.
    let mut seen = vec![renewed().await.expect("leading")];
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < lease_duration * 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = renewed().await.expect("the Lease stays the leader's");
        if Some(&now) != seen.last() {
            seen.push(now);
        }
    }
    // The burst was still queued at the end: not every runner has even its
    // finalizer yet, so the limit held the controllers all along.
    let with_finalizer = finalized().await;
    assert!(
        with_finalizer < count,
        "the burst drained in {:?}; the test proves nothing",
        watched.elapsed()
    );
    let longest = seen
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]))
        .max()
        .expect("renewed during the burst");
    assert!(
        longest < jiff::SignedDuration::try_from(lease_duration * 2 / 3).unwrap(),
        "a renewal waited {longest} (renewals {seen:?}, {with_finalizer} of {count} runners finalized)"
    );
}
