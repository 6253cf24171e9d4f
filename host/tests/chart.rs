//! The Helm charts (`charts/arcwright`, `charts/arcwright-scale-set`) with the
//! helm binary built beside the local control plane: lint, what they render
//! from default and custom values, what their schemas refuse, and an install
//! into the real API server.
//!
//! There is no kubelet, so no pod ever runs: the install tests assert that the
//! API server accepts every object (the CRDs validate the scale set), not that
//! the controller works in a pod. `scale_set.rs` runs the controller with
//! the chart's RBAC enforced.

mod common;
mod helm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use arcwright::runtime::options::RunOptions;
use arcwright_harness::TestEnv;
use clap::Parser;
use helm::{
    controller_chart, documents, helm, install, repo, rules_file, scale_set_chart, uninstall,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// `arcwright run` as the binary parses it.
#[derive(Parser)]
struct RunCommand {
    #[command(flatten)]
    options: RunOptions,
}

/// `helm template` of `chart` with `args` (`--set ...`), as objects.
fn render(chart: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart.to_str().expect("UTF-8 path");
    let mut command = vec!["template", "release", chart, "--namespace", "arcwright"];
    command.extend_from_slice(args);
    helm(&command).map(|out| documents(&out))
}

fn render_ok(chart: &Path, args: &[&str]) -> Vec<Value> {
    render(chart, args).unwrap_or_else(|error| panic!("helm template {args:?}: {error}"))
}

/// Values every scale-set render needs.
const SCALE_SET_REQUIRED: [&str; 4] = [
    "--set",
    "githubConfigUrl=https://github.com/my-org",
    "--set",
    "githubConfigSecret=github-credentials",
];

fn scale_set_render(extra: &[&str]) -> Result<Vec<Value>, String> {
    let args: Vec<&str> = SCALE_SET_REQUIRED.iter().chain(extra).copied().collect();
    render(&scale_set_chart(), &args)
}

fn objects_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    match objects_of(objects, kind).as_slice() {
        [object] => object,
        other => panic!("expected one {kind}, found {}", other.len()),
    }
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// Whether `rules` grant `verb` on `group`/`resource`.
/// The controller container's arguments.
fn container_args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// The arguments as `arcwright run` parses them, with the very options
/// struct the binary uses, so a renamed flag fails here rather than in a
/// crash-looping pod.
fn parse_run(args: &[&str]) -> RunCommand {
    RunCommand::try_parse_from(args.iter().copied())
        .unwrap_or_else(|err| panic!("the chart's arguments {args:?} are refused: {err}"))
}

fn grants(rules: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |list: &Value, item: &str| {
        list.as_array()
            .is_some_and(|items| items.iter().any(|i| i == item))
    };
    rules.as_array().into_iter().flatten().any(|rule| {
        has(&rule["apiGroups"], group)
            && has(&rule["resources"], resource)
            && has(&rule["verbs"], verb)
    })
}

#[test]
fn both_charts_pass_helm_lint_strict() {
    let controller = controller_chart();
    helm(&["lint", "--strict", controller.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("lint arcwright: {e}"));
    let scale_set = scale_set_chart();
    let mut args = vec!["lint", "--strict", scale_set.to_str().unwrap()];
    args.extend_from_slice(&SCALE_SET_REQUIRED);
    helm(&args).unwrap_or_else(|e| panic!("lint arcwright-scale-set: {e}"));
}

#[test]
fn controller_runs_as_non_root_on_a_read_only_root_filesystem_with_probes_on_health_endpoints() {
    let objects = render_ok(&controller_chart(), &[]);
    let deployment = one(&objects, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(container["args"][0], "run");
    assert!(
        container["resources"]["requests"].is_object(),
        "{container}"
    );
    assert_eq!(deployment["spec"]["replicas"], 1);
    // The pod runs the chart's ServiceAccount.
    let account = one(&objects, "ServiceAccount");
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);
    // The metrics Service selects the controller's pods.
    let service = one(&objects, "Service");
    let selector = service["spec"]["selector"].as_object().unwrap();
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector {
        assert_eq!(&labels[key], value, "Service selector {key}");
    }
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http-metrics");
    // A drain takes at most one controller pod at a time.
    assert_eq!(
        one(&objects, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    // Optional monitoring objects stay out unless asked for.
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(objects_of(&objects, kind).is_empty(), "{kind} by default");
    }
}

#[test]
fn controller_flags_and_default_policies_follow_values() {
    let objects = render_ok(
        &controller_chart(),
        &[
            "--set",
            "watchNamespaces={ci,nightly}",
            "--set",
            "logFormat=text",
            "--set",
            "concurrency=3",
            "--set",
            "replicas=3",
            "--set",
            "metricsPort=9090",
            "--set-json",
            r#"defaultPolicies.scaling={"builtin":"buffered","settings":{"idle":2}}"#,
            "--set",
            "slack.signingSecret.name=slack-app",
            "--set",
            "slack.extendBy=1h",
        ],
    );
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = container_args(container);
    for expected in [
        "--namespace=ci",
        "--namespace=nightly",
        "--log-format=text",
        "--reconcile-concurrency=3",
        "--listen-address=0.0.0.0:9090",
    ] {
        assert!(args.contains(&expected), "{expected} missing from {args:?}");
    }
    // The Deployment's arguments are ones `arcwright run` accepts: parsed by
    // the very options struct the binary uses, so a renamed flag fails here
    // rather than in a crash-looping pod.
    assert_eq!(args[0], "run");
    let parsed = parse_run(&args);
    assert_eq!(parsed.options.controllers.reconcile_concurrency, 3);
    assert_eq!(container["ports"][0]["containerPort"], 9090);
    assert_eq!(one(&objects, "Deployment")["spec"]["replicas"], 3);
    let policies = &named(&objects, "ConfigMap", "release-arcwright-default-policies")["data"]["default-policies.yaml"];
    let policies: Value = serde_yaml::from_str(policies.as_str().unwrap()).unwrap();
    assert_eq!(
        policies["scaling"],
        json!({"builtin": "buffered", "settings": {"idle": 2}})
    );
    assert_eq!(policies["deregistration"], json!({"builtin": "exit-code"}));

    // Slack: the URL and extension in the environment, the signing secret a
    // mounted file the environment points at, never a value.
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|var| (var["name"].as_str().unwrap(), var))
        .collect();
    assert_eq!(
        env["ARCWRIGHT_SLACK_API_URL"]["value"],
        "https://slack.com/api/"
    );
    assert_eq!(env["ARCWRIGHT_SLACK_EXTEND_BY"]["value"], "1h");
    assert_eq!(
        env["ARCWRIGHT_SLACK_SIGNING_SECRET_FILE"]["value"],
        "/etc/arcwright-slack/signing-secret"
    );
    assert_eq!(
        env["ARCWRIGHT_DEFAULT_POLICIES"]["value"],
        "/etc/arcwright/default-policies.yaml"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "slack-signing-secret")
        .expect("the signing secret's volume");
    assert_eq!(volume["secret"]["secretName"], "slack-app");
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |m| m["name"] == "slack-signing-secret" && m["mountPath"] == "/etc/arcwright-slack"
            ),
        "{container}"
    );
    // Without a signing secret, nothing of it is rendered.
    let objects = render_ok(&controller_chart(), &[]);
    let rendered = serde_json::to_string(one(&objects, "Deployment")).unwrap();
    assert!(!rendered.contains("SIGNING_SECRET"), "{rendered}");
    assert!(!rendered.contains("slack-signing-secret"), "{rendered}");
}

