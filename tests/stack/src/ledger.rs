//! The invariant every scenario ends with: nothing leaked, nothing lost.
//!
//! The fake's ledger says what happened to every registration and job; the
//! cluster says which runners are alive. Put together after a scenario has
//! settled, they must agree: a registration that no live EphemeralRunner
//! owns is a leak (a runner slot the organisation pays for and nobody uses,
//! which the real service keeps for days), a job cancelled because its
//! runner vanished is the race seed 001 is about (a pod deleted before its
//! registration was removed), and a job not completed is lost work.
//!
//! The check is pure, so each rule has a unit test that makes it fail.

use std::collections::BTreeSet;
use std::fmt;

use fake_actions::{Ledger, RunnerSnapshot};

/// What the check looks at.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The fake's ledger.
    pub ledger: Ledger,
    /// The registrations the fake holds now.
    pub registrations: Vec<RunnerSnapshot>,
    /// EphemeralRunners that exist and are not being deleted, by name (a
    /// runner's registration carries its name).
    pub live_runners: BTreeSet<String>,
    /// How many jobs the scenario enqueued.
    pub jobs_expected: u64,
}

/// One way the invariant is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The ledger's own arithmetic does not hold: a registration is neither
    /// removed nor still registered.
    Unaccounted {
        /// Registrations created.
        created: u64,
        /// Removed by the host, by the runner itself, with the scale set,
        /// plus still registered.
        accounted: u64,
    },
    /// A registration that no live runner owns.
    Leaked {
        /// The registration's runner name.
        name: String,
    },
    /// Jobs cancelled because the runner holding them vanished.
    RunnerVanished {
        /// How many times.
        times: u64,
    },
    /// Jobs that did not complete successfully.
    NotCompleted {
        /// Jobs enqueued.
        enqueued: u64,
        /// Jobs that succeeded.
        succeeded: u64,
        /// Jobs unfinished.
        unfinished: u64,
        /// Jobs cancelled for good.
        cancelled: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Unaccounted { created, accounted } => write!(
                f,
                "{created} registrations created but {accounted} removed or still registered"
            ),
            Violation::Leaked { name } => {
                write!(f, "registration {name} belongs to no live runner")
            }
            Violation::RunnerVanished { times } => write!(
                f,
                "{times} job(s) cancelled because their runner vanished (pod deleted under a job)"
            ),
            Violation::NotCompleted {
                enqueued,
                succeeded,
                unfinished,
                cancelled,
            } => write!(
                f,
                "{succeeded} of {enqueued} jobs succeeded ({unfinished} unfinished, {cancelled} cancelled)"
            ),
        }
    }
}

/// Every violation of the invariant in `observation`; empty when it holds.
pub fn check(observation: &Observation) -> Vec<Violation> {
    let Observation {
        ledger,
        registrations,
        live_runners,
        jobs_expected,
    } = observation;
    let mut violations = Vec::new();
    let accounted = ledger.removed_by_api
        + ledger.self_deregistered
        + ledger.removed_with_scale_set
        + ledger.still_registered;
    if accounted != ledger.runners_created {
        violations.push(Violation::Unaccounted {
            created: ledger.runners_created,
            accounted,
        });
    }
    for registration in registrations {
        if !live_runners.contains(&registration.name) {
            violations.push(Violation::Leaked {
                name: registration.name.clone(),
            });
        }
    }
    if ledger.jobs_cancelled_runner_vanished > 0 {
        violations.push(Violation::RunnerVanished {
            times: ledger.jobs_cancelled_runner_vanished,
        });
    }
    if ledger.jobs_enqueued != *jobs_expected
        || ledger.jobs_succeeded != *jobs_expected
        || ledger.jobs_unfinished != 0
        || ledger.jobs_cancelled != 0
    {
        violations.push(Violation::NotCompleted {
            enqueued: ledger.jobs_enqueued,
            succeeded: ledger.jobs_succeeded,
            unfinished: ledger.jobs_unfinished,
            cancelled: ledger.jobs_cancelled,
        });
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(name: &str) -> RunnerSnapshot {
        RunnerSnapshot {
            id: 1,
            name: name.to_owned(),
            scale_set_id: 1,
            online: true,
            job_id: None,
        }
    }

    /// Three jobs on three runners that deregistered themselves, a fourth
    /// runner removed by the host, and one warm runner still registered.
    fn clean() -> Observation {
        Observation {
            ledger: Ledger {
                runners_created: 5,
                runners_removed: 4,
                removed_by_api: 1,
                self_deregistered: 3,
                still_registered: 1,
                jobs_enqueued: 3,
                jobs_succeeded: 3,
                ..Ledger::default()
            },
            registrations: vec![registration("warm")],
            live_runners: ["warm".to_owned()].into(),
            jobs_expected: 3,
        }
    }

    #[test]
    fn a_clean_scenario_passes() {
        assert_eq!(check(&clean()), []);
    }

    #[test]
    fn a_registration_without_a_live_runner_is_a_leak() {
        let mut o = clean();
        o.live_runners.clear();
        assert_eq!(
            check(&o),
            [Violation::Leaked {
                name: "warm".into()
            }]
        );
    }

    #[test]
    fn a_registration_neither_removed_nor_registered_is_unaccounted() {
        let mut o = clean();
        o.ledger.runners_created = 6;
        assert_eq!(
            check(&o),
            [Violation::Unaccounted {
                created: 6,
                accounted: 5
            }]
        );
    }

    #[test]
    fn a_job_cancelled_under_its_runner_fails_the_check() {
        let mut o = clean();
        o.ledger.jobs_cancelled_runner_vanished = 1;
        o.ledger.jobs_requeued = 1;
        assert_eq!(check(&o), [Violation::RunnerVanished { times: 1 }]);
    }

    #[test]
    fn unfinished_cancelled_or_missing_jobs_fail_the_check() {
        let mut o = clean();
        o.ledger.jobs_succeeded = 2;
        o.ledger.jobs_unfinished = 1;
        assert_eq!(check(&o).len(), 1);
        let mut o = clean();
        o.ledger.jobs_succeeded = 2;
        o.ledger.jobs_cancelled = 1;
        assert_eq!(check(&o).len(), 1);
        let mut o = clean();
        o.jobs_expected = 4;
        assert!(matches!(
            check(&o)[..],
            [Violation::NotCompleted { enqueued: 3, .. }]
        ));
        assert!(
            check(&o)[0].to_string().contains("3 of 3 jobs succeeded"),
            "{}",
            check(&o)[0]
        );
    }
}
