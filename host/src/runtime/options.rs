//! The flags of `arcwright run`, each with an environment variable behind
//! it (a Deployment sets either), in groups that `--help` shows apart.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client, Resource};

use crate::telemetry::LogOptions;

/// Everything `arcwright run` is told.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct RunOptions {
    /// How to reach the API server.
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub kube: KubeOptions,
    /// Which namespaces the controllers watch.
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub watch: WatchOptions,
    /// Where the probes and metrics are served.
    #[command(flatten, next_help_heading = "Endpoints")]
    pub http: HttpOptions,
    /// Logging.
    #[command(flatten, next_help_heading = "Logging")]
    pub log: LogOptions,
    /// How the Actions service is reached.
    #[command(flatten, next_help_heading = "Actions service")]
    pub actions: ActionsOptions,
    /// How much work runs at once.
    #[command(flatten, next_help_heading = "Controllers")]
    pub controllers: ControllerOptions,
    /// How shutdown is bounded.
    #[command(flatten, next_help_heading = "Controllers")]
    pub shutdown: ShutdownOptions,
    /// Whether replicas elect a leader.
    #[command(flatten, next_help_heading = "Leader election")]
    pub election: ElectionOptions,
    /// The cluster-wide default policies.
    #[command(flatten, next_help_heading = "Policies")]
    pub policies: PolicyOptions,
    /// Held failed runners: Slack and the hold API.
    #[command(flatten, next_help_heading = "Debugging")]
    pub debug: DebugOptions,
}

/// The cluster-wide default policies ([`crate::policy::defaults`]).
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct PolicyOptions {
    /// A YAML file with the policy a scale set gets when its spec names
    /// none, per kind (`scaling`, `deregistration`, `podValidation`, each
    /// `{builtin: NAME, settings: {...}}`); kinds left out keep the bundled
    /// default. Read once at start-up; a bad file stops the process.
    #[arg(long, env = "ARCWRIGHT_DEFAULT_POLICIES", value_name = "PATH")]
    pub default_policies: Option<PathBuf>,
    /// The most entries (scaling decisions and job events) a scale set's
    /// recording keeps, oldest dropped first; 0 records nothing. Served at
    /// `/api/v1/namespaces/NS/autoscalingrunnersets/NAME/recording` for
    /// `arcwright policy replay` and `simulate`.
    #[arg(
        long,
        env = "ARCWRIGHT_RECORDING_ENTRIES",
        value_name = "N",
        default_value_t = crate::recording::DEFAULT_LIMITS.entries
    )]
    pub recording_entries: usize,
    /// The most bytes a scale set's recording keeps (`4Mi`, `512Ki`, or
    /// bytes).
    #[arg(
        long,
        env = "ARCWRIGHT_RECORDING_BYTES",
        value_name = "SIZE",
        default_value = "4Mi",
        value_parser = parse_size
    )]
    pub recording_bytes: usize,
    /// The most bytes all scale sets' recordings keep together: a busy
    /// scale set then gives up its own oldest entries, never a quiet one's.
    #[arg(
        long,
        env = "ARCWRIGHT_RECORDING_TOTAL_BYTES",
        value_name = "SIZE",
        default_value = "64Mi",
        value_parser = parse_size
    )]
    pub recording_total_bytes: usize,
}

impl PolicyOptions {
    /// The recordings these flags bound.
    pub fn recordings(&self) -> crate::recording::Recordings {
        crate::recording::Recordings::new(
            crate::recording::Limits {
                entries: self.recording_entries,
                bytes: self.recording_bytes,
            },
            self.recording_total_bytes,
        )
    }
}

