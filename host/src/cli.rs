//! The `arcwright` command line.
//!
//! For now it holds the policy author's tools; they run the same engine, with
//! the same limits, as the controller does, so a module that passes
//! `arcwright policy test` behaves the same in the cluster.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use arcwright::policy::bundled::{load, module_bytes};
use arcwright::policy::suite::{self, Suite};
use arcwright::policy::{CallLimits, EngineConfig, Policy, PolicyEngine, PolicyKind, PolicyModule};
use base64::Engine as _;
use clap::{Parser, Subcommand};
use serde::Deserialize as _;

/// Kubernetes controller for GitHub Actions self-hosted runners, with
/// WebAssembly policies.
#[derive(Debug, Parser)]
#[command(name = "arcwright", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller: watch the runner resources, serve /healthz,
    /// /readyz and /metrics, and shut down cleanly on SIGTERM.
    Run(Box<arcwright::runtime::options::RunOptions>),
    /// Test, run, inspect and package policy modules.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Turn ARC AutoscalingRunnerSets (actions.github.com/v1alpha1) into
    /// arcwright's, printing the manifests (or the scale-set chart's
    /// values) with every field that does not carry over named.
    Migrate(MigrateCommand),
    /// Get a scale set's recording (decisions and job events), or write
    /// one from a CSV of workflow jobs or the fake service's history.
    #[command(subcommand)]
    Recording(arcwright::recording::cli::RecordingCommand),
}