#[test]
fn every_run_flag_has_a_chart_value() {
    use std::time::Duration;
    let objects = render_ok(
        &controller_chart(),
        &[
            "--set-json",
            r#"flags={"kubeQps":20,"kubeBurst":30,"unregistrationWorkers":12,"runnerFailureLimit":3,"runnerFailureBackoff":"500ms","registrationTimeout":"20m","maxRunnersPerScaleSet":250,"messageBatchWindow":"250ms","actionsCallTimeout":"5s","actionsMessageTimeout":"70s","shutdownTimeout":"50s","leaseDuration":"20s","recordingEntries":0,"recordingBytes":"1Mi","recordingTotalBytes":"8Mi","actionsHosts":"github.com,*.ghe.com,ghes.corp.example","allowPlainHttp":true}"#,
            "--set",
            "terminationGracePeriodSeconds=60",
            "--set",
            "shards=4",
        ],
    );
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 60);
    let parsed = parse_run(&container_args(&pod["containers"][0])).options;
    assert_eq!((parsed.kube.kube_qps, parsed.kube.kube_burst), (20, 30));
    let controllers = &parsed.controllers;
    assert_eq!(controllers.unregistration_workers, 12);
    assert_eq!(controllers.runner_failure_limit, 3);
    assert_eq!(
        controllers.runner_failure_backoff,
        Duration::from_millis(500)
    );
    assert_eq!(controllers.registration_timeout, Duration::from_secs(1200));
    assert_eq!(controllers.max_runners_per_scale_set, 250);
    assert_eq!(controllers.message_batch_window, Duration::from_millis(250));
    assert_eq!(parsed.actions.actions_call_timeout, Duration::from_secs(5));
    assert_eq!(
        parsed.actions.actions_message_timeout,
        Duration::from_secs(70)
    );
    assert!(parsed.actions.allow_plain_http);
    assert_eq!(
        parsed.actions.actions_hosts,
        ["github.com", "*.ghe.com", "ghes.corp.example"]
    );
    assert_eq!(parsed.shutdown.shutdown_timeout, Duration::from_secs(50));
    assert_eq!(parsed.election.lease_duration, Duration::from_secs(20));
    assert_eq!(parsed.election.shards, 4);
    assert_eq!(
        (
            parsed.policies.recording_entries,
            parsed.policies.recording_bytes,
            parsed.policies.recording_total_bytes
        ),
        (0, 1 << 20, 8 << 20)
    );

    // Left empty, each is the binary's own default: the chart says nothing.
    let objects = render_ok(&controller_chart(), &[]);
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    let args = container_args(&pod["containers"][0]);
    let defaults = parse_run(&["run"]).options;
    let mut rendered = parse_run(&args).options;
    // The chart's own `concurrency` value always sets this one.
    rendered.controllers.reconcile_concurrency = defaults.controllers.reconcile_concurrency;
    assert_eq!(rendered.controllers, defaults.controllers);
    assert_eq!(rendered.kube.rate(), None);
    assert_eq!(rendered.actions, defaults.actions);
    assert_eq!(rendered.shutdown, defaults.shutdown);
    assert!(
        !args.iter().any(|a| a.starts_with("--allow-plain-http")),
        "{args:?}"
    );
}

#[test]
fn the_debug_endpoint_gets_a_port_of_its_own_and_tls_from_a_secret() {
    let objects = render_ok(
        &controller_chart(),
        &[
            "--set",
            "debugEndpoint.enabled=true",
            "--set",
            "debugEndpoint.port=9443",
            "--set",
            "debugEndpoint.tlsSecretName=arcwright-debug-tls",
        ],
    );
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = container_args(container);
    let parsed = parse_run(&args);
    let http = &parsed.options.http;
    assert_eq!(
        http.debug_listen_address,
        Some("0.0.0.0:9443".parse().unwrap())
    );
    let cert = http.debug_tls_cert_file.as_ref().expect("a certificate");
    let key = http.debug_tls_key_file.as_ref().expect("a key");
    // The files are where the Secret's volume puts them.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "debug-tls")
        .expect("the certificate's mount");
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    assert_eq!(cert, &dir.join("tls.crt"));
    assert_eq!(key, &dir.join("tls.key"));
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "debug-tls")
        .expect("the certificate's volume");
    assert_eq!(volume["secret"]["secretName"], "arcwright-debug-tls");
    let ports = container["ports"].as_array().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "debug" && p["containerPort"] == 9443),
        "{ports:?}"
    );
    let service = one(&objects, "Service");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "debug" && p["targetPort"] == "debug"),
        "{service}"
    );

    // Without a Secret: the port, plain HTTP, no certificate flags.
    let objects = render_ok(
        &controller_chart(),
        &["--set", "debugEndpoint.enabled=true"],
    );
    let rendered = serde_json::to_string(one(&objects, "Deployment")).unwrap();
    assert!(
        rendered.contains("--debug-listen-address=0.0.0.0:8443"),
        "{rendered}"
    );
    assert!(!rendered.contains("debug-tls"), "{rendered}");
    // Off (the default): nothing of it.
    let objects = render_ok(&controller_chart(), &[]);
    let rendered = serde_json::to_string(&objects).unwrap();
    assert!(!rendered.contains("debug"), "{rendered}");
}

#[test]
fn rbac_grants_the_listed_rules_cluster_wide_or_per_watched_namespace() {
    // Which rules there are is proven against the code's calls, with RBAC
    // enforced, in scale_set.rs; here, where the chart binds them.
    let rules = rules_file();
    // All namespaces: the namespaced rules are bound cluster-wide.
    let objects = render_ok(&controller_chart(), &[]);
    let role = named(&objects, "ClusterRole", "release-arcwright");
    assert_eq!(role["rules"], rules["namespaced"]);
    let binding = named(&objects, "ClusterRoleBinding", "release-arcwright");
    assert_eq!(binding["roleRef"]["name"], "release-arcwright");
    assert_eq!(binding["subjects"][0]["name"], "release-arcwright");
    assert_eq!(binding["subjects"][0]["namespace"], "arcwright");
    assert_eq!(
        named(&objects, "ClusterRole", "release-arcwright-auth")["rules"],
        rules["cluster"]
    );
    named(&objects, "ClusterRoleBinding", "release-arcwright-auth");
    let lease_role = one(&objects, "Role");
    assert_eq!(lease_role["metadata"]["namespace"], "arcwright");
    assert_eq!(lease_role["rules"], rules["leaderElection"]);
    // The leader's Lease, and with shards the shard and membership Leases:
    // listed together, a gone replica's membership deleted.
    for verb in ["create", "delete", "get", "list", "patch"] {
        assert!(
            grants(&lease_role["rules"], "coordination.k8s.io", "leases", verb),
            "leases: {verb}"
        );
    }
    assert!(
        !grants(&role["rules"], "coordination.k8s.io", "leases", "update"),
        "leases only in the release namespace"
    );

    // Watched namespaces: a RoleBinding in each, no cluster-wide binding of
    // the namespaced rules.
    let objects = render_ok(
        &controller_chart(),
        &["--set", "watchNamespaces={ci,nightly}"],
    );
    let bindings: BTreeSet<String> = objects_of(&objects, "RoleBinding")
        .into_iter()
        .filter(|b| b["roleRef"]["name"] == "release-arcwright")
        .map(|b| b["metadata"]["namespace"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bindings, BTreeSet::from(["ci".into(), "nightly".into()]));
    let cluster_bindings: Vec<&Value> = objects_of(&objects, "ClusterRoleBinding");
    assert_eq!(cluster_bindings.len(), 1, "only the review binding");
    assert_eq!(
        cluster_bindings[0]["roleRef"]["name"],
        "release-arcwright-auth"
    );

    // rbac.create=false renders no RBAC at all.
    let objects = render_ok(&controller_chart(), &["--set", "rbac.create=false"]);
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(objects_of(&objects, kind).is_empty(), "{kind}");
    }
}

