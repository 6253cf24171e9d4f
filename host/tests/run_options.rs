//! `arcwright run`'s environment fallbacks. A binary of its own: the tests
//! set process environment variables, which is only sound while no other
//! thread reads the environment, so they run one at a time behind a lock
//! and nothing else runs in this binary.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use arcwright::runtime::options::{
    ActionsOptions, ControllerOptions, DebugOptions, ElectionOptions, HttpOptions, KubeOptions,
    KubeSource, PolicyOptions, RunOptions, ShutdownOptions, WatchOptions, WatchScope,
};
use arcwright::telemetry::{LogFormat, LogOptions};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "run")]
struct Run {
    #[command(flatten)]
    options: RunOptions,
}

const VARS: &[&str] = &[
    "ARCWRIGHT_KUBECONFIG",
    "ARCWRIGHT_IN_CLUSTER",
    "ARCWRIGHT_KUBE_QPS",
    "ARCWRIGHT_KUBE_BURST",
    "ARCWRIGHT_NAMESPACES",
    "ARCWRIGHT_LISTEN_ADDRESS",
    "ARCWRIGHT_LOG_FORMAT",
    "ARCWRIGHT_LOG_LEVEL",
    "ARCWRIGHT_RECONCILE_CONCURRENCY",
    "ARCWRIGHT_UNREGISTRATION_WORKERS",
    "ARCWRIGHT_RUNNER_FAILURE_LIMIT",
    "ARCWRIGHT_RUNNER_FAILURE_BACKOFF",
    "ARCWRIGHT_SHUTDOWN_TIMEOUT",
    "ARCWRIGHT_LEADER_ELECT",
    "ARCWRIGHT_LEADER_ELECTION_NAMESPACE",
    "ARCWRIGHT_LEADER_ELECTION_LEASE",
    "ARCWRIGHT_LEASE_DURATION",
    "ARCWRIGHT_SHARDS",
    "ARCWRIGHT_DEFAULT_POLICIES",
    "ARCWRIGHT_SLACK_API_URL",
    "ARCWRIGHT_SLACK_SIGNING_SECRET_FILE",
    "ARCWRIGHT_SLACK_EXTEND_BY",
    "ARCWRIGHT_MESSAGE_BATCH_WINDOW",
    "ARCWRIGHT_REGISTRATION_TIMEOUT",
    "ARCWRIGHT_MAX_RUNNERS_PER_SCALE_SET",
    "ARCWRIGHT_RENEW_IN_PLACE",
    "ARCWRIGHT_STATUS_BUDGET",
    "ARCWRIGHT_ALLOW_PLAIN_HTTP",
    "ARCWRIGHT_ACTIONS_CALL_TIMEOUT",
    "ARCWRIGHT_ACTIONS_MESSAGE_TIMEOUT",
    "ARCWRIGHT_ACTIONS_HOSTS",
    "ARCWRIGHT_DEBUG_LISTEN_ADDRESS",
    "ARCWRIGHT_DEBUG_TLS_CERT_FILE",
    "ARCWRIGHT_DEBUG_TLS_KEY_FILE",
    "ARCWRIGHT_RECORDING_ENTRIES",
    "ARCWRIGHT_RECORDING_BYTES",
    "ARCWRIGHT_RECORDING_TOTAL_BYTES",
];

/// Parses `args` with exactly the `env` variables of ours set.
fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<RunOptions, clap::Error> {
    static ENV: Mutex<()> = Mutex::new(());
    let _guard = ENV.lock().unwrap_or_else(PoisonError::into_inner);
    // SAFETY: the lock keeps the tests of this binary, the only code in it
    // that touches the environment, on one thread at a time.
    unsafe {
        for var in VARS {
            std::env::remove_var(var);
        }
        for (key, value) in env {
            std::env::set_var(key, value);
        }
    }
    let parsed = Run::try_parse_from(std::iter::once("run").chain(args.iter().copied()));
    // SAFETY: as above.
    unsafe {
        for (key, _) in env {
            std::env::remove_var(key);
        }
    }
    parsed.map(|run| run.options)
}

