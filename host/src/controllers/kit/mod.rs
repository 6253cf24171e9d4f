//! What the three controllers share, so each is written once: the
//! finalizer's compare-and-swap ([`finalizer`]), the condition setter
//! ([`conditions`]), the event publisher ([`Publisher`]), the owned
//! watches' filter ([`projection`]) and the deletions a re-list hides from
//! them ([`relist`]), when a watch cache may be decided on
//! ([`expectations`]), start-up and shutdown ([`Synced`], [`until_shutdown`])
//! and the label a failed reconcile is counted under ([`ErrorLabel`]), and
//! the host's budget of status writes that only inform ([`budget`]).

pub mod budget;
pub mod conditions;
pub mod expectations;
pub mod finalizer;
pub mod made;
pub mod projection;
pub mod relist;
mod sync;

pub use crate::events::{Notice, Publisher, Severity};
pub use sync::{Listed, Synced, until_shutdown};

/// The most runners one scale set has unless `--max-runners-per-scale-set`
/// says otherwise: far above what one scale set of a busy organisation
/// runs at once, far below what would fill etcd or spend the Actions rate
/// limit on registrations.
pub const DEFAULT_RUNNER_CAP: u32 = 1000;

/// How a reconcile error is counted in `arcwright_reconcile_errors_total`
/// and named in the log: a short `snake_case` word per kind of failure,
/// stable across releases (dashboards and alerts select on it), never
/// carrying the error's text.
pub trait ErrorLabel: std::error::Error {
    /// The label.
    fn label(&self) -> &'static str;
}

/// The label of a failed Kubernetes API call: by status code where the API
/// server answered (`conflict`, `not_found`...), `kube` otherwise.
pub fn kube_label(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => "not_found",
            409 => "conflict",
            422 => "invalid",
            429 => "throttled",
            403 => "forbidden",
            _ => "kube",
        },
        _ => "kube",
    }
}