/// Whether `path` is a CRD file of `crds/` (the generator writes YAML).
fn is_crd_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml")
}

#[test]
fn packaged_chart_carries_exactly_the_generated_crds() {
    let mut generated = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("crds"))
        .expect("crds/ (cargo xtask crds)")
        .map(|entry| entry.unwrap().path())
        .filter(|path| is_crd_file(path))
        .collect();
    files.sort();
    for file in &files {
        generated.extend(documents(&std::fs::read_to_string(file).unwrap()));
    }
    assert!(!generated.is_empty(), "crds/ holds no CRD");

    // What a user installs is the packaged chart, so package it.
    let out = tempfile::tempdir().unwrap();
    let packaged = helm(&[
        "package",
        controller_chart().to_str().unwrap(),
        "--destination",
        out.path().to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("helm package: {e}"));
    let archive = out.path().join("arcwright-0.1.0.tgz");
    assert!(archive.is_file(), "{packaged}");
    // `helm show crds` joins the files without document separators, so the
    // CRDs are read from a render of the archive that includes them.
    let rendered = render_ok(&archive, &["--include-crds"]);
    let shown: Vec<&Value> = objects_of(&rendered, "CustomResourceDefinition");
    let name = |d: &Value| {
        d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let shown_names: BTreeSet<String> = shown.iter().map(|d| name(d)).collect();
    let generated_names: BTreeSet<String> = generated.iter().map(name).collect();
    assert_eq!(shown_names, generated_names);
    for crd in &generated {
        let packaged = shown.iter().find(|d| name(d) == name(crd)).unwrap();
        assert!(
            *packaged == crd,
            "the packaged chart's {} differs from crds/",
            name(crd)
        );
    }
}

/// The metric names a PromQL expression reads.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if token.starts_with("arcwright_") || token.starts_with("gha_") {
            into.insert(token.to_owned());
        }
    }
}

/// Every `expr` and query string of a Grafana dashboard.
fn dashboard_queries(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query" | "definition", Value::String(s)) => into.push(s.clone()),
                    _ => dashboard_queries(value, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, into)),
        _ => {}
    }
}

