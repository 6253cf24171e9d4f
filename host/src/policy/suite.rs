//! YAML test suites for policies, run through the real engine.
//!
//! The same suites prove the bundled policies in `cargo test` and let a
//! policy author check a module with `arcwright policy test`, so a suite
//! that passes in CI passes for the bytes that run in the cluster. The
//! format:
//!
//! ```yaml
//! kind: scaling                 # scaling | deregistration | pod-validation
//! cases:
//!   - name: scales to min plus assigned jobs
//!     settings: {idle: 2}       # optional; validate-settings runs first
//!     input: {...}              # the JSON form of the input (see `types`)
//!     expect:                   # every key given must match; others ignored
//!       desired: 4
//!       reason: "assigned"      # substring
//!       state: '{"since": 1}'   # exact text; `state: null` = none returned
//!   - name: rejects a bad setting
//!     settings: {idle: -1}
//!     expectSettingsError: "idle"   # substring of validate-settings' Err
//!   - name: decision error
//!     input: {...}
//!     expectError: "substring"      # decide returned Err, or the engine failed
//! ```
//!
//! Deregistration cases expect `{verdict, reason}`; pod-validation cases
//! expect `{violations: [{path, message}]}`, where the set of paths must be
//! exactly the one given (in any order) and each message is a substring.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::types::{
    Decision, PodValidationInput, RunnerEnding, ScalingInput, Violation, from_json, from_json_at,
    join_path, not_a_field,
};
use super::{CallLimits, Policy, PolicyError, PolicyKind, PolicyModule};

/// Why a suite could not be run at all (as opposed to a case failing).
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The YAML does not have the suite's shape.
    #[error("the suite is not valid: {0}")]
    Parse(String),
    /// The suite is for another kind of policy than the module.
    #[error("the suite is for {suite} policies, but the module is a {module} policy")]
    KindMismatch {
        /// The suite's kind.
        suite: PolicyKind,
        /// The module's kind.
        module: PolicyKind,
    },
}

/// A parsed suite.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Suite {
    /// The kind of policy the cases are for.
    pub kind: PolicyKind,
    /// The cases, run in order.
    pub cases: Vec<Case>,
}

/// One case of a suite.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Case {
    /// What the case shows.
    pub name: String,
    /// Settings for this case; when given, `validate-settings` runs first.
    #[serde(default)]
    pub settings: Option<Value>,
    /// The JSON form of the input.
    #[serde(default)]
    pub input: Option<Value>,
    /// Expected fields of the decision.
    #[serde(default)]
    pub expect: Option<Map<String, Value>>,
    /// Expected substring of the settings error.
    #[serde(default)]
    pub expect_settings_error: Option<String>,
    /// Expected substring of the decision error.
    #[serde(default)]
    pub expect_error: Option<String>,
}

impl Suite {
    /// Parses a suite from YAML, refusing what would make a case test less
    /// than it seems to: a misspelt key anywhere outside `settings` (the
    /// message names its path and the field it probably meant), an input a
    /// decision of the suite's kind would not read, and a case that checks
    /// nothing.
    pub fn from_yaml(text: &str) -> Result<Self, SuiteError> {
        let parse = |e: String| SuiteError::Parse(e);
        let document: Value = serde_yaml::from_str(text).map_err(|e| parse(e.to_string()))?;
        let suite: Suite = from_json(&document).map_err(parse)?;
        for (index, case) in suite.cases.iter().enumerate() {
            case.check(suite.kind, &format!("cases[{index}]"))
                .map_err(|problem| parse(format!("case {:?}: {problem}", case.name)))?;
        }
        Ok(suite)
    }
}

/// The keys `expect` may hold for each kind.
fn expect_fields(kind: PolicyKind) -> &'static [&'static str] {
    match kind {
        PolicyKind::Scaling => &["desired", "reason", "state"],
        PolicyKind::Deregistration => &["verdict", "reason"],
        PolicyKind::PodValidation => &["violations"],
    }
}

/// One expected violation of a pod-validation case.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedViolation {
    path: String,
    #[serde(default)]
    message: Option<String>,
}