/// A size in bytes: a number, optionally with `Ki`, `Mi` or `Gi`.
fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let (digits, unit) = match trimmed.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => trimmed.split_at(at),
        None => (trimmed, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(format!("{text:?} is not a size like 4Mi, 512Ki or 1048576")),
    };
    let number: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 4Mi, 512Ki or 1048576"))?;
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Held failed runners (a scale set's `spec.debug`): where their Slack
/// posts go and how the buttons on them are checked.
///
/// The hold API (`/api/v1/namespaces/{ns}/ephemeralrunners/{name}/hold`)
/// needs no flag: it authenticates every caller against the cluster, so it
/// is always served. Slack's button presses are served only with a signing
/// secret, because without one nothing could tell Slack's requests from
/// anybody's.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct DebugOptions {
    /// The Slack Web API's base URL (a scale set's `spec.debug.slack` names
    /// the channel and the Secret with its bot token).
    #[arg(
        long,
        env = "ARCWRIGHT_SLACK_API_URL",
        value_name = "URL",
        default_value = crate::slack::DEFAULT_API_URL
    )]
    pub slack_api_url: url::Url,
    /// A file holding the Slack app's signing secret (a mounted Secret):
    /// with it, `/slack/interactions` is served for the Extend and Release
    /// buttons. A file rather than a flag's value, so the secret is in no
    /// process listing.
    #[arg(long, env = "ARCWRIGHT_SLACK_SIGNING_SECRET_FILE", value_name = "PATH")]
    pub slack_signing_secret_file: Option<PathBuf>,
    /// How much later Slack's Extend button moves a hold (still capped by
    /// the scale set's `maxHold`).
    #[arg(
        long,
        env = "ARCWRIGHT_SLACK_EXTEND_BY",
        value_name = "DURATION",
        default_value = "30m",
        value_parser = parse_positive_duration
    )]
    pub slack_extend_by: Duration,
}

/// Leader election: with several replicas, only the holder of a
/// `coordination.k8s.io` Lease reconciles and holds message sessions.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct ElectionOptions {
    /// Elect a leader among the replicas (off: this process leads alone).
    #[arg(long, env = "ARCWRIGHT_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The namespace of the Lease; defaults to `$POD_NAMESPACE`, then
    /// `default`.
    #[arg(long, env = "ARCWRIGHT_LEADER_ELECTION_NAMESPACE", value_name = "NS")]
    pub leader_election_namespace: Option<String>,
    /// The Lease's name.
    #[arg(
        long,
        env = "ARCWRIGHT_LEADER_ELECTION_LEASE",
        value_name = "NAME",
        default_value = "arcwright-controller"
    )]
    pub leader_election_lease: String,
    /// How long a Lease not renewed stays with its holder: the longest a
    /// crashed leader's replica waits before it takes over.
    #[arg(
        long,
        env = "ARCWRIGHT_LEASE_DURATION",
        value_name = "DURATION",
        default_value = "15s",
        value_parser = parse_lease_duration
    )]
    pub lease_duration: Duration,
    /// Split the scale sets into this many shards, each held by one replica
    /// through a Lease (`arcwright-shard-0..N-1`); every replica serves
    /// the sets of the shards it holds, at most its fair share of them.
    /// Replaces `--leader-elect` when above 1. All replicas must be given
    /// the same number.
    #[arg(
        long,
        env = "ARCWRIGHT_SHARDS",
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub shards: u32,
}

/// A lease duration: whole seconds, at least 2 (the holder renews a third
/// of the way before the end, so it needs a second to spare).
fn parse_lease_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration < Duration::from_secs(2) {
        return Err(format!("{text:?} is shorter than 2s"));
    }
    Ok(Duration::from_secs(duration.as_secs()))
}

/// How to reach the API server.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct KubeOptions {
    /// A kubeconfig file to connect with (its current context). Without it
    /// (and without --in-cluster) the usual search applies: $KUBECONFIG,
    /// ~/.kube/config, then the pod's service account.
    #[arg(long, env = "ARCWRIGHT_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Connect with the pod's service account only, whatever kubeconfig is
    /// around.
    #[arg(long, env = "ARCWRIGHT_IN_CLUSTER", conflicts_with = "kubeconfig")]
    pub in_cluster: bool,
    /// At most this many API server requests a second, sustained (ARC's
    /// --k8s-client-rate-limiter-qps); 0, the default, sets no limit (see
    /// `runtime::rate_limit`).
    #[arg(
        long,
        env = "ARCWRIGHT_KUBE_QPS",
        value_name = "N",
        default_value_t = 0
    )]
    pub kube_qps: u32,
    /// How many requests may go at once after a quiet spell (ARC's
    /// --k8s-client-rate-limiter-burst); 0 means one second's worth.
    #[arg(
        long,
        env = "ARCWRIGHT_KUBE_BURST",
        value_name = "N",
        default_value_t = 0
    )]
    pub kube_burst: u32,
}