fn listed_metrics() -> BTreeSet<String> {
    std::fs::read_to_string(controller_chart().join("metrics.txt"))
        .expect("charts/arcwright/metrics.txt")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn dashboard_and_alerts_query_exactly_the_listed_metrics() {
    let objects = render_ok(
        &controller_chart(),
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.namespace=monitoring",
            "--set",
            "serviceMonitor.enabled=true",
        ],
    );

    let rule = one(&objects, "PrometheusRule");
    let alerts: Vec<&Value> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let alert_names: BTreeSet<&str> = alerts
        .iter()
        .map(|a| a["alert"].as_str().unwrap())
        .collect();
    for name in [
        "ArcwrightScaleSetStuck",
        "ArcwrightPolicyFailing",
        "ArcwrightUnregistrationBacklogGrowing",
    ] {
        assert!(
            alert_names.contains(name),
            "{name} missing from {alert_names:?}"
        );
    }
    let mut queried = BTreeSet::new();
    for alert in &alerts {
        metric_names(alert["expr"].as_str().unwrap(), &mut queried);
        assert!(alert["annotations"]["summary"].is_string(), "{alert}");
    }

    let dashboard_map = named(&objects, "ConfigMap", "release-arcwright-dashboard");
    assert_eq!(dashboard_map["metadata"]["namespace"], "monitoring");
    assert_eq!(
        dashboard_map["metadata"]["labels"]["grafana_dashboard"],
        "1"
    );
    let dashboard: Value =
        serde_json::from_str(dashboard_map["data"]["arcwright.json"].as_str().unwrap())
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    for query in &queries {
        metric_names(query, &mut queried);
    }
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert!(
            panel["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "panel {} queries nothing",
            panel["title"]
        );
    }

    assert_eq!(queried, listed_metrics(), "charts/arcwright/metrics.txt");

    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http-metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn scale_set_spec_follows_arc_style_values() {
    let objects = scale_set_render(&[
        "--set",
        "runnerScaleSetName=linux-x64",
        "--set",
        "runnerGroup=builders",
        "--set",
        "minRunners=1",
        "--set",
        "maxRunners=20",
        "--set",
        "scaleSetLabels={gpu,large}",
        "--set",
        "labels.team=platform",
        "--set-json",
        r#"scalingPolicy={"builtin":"cooldown","settings":{"scaleDownAfterSeconds":600}}"#,
        "--set-json",
        r#"shadowScalingPolicy={"builtin":"buffered","settings":{"idle":2}}"#,
        "--set-json",
        r#"podValidationPolicy={"configMapRef":{"name":"strict"},"sha256":"3f5c000000000000000000000000000000000000000000000000000000000000"}"#,
        "--set-json",
        r#"template={"spec":{"containers":[{"name":"runner","image":"example/runner:1"}]}}"#,
        "--set",
        "maxIdleAge=12h",
        "--set-json",
        r##"debug={"holdFailedFor":"20m","maxHeld":2,"slack":{"channel":"#ci","tokenSecretRef":{"name":"slack-bot"}}}"##,
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    // An existing Secret by name: the chart makes none.
    assert!(objects_of(&objects, "Secret").is_empty());
    let set = one(&objects, "AutoscalingRunnerSet");
    assert_eq!(set["apiVersion"], "arcwright.dev/v1alpha1");
    assert_eq!(set["metadata"]["name"], "linux-x64");
    assert_eq!(set["metadata"]["namespace"], "arcwright");
    assert_eq!(set["metadata"]["labels"]["team"], "platform");
    let spec = &set["spec"];
    assert_eq!(spec["maxIdleAge"], "12h");
    assert_eq!(
        spec["debug"],
        json!({"holdFailedFor": "20m", "maxHeld": 2, "slack": {"channel": "#ci", "tokenSecretRef": {"name": "slack-bot"}}})
    );
    assert_eq!(spec["githubConfigUrl"], "https://github.com/my-org");
    assert_eq!(spec["githubConfigSecret"], "github-credentials");
    assert_eq!(spec["runnerScaleSetName"], "linux-x64");
    assert_eq!(spec["runnerGroup"], "builders");
    assert_eq!(spec["minRunners"], 1);
    assert_eq!(spec["maxRunners"], 20);
    assert_eq!(spec["runnerScaleSetLabels"], json!(["gpu", "large"]));
    assert_eq!(
        spec["scalingPolicy"],
        json!({"builtin": "cooldown", "settings": {"scaleDownAfterSeconds": 600}})
    );
    assert_eq!(
        spec["podValidationPolicy"]["configMapRef"]["name"],
        "strict"
    );
    assert!(spec.get("deregistrationPolicy").is_none(), "{spec}");
    assert_eq!(
        spec["shadowScalingPolicy"],
        json!({"builtin": "buffered", "settings": {"idle": 2}})
    );
    assert!(spec.get("shadowPodValidationPolicy").is_none(), "{spec}");
    assert_eq!(
        spec["template"],
        json!({"spec": {
            "containers": [{"name": "runner", "image": "example/runner:1"}],
            // Helm merges maps: the default's restartPolicy stays.
            "restartPolicy": "Never",
            // The template names no account: the chart's, with no rights.
            "serviceAccountName": "linux-x64-no-permission",
        }})
    );

    // Defaults: the release name, no ceiling, ARC's runner image.
    let objects = scale_set_render(&[]).unwrap();
    let spec = &one(&objects, "AutoscalingRunnerSet")["spec"];
    assert_eq!(spec["runnerScaleSetName"], "release");
    assert_eq!(spec["minRunners"], 0);
    assert!(spec.get("maxRunners").is_none(), "{spec}");
    assert!(spec.get("debug").is_none(), "{spec}");
    assert!(spec.get("maxIdleAge").is_none(), "{spec}");
    assert_eq!(spec["template"]["spec"]["containers"][0]["name"], "runner");
    assert_eq!(spec["template"]["spec"]["restartPolicy"], "Never");
}

#[test]
fn scale_set_secret_holds_a_pat_or_github_app_keys_under_arc_names() {
    let url = ["--set", "githubConfigUrl=https://github.com/my-org/my-repo"];
    let with = |extra: &[&str]| {
        let args: Vec<&str> = url.iter().chain(extra).copied().collect();
        render(&scale_set_chart(), &args)
    };

    let objects = with(&["--set", "githubConfigSecret.github_token=ghp_example"]).unwrap();
    let secret = one(&objects, "Secret");
    assert_eq!(secret["stringData"], json!({"github_token": "ghp_example"}));
    assert_eq!(
        one(&objects, "AutoscalingRunnerSet")["spec"]["githubConfigSecret"],
        secret["metadata"]["name"]
    );

    let objects = with(&[
        "--set",
        "githubConfigSecret.github_token=",
        "--set",
        "githubConfigSecret.github_app_id=123",
        "--set",
        "githubConfigSecret.github_app_installation_id=456",
        "--set",
        "githubConfigSecret.github_app_private_key=-----BEGIN KEY-----",
    ])
    .unwrap();
    assert_eq!(
        one(&objects, "Secret")["stringData"],
        json!({
            "github_app_id": "123",
            "github_app_installation_id": "456",
            "github_app_private_key": "-----BEGIN KEY-----",
        })
    );

    for (bad, says) in [
        (
            &["--set", "githubConfigSecret.github_app_id=123"][..],
            "either github_token or the github_app_* keys",
        ),
        (
            &[
                "--set",
                "githubConfigSecret.github_token=",
                "--set",
                "githubConfigSecret.github_app_id=123",
            ],
            "needs github_app_id, github_app_installation_id and github_app_private_key",
        ),
        (
            &["--set", "githubConfigSecret.github_token="],
            "the name of an existing Secret",
        ),
    ] {
        let mut args = vec!["--set", "githubConfigSecret.github_token=ghp_example"];
        args.extend_from_slice(bad);
        let error = with(&args).expect_err(&format!("{bad:?} accepted"));
        assert!(error.contains(says), "{bad:?}: {error}");
    }
}

#[test]
fn scale_set_policy_configmap_carries_the_module_under_its_key() {
    let objects = scale_set_render(&[
        "--set",
        "policyConfigMap.create=true",
        "--set",
        "policyConfigMap.name=my-policy",
        "--set",
        "policyConfigMap.wasmBase64=AGFzbQ==",
    ])
    .unwrap();
    let map = one(&objects, "ConfigMap");
    assert_eq!(map["metadata"]["name"], "my-policy");
    assert_eq!(map["binaryData"], json!({"policy.wasm": "AGFzbQ=="}));
    assert!(
        objects_of(&scale_set_render(&[]).unwrap(), "ConfigMap").is_empty(),
        "no ConfigMap unless asked"
    );
}

#[test]
fn schemas_and_templates_refuse_bad_values() {
    let scale_set_cases: [(&[&str], &str); 10] = [
        (&["--set", "debug.maxHeld=-1"], "/debug/maxHeld"),
        (&["--set", "debug.slack.channel=#ci"], "/debug/slack"),
        (&["--set", "maxRunners=-1"], "/maxRunners"),
        (&["--set", "minRunners=-2"], "/minRunners"),
        (
            &["--set", "minRunners=5", "--set", "maxRunners=2"],
            "maxRunners (2) is below minRunners (5)",
        ),
        (
            &["--set", "githubConfigUrl=github.com/my-org"],
            "/githubConfigUrl",
        ),
        // arcwright's own values know their keys: a misspelt one would run
        // other runners than meant. (ARC's own ignore theirs, as ARC does.)
        (&["--set", "debug.holdFailedFr=1h"], "holdFailedFr"),
        (
            &[
                "--set-json",
                r#"scalingPolicy={"builtin":"default","configMapRef":{"name":"x"}}"#,
            ],
            "/scalingPolicy",
        ),
        (
            &[
                "--set-json",
                r#"scalingPolicy={"builtin":"default","timeoutMillis":5}"#,
            ],
            "/scalingPolicy/timeoutMillis",
        ),
        (
            &["--set", "policyConfigMap.create=true"],
            "policyConfigMap.wasmBase64 is required",
        ),
    ];
    for (args, says) in scale_set_cases {
        let error = scale_set_render(args).expect_err(&format!("{args:?} accepted"));
        assert!(error.contains(says), "{args:?}: {error}");
    }
    let controller_cases: [(&[&str], &str); 8] = [
        (
            &["--set", "defaultPolicies.scaling.configMapRef.name=mine"],
            "/defaultPolicies/scaling",
        ),
        (&["--set", "slack.extendBy=soon"], "/slack/extendBy"),
        (&["--set", "replicas=-1"], "/replicas"),
        (&["--set", "logFormat=xml"], "/logFormat"),
        (&["--set", "concurrency=0"], "/concurrency"),
        (
            &["--set", "watchNamespaces={Not_A_Namespace}"],
            "/watchNamespaces/0",
        ),
        (
            &["--set", "defaultPolicies.scaling.memoryLimitMib=128"],
            "/defaultPolicies/scaling/memoryLimitMib",
        ),
        (&["--set", "replica=3"], "replica"),
    ];
    for (args, says) in controller_cases {
        let error = render(&controller_chart(), args).expect_err(&format!("{args:?} accepted"));
        assert!(error.contains(says), "{args:?}: {error}");
    }
    // The same values one step inside the bounds are accepted.
    scale_set_render(&["--set", "maxRunners=0"]).unwrap();
    render(
        &controller_chart(),
        &["--set", "replicas=0", "--set", "logFormat=text"],
    )
    .unwrap();
}

#[tokio::test]
async fn charts_install_into_a_real_api_server_which_accepts_every_object() {
    let env = TestEnv::new("chart-install").await;
    let client = env.client();
    let ns = env.namespace();
    // Release names are unique per test namespace, so cluster-scoped names
    // (ClusterRoles) cannot collide with another run on the same plane.
    let controller = format!("ctl-{}", &ns[ns.len().saturating_sub(6)..]);
    install(
        &env,
        &controller,
        &controller_chart(),
        &[
            "--set",
            "debugEndpoint.enabled=true",
            "--set",
            "debugEndpoint.tlsSecretName=arcwright-debug-tls",
        ],
    );
    let fullname = format!("{controller}-arcwright");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        "autoscalingrunnersets.arcwright.dev",
        "ephemeralrunnersets.arcwright.dev",
        "ephemeralrunners.arcwright.dev",
    ] {
        crds.get(crd)
            .await
            .unwrap_or_else(|e| panic!("CRD {crd}: {e}"));
    }
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(&fullname)
        .await
        .expect("the Deployment");
    let pod = deployment.spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(fullname.as_str()));
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .get(&fullname)
        .await
        .expect("the ServiceAccount");
    Api::<Service>::namespaced(client.clone(), ns)
        .get(&format!("{fullname}-metrics"))
        .await
        .expect("the metrics Service");
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .get(&fullname)
        .await
        .expect("the PodDisruptionBudget");
    let role = Api::<ClusterRole>::all(client.clone())
        .get(&fullname)
        .await
        .expect("the ClusterRole");
    // The API server stored the rules of the list, as written.
    let stored = serde_json::to_value(role.rules.unwrap()).unwrap();
    assert_eq!(stored, rules_file()["namespaced"]);
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get(&fullname)
        .await
        .expect("the ClusterRoleBinding");
    assert_eq!(binding.subjects.unwrap()[0].namespace.as_deref(), Some(ns));
    Api::<Role>::namespaced(client.clone(), ns)
        .get(&format!("{fullname}-leader-election"))
        .await
        .expect("the leader-election Role");

    // A scale set, its credentials inline: the AutoscalingRunnerSet passes
    // the CRD's validation.
    install(
        &env,
        "linux",
        &scale_set_chart(),
        &[
            "--set",
            "githubConfigUrl=https://github.com/my-org",
            "--set",
            "githubConfigSecret.github_token=ghp_example",
            "--set",
            "maxRunners=4",
            "--set",
            "runnerGroup=builders",
        ],
    );
    let gvk = GroupVersionKind::gvk("arcwright.dev", "v1alpha1", "AutoscalingRunnerSet");
    let sets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let set = sets.get("linux").await.expect("the AutoscalingRunnerSet");
    assert_eq!(set.data["spec"]["maxRunners"], 4);
    assert_eq!(set.data["spec"]["runnerGroup"], "builders");
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get("linux-github-secret")
        .await
        .expect("the GitHub Secret");
    assert!(secret.data.unwrap().contains_key("github_token"));

    // Scale sets go first, then the controller; with no controller running
    // nothing holds a finalizer, so both complete.
    uninstall(&env, "linux");
    assert!(sets.get_opt("linux").await.unwrap().is_none());
    uninstall(&env, &controller);
    assert!(
        Api::<Deployment>::namespaced(client.clone(), ns)
            .get_opt(&fullname)
            .await
            .unwrap()
            .is_none()
    );
    // Helm keeps CRDs on uninstall, so scale sets elsewhere survive.
    crds.get("autoscalingrunnersets.arcwright.dev")
        .await
        .expect("CRDs stay after uninstall");
}

/// One of the ARC-shaped values files under `tests/arc/values`.
fn arc_values(name: &str) -> String {
    helm::repo()
        .join("host/tests/arc/values")
        .join(format!("{name}.yaml"))
        .to_string_lossy()
        .into_owned()
}

/// The scale-set chart rendered from an ARC-shaped values file, and its
/// notes.
fn render_arc(name: &str, extra: &[&str]) -> Vec<Value> {
    let file = arc_values(name);
    let mut args = vec!["-f", file.as_str()];
    args.extend_from_slice(extra);
    render_ok(&scale_set_chart(), &args)
}

/// `items` keyed by their `name`, so order does not matter.
fn by_name(items: &Value) -> BTreeMap<String, Value> {
    items
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {items}"))
        .iter()
        .map(|item| (item["name"].as_str().unwrap().to_owned(), item.clone()))
        .collect()
}

#[test]
fn dind_mode_renders_arcs_pod_merged_with_the_users_template() {
    let objects = render_arc("dind", &[]);
    let set = one(&objects, "AutoscalingRunnerSet");
    let pod = &set["spec"]["template"]["spec"];
    // ARC's values.yaml documents this pod for dind; the user's init
    // container, volume and variable are kept beside it.
    let init: Vec<&str> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(init, ["init-dind-externals", "dind", "warm-cache"]);
    let init = by_name(&pod["initContainers"]);
    assert_eq!(
        init["init-dind-externals"],
        arc_pod::externals("ghcr.io/actions/actions-runner:2.330.0")
    );
    assert_eq!(init["dind"], arc_pod::dind());
    let runner = &pod["containers"][0];
    assert_eq!(runner["image"], "ghcr.io/actions/actions-runner:2.330.0");
    assert_eq!(
        by_name(&runner["env"]),
        by_name(&json!([
            // The user's wait stays; ARC's is not added over it.
            {"name": "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS", "value": "300"},
            {"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"},
        ]))
    );
    assert_eq!(
        by_name(&runner["volumeMounts"]),
        by_name(&json!([
            {"name": "cache", "mountPath": "/cache"},
            {"name": "work", "mountPath": "/home/runner/_work"},
            {"name": "dind-sock", "mountPath": "/var/run"},
        ]))
    );
    assert_eq!(
        by_name(&pod["volumes"]),
        by_name(&json!([
            {"name": "cache", "emptyDir": {}},
            {"name": "dind-sock", "emptyDir": {}},
            {"name": "dind-externals", "emptyDir": {}},
            {"name": "work", "emptyDir": {}},
        ]))
    );
    // The runners' own account, with no rights and no token.
    assert_eq!(pod["serviceAccountName"], "dind-runners-no-permission");
    let account = named(&objects, "ServiceAccount", "dind-runners-no-permission");
    assert_eq!(account["automountServiceAccountToken"], false);
    assert!(objects_of(&objects, "Role").is_empty());
    // The privileged sidecar passes the bundled policy because the chart
    // says so, explicitly, on this set only.
    assert_eq!(
        set["spec"]["podValidationPolicy"],
        json!({"builtin": "default", "settings": {"allowPrivileged": true}})
    );
    // Told the opposite, the chart refuses rather than every runner.
    let file = arc_values("dind");
    let error = render(
        &scale_set_chart(),
        &[
            "-f",
            &file,
            "--set-json",
            r#"podValidationPolicy={"builtin":"default","settings":{"allowPrivileged":false}}"#,
        ],
    )
    .unwrap_err();
    assert!(error.contains("allowPrivileged=false refuses"), "{error}");
    // Without a mode, nothing privileged and no policy is set.
    let plain = scale_set_render(&[]).unwrap();
    let spec = &one(&plain, "AutoscalingRunnerSet")["spec"];
    assert!(spec.get("podValidationPolicy").is_none(), "{spec}");
    assert!(
        spec["template"]["spec"].get("initContainers").is_none(),
        "{spec}"
    );
    assert_eq!(
        spec["template"]["spec"]["serviceAccountName"],
        "release-no-permission"
    );
}

#[test]
fn kubernetes_modes_render_the_hooks_their_volume_and_their_rights() {
    let objects = render_arc("kubernetes", &[]);
    let pod = &one(&objects, "AutoscalingRunnerSet")["spec"]["template"]["spec"];
    let runner = &pod["containers"][0];
    assert_eq!(
        by_name(&runner["env"]),
        by_name(&json!([
            {"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/home/runner/k8s/index.js"},
            {"name": "ACTIONS_RUNNER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER", "value": "true"},
        ]))
    );
    assert_eq!(
        runner["volumeMounts"],
        json!([{"name": "work", "mountPath": "/home/runner/_work"}])
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "work", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "standard",
            "resources": {"requests": {"storage": "1Gi"}},
        }}}}])
    );
    assert_eq!(pod["serviceAccountName"], "k8s-runners-kube-mode");
    assert!(pod.get("initContainers").is_none(), "{pod}");
    named(&objects, "ServiceAccount", "k8s-runners-kube-mode");
    let role = named(&objects, "Role", "k8s-runners-kube-mode");
    for (group, resource, verb) in [
        ("", "pods", "create"),
        ("", "pods/exec", "create"),
        ("", "pods/log", "watch"),
        ("", "secrets", "delete"),
        ("batch", "jobs", "create"),
        // The user's own rule.
        ("", "configmaps", "list"),
    ] {
        assert!(
            grants(&role["rules"], group, resource, verb),
            "{verb} {resource}: {role}"
        );
    }
    let binding = named(&objects, "RoleBinding", "k8s-runners-kube-mode");
    assert_eq!(binding["subjects"][0]["name"], "k8s-runners-kube-mode");
    assert_eq!(binding["roleRef"]["name"], "k8s-runners-kube-mode");
    // ARC's chart refuses the mode without its claim; so does this one.
    let error = scale_set_render(&["--set", "containerMode.type=kubernetes"]).unwrap_err();
    assert!(
        error.contains("kubernetesModeWorkVolumeClaim is required"),
        "{error}"
    );

    // novolume: the hooks of their own, no work volume, the user's mount kept.
    let objects = render_arc("kubernetes-novolume", &[]);
    let pod = &one(&objects, "AutoscalingRunnerSet")["spec"]["template"]["spec"];
    let runner = &pod["containers"][0];
    assert_eq!(
        by_name(&runner["env"])["ACTIONS_RUNNER_CONTAINER_HOOKS"]["value"],
        "/home/runner/k8s-novolume/index.js"
    );
    assert_eq!(
        runner["volumeMounts"],
        json!([{"name": "tools", "mountPath": "/opt/tools"}])
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "tools", "configMap": {"name": "runner-tools"}}])
    );
    assert_eq!(pod["serviceAccountName"], "novolume-runners-kube-mode");
    named(&objects, "Role", "novolume-runners-kube-mode");
}

