//! Changing a hold from outside the reconciler: extending it by a duration
//! or releasing it now, for the Slack buttons and the hold API.
//!
//! Both only write the `arcwright.dev/hold-until` annotation, as `kubectl
//! annotate` would; the runner's reconciler reads it, applies the cap and
//! ends the hold. The cap is applied here too, so what the caller is told
//! is what the reconciler will do.
//!
//! A Slack press must act once however many replicas it reaches: Slack
//! retries, and a captured request can be sent again within its
//! signature's five minutes, to any replica behind the Service. So a press
//! is recorded on the runner itself ([`PRESSES_TAKEN_ANNOTATION`]), in the
//! same conditional write as the hold it changes: a second replica reading
//! the runner sees the press taken, and two replicas taking it at once meet
//! the resourceVersion precondition, the loser re-reads and sees it. A
//! memory of presses per process would let each replica act once.

use std::time::Duration;

use jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

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
    /// The press was taken already, by this replica or another.
    #[error("EphemeralRunner {namespace}/{name}'s hold was changed by this press already")]
    Taken {
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

/// The annotation recording the Slack presses a runner's hold has taken
/// within their signatures' window: `<signed at>:<digest>` entries, space
/// separated. The digest is of the request's signature, so the annotation
/// tells nobody a signature to send again.
pub const PRESSES_TAKEN_ANNOTATION: &str = "arcwright.dev/slack-presses-taken";

/// How long a press is remembered: the signature check's five minutes and
/// a minute for clocks that disagree.
const PRESS_MEMORY_SECS: i64 = 6 * 60;

/// At most this many presses are remembered on a runner; a burst beyond it
/// within six minutes forgets the oldest, which a replay could then take
/// again (one extension more, still within the hold's cap).
const PRESSES_KEPT: usize = 32;

/// One signed request, to be taken once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Press {
    digest: String,
    signed_at: i64,
}

impl Press {
    /// The press whose request carries `signature`, signed at `signed_at`
    /// (Unix seconds).
    pub fn new(signature: &str, signed_at: i64) -> Press {
        let digest = Sha256::digest(signature.as_bytes());
        Press {
            digest: digest[..12].iter().map(|b| format!("{b:02x}")).collect(),
            signed_at,
        }
    }
}

/// The annotation's value once `press` is taken at `now`, the presses past
/// their window dropped; `None` when `press` was taken already. Pure, for
/// the tests.
pub fn take_press(taken: Option<&str>, press: &Press, now: i64) -> Option<String> {
    let mut kept: Vec<(i64, &str)> = taken
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|entry| {
            let (at, digest) = entry.split_once(':')?;
            Some((at.parse().ok()?, digest))
        })
        .filter(|(at, _)| now - at <= PRESS_MEMORY_SECS)
        .collect();
    if kept.iter().any(|(_, digest)| *digest == press.digest) {
        return None;
    }
    kept.push((press.signed_at, &press.digest));
    kept.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    kept.truncate(PRESSES_KEPT);
    Some(
        kept.iter()
            .map(|(at, digest)| format!("{at}:{digest}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Extends or releases the hold of `namespace/name`; returns its new end.
/// With `press`, the change is that press's and is taken once
/// ([`HoldControlError::Taken`] after that).
///
/// The write is conditional on the runner's resourceVersion, so two
/// presses at once both count rather than one overwriting the other's
/// extension; a conflict is retried on a fresh read, a few times.
pub async fn change_hold(
    client: &Client,
    namespace: &str,
    name: &str,
    change: HoldChange,
    press: Option<&Press>,
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
        let now = Timestamp::now();
        let mut annotations = serde_json::Map::new();
        if let Some(press) = press {
            let taken = runner
                .annotations()
                .get(PRESSES_TAKEN_ANNOTATION)
                .map(String::as_str);
            let Some(taken) = take_press(taken, press, now.as_second()) else {
                return Err(HoldControlError::Taken {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                });
            };
            annotations.insert(PRESSES_TAKEN_ANNOTATION.into(), taken.into());
        }
        let until = new_end(&runner, change, now)?;
        annotations.insert(
            HOLD_UNTIL_ANNOTATION.into(),
            format_hold_until(until).into(),
        );
        let patch = json!({"metadata": {
            "resourceVersion": runner.resource_version(),
            "annotations": annotations,
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
    fn a_press_is_taken_once_and_forgotten_after_its_window() {
        let first = Press::new("v0=aaaa", 1000);
        let second = Press::new("v0=bbbb", 1010);
        let once = take_press(None, &first, 1000).unwrap();
        assert!(!once.contains("aaaa"), "the signature itself is not kept");
        assert_eq!(take_press(Some(&once), &first, 1001), None, "a replay");
        let both = take_press(Some(&once), &second, 1010).unwrap();
        assert_eq!(take_press(Some(&both), &first, 1300), None);
        assert_eq!(take_press(Some(&both), &second, 1300), None);
        // Past six minutes the signature check refuses the request anyway,
        // so the press is forgotten.
        let later = take_press(Some(&both), &Press::new("v0=cccc", 1400), 1400).unwrap();
        assert_eq!(later.split_whitespace().count(), 1, "{later}");
        // A value nobody wrote is no press, and does not stop one.
        assert!(take_press(Some("garbage 12:"), &first, 1000).is_some());
        // A burst keeps the newest presses only.
        let mut value = String::new();
        for i in 0..40 {
            value = take_press(
                Some(&value),
                &Press::new(&format!("v0={i}"), 2000 + i),
                2040,
            )
            .unwrap();
        }
        assert_eq!(value.split_whitespace().count(), PRESSES_KEPT);
        assert_eq!(
            take_press(Some(&value), &Press::new("v0=39", 2039), 2040),
            None
        );
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
