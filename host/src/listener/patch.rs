//! The sequence of a scale set's decisions: when a decision is sent to the
//! target, and with which patch id.

use super::target::ScalePatch;

/// Numbers the decisions of one scale set the way ARC's scaler does.
///
/// The EphemeralRunnerSet follows ARC's rule: a non-zero patch id means
/// "create up to `replicas` unless a runner already carries this id, and
/// never scale down"; only `patchID == 0` lets it remove idle runners above
/// `replicas`. So each decision takes the next id of the sequence, except a
/// decision steady at minRunners (no job started, completed or assigned
/// since the last applied decision, the same count as that decision, and
/// that count is minRunners), which carries 0. Without the 0, runners left
/// idle when jobs were cancelled before a runner took them, or a warm pool
/// above min, would never go.
///
/// A decision is sent when it is the first of this listener, when its
/// replica count differs from the last one applied, when jobs started,
/// ended or were assigned since (the runners changed, so the
/// EphemeralRunnerSet has work even at the same count), or when it is the
/// first steady decision at min (the one 0). A decision identical to the
/// last applied one with nothing new is not sent again: ARC patches after
/// every empty long poll, which is an API server write per scale set per
/// minute that changes nothing.
///
/// The 0 does not use up a number: the decision after it continues the
/// sequence, so its id is greater than any id this listener handed out and
/// no runner carries it yet. A restarted listener continues after the id
/// the target holds; when that is 0 it starts again from 1, as ARC's
/// listener does on every start.
///
/// Unlike ARC's, a restarted listener that finds the target already steady
/// (id 0) takes that for its last applied decision, so a first decision
/// that says the same thing is not sent. Otherwise every start of the host
/// wrote each scale set's EphemeralRunnerSet twice (the numbered decision,
/// then the 0), and each write woke both controllers: at a thousand idle
/// scale sets that was some fourteen thousand API server requests for a
/// restart that changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchSequence {
    last_id: i64,
    /// The last applied patch.
    applied: Option<ScalePatch>,
    job_events: bool,
}

impl PatchSequence {
    /// Continues after `observed_patch_id`, the id the target holds, with
    /// `observed_replicas` the count it holds.
    pub fn resume(observed_patch_id: i64, observed_replicas: Option<u32>) -> Self {
        let steady = (observed_patch_id == 0)
            .then_some(observed_replicas)
            .flatten()
            .map(|replicas| ScalePatch {
                replicas,
                patch_id: 0,
            });
        Self {
            last_id: observed_patch_id.max(0),
            applied: steady,
            job_events: false,
        }
    }

    /// Notes that jobs started, ended or were assigned since the last
    /// applied decision.
    pub fn note_job_events(&mut self) {
        self.job_events = true;
    }

    /// The patch to send for `desired` in a scale set of at least
    /// `min_runners`, if any; a non-zero id is used up whether or not
    /// applying it succeeds, so an id never names two different answers
    /// (short of `i64::MAX`, where ids stop growing: at a decision per
    /// millisecond that is 290 million years away).
    pub fn next(&mut self, desired: u32, min_runners: u32) -> Option<ScalePatch> {
        let unchanged =
            !self.job_events && self.applied.is_some_and(|last| last.replicas == desired);
        if unchanged && desired == min_runners {
            return match self.applied {
                Some(last) if last.patch_id == 0 => None,
                _ => Some(ScalePatch {
                    replicas: desired,
                    patch_id: 0,
                }),
            };
        }
        if unchanged {
            return None;
        }
        self.last_id = self.last_id.saturating_add(1);
        Some(ScalePatch {
            replicas: desired,
            patch_id: self.last_id,
        })
    }

    /// Records that `patch` was applied.
    pub fn applied(&mut self, patch: &ScalePatch) {
        self.applied = Some(*patch);
        self.job_events = false;
    }