/// What ARC's gha-runner-scale-set chart renders for each container mode,
/// written from its `_helpers.tpl` as it renders on Kubernetes 1.29 or newer
/// (dind's sidecar a native one): the parts the expected pods are made of.
mod arc_pod {
    use serde_json::{Value, json};

    /// The runner of ARC's (and this chart's) default values.
    pub fn default_runner() -> Value {
        json!({"name": "runner", "image": "ghcr.io/actions/actions-runner:latest", "command": ["/home/runner/run.sh"]})
    }

    /// The work volume the test files bring, which takes the mode's place.
    pub fn host_work() -> Value {
        json!({"name": "work", "hostPath": {"path": "/var/lib/runner-work", "type": "Directory"}})
    }

    pub fn empty_dir(name: &str) -> Value {
        json!({"name": name, "emptyDir": {}})
    }

    pub fn mount(name: &str, path: &str) -> Value {
        json!({"name": name, "mountPath": path})
    }

    pub fn work_mount() -> Value {
        mount("work", "/home/runner/_work")
    }

    pub fn dind_sock_mount() -> Value {
        mount("dind-sock", "/var/run")
    }

    /// What dind adds to the runner's variables, after the template's.
    pub fn docker_env() -> [Value; 2] {
        [
            json!({"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"}),
            json!({"name": "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS", "value": "120"}),
        ]
    }

