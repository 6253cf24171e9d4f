//! The bundled `default` pod-validation policy: rejects runner pod
//! templates that would make runners fail or churn, or that reach into the
//! node, before a single runner is built from them.
//!
//! A bad template is cheaper to refuse than to run: a pod without a
//! `runner` container never registers and is recreated forever; a restart
//! policy other than `Never` restarts an ephemeral runner whose registration
//! is already spent; a missing image fails every pod. Host namespaces and
//! privileged containers hand a job the node, and a job runs code from any
//! branch of the repository, so they are refused unless the admin says
//! otherwise in settings.
//!
//! Settings (all default `false`):
//! - `allowHostAccess`: permit `hostNetwork`, `hostPID`, `hostIPC`;
//! - `allowPrivileged`: permit privileged containers (e.g. Docker-in-Docker);
//! - `requireResources`: the runner container must set resource requests and
//!   limits, so a noisy job cannot starve its neighbours.
//!
//! The policy reports every problem it finds, not just the first, so an
//! admin fixes a template in one round.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use arcwright_guest::Settings;
use arcwright_guest::settings::describe;
use exports::arcwright::policy::pod_validation::{Guest, PodValidationInput, Violation};
use serde_json::Value;

wit_bindgen::generate!({ world: "pod-validation-policy", path: "../../wit" });

const KEYS: &[&str] = &["allowHostAccess", "allowPrivileged", "requireResources"];

/// The container the controller runs the runner in; the name is fixed by
/// the runner image's contract, as in ARC.
const RUNNER_CONTAINER: &str = "runner";

/// Environment variables the controller sets on the runner container. A
/// template that sets them would override the JIT config or the exit-code
/// contract that deregistration relies on.
const RESERVED_ENV: &[&str] = &[
    "ACTIONS_RUNNER_INPUT_JITCONFIG",
    "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE",
    "GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT",
];

#[derive(Debug, Default, Clone, Copy)]
struct Options {
    allow_host_access: bool,
    allow_privileged: bool,
    require_resources: bool,
}

impl Options {
    fn parse(text: &str) -> Result<Self, String> {
        let settings = Settings::parse(text, KEYS)?;
        Ok(Self {
            allow_host_access: settings.bool("allowHostAccess")?.unwrap_or(false),
            allow_privileged: settings.bool("allowPrivileged")?.unwrap_or(false),
            require_resources: settings.bool("requireResources")?.unwrap_or(false),
        })
    }
}

/// The most violations listed one by one. The host refuses answers with
/// more than 256 (and would fall back to this very policy), and nobody
/// reads past the first screenful; the rest are summed up in one line.
const MAX_LISTED: usize = 100;

/// Collects violations.
#[derive(Default)]
struct Findings {
    listed: Vec<Violation>,
    unlisted: usize,
}

impl Findings {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        if self.listed.len() < MAX_LISTED {
            self.listed.push(Violation {
                path: path.into(),
                message: message.into(),
            });
        } else {
            self.unlisted += 1;
        }
    }

    fn finish(mut self) -> Vec<Violation> {
        if self.unlisted > 0 {
            self.listed.push(Violation {
                path: String::from("spec"),
                message: format!("{} more violations not listed", self.unlisted),
            });
        }
        self.listed
    }
}

/// The containers of a list field (`containers`, `initContainers`, …),
/// each with its path. A field of the wrong type is itself a violation.
fn containers<'a>(
    spec: &'a Value,
    field: &str,
    findings: &mut Findings,
) -> Vec<(String, &'a Value)> {
    match spec.get(field) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(index, container)| (format!("spec.{field}[{index}]"), container))
            .collect(),
        Some(other) => {
            findings.add(
                format!("spec.{field}"),
                format!("must be a list of containers, got {}", describe(other)),
            );
            Vec::new()
        }
    }
}

fn is_true(value: Option<&Value>) -> bool {
    value.and_then(Value::as_bool).unwrap_or(false)
}

