//! A budget of status writes for the whole host: writes that only inform
//! (a runner's pod started running, it turned ready) are made as the
//! budget allows, and the writes decisions rest on are never held to it.
//!
//! Under a burst a runner's pod starts and its job ends within a second
//! or two; the write saying it is Running costs the API server one write a
//! job and tells nothing any decision reads (the set counts Pending and
//! Running runners alike, the listener too). A budget per runner or per
//! set would still grow with the fleet; one for the host bounds the sum.
//! A write put off is not lost: the runner's next status write (its
//! renewal or its ending) writes over it, and one that stays idle is
//! looked at again after [`RETRY`] and written once the budget allows.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How soon a runner whose write was put off looks again.
pub const RETRY: Duration = Duration::from_secs(2);

/// How old a runner's pod must be before a write that only informs of it
/// is made. Under a burst a pod starts, runs its job and exits within a
/// second or two: a write saying it runs is stale by the time anyone reads
/// it, and the runner's next write (its renewal or its ending) says what
/// is true then. A runner whose pod waits for a job, or runs a long one,
/// shows Running two seconds after its pod was made.
pub const SETTLED: Duration = Duration::from_secs(2);

/// The host's default: informative status writes per second.
pub const DEFAULT_PER_SECOND: u32 = 5;

/// A token bucket shared by every runner of the host. Clones share it.
#[derive(Clone, Debug)]
pub struct WriteBudget {
    bucket: Arc<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    /// Writes a second; also the most saved up.
    per_second: u32,
    tokens: f64,
    refilled: Instant,
}

impl WriteBudget {
    /// A budget of `per_second` writes a second, as many saved up at most;
    /// 0 puts every such write off until a decision's write carries it.
    pub fn new(per_second: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(Bucket {
                per_second,
                tokens: f64::from(per_second),
                refilled: Instant::now(),
            })),
        }
    }

    /// Takes one write from the budget, if it has one now.
    pub fn take(&self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let rate = f64::from(bucket.per_second);
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Default for WriteBudget {
    fn default() -> Self {
        Self::new(DEFAULT_PER_SECOND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_its_rate_and_what_it_saved_and_no_more() {
        let budget = WriteBudget::new(2);
        let start = Instant::now();
        assert!(budget.take_at(start));
        assert!(budget.take_at(start));
        assert!(!budget.take_at(start), "two saved, both spent");
        assert!(!budget.take_at(start + Duration::from_millis(400)));
        assert!(
            budget.take_at(start + Duration::from_millis(600)),
            "refilled"
        );
        // Idle for long, it saves up no more than a second's worth.
        let later = start + Duration::from_secs(60);
        assert!(budget.take_at(later) && budget.take_at(later));
        assert!(!budget.take_at(later));
        assert!(!WriteBudget::new(0).take(), "none at all");
    }
}