    /// The last patch id handed out.
    pub fn last_id(&self) -> i64 {
        self.last_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step: job events before it, the decision, whether applying
    /// succeeds, and the patch expected (replicas, id).
    type Step = (bool, u32, bool, Option<(u32, i64)>);
    /// The patch id and replica count the target holds when the listener
    /// starts.
    type Held = (i64, Option<u32>);

    #[test]
    fn decisions_are_numbered_and_sent_only_when_they_say_something() {
        // (name, id and count the target holds, minRunners, steps)
        let cases: Vec<(&str, Held, u32, Vec<Step>)> = vec![
            (
                "a fresh scale set starts at 1, grows, and sends 0 once settled at min",
                (0, None),
                0,
                vec![
                    (false, 0, true, Some((0, 1))),
                    (false, 0, true, Some((0, 0))),
                    (false, 0, true, None),
                    (false, 3, true, Some((3, 2))),
                    (false, 3, true, None),
                    (false, 1, true, Some((1, 3))),
                    (false, 1, true, None),
                ],
            ),
            (
                "a burst drained back to min ends with 0, and the next decision gets a fresh id",
                (7, None),
                1,
                vec![
                    (false, 1, true, Some((1, 8))),
                    (false, 1, true, Some((1, 0))),
                    (false, 4, true, Some((4, 9))),
                    (true, 4, true, Some((4, 10))),
                    (true, 2, true, Some((2, 11))),
                    (true, 1, true, Some((1, 12))),
                    (false, 1, true, Some((1, 0))),
                    (false, 1, true, None),
                    (false, 1, true, None),
                    (false, 3, true, Some((3, 13))),
                ],
            ),
            (
                "job events at min resend a numbered decision, then 0 again",
                (4, None),
                2,
                vec![
                    (false, 2, true, Some((2, 5))),
                    (false, 2, true, Some((2, 0))),
                    (true, 2, true, Some((2, 6))),
                    (false, 2, true, Some((2, 0))),
                    (false, 2, true, None),
                ],
            ),
            (
                "a steady count above min is never 0",
                (0, None),
                1,
                vec![
                    (false, 3, true, Some((3, 1))),
                    (false, 3, true, None),
                    (false, 3, true, None),
                ],
            ),
            (
                "a failed 0 is sent again, still 0",
                (0, None),
                1,
                vec![
                    (false, 1, true, Some((1, 1))),
                    (false, 1, false, Some((1, 0))),
                    (false, 1, true, Some((1, 0))),
                    (false, 1, true, None),
                ],
            ),
            (
                "a restarted listener continues after the target's id",
                (41, None),
                0,
                vec![(false, 2, true, Some((2, 42))), (false, 2, true, None)],
            ),
            (
                "a restarted listener's first decision at min is numbered, then 0",
                (41, None),
                1,
                vec![
                    (false, 1, true, Some((1, 42))),
                    (false, 1, true, Some((1, 0))),
                ],
            ),
            (
                "a restarted listener finding the target steady sends nothing new",
                (0, Some(1)),
                1,
                vec![
                    (false, 1, true, None),
                    (false, 1, true, None),
                    (false, 3, true, Some((3, 1))),
                    (false, 1, true, Some((1, 2))),
                    (false, 1, true, Some((1, 0))),
                ],
            ),
            (
                "a restarted listener finding the target steady at another count decides afresh",
                (0, Some(2)),
                1,
                vec![
                    (false, 1, true, Some((1, 1))),
                    (false, 1, true, Some((1, 0))),
                ],
            ),
            (
                "a restarted listener finding the target steady still sends job events",
                (0, Some(0)),
                0,
                vec![
                    (true, 0, true, Some((0, 1))),
                    (false, 0, true, Some((0, 0))),
                ],
            ),
            (
                "a negative id on the target counts as none",
                (-5, None),
                0,
                vec![(false, 2, true, Some((2, 1)))],
            ),
            (
                "job events resend the same answer once",
                (0, None),
                0,
                vec![
                    (false, 2, true, Some((2, 1))),
                    (true, 2, true, Some((2, 2))),
                    (false, 2, true, None),
                ],
            ),
            (
                "a failed apply is sent again with a new id",
                (0, None),
                0,
                vec![
                    (false, 4, false, Some((4, 1))),
                    (false, 4, true, Some((4, 2))),
                    (false, 4, true, None),
                ],
            ),
            (
                "job events survive a failed apply",
                (0, None),
                0,
                vec![
                    (false, 1, true, Some((1, 1))),
                    (true, 1, false, Some((1, 2))),
                    (false, 1, true, Some((1, 3))),
                    (false, 1, true, None),
                ],
            ),
            (
                "ids saturate instead of wrapping",
                (i64::MAX - 1, None),
                0,
                vec![
                    (false, 1, true, Some((1, i64::MAX))),
                    (false, 2, true, Some((2, i64::MAX))),
                ],
            ),
        ];
        for (name, resume, min_runners, steps) in cases {
            let mut sequence = PatchSequence::resume(resume.0, resume.1);
            for (i, (events, desired, applies, expected)) in steps.into_iter().enumerate() {
                if events {
                    sequence.note_job_events();
                }
                let patch = sequence.next(desired, min_runners);
                assert_eq!(
                    patch.map(|p| (p.replicas, p.patch_id)),
                    expected,
                    "{name}, step {i}"
                );
                if let (Some(patch), true) = (patch, applies) {
                    sequence.applied(&patch);
                }
            }
        }
    }
}