/// What the flags and the environment below both say. A struct literal:
/// a new flag fails to compile here until the tests cover it.
fn expected() -> RunOptions {
    RunOptions {
        kube: KubeOptions {
            kubeconfig: Some("/etc/kube/config".into()),
            in_cluster: false,
            kube_qps: 20,
            kube_burst: 30,
        },
        watch: WatchOptions {
            namespaces: vec!["ci".into(), "ci-large".into()],
        },
        http: HttpOptions {
            listen_address: "127.0.0.1:9090".parse().unwrap(),
            debug_listen_address: Some("0.0.0.0:8443".parse().unwrap()),
            debug_tls_cert_file: Some("/etc/arcwright/tls/tls.crt".into()),
            debug_tls_key_file: Some("/etc/arcwright/tls/tls.key".into()),
        },
        log: LogOptions {
            log_format: LogFormat::Json,
            log_level: "arcwright=debug,kube=warn".into(),
        },
        controllers: ControllerOptions {
            reconcile_concurrency: 32,
            unregistration_workers: 12,
            runner_failure_limit: 3,
            runner_failure_backoff: Duration::from_millis(500),
            registration_timeout: Duration::from_secs(1200),
            max_runners_per_scale_set: 250,
            message_batch_window: Duration::from_millis(250),
            renew_in_place: false,
            status_budget: 7,
        },
        actions: ActionsOptions {
            allow_plain_http: true,
            actions_call_timeout: Duration::from_secs(5),
            actions_message_timeout: Duration::from_secs(70),
            actions_hosts: vec!["github.com".into(), "ghes.corp.example".into()],
        },
        shutdown: ShutdownOptions {
            shutdown_timeout: Duration::from_secs(90),
        },
        election: ElectionOptions {
            leader_elect: true,
            leader_election_namespace: Some("arcwright-system".into()),
            leader_election_lease: "ci-controller".into(),
            lease_duration: Duration::from_secs(20),
            shards: 4,
        },
        policies: PolicyOptions {
            default_policies: Some("/etc/arcwright/default-policies.yaml".into()),
            recording_entries: 500,
            recording_bytes: 1 << 20,
            recording_total_bytes: 32 << 20,
        },
        debug: DebugOptions {
            slack_api_url: "http://slack.internal/api/".parse().unwrap(),
            slack_signing_secret_file: Some("/etc/slack/signing-secret".into()),
            slack_extend_by: Duration::from_secs(3600),
        },
    }
}

