//! ARC's scaling formula, which the bundled scaling policies start from.

use alloc::format;
use alloc::string::String;

/// The answer of ARC's formula, `min(minRunners + assignedJobs, maxRunners)`,
/// with the numbers that went into it so a policy can explain itself.
///
/// Start from it and adjust, keeping its words in the `reason`:
///
/// ```
/// use arcwright_guest::scaling::Demand;
///
/// let demand = Demand::new(1, 5, 4);
/// assert_eq!(demand.desired, 4);
/// assert_eq!(demand.wanted, 6); // what the jobs asked for
/// assert!(demand.capped());
/// assert_eq!(
///     demand.explain(),
///     "minRunners 1 + assignedJobs 5 = 6, capped at maxRunners 4"
/// );
///
/// // Two spare runners on top, still within the cap.
/// let with_spares = (demand.wanted + 2).min(u64::from(demand.max_runners)) as u32;
/// let reason = format!("{} + 2 spare = {with_spares}", demand.explain());
/// # assert_eq!(with_spares, 4);
/// # let _ = reason;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// The minimum number of runners the formula used.
    pub min_runners: u32,
    /// Jobs the service has assigned to the scale set.
    pub assigned_jobs: u32,
    /// The scale set's cap.
    pub max_runners: u32,
    /// `min_runners + assigned_jobs` before the cap: what the jobs ask for.
    pub wanted: u64,
    /// The formula's answer.
    pub desired: u32,
}

impl Demand {
    /// Applies the formula. The sum is taken in 64 bits, so a scale set
    /// with `u32::MAX` runners and jobs is capped rather than wrapped to a
    /// small number; a wrap would scale a busy set *down*.
    ///
    /// A `min_runners` above `max_runners` is an invalid scale set; the cap
    /// wins, as it does in ARC, because the cap is what protects the cluster.
    ///
    /// Arguments come straight from the input: `scale_set.min_runners`,
    /// `statistics.assigned_jobs`, `scale_set.max_runners`.
    ///
    /// ```
    /// # use arcwright_guest::scaling::Demand;
    /// assert_eq!(Demand::new(u32::MAX, u32::MAX, 7).desired, 7);
    /// assert_eq!(Demand::new(3, 0, 2).desired, 2);
    /// ```
    pub fn new(min_runners: u32, assigned_jobs: u32, max_runners: u32) -> Self {
        let wanted = u64::from(min_runners) + u64::from(assigned_jobs);
        let desired = wanted.min(u64::from(max_runners)) as u32;
        Self {
            min_runners,
            assigned_jobs,
            max_runners,
            wanted,
            desired,
        }
    }

    /// Whether the cap lowered the answer: some jobs wait for a runner.
    ///
    /// ```
    /// # use arcwright_guest::scaling::Demand;
    /// assert!(!Demand::new(1, 3, 10).capped());
    /// assert!(Demand::new(1, 10, 10).capped());
    /// ```
    pub fn capped(&self) -> bool {
        self.wanted > u64::from(self.max_runners)
    }

    /// The formula in words, e.g. `minRunners 1 + assignedJobs 3 = 4`,
    /// followed by the cap when it applied: the start of a `reason`.
    ///
    /// ```
    /// # use arcwright_guest::scaling::Demand;
    /// assert_eq!(Demand::new(1, 3, 10).explain(), "minRunners 1 + assignedJobs 3 = 4");
    /// ```
    pub fn explain(&self) -> String {
        let sum = format!(
            "minRunners {} + assignedJobs {} = {}",
            self.min_runners, self.assigned_jobs, self.wanted
        );
        if self.capped() {
            format!("{sum}, capped at maxRunners {}", self.max_runners)
        } else {
            sum
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_min_and_assigned_jobs() {
        let demand = Demand::new(1, 3, 10);
        assert_eq!(demand.desired, 4);
        assert!(!demand.capped());
        assert_eq!(demand.explain(), "minRunners 1 + assignedJobs 3 = 4");
    }

    #[test]
    fn caps_at_max_without_wrapping() {
        let demand = Demand::new(u32::MAX, u32::MAX, 7);
        assert_eq!(demand.desired, 7);
        assert_eq!(
            demand.explain(),
            "minRunners 4294967295 + assignedJobs 4294967295 = 8589934590, capped at maxRunners 7"
        );
        assert_eq!(Demand::new(5, 0, 0).desired, 0);
        assert_eq!(Demand::new(3, 0, 2).desired, 2);
    }
}
