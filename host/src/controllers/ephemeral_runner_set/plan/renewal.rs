//! Rule 8: how a renewal the plan asked for is carried to its end.

use super::RunnerView;

/// More input a decision needs, which the reconcile reads and hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The runner being renewed, read again: its renewal was refused
    /// because it changed since the list (rule 8).
    Reread,
}

/// What came of writing a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// The runner is renewed.
    Renewed,
    /// Refused: the runner changed since the copy the renewal was made of
    /// (a conflict). What changes a finished runner meanwhile is nearly
    /// always the listener's late record of the job it ran, which a
    /// renewal is meant to replace.
    Changed,
    /// Failed otherwise (the runner gone, the API server unreachable).
    Failed,
}

/// One thing a pass did or learnt about one renewal, in order; the record
/// [`renewal`] decides the next step from.
#[derive(Clone, Debug, PartialEq)]
pub enum Tried {
    /// The renewal written, of the latest copy of the runner.
    Written(Written),
    /// The runner read again ([`Need::Reread`]): as it is now, or `None`
    /// when it is gone or could not be read.
    Reread(Option<RunnerView>),
}

/// The next step of a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalStep {
    /// Write the renewal over the latest copy of the runner (the one
    /// listed, or the one read again).
    Write,
    /// Nothing more: the runner is renewed, or not, and then a creation
    /// makes up for it ([`Plan::creation`](super::Plan::creation)).
    Done {
        /// Whether it is renewed.
        renewed: bool,
    },
}

/// The next step of a renewal the plan asked for, from what was `tried` of
/// it so far (rule 8): write it; when the write is refused because the
/// runner changed, read the runner again and write it once more if it is
/// still renewable (it succeeded, its registration is gone, it is built as
/// now, it is not being deleted). Once: a renewal given up makes a
/// creation, three API server writes more than a renewal, but a runner
/// that keeps changing is not chased.
pub fn renewal(tried: &[Tried]) -> Result<RenewalStep, Need> {
    let reread = tried.iter().any(|t| matches!(t, Tried::Reread(_)));
    match tried.last() {
        None => Ok(RenewalStep::Write),
        Some(Tried::Written(Written::Renewed)) => Ok(RenewalStep::Done { renewed: true }),
        Some(Tried::Written(Written::Changed)) if !reread => Err(Need::Reread),
        Some(Tried::Reread(Some(view))) if view.can_be_renewed() => Ok(RenewalStep::Write),
        Some(Tried::Written(_) | Tried::Reread(_)) => Ok(RenewalStep::Done { renewed: false }),
    }
}
