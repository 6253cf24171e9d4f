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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchSequence {
    last_id: i64,
    /// The last applied patch.
    applied: Option<ScalePatch>,
    job_events: bool,
}

impl PatchSequence {
    /// Continues after `observed_patch_id`, the id the target holds.
    pub fn resume(observed_patch_id: i64) -> Self {
        Self {
            last_id: observed_patch_id.max(0),
            applied: None,
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

    #[test]
    fn decisions_are_numbered_and_sent_only_when_they_say_something() {
        // (name, id the target holds, minRunners, steps)
        let cases: Vec<(&str, i64, u32, Vec<Step>)> = vec![
            (
                "a fresh scale set starts at 1, grows, and sends 0 once settled at min",
                0,
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
                7,
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
                4,
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
                0,
                1,
                vec![
                    (false, 3, true, Some((3, 1))),
                    (false, 3, true, None),
                    (false, 3, true, None),
                ],
            ),
            (
                "a failed 0 is sent again, still 0",
                0,
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
                41,
                0,
                vec![(false, 2, true, Some((2, 42))), (false, 2, true, None)],
            ),
            (
                "a restarted listener's first decision at min is numbered, then 0",
                41,
                1,
                vec![
                    (false, 1, true, Some((1, 42))),
                    (false, 1, true, Some((1, 0))),
                ],
            ),
            (
                "a negative id on the target counts as none",
                -5,
                0,
                vec![(false, 2, true, Some((2, 1)))],
            ),
            (
                "job events resend the same answer once",
                0,
                0,
                vec![
                    (false, 2, true, Some((2, 1))),
                    (true, 2, true, Some((2, 2))),
                    (false, 2, true, None),
                ],
            ),
            (
                "a failed apply is sent again with a new id",
                0,
                0,
                vec![
                    (false, 4, false, Some((4, 1))),
                    (false, 4, true, Some((4, 2))),
                    (false, 4, true, None),
                ],
            ),
            (
                "job events survive a failed apply",
                0,
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
                i64::MAX - 1,
                0,
                vec![
                    (false, 1, true, Some((1, i64::MAX))),
                    (false, 2, true, Some((2, i64::MAX))),
                ],
            ),
        ];
        for (name, resume, min_runners, steps) in cases {
            let mut sequence = PatchSequence::resume(resume);
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