fn check_runner(path: &str, runner: &Value, options: Options, findings: &mut Findings) {
    match runner.get("image") {
        Some(Value::String(image)) if !image.trim().is_empty() => {}
        _ => findings.add(
            format!("{path}.image"),
            "the runner container has no image: every runner pod would fail to start",
        ),
    }

    if options.require_resources {
        let resources = runner.get("resources");
        for kind in ["requests", "limits"] {
            let set = resources
                .and_then(|r| r.get(kind))
                .and_then(Value::as_object)
                .is_some_and(|map| !map.is_empty());
            if !set {
                findings.add(
                    format!("{path}.resources.{kind}"),
                    format!(
                        "the runner container must set resource {kind} (requireResources is on)"
                    ),
                );
            }
        }
    }

    if let Some(env) = runner.get("env").and_then(Value::as_array) {
        for (index, variable) in env.iter().enumerate() {
            let name = variable.get("name").and_then(Value::as_str).unwrap_or("");
            if RESERVED_ENV.contains(&name) {
                findings.add(
                    format!("{path}.env[{index}].name"),
                    format!("{name} is reserved: the controller sets it on the runner container"),
                );
            }
        }
    }
}

fn validate(template: &Value, options: Options) -> Result<Vec<Violation>, String> {
    if !template.is_object() {
        return Err(format!(
            "the pod template must be a JSON object (a PodTemplateSpec), got {}",
            describe(template)
        ));
    }
    let mut findings = Findings::default();
    let spec = match template.get("spec") {
        Some(spec @ Value::Object(_)) => spec,
        Some(other) => {
            findings.add(
                "spec",
                format!("must be an object, got {}", describe(other)),
            );
            return Ok(findings.finish());
        }
        None => {
            findings.add(
                "spec",
                "the template has no spec: there is no runner container to run",
            );
            return Ok(findings.finish());
        }
    };

    let main = containers(spec, "containers", &mut findings);
    let runner = main.iter().find(|(_, container)| {
        container.get("name").and_then(Value::as_str) == Some(RUNNER_CONTAINER)
    });
    match runner {
        Some((path, runner)) => check_runner(path, runner, options, &mut findings),
        None => findings.add(
            "spec.containers",
            "no container named `runner`: the controller runs the runner in the container of that name",
        ),
    }

    match spec.get("restartPolicy") {
        None | Some(Value::Null) => {}
        Some(Value::String(policy)) if policy == "Never" => {}
        Some(other) => findings.add(
            "spec.restartPolicy",
            format!(
                "must be Never (or left out), got {}: a restarted ephemeral runner has already spent its registration",
                describe(other)
            ),
        ),
    }

    if !options.allow_host_access {
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            if is_true(spec.get(field)) {
                findings.add(
                    format!("spec.{field}"),
                    format!(
                        "{field} gives jobs the node's namespaces; set allowHostAccess to permit it"
                    ),
                );
            }
        }
    }

    if !options.allow_privileged {
        let init = containers(spec, "initContainers", &mut findings);
        let ephemeral = containers(spec, "ephemeralContainers", &mut findings);
        for (path, container) in main.iter().chain(&init).chain(&ephemeral) {
            let privileged = container
                .get("securityContext")
                .and_then(|context| context.get("privileged"));
            if is_true(privileged) {
                findings.add(
                    format!("{path}.securityContext.privileged"),
                    "a privileged container gives jobs the node; set allowPrivileged to permit it"
                        .to_string(),
                );
            }
        }
    }

    Ok(findings.finish())
}

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: String) -> Result<(), String> {
        Options::parse(&settings).map(drop)
    }

    fn validate(input: PodValidationInput) -> Result<Vec<Violation>, String> {
        let options = Options::parse(&input.settings)?;
        let template = arcwright_guest::json::parse("the pod template", input.template.as_bytes())?;
        validate(&template, options)
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    fn input(template: &str, settings: &str) -> PodValidationInput {
        PodValidationInput {
            template: template.into(),
            settings: settings.into(),
        }
    }

    #[test]
    fn a_template_that_is_not_json_is_an_error_not_a_violation() {
        let error = <Policy as Guest>::validate(input("spec: {}", "")).unwrap_err();
        assert!(
            error.starts_with("the pod template is not valid JSON"),
            "{error}"
        );
    }

    #[test]
    fn settings_are_checked_on_every_call() {
        let error = <Policy as Guest>::validate(input("{}", r#"{"allow": true}"#)).unwrap_err();
        assert!(error.starts_with("unknown setting `allow`"), "{error}");
    }

    #[test]
    fn the_list_is_capped_with_a_summary() {
        let mut findings = Findings::default();
        for index in 0..MAX_LISTED + 5 {
            findings.add(format!("spec.containers[{index}]"), "x");
        }
        let violations = findings.finish();
        assert_eq!(violations.len(), MAX_LISTED + 1);
        assert_eq!(
            violations[MAX_LISTED].message,
            "5 more violations not listed"
        );
    }
}