/// Where the client configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeSource {
    /// `kube::Config::infer`: `$KUBECONFIG`, `~/.kube/config`, in-cluster.
    Infer,
    /// This kubeconfig file.
    File(PathBuf),
    /// The pod's service account.
    InCluster,
}

impl KubeOptions {
    /// The client-side limit the flags set, if any.
    pub fn rate(&self) -> Option<super::rate_limit::Rate> {
        super::rate_limit::Rate::from_flags(self.kube_qps, self.kube_burst)
    }

    /// Where the configuration comes from.
    pub fn source(&self) -> KubeSource {
        let Self {
            kubeconfig,
            in_cluster,
            ..
        } = self;
        match (kubeconfig, in_cluster) {
            (Some(path), _) => KubeSource::File(path.clone()),
            (None, true) => KubeSource::InCluster,
            (None, false) => KubeSource::Infer,
        }
    }
}

/// Which namespaces the controllers watch.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct WatchOptions {
    /// A namespace to watch; repeat the flag (or separate with commas) for
    /// several. Without any, every namespace is watched, which needs
    /// cluster-wide permissions.
    #[arg(
        long = "namespace",
        short = 'n',
        env = "ARCWRIGHT_NAMESPACES",
        value_name = "NAMESPACE",
        value_delimiter = ',',
        value_parser = parse_namespace
    )]
    pub namespaces: Vec<String>,
}

impl WatchOptions {
    /// The scope the flags describe.
    pub fn scope(&self) -> WatchScope {
        let Self { namespaces } = self;
        if namespaces.is_empty() {
            WatchScope::All
        } else {
            WatchScope::Namespaces(namespaces.iter().cloned().collect())
        }
    }
}

/// The namespaces the controllers watch: every one, or a fixed set.
///
/// A fixed set becomes one watch per namespace rather than a cluster-wide
/// watch filtered locally, so a namespaced Role is enough to run it and the
/// process never receives objects it would throw away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchScope {
    /// Every namespace.
    All,
    /// Only these (never empty).
    Namespaces(BTreeSet<String>),
}

impl WatchScope {
    /// The APIs to list and watch `K` through: one cluster-wide, or one per
    /// namespace.
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Self::All => vec![Api::all(client.clone())],
            Self::Namespaces(namespaces) => namespaces
                .iter()
                .map(|namespace| Api::namespaced(client.clone(), namespace))
                .collect(),
        }
    }

    /// Whether an object in `namespace` is in scope.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Namespaces(namespaces) => namespaces.contains(namespace),
        }
    }
}

/// A namespace name as the API server accepts it (an RFC 1123 label), so a
/// typo fails at start-up with its reason instead of as a 404 per watch.
fn parse_namespace(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a namespace name (at most 63 lower-case letters, digits and '-', \
             starting and ending with a letter or digit)"
        ))
    }
}

/// Where the probes and metrics are served.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct HttpOptions {
    /// The address `/healthz`, `/readyz` and `/metrics` are served on.
    /// Port 0 picks a free port; the log says which.
    #[arg(
        long,
        env = "ARCWRIGHT_LISTEN_ADDRESS",
        value_name = "ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub listen_address: SocketAddr,
    /// Serve the hold API and `/slack/interactions` on this address instead,
    /// so they can be exposed (with TLS) without the metrics.
    #[arg(long, env = "ARCWRIGHT_DEBUG_LISTEN_ADDRESS", value_name = "ADDRESS")]
    pub debug_listen_address: Option<SocketAddr>,
    /// The PEM certificate chain the debug address serves TLS with (with
    /// `--debug-tls-key-file`).
    #[arg(
        long,
        env = "ARCWRIGHT_DEBUG_TLS_CERT_FILE",
        value_name = "PATH",
        requires_all = ["debug_listen_address", "debug_tls_key_file"]
    )]
    pub debug_tls_cert_file: Option<PathBuf>,
    /// The PEM private key of that certificate.
    #[arg(
        long,
        env = "ARCWRIGHT_DEBUG_TLS_KEY_FILE",
        value_name = "PATH",
        requires_all = ["debug_listen_address", "debug_tls_cert_file"]
    )]
    pub debug_tls_key_file: Option<PathBuf>,
}