impl Case {
    /// Refuses a case that would check less than it seems to; `at` is its
    /// path in the suite.
    fn check(&self, kind: PolicyKind, at: &str) -> Result<(), String> {
        if self.expect_settings_error.is_some() {
            let ignored: Vec<&str> = [
                ("input", self.input.is_some()),
                ("expect", self.expect.is_some()),
                ("expectError", self.expect_error.is_some()),
            ]
            .into_iter()
            .filter_map(|(key, given)| given.then_some(key))
            .collect();
            if !ignored.is_empty() {
                return Err(format!(
                    "it expects a settings error, so no decision is made and its {} would never \
                     be checked; move them to a case of their own",
                    ignored.join(" and ")
                ));
            }
            return Ok(());
        }
        let Some(input) = &self.input else {
            return Err("it has neither an input nor expectSettingsError".into());
        };
        typed_input(kind, &join_path(at, "input"), input)?;
        match (&self.expect, &self.expect_error) {
            (None, None) => Err("it has an input but neither expect nor expectError".into()),
            (Some(_), Some(_)) => {
                Err("it has both expect and expectError; a decision either fails or answers".into())
            }
            (None, Some(_)) => Ok(()),
            (Some(expect), None) if expect.is_empty() => Err(format!(
                "its expect checks nothing; give at least one of {}",
                expect_fields(kind).join(", ")
            )),
            (Some(expect), None) => {
                let fields = expect_fields(kind);
                let expect_at = join_path(at, "expect");
                for key in expect.keys() {
                    if !fields.contains(&key.as_str()) {
                        return Err(not_a_field(&expect_at, key, fields));
                    }
                }
                if let Some(violations) = expect.get("violations") {
                    from_json_at::<Vec<ExpectedViolation>>(
                        &join_path(&expect_at, "violations"),
                        violations,
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Parses `input` as the input of a `kind` decision, so a misspelt key is
/// refused with its path before anything runs.
fn typed_input(kind: PolicyKind, at: &str, input: &Value) -> Result<(), String> {
    match kind {
        PolicyKind::Scaling => from_json_at::<ScalingInput>(at, input).map(drop),
        PolicyKind::Deregistration => from_json_at::<RunnerEnding>(at, input).map(drop),
        PolicyKind::PodValidation => from_json_at::<PodValidationInput>(at, input).map(drop),
    }
}

/// The result of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseOutcome {
    /// The case's name.
    pub name: String,
    /// `None` when it passed, otherwise what went wrong.
    pub failure: Option<String>,
}

impl CaseOutcome {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// Runs every case of `suite` against `module`, each in fresh instances,
/// within `limits` (`arcwright policy test` gives production's, so a policy
/// that passes also fits the deadline it will run under).
pub fn run(
    module: &Arc<PolicyModule>,
    suite: &Suite,
    limits: CallLimits,
) -> Result<Vec<CaseOutcome>, SuiteError> {
    if suite.kind != module.kind() {
        return Err(SuiteError::KindMismatch {
            suite: suite.kind,
            module: module.kind(),
        });
    }
    Ok(suite
        .cases
        .iter()
        .map(|case| CaseOutcome {
            name: case.name.clone(),
            failure: run_case(module, suite.kind, case, limits).err(),
        })
        .collect())
}

fn run_case(
    module: &Arc<PolicyModule>,
    kind: PolicyKind,
    case: &Case,
    limits: CallLimits,
) -> Result<(), String> {
    let label = "suite";
    let policy = match (&case.settings, &case.expect_settings_error) {
        (settings, Some(expected)) => {
            match Policy::new(Arc::clone(module), label, settings.as_ref(), limits) {
                Ok(_) => {
                    return Err(format!(
                        "the settings were accepted; expected an error containing {expected:?}"
                    ));
                }
                Err(PolicyError::SettingsRejected(message))
                    if message.contains(expected.as_str()) =>
                {
                    return Ok(());
                }
                Err(PolicyError::SettingsRejected(message)) => {
                    return Err(format!(
                        "the settings error {message:?} does not contain {expected:?}"
                    ));
                }
                Err(other) => return Err(format!("validating the settings failed: {other}")),
            }
        }
        (Some(settings), None) => Policy::new(Arc::clone(module), label, Some(settings), limits)
            .map_err(|e| format!("validating the settings failed: {e}"))?,
        (None, None) => Policy::unvalidated(Arc::clone(module), label, limits),
    };
    let input = case.input.as_ref().ok_or("the case has no input")?;
    let result = policy.decide_json(input);
    match (&case.expect_error, result) {
        (Some(expected), Err(error)) => {
            let message = error.to_string();
            if message.contains(expected.as_str()) {
                Ok(())
            } else {
                Err(format!(
                    "the error {message:?} does not contain {expected:?}"
                ))
            }
        }
        (Some(expected), Ok(decision)) => Err(format!(
            "expected an error containing {expected:?}, got {}",
            serde_json::to_string(&decision).unwrap_or_default()
        )),
        (None, Err(error)) => Err(format!("the decision failed: {error}")),
        (None, Ok(decision)) => check(
            kind,
            case.expect.as_ref().ok_or("the case has no expect")?,
            &decision,
        ),
    }
}

/// Compares a decision with the expected fields.
fn check(kind: PolicyKind, expect: &Map<String, Value>, decision: &Decision) -> Result<(), String> {
    let mut problems = Vec::new();
    for (key, expected) in expect {
        let problem = match (decision, key.as_str()) {
            (Decision::Scaling(d), "desired") => match expected.as_u64() {
                Some(n) if n == u64::from(d.desired) => None,
                Some(n) => Some(format!("desired is {}, expected {n}", d.desired)),
                None => Some(format!("expect.desired must be a number, got {expected}")),
            },
            (Decision::Scaling(d), "reason") => substring("reason", &d.reason, expected),
            (Decision::Scaling(d), "state") => {
                let actual = d
                    .state
                    .as_ref()
                    .map(|s| String::from_utf8_lossy(s).into_owned());
                match (expected, actual) {
                    (Value::Null, None) => None,
                    (Value::Null, Some(actual)) => {
                        Some(format!("state is {actual:?}, expected none"))
                    }
                    (Value::String(e), Some(actual)) if *e == actual => None,
                    (Value::String(e), actual) => {
                        Some(format!("state is {actual:?}, expected {e:?}"))
                    }
                    (other, _) => Some(format!("expect.state must be text or null, got {other}")),
                }
            }
            (Decision::Deregistration(d), "verdict") => {
                let actual = serde_json::to_value(d.verdict).unwrap_or_default();
                (actual != *expected).then(|| format!("verdict is {actual}, expected {expected}"))
            }
            (Decision::Deregistration(d), "reason") => substring("reason", &d.reason, expected),
            (Decision::PodValidation(d), "violations") => violations(&d.violations, expected),
            (_, other) => Some(format!(
                "{kind} decisions have no field {other:?} to expect"
            )),
        };
        problems.extend(problem);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} (decision: {})",
            problems.join("; "),
            serde_json::to_string(decision).unwrap_or_default()
        ))
    }
}

fn substring(what: &str, actual: &str, expected: &Value) -> Option<String> {
    match expected.as_str() {
        Some(e) if actual.contains(e) => None,
        Some(e) => Some(format!("{what} {actual:?} does not contain {e:?}")),
        None => Some(format!("expect.{what} must be text, got {expected}")),
    }
}

fn violations(actual: &[Violation], expected: &Value) -> Option<String> {
    let expected: Vec<ExpectedViolation> = match from_json(expected) {
        Ok(list) => list,
        Err(e) => {
            return Some(format!(
                "expect.violations must be a list of {{path, message}}: {e}"
            ));
        }
    };
    let mut want: Vec<&str> = expected.iter().map(|v| v.path.as_str()).collect();
    let mut got: Vec<&str> = actual.iter().map(|v| v.path.as_str()).collect();
    want.sort_unstable();
    want.dedup();
    got.sort_unstable();
    got.dedup();
    if want != got {
        return Some(format!("violation paths are {got:?}, expected {want:?}"));
    }
    for e in &expected {
        if let Some(message) = &e.message
            && !actual
                .iter()
                .any(|v| v.path == e.path && v.message.contains(message.as_str()))
        {
            return Some(format!("no violation at {} contains {message:?}", e.path));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::types::{
        DeregistrationDecision, PodValidationDecision, ScalingDecision, Verdict,
    };

    fn map(yaml: &str) -> Map<String, Value> {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn refused(yaml: &str) -> String {
        Suite::from_yaml(yaml).unwrap_err().to_string()
    }

    #[test]
    fn a_case_needs_something_to_check() {
        let table: &[(&str, &str)] = &[
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {}\n",
                "neither expect nor expectError",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {}\n    expect: {}\n",
                "its expect checks nothing; give at least one of desired, reason, state",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n",
                "neither an input nor expectSettingsError",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n    settings: {a: 1}\n    expectSettingsError: a\n    input: {}\n    expect: {desired: 1}\n",
                "its input and expect would never be checked",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {}\n    expect: {desired: 1}\n    expectError: boom\n",
                "both expect and expectError",
            ),
            ("kind: sideways\ncases: []\n", "sideways"),
        ];
        for (yaml, expected) in table {
            let err = refused(yaml);
            assert!(err.contains(expected), "{yaml}: {err}");
        }
        assert!(Suite::from_yaml("kind: pod-validation\ncases:\n  - name: x\n    input: {}\n    expect: {violations: []}\n").is_ok());
        assert!(Suite::from_yaml("kind: scaling\ncases:\n  - name: x\n    settings: {anything: [1]}\n    expectSettingsError: anything\n").is_ok());
    }

    #[test]
    fn misspelt_keys_are_refused_with_their_path() {
        let table: &[(&str, &str)] = &[
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {scaleSet: {minRunner: 1}}\n    expect: {desired: 1}\n",
                "case \"x\": `cases[0].input.scaleSet.minRunner` is not a field; did you mean `minRunners`?",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {}\n    expect: {desird: 1}\n",
                "case \"x\": `cases[0].expect.desird` is not a field; did you mean `desired`?",
            ),
            (
                "kind: deregistration\ncases:\n  - name: ok\n    input: {}\n    expect: {verdict: remove-now}\n  - name: y\n    input: {}\n    expect: {desired: 1}\n",
                "case \"y\": `cases[1].expect.desired` is not a field; the fields are verdict, reason",
            ),
            (
                "kind: pod-validation\ncases:\n  - name: x\n    input: {}\n    expect: {violations: [{path: a, mesage: b}]}\n",
                "`cases[0].expect.violations[0].mesage` is not a field; did you mean `message`?",
            ),
            (
                "kind: scaling\ncases:\n  - name: x\n    input: {}\n    expct: {desired: 1}\n",
                "`cases[0].expct` is not a field; did you mean `expect`?",
            ),
            (
                "kind: scaling\ncase:\n  - name: x\n",
                "`case` is not a field; did you mean `cases`?",
            ),
        ];
        for (yaml, expected) in table {
            let err = refused(yaml);
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn scaling_expectations() {
        let decision = Decision::Scaling(ScalingDecision {
            desired: 4,
            clamped_from: None,
            reason: "min 1 + 3 assigned".into(),
            state: None,
        });
        assert!(
            check(
                PolicyKind::Scaling,
                &map("{desired: 4, reason: assigned, state: null}"),
                &decision
            )
            .is_ok()
        );
        let err = check(
            PolicyKind::Scaling,
            &map("{desired: 5, state: 'x'}"),
            &decision,
        )
        .unwrap_err();
        assert!(err.contains("desired is 4, expected 5"), "{err}");
        assert!(err.contains("expected \"x\""), "{err}");
        let err = check(
            PolicyKind::Scaling,
            &map("{verdict: remove-now}"),
            &decision,
        )
        .unwrap_err();
        assert!(err.contains("no field \"verdict\""), "{err}");
    }

    #[test]
    fn deregistration_expectations() {
        let decision = Decision::Deregistration(DeregistrationDecision {
            verdict: Verdict::RemoveAfterJob,
            reason: "it had a job".into(),
        });
        assert!(
            check(
                PolicyKind::Deregistration,
                &map("{verdict: remove-after-job, reason: job}"),
                &decision
            )
            .is_ok()
        );
        assert!(
            check(
                PolicyKind::Deregistration,
                &map("{verdict: remove-now}"),
                &decision
            )
            .is_err()
        );
    }

    #[test]
    fn violations_are_an_exact_set_of_paths() {
        let decision = Decision::PodValidation(PodValidationDecision {
            violations: vec![
                Violation {
                    path: "spec.restartPolicy".into(),
                    message: "must be Never".into(),
                },
                Violation {
                    path: "spec.containers[0].image".into(),
                    message: "is missing".into(),
                },
            ],
        });
        let ok = map(
            "{violations: [{path: 'spec.containers[0].image'}, {path: spec.restartPolicy, message: Never}]}",
        );
        assert!(check(PolicyKind::PodValidation, &ok, &decision).is_ok());
        let missing = map("{violations: [{path: spec.restartPolicy}]}");
        assert!(check(PolicyKind::PodValidation, &missing, &decision).is_err());
        let wrong_message = map(
            "{violations: [{path: 'spec.containers[0].image'}, {path: spec.restartPolicy, message: Always}]}",
        );
        assert!(check(PolicyKind::PodValidation, &wrong_message, &decision).is_err());
        assert!(
            check(
                PolicyKind::PodValidation,
                &map("{violations: []}"),
                &decision
            )
            .is_err()
        );
    }
}