    /// What the kubernetes modes add to the runner's variables.
    pub fn hooks_env(hooks: &str) -> [Value; 3] {
        [
            json!({"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": hooks}),
            json!({"name": "ACTIONS_RUNNER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
            json!({"name": "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER", "value": "true"}),
        ]
    }

    /// The copy of the runner image's externals for the sidecar.
    pub fn externals(image: &str) -> Value {
        json!({
            "name": "init-dind-externals",
            "image": image,
            "command": ["cp"],
            "args": ["-r", "/home/runner/externals/.", "/home/runner/tmpDir/"],
            "volumeMounts": [{"name": "dind-externals", "mountPath": "/home/runner/tmpDir"}],
        })
    }

    pub fn dind() -> Value {
        json!({
            "name": "dind",
            "image": "docker:dind",
            "args": ["dockerd", "--host=unix:///var/run/docker.sock", "--group=$(DOCKER_GROUP_GID)"],
            "env": [{"name": "DOCKER_GROUP_GID", "value": "123"}],
            "securityContext": {"privileged": true},
            "restartPolicy": "Always",
            "startupProbe": {
                "exec": {"command": ["docker", "info"]},
                "initialDelaySeconds": 0,
                "failureThreshold": 24,
                "periodSeconds": 5,
            },
            "volumeMounts": [
                work_mount(),
                dind_sock_mount(),
                mount("dind-externals", "/home/runner/externals"),
            ],
        })
    }

    /// dind's volumes, before the template's others.
    pub fn dind_volumes(work: Value) -> [Value; 3] {
        [empty_dir("dind-sock"), empty_dir("dind-externals"), work]
    }

    pub fn cache_proxy() -> Value {
        json!({"name": "cache-proxy", "image": "registry.example.com/cache-proxy:1"})
    }

    /// The variable and mounts the merge test files give their runner.
    pub fn node_name_env() -> Value {
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    }

    pub fn limits() -> Value {
        json!({"limits": {"cpu": "500m", "memory": "128Mi"}})
    }
}

/// The ARC test cases under `tests/arc/values`, each with the runner pod
/// ARC's chart renders from the same values (its account aside: `ACCOUNT`
/// stands for `<release>-gha-rs-<kind>` in ARC's, `<release>-<kind>` here),
/// and whether `arcwright migrate --values` can give it back (a template
/// with no runner container renders a bare one in ARC, which, once named,
/// takes the mode's variables on a second render, in ARC's chart as here).
fn arc_cases() -> Vec<(&'static str, &'static str, Value, bool)> {
    use arc_pod::*;
    let runner2 = "registry.example.com/runner:2";
    let scratch_tools = [empty_dir("scratch"), empty_dir("tools")];
    // No runner: ARC's is bare; the template's work volume first.
    let kubernetes_without_runner = json!({
        "restartPolicy": "Never",
        "containers": [{"name": "runner"}, cache_proxy()],
        "volumes": ([&[host_work()][..], &scratch_tools].concat()),
    });
    vec![
        (
            "counts",
            "no-permission",
            json!({"restartPolicy": "Never", "containers": [default_runner()]}),
            true,
        ),
        (
            "dind-init-containers",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                "initContainers": [
                    externals("ghcr.io/actions/actions-runner:latest"),
                    dind(),
                    {"name": "fix-permissions", "image": runner2,
                     "command": ["sudo", "chown", "-R", "1001:123", "/home/runner/_work"],
                     "volumeMounts": [work_mount()]},
                    {"name": "list", "image": "busybox:1.36", "command": ["ls"]},
                ],
                "containers": [{
                    "name": "runner", "image": "ghcr.io/actions/actions-runner:latest",
                    "command": ["/home/runner/run.sh"],
                    "env": docker_env(),
                    "volumeMounts": [work_mount(), dind_sock_mount()],
                }],
                "volumes": dind_volumes(empty_dir("work")),
            }),
            true,
        ),
        (
            "dind-without-runner",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                // Without a runner, ARC's copy names no image nor command.
                "initContainers": [{"name": "init-dind-externals"}, dind()],
                "containers": [{"name": "runner"}, cache_proxy()],
                "volumes": ([dind_volumes(host_work()).as_slice(), &scratch_tools].concat()),
            }),
            false,
        ),
        (
            "dind-merge",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                "initContainers": [externals(runner2), dind()],
                "containers": [{
                    "name": "runner", "image": runner2,
                    // The template's DOCKER_HOST stays; ARC's wait is added after.
                    "env": [
                        {"name": "DOCKER_HOST", "value": "tcp://localhost:2376"},
                        node_name_env(),
                        docker_env()[1].clone(),
                    ],
                    "volumeMounts": [mount("work", "/work"), mount("scratch", "/scratch"), dind_sock_mount()],
                    "resources": limits(),
                }],
                "volumes": dind_volumes(host_work()),
            }),
            true,
        ),
        (
            "mode-none",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                "containers": [
                    {"name": "runner", "image": runner2,
                     "env": [{"name": "TEAM", "value": "platform"}],
                     "volumeMounts": [mount("work", "/work")],
                     "resources": {"limits": {"cpu": "500m"}}},
                    {"name": "cache-proxy", "image": "registry.example.com/cache-proxy:1",
                     "volumeMounts": [mount("work", "/work")]},
                ],
                "volumes": [host_work()],
                "dnsPolicy": "None",
                "dnsConfig": {"nameservers": ["198.51.100.53"]},
            }),
            true,
        ),
        (
            "pod-spec",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                "containers": [{"name": "runner", "image": runner2}],
                "dnsPolicy": "None",
                "dnsConfig": {"nameservers": ["198.51.100.53"]},
            }),
            true,
        ),
        (
            "volumes-no-mode",
            "no-permission",
            json!({
                "restartPolicy": "Never",
                "containers": [cache_proxy()],
                "volumes": ([&scratch_tools[..], &[host_work()]].concat()),
            }),
            true,
        ),
        (
            "kubernetes-without-runner",
            "kube-mode",
            kubernetes_without_runner.clone(),
            false,
        ),
        // The misspelt key changes nothing in the pod.
        (
            "kubernetes-misspelt-rules",
            "kube-mode",
            kubernetes_without_runner,
            false,
        ),
        (
            "kubernetes-merge",
            "kube-mode",
            json!({
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner", "image": runner2,
                    "env": [
                        {"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/opt/hooks/index.js"},
                        node_name_env(),
                        hooks_env("")[1].clone(),
                        hooks_env("")[2].clone(),
                    ],
                    "volumeMounts": [mount("work", "/work"), mount("scratch", "/scratch")],
                    "resources": limits(),
                }],
                "volumes": [host_work()],
            }),
            true,
        ),
        (
            "novolume-mounts",
            "kube-mode",
            json!({
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner",
                    "env": ([hooks_env("/home/runner/k8s-novolume/index.js").as_slice(), &[json!({"name": "ACTIONS_RUNNER_IMAGE", "value": ""})]].concat()),
                    "volumeMounts": [mount("tools", "/opt/tools")],
                }],
                "volumes": [empty_dir("tools")],
            }),
            true,
        ),
        (
            "novolume-volumes",
            "kube-mode",
            json!({
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner", "image": "ghcr.io/actions/actions-runner:latest",
                    "command": ["/home/runner/run.sh"],
                    "env": ([hooks_env("/home/runner/k8s-novolume/index.js").as_slice(), &[json!({"name": "ACTIONS_RUNNER_IMAGE", "value": "ghcr.io/actions/actions-runner:latest"})]].concat()),
                    // Never null: no mounts at all.
                    "volumeMounts": [],
                }],
                "volumes": [empty_dir("tools")],
            }),
            true,
        ),
    ]
}