/// How the Actions service is reached.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct ActionsOptions {
    /// Allow `http://` configuration and service URLs. Off, a scale set
    /// whose `githubConfigUrl` is plain http fails with a condition saying
    /// so, and no call the service's answers point at plain http is made:
    /// tokens never cross a network in clear text. For tests and labs
    /// against a local fake.
    #[arg(long, env = "ARCWRIGHT_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: bool,
    /// The limit on each attempt of every Actions call but the message long
    /// poll. A call that outlives it is retried like a refused one; a
    /// service answering slower than this for every attempt leaves its
    /// scale set backing off alone, while the others run.
    #[arg(
        long,
        env = "ARCWRIGHT_ACTIONS_CALL_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = parse_positive_duration
    )]
    pub actions_call_timeout: Duration,
    /// The limit on each message long poll. The service holds a poll about
    /// 50 s before answering that nothing came, so below a minute every
    /// quiet poll would end as a timeout.
    #[arg(
        long,
        env = "ARCWRIGHT_ACTIONS_MESSAGE_TIMEOUT",
        value_name = "DURATION",
        default_value = "90s",
        value_parser = parse_positive_duration
    )]
    pub actions_message_timeout: Duration,
    /// The hosts a scale set's `githubConfigUrl` may name, comma-separated:
    /// a host name or address as it is, or `*.DOMAIN` for its subdomains;
    /// `*` alone allows any. A GitHub Enterprise Server is added by its
    /// host. Service URLs the Actions service hands out must be its own
    /// (the configuration host and its subdomains,
    /// `*.actions.githubusercontent.com`) or listed here, so a tenant's URL
    /// cannot aim the controller at the cluster's own addresses.
    #[arg(
        long,
        env = "ARCWRIGHT_ACTIONS_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ',',
        default_value = "github.com,*.ghe.com",
        value_parser = parse_host_entry
    )]
    pub actions_hosts: Vec<String>,
}

impl ActionsOptions {
    /// The host policy `--actions-hosts` describes.
    pub fn host_policy(&self) -> crate::actions::hosts::HostPolicy {
        // Each entry was parsed when the flag was read.
        crate::actions::hosts::HostPolicy::from_entries(&self.actions_hosts)
            .unwrap_or(crate::actions::hosts::HostPolicy::Listed(Vec::new()))
    }
}

/// One `--actions-hosts` entry, checked as it is read.
fn parse_host_entry(text: &str) -> Result<String, String> {
    if text.trim() != "*" {
        crate::actions::hosts::HostPattern::parse(text)?;
    }
    Ok(text.trim().to_owned())
}

