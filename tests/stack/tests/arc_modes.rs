//! ARC's own end-to-end scenarios that need more than a plain runner pod,
//! through `arcwright run`: dind, kubernetes mode and runners behind a
//! proxy or a private CA. The runner pods are ARC's, as ARC's chart expands each container
//! mode (the fixtures `arcwright migrate` is tested on); the simulator plays
//! what ARC's e2e runs would do on a real node: a native dind sidecar that
//! keeps running, container hooks that make the job's pod and Secret, a
//! runner whose calls go through the proxy its pod's environment names and
//! trust the CA its pod mounts.
//! Every test ends with the ledger invariant.

#[path = "../../../host/tests/relay/mod.rs"]
mod relay;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcwright_stack::{ScaleSet, Stack, StackConfig};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use runner_simulator::{Rule, Scenario, Step};
use serde_json::{Value, json};

async fn stack(name: &str) -> Stack {
    Stack::start(StackConfig::new(name))
        .await
        .expect("the stack starts")
}

/// The runner pod template ARC's chart renders for `mode`.
fn arc_template(mode: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../host/tests/arc/sets")
        .join(format!("{mode}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let arc: Value = serde_yaml::from_str(&text).unwrap();
    arc["spec"]["template"].clone()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

async fn service_account(stack: &Stack, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(stack.client(), stack.namespace());
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
}

/// dind: ARC's pod (the externals init container, the privileged docker
/// daemon as a native sidecar that runs beside the runner) is accepted
/// because the set allows privilege explicitly, and its jobs run. With drain
/// protection on, a busy runner's pod is annotated for the cluster
/// autoscaler and Karpenter while its job runs; idle pods are created
/// evictable.
#[tokio::test]
async fn dind_runners_run_jobs_and_busy_ones_are_kept_from_scale_down() {
    let stack = stack("dind").await;
    service_account(&stack, "dind-runners-gha-rs-no-permission").await;
    let pods = arcwright_stack::record(stack.pods());
    let set = ScaleSet::new("dind", 0, 3)
        .with("template", arc_template("dind"))
        .with(
            "podValidationPolicy",
            json!({"builtin": "default", "settings": {"allowPrivileged": true}}),
        )
        .with("protectBusyRunners", json!(true));
    stack.create_scale_set(&set).await.unwrap();
    stack.listening("dind").await.unwrap();
    // One long job, so its pod is seen busy; two short ones beside it.
    stack.enqueue("dind", 1, Duration::from_secs(20));
    stack.enqueue("dind", 2, Duration::from_millis(500));
    stack
        .until("a busy runner's pod protected from scale-down", || async {
            let protected = pods.lock().unwrap().iter().any(|pod| {
                annotation(pod, "karpenter.sh/do-not-disrupt") == Some("true")
                    && annotation(pod, "cluster-autoscaler.kubernetes.io/safe-to-evict")
                        == Some("false")
            });
            protected.then_some(())
        })
        .await
        .unwrap();
    stack.jobs_succeeded(3).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(3).await.unwrap();

    let seen = pods.lock().unwrap().clone();
    let mut first: BTreeMap<String, &Pod> = BTreeMap::new();
    for pod in &seen {
        first
            .entry(pod.metadata.uid.clone().unwrap_or_default())
            .or_insert(pod);
    }
    for pod in first.values() {
        let spec = pod.spec.as_ref().unwrap();
        let init = spec.init_containers.as_deref().unwrap_or_default();
        let dind = init.iter().find(|c| c.name == "dind").expect("the sidecar");
        assert_eq!(dind.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            annotation(pod, "cluster-autoscaler.kubernetes.io/safe-to-evict"),
            Some("true"),
            "created evictable: {:?}",
            pod.metadata
        );
    }
    // The sidecar was reported running beside the runner, and that is no
    // failed start.
    let sidecar_running = seen.iter().any(|pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.init_container_statuses.as_ref())
            .is_some_and(|statuses| {
                statuses.iter().any(|s| {
                    s.name == "dind" && s.state.as_ref().is_some_and(|st| st.running.is_some())
                })
            })
    });
    assert!(sidecar_running);
    let runners = stack.sim().runners();
    assert!(
        runners
            .iter()
            .all(|r| r.scenario.fate == runner_simulator::Fate::Succeed)
    );
}

/// kubernetes mode: the container hooks make a pod and a Secret for each
/// job, labelled `runner-pod=<runner>`. Where their cleanup deletes them the
/// controller has nothing to do; where it leaves them, the runner's
/// finalizer deletes them before the runner goes, as ARC's does. Nothing
/// the hooks made is left once the set is idle.
#[tokio::test]
async fn kubernetes_mode_leaves_no_job_pod_or_secret_behind() {
    let stack = stack("kube-mode").await;
    service_account(&stack, "k8s-runners-gha-rs-kube-mode").await;
    // The first two runners' hooks fail to clean up.
    stack.sim().add_rule(Rule::next(
        2,
        Scenario::succeed().with_hooks_leaving_objects(),
    ));
    let set = ScaleSet::new("k8s", 0, 2).with("template", arc_template("kubernetes"));
    stack.create_scale_set(&set).await.unwrap();
    stack.listening("k8s").await.unwrap();
    stack.enqueue("k8s", 4, Duration::from_millis(500));
    stack.jobs_succeeded(4).await.unwrap();
    // settled_at counts every pod in the namespace: the job pods too.
    stack.settled_at(0).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(stack.client(), stack.namespace());
    stack
        .until("the hooks' Secrets gone", || async {
            let left = secrets
                .list_metadata(&ListParams::default().labels("runner-pod"))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        })
        .await
        .unwrap();
    stack.check_ledger(4).await.unwrap();

    let runners = stack.sim().runners();
    let made: Vec<_> = runners
        .iter()
        .filter(|r| !r.hook_objects.is_empty())
        .collect();
    assert_eq!(
        made.len(),
        4,
        "every job's hooks made their objects: {runners:?}"
    );
    let cleaned = made
        .iter()
        .filter(|r| r.when(Step::HookObjectsCleaned).is_some())
        .count();
    assert_eq!(cleaned, 2, "two were left for the finalizer: {runners:?}");
}

/// Runners behind a proxy, anonymous and authenticated: the runner's calls
/// go through the proxy its pod's environment names (`http_proxy`, read
/// from the Secret the set writes), the authenticated proxy is shown the
/// credentials, and no pod spec carries them.
#[tokio::test]
async fn runners_reach_the_service_through_the_proxy_their_pod_names() {
    let stack = stack("proxy").await;
    let pods = arcwright_stack::record(stack.pods());
    let (anonymous, anonymous_seen) = relay::start_proxy();
    let (authenticated, authenticated_seen) = relay::start_proxy();
    let secrets: Api<Secret> = Api::namespaced(stack.client(), stack.namespace());
    let credentials: Secret = serde_json::from_value(json!({
        "metadata": {"name": "proxy-auth"},
        "stringData": {"username": "squid", "password": "s3cret-pass"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &credentials)
        .await
        .unwrap();
    let open = ScaleSet::new("open", 0, 2).with(
        "proxy",
        json!({"http": {"url": format!("http://{anonymous}")}, "noProxy": ["example.internal"]}),
    );
    let guarded = ScaleSet::new("guarded", 0, 2).with(
        "proxy",
        json!({"http": {"url": format!("http://{authenticated}"), "credentialSecretRef": "proxy-auth"}}),
    );
    for set in [&open, &guarded] {
        stack.create_scale_set(set).await.unwrap();
        stack.listening(&set.name).await.unwrap();
    }
    stack.enqueue("open", 2, Duration::from_millis(300));
    stack.enqueue("guarded", 2, Duration::from_millis(300));
    stack.jobs_succeeded(4).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(4).await.unwrap();

    let runner_calls = |seen: &Arc<Mutex<Vec<relay::Request>>>| -> Vec<relay::Request> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|r| r.target.contains("/_runner/"))
            .cloned()
            .collect()
    };
    let open_calls = runner_calls(&anonymous_seen);
    let guarded_calls = runner_calls(&authenticated_seen);
    assert!(
        !open_calls.is_empty(),
        "the open set's runners used their proxy"
    );
    assert!(
        !guarded_calls.is_empty(),
        "the guarded set's runners used theirs"
    );
    assert!(
        open_calls
            .iter()
            .all(|r| r.header("proxy-authorization").is_none()),
        "{open_calls:?}"
    );
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("squid:s3cret-pass")
    );
    assert!(
        guarded_calls
            .iter()
            .all(|r| r.header("proxy-authorization") == Some(basic.as_str())),
        "{guarded_calls:?}"
    );
    // Each set's runners, and only they, went through its proxy.
    let records = stack.sim().runners();
    let by_proxy: BTreeSet<(String, Option<String>)> = records
        .iter()
        .map(|r| {
            (
                r.pod.split('-').next().unwrap_or_default().to_owned(),
                r.proxy.clone(),
            )
        })
        .collect();
    assert_eq!(
        by_proxy,
        BTreeSet::from([
            (
                "guarded".to_owned(),
                Some(format!("http://{authenticated}/"))
            ),
            ("open".to_owned(), Some(format!("http://{anonymous}/"))),
        ]),
        "{records:?}"
    );
    // The credentials reached the runners from a Secret, never the spec.
    let seen = pods.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for pod in &seen {
        let text = serde_json::to_string(&pod.spec).unwrap();
        assert!(!text.contains("s3cret-pass"), "{text}");
    }
}

/// GitHub Enterprise Server behind a private CA: the service is reached
/// only over TLS with a certificate no system trusts. The controller trusts
/// the CA `githubServerTLS` names; the runner trusts the copy mounted at
/// `runnerMountPath` (`NODE_EXTRA_CA_CERTS`), and its jobs run.
#[tokio::test]
async fn runners_trust_the_private_ca_their_pod_mounts() {
    let stack = stack("private-ca").await;
    let pki = relay::pki();
    let fake_url = stack.fake().url().to_owned();
    let (terminator, connections) =
        relay::start_tls_terminator(pki.server, stack.fake().addr(), fake_url);
    let public = format!("https://localhost:{}", terminator.port());
    stack.fake().control().serve_behind(&public);
    let maps: Api<ConfigMap> = Api::namespaced(stack.client(), stack.namespace());
    let ca: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "ghes-ca"},
        "data": {"ca.crt": pki.ca_pem},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &ca).await.unwrap();
    let set = ScaleSet::new("ghes", 0, 2)
        .with("githubConfigUrl", json!(format!("{public}/octo")))
        .with(
            "githubServerTLS",
            json!({
                "certificateFrom": {"configMapKeyRef": {"name": "ghes-ca", "key": "ca.crt"}},
                "runnerMountPath": "/usr/local/share/ca-certificates/",
            }),
        );
    stack.create_scale_set(&set).await.unwrap();
    stack.listening("ghes").await.unwrap();
    stack.enqueue("ghes", 2, Duration::from_millis(300));
    stack.jobs_succeeded(2).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(2).await.unwrap();

    assert!(connections.load(std::sync::atomic::Ordering::SeqCst) > 0);
    let runners = stack.sim().runners();
    assert!(!runners.is_empty());
    for runner in &runners {
        assert_eq!(
            runner.service_url.as_deref(),
            Some(public.as_str()),
            "every runner went to the service over TLS: {runners:?}"
        );
    }
}