/// `pod` with the runners' account of `kind` under `release`'s names.
fn with_account(pod: &Value, account: String) -> Value {
    let mut pod = pod.clone();
    pod["serviceAccountName"] = json!(account);
    pod
}

#[test]
fn arc_test_values_render_the_pod_arcs_chart_renders_order_included() {
    for (name, kind, arc, _) in arc_cases() {
        let objects = render_arc(name, &[]);
        let spec = &one(&objects, "AutoscalingRunnerSet")["spec"];
        assert_eq!(
            spec["template"]["spec"],
            with_account(&arc, format!("release-{kind}")),
            "{name}"
        );
        // The scale set's own fields, as the file gives them.
        let file: Value =
            serde_yaml::from_str(&std::fs::read_to_string(arc_values(name)).unwrap()).unwrap();
        assert_eq!(spec["githubConfigUrl"], file["githubConfigUrl"], "{name}");
        assert_eq!(spec["runnerScaleSetName"], "release", "{name}");
        assert!(spec.get("runnerGroup").is_none(), "{name}");
        let min = file.get("minRunners").cloned().unwrap_or(json!(0));
        assert_eq!(spec["minRunners"], min, "{name}");
        assert_eq!(spec.get("maxRunners"), file.get("maxRunners"), "{name}");
        assert_eq!(
            objects_of(&objects, "Role").is_empty(),
            kind != "kube-mode",
            "{name}"
        );
    }
    // The misspelt key grants nothing, as in ARC: the hooks' rules alone.
    let objects = render_arc("kubernetes-misspelt-rules", &[]);
    let role = one(&objects, "Role");
    assert!(
        !grants(&role["rules"], "apps", "deployments", "create"),
        "{role}"
    );
    assert_eq!(role["rules"].as_array().unwrap().len(), 5, "{role}");
}

#[test]
fn arcs_rendered_sets_migrate_to_values_that_render_the_same_pod() {
    for (name, kind, arc, round_trips) in arc_cases() {
        if !round_trips {
            continue;
        }
        // The set ARC's chart applies from the file, with its account.
        let arc_set = json!({
            "apiVersion": arcwright::migrate::ARC_API_VERSION,
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": "release", "namespace": "arcwright"},
            "spec": {
                "githubConfigUrl": "https://github.com/octo-org",
                "githubConfigSecret": "release-gha-rs-github-secret",
                "template": {"spec": with_account(&arc, format!("release-gha-rs-{kind}"))},
            },
        });
        let migrated = arcwright::migrate::migrate(&arc_set).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let values = dir.path().join("values.yaml");
        std::fs::write(&values, serde_yaml::to_string(&migrated.values).unwrap()).unwrap();
        let objects = render_ok(&scale_set_chart(), &["-f", values.to_str().unwrap()]);
        assert_eq!(
            one(&objects, "AutoscalingRunnerSet")["spec"]["template"]["spec"],
            with_account(&arc, format!("release-{kind}")),
            "{name}: {}",
            migrated.values
        );
    }
}