#[test]
fn every_flag_is_read() {
    let options = parse(
        &[
            "--kubeconfig",
            "/etc/kube/config",
            "--kube-qps",
            "20",
            "--kube-burst",
            "30",
            "-n",
            "ci",
            "--namespace",
            "ci-large",
            "--listen-address",
            "127.0.0.1:9090",
            "--debug-listen-address",
            "0.0.0.0:8443",
            "--debug-tls-cert-file",
            "/etc/arcwright/tls/tls.crt",
            "--debug-tls-key-file",
            "/etc/arcwright/tls/tls.key",
            "--log-format",
            "json",
            "--log-level",
            "arcwright=debug,kube=warn",
            "--reconcile-concurrency",
            "32",
            "--unregistration-workers",
            "12",
            "--runner-failure-limit",
            "3",
            "--runner-failure-backoff",
            "500ms",
            "--message-batch-window",
            "250ms",
            "--registration-timeout",
            "20m",
            "--max-runners-per-scale-set",
            "250",
            "--renew-in-place=false",
            "--status-budget",
            "7",
            "--allow-plain-http",
            "--actions-call-timeout",
            "5s",
            "--actions-message-timeout",
            "70s",
            "--actions-hosts",
            "github.com,ghes.corp.example",
            "--shutdown-timeout",
            "1m30s",
            "--leader-elect",
            "--leader-election-namespace",
            "arcwright-system",
            "--leader-election-lease",
            "ci-controller",
            "--lease-duration",
            "20s",
            "--shards",
            "4",
            "--default-policies",
            "/etc/arcwright/default-policies.yaml",
            "--recording-entries",
            "500",
            "--recording-bytes",
            "1Mi",
            "--recording-total-bytes",
            "32Mi",
            "--slack-api-url",
            "http://slack.internal/api/",
            "--slack-signing-secret-file",
            "/etc/slack/signing-secret",
            "--slack-extend-by",
            "1h",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(options, expected());
}

#[test]
fn every_flag_falls_back_to_its_environment_variable() {
    let options = parse(
        &[],
        &[
            ("ARCWRIGHT_KUBECONFIG", "/etc/kube/config"),
            ("ARCWRIGHT_KUBE_QPS", "20"),
            ("ARCWRIGHT_KUBE_BURST", "30"),
            ("ARCWRIGHT_NAMESPACES", "ci,ci-large"),
            ("ARCWRIGHT_LISTEN_ADDRESS", "127.0.0.1:9090"),
            ("ARCWRIGHT_DEBUG_LISTEN_ADDRESS", "0.0.0.0:8443"),
            (
                "ARCWRIGHT_DEBUG_TLS_CERT_FILE",
                "/etc/arcwright/tls/tls.crt",
            ),
            ("ARCWRIGHT_DEBUG_TLS_KEY_FILE", "/etc/arcwright/tls/tls.key"),
            ("ARCWRIGHT_LOG_FORMAT", "json"),
            ("ARCWRIGHT_LOG_LEVEL", "arcwright=debug,kube=warn"),
            ("ARCWRIGHT_RECONCILE_CONCURRENCY", "32"),
            ("ARCWRIGHT_UNREGISTRATION_WORKERS", "12"),
            ("ARCWRIGHT_RUNNER_FAILURE_LIMIT", "3"),
            ("ARCWRIGHT_RUNNER_FAILURE_BACKOFF", "500ms"),
            ("ARCWRIGHT_MESSAGE_BATCH_WINDOW", "250ms"),
            ("ARCWRIGHT_REGISTRATION_TIMEOUT", "1200s"),
            ("ARCWRIGHT_MAX_RUNNERS_PER_SCALE_SET", "250"),
            ("ARCWRIGHT_RENEW_IN_PLACE", "false"),
            ("ARCWRIGHT_STATUS_BUDGET", "7"),
            ("ARCWRIGHT_ALLOW_PLAIN_HTTP", "true"),
            ("ARCWRIGHT_ACTIONS_CALL_TIMEOUT", "5s"),
            ("ARCWRIGHT_ACTIONS_MESSAGE_TIMEOUT", "70s"),
            ("ARCWRIGHT_ACTIONS_HOSTS", "github.com,ghes.corp.example"),
            ("ARCWRIGHT_SHUTDOWN_TIMEOUT", "90s"),
            ("ARCWRIGHT_LEADER_ELECT", "true"),
            ("ARCWRIGHT_LEADER_ELECTION_NAMESPACE", "arcwright-system"),
            ("ARCWRIGHT_LEADER_ELECTION_LEASE", "ci-controller"),
            ("ARCWRIGHT_LEASE_DURATION", "20s"),
            ("ARCWRIGHT_SHARDS", "4"),
            (
                "ARCWRIGHT_DEFAULT_POLICIES",
                "/etc/arcwright/default-policies.yaml",
            ),
            ("ARCWRIGHT_RECORDING_ENTRIES", "500"),
            ("ARCWRIGHT_RECORDING_BYTES", "1048576"),
            ("ARCWRIGHT_RECORDING_TOTAL_BYTES", "32Mi"),
            ("ARCWRIGHT_SLACK_API_URL", "http://slack.internal/api/"),
            (
                "ARCWRIGHT_SLACK_SIGNING_SECRET_FILE",
                "/etc/slack/signing-secret",
            ),
            ("ARCWRIGHT_SLACK_EXTEND_BY", "60m"),
        ],
    )
    .unwrap();
    assert_eq!(options, expected());
}

#[test]
fn repeated_and_comma_separated_namespaces_make_one_scope() {
    let options = parse(&["-n", "ci", "--namespace", "ci-large,ci"], &[]).unwrap();
    assert_eq!(
        options.watch.scope(),
        WatchScope::Namespaces(["ci".into(), "ci-large".into()].into())
    );
}

#[test]
fn a_flag_wins_over_its_environment_variable() {
    let options = parse(
        &["--namespace", "flag", "--log-format", "text"],
        &[
            ("ARCWRIGHT_NAMESPACES", "env"),
            ("ARCWRIGHT_LOG_FORMAT", "json"),
        ],
    )
    .unwrap();
    assert_eq!(
        options.watch.scope(),
        WatchScope::Namespaces(["flag".into()].into())
    );
    assert_eq!(options.log.log_format, LogFormat::Text);
}

#[test]
fn in_cluster_is_a_boolean_in_the_environment() {
    let on = parse(&[], &[("ARCWRIGHT_IN_CLUSTER", "true")]).unwrap();
    assert_eq!(on.kube.source(), KubeSource::InCluster);
    let off = parse(&[], &[("ARCWRIGHT_IN_CLUSTER", "false")]).unwrap();
    assert_eq!(off.kube.source(), KubeSource::Infer);
}

#[test]
fn a_bad_environment_value_is_refused_with_its_reason() {
    let err = parse(&[], &[("ARCWRIGHT_NAMESPACES", "ci,Prod")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"Prod\" is not a namespace name"), "{err}");
    let err = parse(&["--actions-hosts", "github.com,https://ghes/"], &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a host name"), "{err}");
}

/// The operations guide's table of flags (`docs/operations.md`) names every
/// flag and its variable, on the flag's own row, so a new flag is documented
/// where operators look.
#[test]
fn the_operations_guide_lists_every_flag_and_its_variable() {
    use clap::CommandFactory;
    let guide = include_str!("../../docs/operations.md");
    for arg in Run::command().get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let row = guide
            .lines()
            .find(|line| {
                // The flag itself, not a longer one it is the start of.
                [format!("| `--{long}`"), format!("| `--{long} ")]
                    .iter()
                    .any(|start| line.starts_with(start.as_str()))
            })
            .unwrap_or_else(|| {
                panic!("--{long} is missing from the operations guide's table of flags")
            });
        if let Some(env) = arg.get_env() {
            let env = env.to_str().unwrap();
            assert!(
                row.contains(&format!("`{env}`")),
                "{env} is missing from the row of --{long} in the operations guide: {row}"
            );
        }
    }
}