/// How much work runs at once.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct ControllerOptions {
    /// How many objects each controller reconciles at once.
    #[arg(
        long,
        env = "ARCWRIGHT_RECONCILE_CONCURRENCY",
        value_name = "N",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub reconcile_concurrency: u16,
    /// How many workers remove runner registrations from the Actions
    /// service, off the reconcile path (at least 4).
    #[arg(
        long,
        env = "ARCWRIGHT_UNREGISTRATION_WORKERS",
        value_name = "N",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(4..)
    )]
    pub unregistration_workers: u16,
    /// Failed starts of a runner (a pod that fails before it runs a job)
    /// before it is marked Failed and its set replaces it (ARC: 5).
    #[arg(
        long,
        env = "ARCWRIGHT_RUNNER_FAILURE_LIMIT",
        value_name = "N",
        default_value_t = 5,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub runner_failure_limit: u16,
    /// The wait before a failed runner's second start, doubled for each
    /// further failure up to 80 s (ARC: 5 s).
    #[arg(
        long,
        env = "ARCWRIGHT_RUNNER_FAILURE_BACKOFF",
        value_name = "DURATION",
        default_value = "5s",
        value_parser = parse_positive_duration
    )]
    pub runner_failure_backoff: Duration,
    /// How long a runner may take, from its container's start, to be seen
    /// online by the Actions service before it is removed and recreated
    /// (ARC: 10 minutes, counted from the pod's creation). A scale set's
    /// `spec.registrationTimeout` overrides it.
    #[arg(
        long,
        env = "ARCWRIGHT_REGISTRATION_TIMEOUT",
        value_name = "DURATION",
        default_value = "10m",
        value_parser = parse_positive_duration
    )]
    pub registration_timeout: Duration,
    /// The most runners any one scale set has, whatever its `maxRunners`,
    /// `minRunners` or scaling policy say: a typo or a policy answering
    /// `u32::MAX` then costs this many registrations, not etcd and the
    /// Actions rate limit. A decision above it is capped, and the scale
    /// set's status says so.
    #[arg(
        long,
        env = "ARCWRIGHT_MAX_RUNNERS_PER_SCALE_SET",
        value_name = "N",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_runners_per_scale_set: u32,
    /// The least time from one Actions message to a listener's next poll,
    /// so that a burst's job events arrive in a few large messages rather
    /// than many small ones (each costs a poll and an acknowledgement).
    /// Scaling decisions are not delayed by it; `0s` polls at once.
    #[arg(
        long,
        env = "ARCWRIGHT_MESSAGE_BATCH_WINDOW",
        value_name = "DURATION",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub message_batch_window: Duration,
    /// Renew a runner in place the moment it finishes its job, when its
    /// listener last heard of a job waiting for it: one status write and
    /// no wait for the next scaling decision (see the architecture doc,
    /// "Renewal in place"). Off (`--renew-in-place=false`): a finished
    /// runner is renewed by its set under the listener's next decision.
    #[arg(
        long,
        env = "ARCWRIGHT_RENEW_IN_PLACE",
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub renew_in_place: bool,
    /// Status writes that only inform (a runner's pod started running, it
    /// turned ready), a second, for the whole host; the writes decisions
    /// rest on are never held to it. A write put off is carried by the
    /// runner's next one, or made when the budget allows.
    #[arg(
        long,
        env = "ARCWRIGHT_STATUS_BUDGET",
        value_name = "WRITES_PER_SECOND",
        default_value_t = crate::controllers::kit::budget::DEFAULT_PER_SECOND
    )]
    pub status_budget: u32,
}

/// How shutdown is bounded.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct ShutdownOptions {
    /// How long components get, after SIGTERM or SIGINT, to finish (listeners
    /// delete their message sessions) before the process gives up on them.
    /// Keep it below the pod's terminationGracePeriodSeconds (30 s by
    /// default) so the kubelet does not kill the process first.
    #[arg(
        long,
        env = "ARCWRIGHT_SHUTDOWN_TIMEOUT",
        value_name = "DURATION",
        default_value = "25s",
        value_parser = parse_duration
    )]
    pub shutdown_timeout: Duration,
}

/// A duration that is more than zero (an Extend of nothing would be a
/// button that does nothing).
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!("{text:?} is zero"));
    }
    Ok(duration)
}