/// `arcwright migrate`'s arguments.
#[derive(Debug, clap::Args)]
struct MigrateCommand {
    /// YAML files of ARC AutoscalingRunnerSets (several documents each is
    /// fine; other kinds are skipped); `-` reads standard input.
    #[arg(
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    files: Vec<PathBuf>,
    /// Read them from the cluster instead (the current kubeconfig context).
    #[arg(long)]
    from_cluster: bool,
    /// With --from-cluster, this namespace only.
    #[arg(long, short = 'n', requires = "from_cluster")]
    namespace: Option<String>,
    /// Print the arcwright-scale-set chart's values instead of manifests.
    #[arg(long)]
    values: bool,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Run YAML suites against a module; exits non-zero when a case fails.
    Test {
        /// A `.wasm` file, or `builtin:NAME` (`builtin:KIND/NAME`).
        module: String,
        /// Suite files.
        #[arg(required = true)]
        suites: Vec<PathBuf>,
    },
    /// Make one decision and print it as JSON.
    Eval {
        /// The kind of decision.
        #[arg(long, value_parser = parse_kind)]
        kind: PolicyKind,
        /// A `.wasm` file, or `builtin:NAME`.
        #[arg(long)]
        module: String,
        /// A file holding the input, in its JSON form (YAML works too).
        #[arg(long)]
        input: PathBuf,
        /// The settings as inline JSON (`'{"batch": 4}'`), or `@PATH` to read
        /// them from a file.
        #[arg(long, value_name = "JSON", conflicts_with = "settings_file")]
        settings: Option<String>,
        /// A file holding the settings as JSON (YAML works too).
        #[arg(long, value_name = "PATH")]
        settings_file: Option<PathBuf>,
    },
    /// Ask every scaling decision of a recording again of a candidate
    /// module, its own state threaded as in production, and show where it
    /// would have decided otherwise.
    Replay {
        /// A trace (`arcwright recording fetch`, `from-csv`, ...).
        trace: PathBuf,
        /// The candidate: a `.wasm` file, or `builtin:NAME`.
        #[arg(long)]
        module: String,
        /// Its settings as inline JSON, or `@PATH`.
        #[arg(long, value_name = "JSON")]
        settings: Option<String>,
        /// The deadline of one decision, as a scale set's
        /// `scalingPolicy.timeoutMillis` sets it.
        #[arg(long, value_name = "MS")]
        timeout_millis: Option<u32>,
        /// The memory cap of one decision, as `scalingPolicy.memoryLimitMiB`.
        #[arg(long, value_name = "MIB")]
        memory_limit_mib: Option<u32>,
        /// How many of the largest differences to show.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Run a recorded job stream through a model of its scale set under
    /// each policy, and compare the waits and runner-seconds they cost.
    Simulate(arcwright::lab::simulate::SimulateArgs),
    /// Show a module's world, exports, imports, size and sha256.
    Inspect {
        /// A `.wasm` file, or `builtin:NAME` (`builtin:KIND/NAME`).
        module: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the ConfigMap that carries a module, ready for `kubectl apply`.
    Configmap {
        /// A `.wasm` file, or `builtin:NAME`.
        module: String,
        /// The ConfigMap's name.
        #[arg(long)]
        name: String,
        /// The ConfigMap's namespace (omitted: kubectl's current one).
        #[arg(long)]
        namespace: Option<String>,
        /// The binaryData key.
        #[arg(long, default_value = arcwright::policy::loader::DEFAULT_KEY)]
        key: String,
    },
}

fn parse_kind(text: &str) -> Result<PolicyKind, String> {
    PolicyKind::parse(text)
        .ok_or_else(|| format!("expected scaling, deregistration or pod-validation, got {text:?}"))
}

impl Cli {
    /// The logging flags, for the commands that have them.
    pub fn logging(&self) -> Option<&arcwright::telemetry::LogOptions> {
        match &self.command {
            Command::Run(options) => Some(&options.log),
            Command::Policy(_) | Command::Migrate(_) | Command::Recording(_) => None,
        }
    }

    /// Runs the command; the exit code says whether it succeeded.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let Self { command } = self;
        match command {
            Command::Policy(command) => command.run(),
            Command::Migrate(command) => command.run(),
            Command::Recording(command) => command.run(),
            Command::Run(options) => {
                arcwright::runtime::run(*options)?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

impl MigrateCommand {
    fn run(self) -> anyhow::Result<ExitCode> {
        let objects = if self.from_cluster {
            from_cluster(self.namespace.as_deref())?
        } else {
            let mut objects = Vec::new();
            for path in &self.files {
                let text = if path.as_os_str() == "-" {
                    std::io::read_to_string(std::io::stdin()).context("reading standard input")?
                } else {
                    std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?
                };
                for document in serde_yaml::Deserializer::from_str(&text) {
                    let value = serde_json::Value::deserialize(document)
                        .with_context(|| format!("parsing {}", path.display()))?;
                    if !value.is_null() {
                        objects.push(value);
                    }
                }
            }
            objects
        };
        let mut converted = 0;
        let mut failed = false;
        for object in &objects {
            match arcwright::migrate::migrate(object) {
                Ok(migrated) => {
                    if converted > 0 {
                        println!("---");
                    }
                    print!("{}", arcwright::migrate::render(&migrated, self.values));
                    converted += 1;
                    for note in &migrated.notes {
                        eprintln!("{}: {note}", migrated.name);
                    }
                }
                Err(arcwright::migrate::MigrateError::NotArc { .. }) => {}
                Err(error) => {
                    eprintln!("error: {error}");
                    failed = true;
                }
            }
        }
        if converted == 0 && !failed {
            bail!(
                "no ARC AutoscalingRunnerSet ({}) found",
                arcwright::migrate::ARC_API_VERSION
            );
        }
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// ARC's AutoscalingRunnerSets as the cluster has them.
fn from_cluster(namespace: Option<&str>) -> anyhow::Result<Vec<serde_json::Value>> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client =
            arcwright::runtime::client(&arcwright::runtime::options::KubeSource::Infer, None)
                .await?;
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "actions.github.com",
            "v1alpha1",
            "AutoscalingRunnerSet",
        ));
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(client, namespace, &resource),
            None => Api::all_with(client, &resource),
        };
        let list = api
            .list(&ListParams::default())
            .await
            .context("listing ARC's AutoscalingRunnerSets (is ARC's CRD installed?)")?;
        list.items
            .into_iter()
            .map(|mut object| {
                object.metadata.managed_fields = None;
                let mut value = serde_json::to_value(&object)?;
                value["apiVersion"] = serde_json::json!(arcwright::migrate::ARC_API_VERSION);
                value["kind"] = serde_json::json!("AutoscalingRunnerSet");
                Ok(value)
            })
            .collect()
    })
}

impl PolicyCommand {
    fn run(self) -> anyhow::Result<ExitCode> {
        let engine = PolicyEngine::new(EngineConfig::default())?;
        match self {
            Self::Test { module, suites } => test(&engine, &module, &suites),
            Self::Eval {
                kind,
                module,
                input,
                settings,
                settings_file,
            } => {
                let module = Arc::new(load(&engine, &module, Some(kind))?);
                let input = read_json(&input)?;
                let settings = match (settings, settings_file) {
                    (Some(text), _) => Some(settings_arg(&text)?),
                    (None, Some(path)) => Some(read_json(&path)?),
                    (None, None) => None,
                };
                let policy = Policy::new(module, "cli", settings.as_ref(), CallLimits::default())?;
                let decision = policy.decide_json(&input)?;
                println!("{}", serde_json::to_string_pretty(&decision)?);
                Ok(ExitCode::SUCCESS)
            }
            Self::Replay {
                trace,
                module,
                settings,
                timeout_millis,
                memory_limit_mib,
                top,
                json,
            } => {
                let text = std::fs::read_to_string(&trace)
                    .with_context(|| format!("reading {}", trace.display()))?;
                let trace = arcwright::recording::read(&text)
                    .with_context(|| format!("reading {}", trace.display()))?;
                let settings = settings.as_deref().map(settings_arg).transpose()?;
                let limits = arcwright::policy::loader::PolicyRef {
                    timeout_millis,
                    memory_limit_mib,
                    ..Default::default()
                }
                .limits()?;
                let candidate =
                    arcwright::lab::candidate(&engine, &module, settings.as_ref(), limits)?;
                let replay = arcwright::lab::replay::replay(&trace, &candidate, top)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&replay)?);
                } else {
                    print!("{}", arcwright::lab::replay::render(&replay, &module));
                }
                Ok(ExitCode::SUCCESS)
            }
            Self::Simulate(args) => args.run(),
            Self::Inspect { module, json } => {
                let module = load(&engine, &module, None)?;
                let info = module.info();
                if json {
                    println!("{}", serde_json::to_string_pretty(info)?);
                    return Ok(ExitCode::SUCCESS);
                }
                println!("world:   {}", info.world);
                println!("kind:    {}", info.kind);
                println!("size:    {} bytes", info.size);
                println!("sha256:  {}", info.sha256);
                println!("exports:");
                for export in &info.exports {
                    println!("  {export}");
                }
                if info.imports.is_empty() {
                    println!("imports: (none)");
                } else {
                    println!("imports:");
                    for import in &info.imports {
                        println!("  {import}");
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            Self::Configmap {
                module,
                name,
                namespace,
                key,
            } => {
                let wasm = module_bytes(&module, None)?;
                // Refuse to package what the controller would refuse to load.
                let loaded = engine.load(&wasm, None)?;
                print!(
                    "{}",
                    configmap_yaml(&loaded, &wasm, &name, namespace.as_deref(), &key)?
                );
                eprintln!(
                    "reference it with:\n  configMapRef: {{name: {name}{}}}\n  sha256: {}",
                    if key == arcwright::policy::loader::DEFAULT_KEY {
                        String::new()
                    } else {
                        format!(", key: {key}")
                    },
                    loaded.sha256()
                );
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

fn test(engine: &PolicyEngine, module: &str, suites: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut loaded: Option<Arc<PolicyModule>> = None;
    for path in suites {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let suite = Suite::from_yaml(&text).with_context(|| format!("in {}", path.display()))?;
        let module = match &loaded {
            Some(module) => Arc::clone(module),
            None => {
                let module = Arc::new(load(engine, module, Some(suite.kind))?);
                loaded = Some(Arc::clone(&module));
                module
            }
        };
        println!("{}", path.display());
        let outcomes = suite::run(&module, &suite, CallLimits::default())
            .with_context(|| format!("in {}", path.display()))?;
        for outcome in outcomes {
            match &outcome.failure {
                None => {
                    passed += 1;
                    println!("  ok    {}", outcome.name);
                }
                Some(why) => {
                    failed += 1;
                    println!("  FAIL  {}: {why}", outcome.name);
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The value of `--settings`: inline JSON, or `@PATH` for a file.
fn settings_arg(text: &str) -> anyhow::Result<serde_json::Value> {
    match text.strip_prefix('@') {
        Some(path) => read_json(Path::new(path)),
        None => serde_json::from_str(text).with_context(|| {
            format!(
                "--settings {text:?} is not valid JSON (give a file as --settings-file PATH \
                 or --settings @PATH)"
            )
        }),
    }
}

/// Reads JSON (or YAML, its superset) into a JSON value.
fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn configmap_yaml(
    module: &PolicyModule,
    wasm: &[u8],
    name: &str,
    namespace: Option<&str>,
    key: &str,
) -> anyhow::Result<String> {
    let mut out = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n");
    out.push_str(&format!("  name: {}\n", serde_json::to_string(name)?));
    if let Some(namespace) = namespace {
        out.push_str(&format!(
            "  namespace: {}\n",
            serde_json::to_string(namespace)?
        ));
    }
    out.push_str("  annotations:\n");
    out.push_str(&format!(
        "    arcwright.dev/policy-kind: {}\n",
        module.kind()
    ));
    out.push_str(&format!(
        "    arcwright.dev/policy-sha256: \"{}\"\n",
        module.sha256()
    ));
    out.push_str("binaryData:\n");
    out.push_str(&format!(
        "  {}: {}\n",
        serde_json::to_string(key)?,
        base64::engine::general_purpose::STANDARD.encode(wasm)
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn settings_are_inline_json_or_a_file() {
        assert_eq!(
            settings_arg(r#"{"batch": 4}"#).unwrap(),
            serde_json::json!({"batch": 4})
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.yaml");
        std::fs::write(&path, "batch: 2\n").unwrap();
        assert_eq!(
            settings_arg(&format!("@{}", path.display())).unwrap(),
            serde_json::json!({"batch": 2})
        );
        let err = format!("{:#}", settings_arg("settings.json").unwrap_err());
        assert!(err.contains("--settings-file PATH"), "{err}");
    }

    #[test]
    fn kinds_parse_by_their_yaml_names() {
        assert_eq!(parse_kind("pod-validation"), Ok(PolicyKind::PodValidation));
        assert!(
            parse_kind("podvalidation")
                .unwrap_err()
                .contains("expected scaling")
        );
    }
}
