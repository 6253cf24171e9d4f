//! Changing a hold from outside the reconciler: extending it by a duration
//! or releasing it now, for the Slack buttons and the hold API.
//!
//! Both only write the `arcwright.dev/hold-until` annotation, as `kubectl
//! annotate` would; the runner's reconciler reads it, applies the cap and
//! ends the hold. The cap is applied here too, so what the caller is told
//! is what the reconciler will do.

use std::time::Duration;

use jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::hold::{DebugSpecError, HOLD_UNTIL_ANNOTATION, Hold, format_hold_until};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase};

/// What to do to a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldChange {
    /// Move its end this much later (from now, if it has passed), capped.
    Extend(Duration),
    /// End it now.
    Release,
}

/// Why a hold could not be changed. Messages are safe to show the caller.
#[derive(Debug, thiserror::Error)]
pub enum HoldControlError {
    /// No such runner.
    #[error("EphemeralRunner {namespace}/{name} does not exist")]
    NotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The runner is not in a hold.
    #[error("EphemeralRunner {namespace}/{name} is not held for debugging (phase {phase})")]
    NotHeld {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its phase.
        phase: &'static str,
    },
    /// Its debug settings cannot be followed.
    #[error("the runner's debug settings are invalid: {0}")]
    Spec(#[from] DebugSpecError),
    /// The runner kept changing under the write.
    #[error("EphemeralRunner {namespace}/{name} kept changing; try again")]
    Contended {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A Kubernetes API call failed.
    #[error("the Kubernetes API refused to {action}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Extends or releases the hold of `namespace/name`; returns its new end.
///
/// The write is conditional on the runner's resourceVersion, so two
/// presses at once both count rather than one overwriting the other's
/// extension; a conflict is retried on a fresh read, a few times.
pub async fn change_hold(
    client: &Client,
    namespace: &str,
    name: &str,
    change: HoldChange,
) -> Result<Timestamp, HoldControlError> {
    let api: Api<EphemeralRunner> = Api::namespaced(client.clone(), namespace);
    for _ in 0..4 {
        let runner = api
            .get_opt(name)
            .await
            .map_err(|source| HoldControlError::Kube {
                action: "read the EphemeralRunner",
                source,
            })?
            .ok_or_else(|| HoldControlError::NotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })?;
        let until = new_end(&runner, change, Timestamp::now())?;
        let patch = json!({"metadata": {
            "resourceVersion": runner.resource_version(),
            "annotations": { HOLD_UNTIL_ANNOTATION: format_hold_until(until) },
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(until),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(source) => {
                return Err(HoldControlError::Kube {
                    action: "annotate the EphemeralRunner",
                    source,
                });
            }
        }
    }
    Err(HoldControlError::Contended {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// The end a change gives the runner's hold; pure, for the tests.
pub fn new_end(
    runner: &EphemeralRunner,
    change: HoldChange,
    now: Timestamp,
) -> Result<Timestamp, HoldControlError> {
    let status = runner.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let not_held = || HoldControlError::NotHeld {
        namespace: runner.namespace().unwrap_or_default(),
        name: runner.name_any(),
        phase: phase.as_str(),
    };
    if phase != EphemeralRunnerPhase::Debugging {
        return Err(not_held());
    }
    let hold = Hold::from_spec(runner.spec.debug.as_ref())?.ok_or_else(not_held)?;
    let since = status
        .held_since
        .as_ref()
        .or(status.job_finished_at.as_ref())
        .map_or(now, |t| t.0);
    let current = hold
        .deadline(
            since,
            runner
                .annotations()
                .get(HOLD_UNTIL_ANNOTATION)
                .map(String::as_str),
        )
        .at;
    Ok(match change {
        HoldChange::Extend(by) => hold.extended(since, current, by, now),
        HoldChange::Release => now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DebugSpec, EphemeralRunnerSpec, EphemeralRunnerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn runner(phase: EphemeralRunnerPhase, annotation: Option<Timestamp>) -> EphemeralRunner {
        let mut r = EphemeralRunner::new(
            "r",
            EphemeralRunnerSpec {
                debug: Some(DebugSpec {
                    hold_failed_for: Some("10m".into()),
                    max_hold: Some("1h".into()),
                    ..DebugSpec::default()
                }),
                ..EphemeralRunnerSpec::default()
            },
        );
        r.status = Some(EphemeralRunnerStatus {
            phase: Some(phase),
            held_since: Some(Time(at(0))),
            ..EphemeralRunnerStatus::default()
        });
        if let Some(a) = annotation {
            r.metadata.annotations =
                Some([(HOLD_UNTIL_ANNOTATION.to_string(), a.to_string())].into());
        }
        r
    }

    #[test]
    fn extending_and_releasing_move_the_end_within_the_cap() {
        let debugging = EphemeralRunnerPhase::Debugging;
        let extend = HoldChange::Extend(Duration::from_secs(1800));
        let rows = [
            (
                "from the default end",
                runner(debugging, None),
                extend,
                at(2400),
            ),
            (
                "from an earlier extension",
                runner(debugging, Some(at(2000))),
                extend,
                at(3600),
            ),
            (
                "release",
                runner(debugging, Some(at(2000))),
                HoldChange::Release,
                at(100),
            ),
        ];
        for (name, runner, change, want) in rows {
            assert_eq!(new_end(&runner, change, at(100)).unwrap(), want, "{name}");
        }
        let not_held = new_end(&runner(EphemeralRunnerPhase::Running, None), extend, at(1));
        assert!(
            matches!(
                not_held,
                Err(HoldControlError::NotHeld {
                    phase: "Running",
                    ..
                })
            ),
            "{not_held:?}"
        );
    }
}