/// `25s`, `1m30s`, `2 minutes` or ISO 8601 (`PT25S`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = text
        .parse()
        .map_err(|e| format!("{text:?} is not a duration like 25s or 1m30s: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::telemetry::LogFormat;

    /// `RunOptions` as a command of its own, as the binary flattens it.
    #[derive(Debug, Parser)]
    #[command(name = "run")]
    struct Run {
        #[command(flatten)]
        options: RunOptions,
    }

    /// Parses flags alone; every flag, and its environment fallback, is
    /// tested in `tests/run_options.rs`, a binary of its own, because
    /// setting variables while other tests' threads read the environment
    /// is undefined behaviour.
    fn parse(args: &[&str]) -> Result<RunOptions, clap::Error> {
        Run::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .map(|run| run.options)
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(parse_size("512Ki"), Ok(512 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("4MB").unwrap_err().contains("like 4Mi"));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn the_command_is_well_formed() {
        Run::command().debug_assert();
    }

    #[test]
    fn defaults_watch_everything_and_serve_on_8080() {
        let RunOptions {
            kube,
            watch,
            http:
                HttpOptions {
                    listen_address,
                    debug_listen_address,
                    ..
                },
            log: LogOptions {
                log_format,
                log_level,
            },
            controllers:
                ControllerOptions {
                    reconcile_concurrency,
                    unregistration_workers,
                    runner_failure_limit,
                    runner_failure_backoff,
                    registration_timeout,
                    max_runners_per_scale_set,
                    message_batch_window,
                    renew_in_place,
                    status_budget,
                },
            shutdown: ShutdownOptions { shutdown_timeout },
            election,
            policies,
            debug,
            actions,
        } = parse(&[]).unwrap();
        assert!(!actions.allow_plain_http, "tokens go over https only");
        assert!(renew_in_place);
        let off = |args: &[&str]| parse(args).unwrap().controllers.renew_in_place;
        assert!(!off(&["--renew-in-place=false"]));
        assert!(off(&["--renew-in-place"]), "the bare flag still says on");
        assert_eq!(status_budget, 5);
        assert_eq!(
            (
                actions.actions_call_timeout,
                actions.actions_message_timeout
            ),
            (
                crate::actions::ClientOptions::default().timeout,
                crate::actions::ClientOptions::default().message_timeout
            )
        );
        assert_eq!(policies.default_policies, None);
        assert_eq!(debug.slack_api_url.as_str(), crate::slack::DEFAULT_API_URL);
        assert_eq!(debug.slack_signing_secret_file, None);
        assert_eq!(debug.slack_extend_by, crate::slack::DEFAULT_EXTEND_BY);
        assert!(
            !election.leader_elect,
            "a lone replica leads without a Lease"
        );
        assert_eq!(election.leader_election_lease, "arcwright-controller");
        assert_eq!(election.lease_duration, Duration::from_secs(15));
        assert_eq!(kube.source(), KubeSource::Infer);
        assert_eq!(watch.scope(), WatchScope::All);
        assert_eq!(listen_address, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(debug_listen_address, None, "the hold API beside the probes");
        assert_eq!(log_format, LogFormat::Text);
        assert_eq!(log_level, "info");
        assert_eq!(reconcile_concurrency, 8);
        assert_eq!(unregistration_workers, 4);
        assert_eq!(runner_failure_limit, 5);
        assert_eq!(runner_failure_backoff, Duration::from_secs(5));
        assert_eq!(registration_timeout, Duration::from_secs(600));
        assert_eq!(max_runners_per_scale_set, 1000);
        assert_eq!(message_batch_window, Duration::from_secs(2));
        assert_eq!(shutdown_timeout, Duration::from_secs(25));
    }

    #[test]
    fn in_cluster_and_a_kubeconfig_exclude_each_other() {
        let flag = parse(&["--in-cluster"]).unwrap();
        assert_eq!(flag.kube.source(), KubeSource::InCluster);
        let both = parse(&["--in-cluster", "--kubeconfig", "/k"]).unwrap_err();
        assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn bad_values_are_refused_with_their_reason() {
        let cases: &[(&[&str], &str)] = &[
            (&["--lease-duration", "1s"], "shorter than 2s"),
            (&["--namespace", "CI"], "is not a namespace name"),
            (&["--namespace=-ci"], "is not a namespace name"),
            (&["--namespace", ""], "is not a namespace name"),
            (&["--listen-address", "8080"], "invalid socket address"),
            (&["--log-format", "xml"], "possible values: text, json"),
            (
                &["--log-level", "arcwright=loud"],
                "not a log level or filter",
            ),
            (&["--reconcile-concurrency", "0"], "not in 1.."),
            (&["--unregistration-workers", "2"], "not in 4.."),
            (&["--runner-failure-limit", "0"], "not in 1.."),
            (&["--runner-failure-backoff", "0s"], "is zero"),
            (
                &["--shutdown-timeout", "soon"],
                "is not a duration like 25s",
            ),
            (&["--shutdown-timeout=-5s"], "is negative"),
            (&["--message-batch-window", "a while"], "is not a duration"),
            (&["--slack-extend-by", "0s"], "is zero"),
            (&["--slack-api-url", "slack"], "relative URL without a base"),
        ];
        for (args, want) in cases {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn namespace_names_follow_the_api_server() {
        let cases = [
            ("ci", true),
            ("a", true),
            ("team-1", true),
            ("1team", true),
            (&*"a".repeat(63), true),
            (&*"a".repeat(64), false),
            ("Team", false),
            ("team_1", false),
            ("team-", false),
            ("team.ci", false),
        ];
        for (name, ok) in cases {
            assert_eq!(parse_namespace(name).is_ok(), ok, "{name}");
        }
    }

    #[test]
    fn a_scope_contains_its_namespaces() {
        let scope = WatchScope::Namespaces(["ci".into()].into());
        assert!(scope.contains("ci"));
        assert!(!scope.contains("prod"));
        assert!(WatchScope::All.contains("prod"));
    }
}
