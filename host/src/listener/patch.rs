//! The sequence of a scale set's decisions: when a decision is sent to the
//! target, and with which patch id.

use super::target::ScalePatch;

/// Numbers the decisions of one scale set.
///
/// Each decision sent gets the next patch id, continuing from the id the
/// target already holds, so the ids keep growing across listener restarts
/// and a restarted listener's decisions are not mistaken for older ones.
///
/// A decision is sent when it is the first of this listener, when its
/// replica count differs from the last one applied, or when jobs started or
/// ended since (the runners changed, so the EphemeralRunnerSet has work
/// even at the same count: ARC's listener re-patches then for the same
/// reason). A decision identical to the last applied one with nothing new
/// is not sent: ARC patches after every empty long poll, which is an API
/// server write per scale set per minute that changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchSequence {
    last_id: i64,
    applied: Option<u32>,
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

    /// Notes that jobs started or ended since the last applied decision.
    pub fn note_job_events(&mut self) {
        self.job_events = true;
    }

    /// The patch to send for `desired`, if any; its id is used up whether or
    /// not applying it succeeds, so an id never names two different answers
    /// (short of `i64::MAX`, where ids stop growing: at a decision per
    /// millisecond that is 290 million years away).
    pub fn next(&mut self, desired: u32) -> Option<ScalePatch> {
        if self.applied == Some(desired) && !self.job_events {
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
        self.applied = Some(patch.replicas);
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
        let cases: Vec<(&str, i64, Vec<Step>)> = vec![
            (
                "a fresh scale set starts at 1 and grows",
                0,
                vec![
                    (false, 0, true, Some((0, 1))),
                    (false, 0, true, None),
                    (false, 3, true, Some((3, 2))),
                    (false, 3, true, None),
                    (false, 1, true, Some((1, 3))),
                ],
            ),
            (
                "a restarted listener continues after the target's id",
                41,
                vec![(false, 2, true, Some((2, 42))), (false, 2, true, None)],
            ),
            (
                "a negative id on the target counts as none",
                -5,
                vec![(false, 2, true, Some((2, 1)))],
            ),
            (
                "job events resend the same answer once",
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
                vec![
                    (false, 4, false, Some((4, 1))),
                    (false, 4, true, Some((4, 2))),
                    (false, 4, true, None),
                ],
            ),
            (
                "job events survive a failed apply",
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
                vec![
                    (false, 1, true, Some((1, i64::MAX))),
                    (false, 2, true, Some((2, i64::MAX))),
                ],
            ),
        ];
        for (name, resume, steps) in cases {
            let mut sequence = PatchSequence::resume(resume);
            for (i, (events, desired, applies, expected)) in steps.into_iter().enumerate() {
                if events {
                    sequence.note_job_events();
                }
                let patch = sequence.next(desired);
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