#[test]
fn proxy_and_ca_values_reach_the_runner_pod_as_arc_sets_them() {
    use arcwright::api::{AutoscalingRunnerSetSpec, EphemeralRunner, EphemeralRunnerSpec};
    use arcwright::controllers::ephemeral_runner::resources::runner_pod;
    // The pod as it runs: the chart's set, then the controller's pod.
    let pod_of = |objects: &[Value], proxy_secret: Option<&str>| {
        let spec: AutoscalingRunnerSetSpec =
            serde_json::from_value(one(objects, "AutoscalingRunnerSet")["spec"].clone()).unwrap();
        let runner = EphemeralRunner::new(
            "set-runner-abcde",
            EphemeralRunnerSpec {
                github_config_url: spec.github_config_url.clone(),
                proxy: spec.proxy.clone(),
                proxy_secret_ref: proxy_secret.map(str::to_owned),
                github_server_tls: spec.github_server_tls.clone(),
                spec: spec.template.spec.clone().unwrap(),
                ..EphemeralRunnerSpec::default()
            },
        );
        serde_json::to_value(runner_pod(&runner, "arcwright/test")).unwrap()
    };

    let objects = render_arc("proxy", &[]);
    let pod = pod_of(&objects, Some("proxied-runners-runner-proxy"));
    let env = by_name(&pod["spec"]["containers"][0]["env"]);
    for key in ["http_proxy", "https_proxy", "no_proxy"] {
        assert_eq!(
            env[key]["valueFrom"]["secretKeyRef"],
            json!({"name": "proxied-runners-runner-proxy", "key": key, "optional": false}),
            "{key}"
        );
        assert!(env[key].get("value").is_none(), "never literal: {key}");
    }
    let rendered = serde_json::to_string(&objects).unwrap();
    assert!(!rendered.contains("password"), "{rendered}");

    let objects = render_arc("ca", &[]);
    let pod = pod_of(&objects, None);
    let spec = &pod["spec"];
    let env = by_name(&spec["containers"][0]["env"]);
    assert_eq!(
        env["NODE_EXTRA_CA_CERTS"]["value"],
        "/usr/local/share/ca-certificates/ca.crt"
    );
    assert_eq!(env["RUNNER_UPDATE_CA_CERTS"]["value"], "1");
    assert_eq!(
        by_name(&spec["containers"][0]["volumeMounts"])["github-server-tls-cert"],
        json!({"name": "github-server-tls-cert", "mountPath": "/usr/local/share/ca-certificates/ca.crt", "subPath": "ca.crt"})
    );
    assert_eq!(
        by_name(&spec["volumes"])["github-server-tls-cert"],
        json!({"name": "github-server-tls-cert", "configMap": {"name": "ghes-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}})
    );
}

#[test]
fn arc_values_files_install_with_what_has_no_meaning_named() {
    // Every ARC-shaped file renders.
    for name in [
        "dind",
        "kubernetes",
        "kubernetes-novolume",
        "proxy",
        "ca",
        "listener-template",
    ]
    .into_iter()
    .chain(arc_cases().into_iter().map(|(name, ..)| name))
    {
        render_arc(name, &[]);
    }
    let objects = render_arc("listener-template", &[]);
    let set = one(&objects, "AutoscalingRunnerSet");
    assert_eq!(
        set["metadata"]["namespace"], "arc-runners",
        "namespaceOverride"
    );
    for object in &objects {
        assert_eq!(object["metadata"]["namespace"], "arc-runners", "{object}");
    }
    assert_eq!(
        set["spec"]["ephemeralRunnerMetadata"],
        json!({"labels": {"team": "ci"}})
    );
    assert_eq!(
        set["spec"]["listenerMetrics"]["counters"]["gha_completed_jobs_total"]["labels"],
        json!(["repository", "job_name", "job_result"])
    );
    assert!(set["spec"].get("listenerTemplate").is_none());
    // Key Vault is refused with what to do instead; a typo is still one.
    let error = scale_set_render(&["--set", "keyVault.type=azure_key_vault"]).unwrap_err();
    assert!(error.contains("keyVault is not supported"), "{error}");
    assert!(error.contains("External Secrets Operator"), "{error}");
    // A mode ARC's chart does not know renders none, as ARC renders it, and
    // a key neither chart reads is left out (the NOTES name both).
    let objects = scale_set_render(&[
        "--set",
        "containerMode.type=docker",
        "--set",
        "maxRunner=3",
        "--set",
        "proxy.https.url=http://proxy:3128",
        "--set",
        "proxy.https.user=me",
        "--set",
        "resourceMeta.ephemeralRunner.label.team=ci",
    ])
    .unwrap();
    let spec = &one(&objects, "AutoscalingRunnerSet")["spec"];
    assert_eq!(
        spec["template"]["spec"],
        json!({
            "restartPolicy": "Never",
            "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest", "command": ["/home/runner/run.sh"]}],
            "serviceAccountName": "release-no-permission",
        })
    );
    assert!(spec.get("maxRunners").is_none(), "{spec}");
    assert!(spec.get("podValidationPolicy").is_none(), "{spec}");
    assert_eq!(
        spec["proxy"],
        json!({"https": {"url": "http://proxy:3128"}}),
        "{spec}"
    );
    assert!(spec.get("ephemeralRunnerMetadata").is_none(), "{spec}");
    // Drain protection is opt-in.
    let set = one(&render_arc("dind", &[]), "AutoscalingRunnerSet").clone();
    assert!(set["spec"].get("protectBusyRunners").is_none(), "{set}");
    let objects = render_arc("dind", &["--set", "protectBusyRunners=true"]);
    assert_eq!(
        one(&objects, "AutoscalingRunnerSet")["spec"]["protectBusyRunners"],
        true
    );
}

/// What `helm install` prints after installing the scale-set chart with an
/// ARC-shaped values file (a dry run against the test's API server: Helm
/// renders the NOTES only when installing).
fn install_notes(env: &TestEnv, values: &str) -> String {
    let kubeconfig = env.control_plane().kubeconfig_path();
    let file = arc_values(values);
    helm(&[
        "install",
        "release",
        scale_set_chart().to_str().unwrap(),
        "--dry-run",
        "--namespace",
        env.namespace(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "-f",
        &file,
    ])
    .unwrap_or_else(|e| panic!("helm install --dry-run -f {values}: {e}"))
}

#[tokio::test]
async fn the_notes_say_what_dind_allows_and_what_arc_values_have_no_meaning() {
    let env = TestEnv::new("chart-notes").await;
    // A dry-run install maps every object to its kind: the CRDs must be there.
    common::install_crds(env.client()).await;
    let notes = install_notes(&env, "dind");
    assert!(notes.contains("PRIVILEGED docker:dind sidecar"), "{notes}");
    assert!(notes.contains("allowPrivileged: true"), "{notes}");
    let notes = install_notes(&env, "kubernetes");
    assert!(notes.contains("label runner-pod=<runner>"), "{notes}");
    let notes = install_notes(&env, "listener-template");
    for says in [
        "listenerTemplate is ignored",
        "controllerServiceAccount is ignored",
        "resourceMeta.autoscalingListener: ignored",
    ] {
        assert!(notes.contains(says), "{says} in {notes}");
    }
    assert!(!notes.contains("PRIVILEGED"), "{notes}");
    // What ARC ignores is named, one line each, and so is a template whose
    // runner cannot start.
    for (values, says) in [
        (
            "kubernetes-misspelt-rules",
            "containerMode.kubernetesModeAdditionalRoleRule: a key neither ARC's chart nor this one reads",
        ),
        (
            "kubernetes-misspelt-rules",
            "containerMode kubernetes adds a bare one, with no image",
        ),
        (
            "mode-none",
            r#"containerMode.type "none": not a mode ARC's chart knows"#,
        ),
        ("dind-without-runner", "has no container named runner"),
        ("volumes-no-mode", "has no container named runner"),
        ("novolume-mounts", "The runner container has no image"),
    ] {
        let notes = install_notes(&env, values);
        assert!(notes.contains(says), "{values}: {says} in {notes}");
    }
    let notes = install_notes(&env, "dind-merge");
    assert!(!notes.contains("Ignored"), "{notes}");
    assert!(!notes.contains("no runner can start"), "{notes}");
}

/// The keys the NOTES call ignored are those `files/known-values.yaml` does
/// not list; the schema says what the chart reads, so the two must agree.
#[test]
fn the_keys_the_notes_call_ignored_are_those_the_schema_does_not_describe() {
    let chart = scale_set_chart();
    let read = |file: &str| std::fs::read_to_string(chart.join(file)).unwrap();
    let schema: Value = serde_json::from_str(&read("values.schema.json")).unwrap();
    let known: BTreeMap<String, Vec<String>> =
        serde_yaml::from_str(&read("files/known-values.yaml")).unwrap();
    for (path, keys) in &known {
        let mut node = &schema;
        for key in path.split('.').filter(|key| !key.is_empty()) {
            node = &node["properties"][key];
            if let Some(target) = node["$ref"].as_str() {
                node = &schema["definitions"][target.rsplit('/').next().unwrap()];
            }
            if let Some(object) = node["oneOf"]
                .as_array()
                .and_then(|all| all.iter().find(|one| one["type"] == "object"))
            {
                node = object;
            }
        }
        let described: BTreeSet<&str> = node["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{path:?} has no properties in the schema"))
            .keys()
            .map(String::as_str)
            .collect();
        let listed: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(listed, described, "{path:?}");
    }
}
