//! What a simulated runner pod does, and how a pod gets its scenario.
//!
//! Scenarios are chosen once per pod, when the simulator first sees it, from
//! rules tried in order and then a default. Rules can be added at runtime, so
//! a test can say "the next two runner pods OOM" at the moment it matters,
//! without knowing the names a controller will pick.

use std::collections::BTreeMap;
use std::time::Duration;

/// How a simulated runner ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Connects, takes one job, runs it for its duration, reports it (the
    /// fake deregisters the ephemeral runner) and exits 0, whatever the job's
    /// result: a real runner exits 0 after a failed job too.
    Succeed,
    /// Crashes on start with exit code 1, before connecting: its
    /// registration is left for the controller to remove.
    Fail,
    /// Refuses to run because its version is deprecated, with exit code 7,
    /// before connecting (the runner does this when started with
    /// `ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1`, as ARC does).
    Outdated,
    /// Connects, takes its job, and is killed by the kernel half-way through
    /// it: exit 137, reason `OOMKilled`. The fake is told the runner vanished.
    OomKilled,
    /// The container runs but the runner never connects: the pod stays
    /// Running and the registration stays offline until someone acts.
    NeverRegisters,
    /// Runs like [`Fate::Succeed`] until its job starts (or its pod is
    /// deleted), then its node is lost: the fake is told the runner vanished,
    /// the pod's status is never written again, and its deletion is never
    /// confirmed, so it stays terminating until someone force-deletes it.
    NodeLost,
}

/// A fate plus timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    /// How the runner ends.
    pub fate: Fate,
    /// How long the pod stays Pending (image pull, slow node) before it runs.
    pub start_delay: Duration,
    /// How long, after that, its init containers run (a cache warm-up):
    /// the pod is Pending, not Initialized, its init containers running and
    /// the runner container waiting, as a kubelet reports it.
    pub init_delay: Duration,
    /// Whether, in kubernetes mode, the container hooks' cleanup deletes
    /// the job's pod and Secret when the job ends. It does normally; when
    /// it cannot (the hook's API call fails, the job pod's node is gone)
    /// they are left for the runner's controller to remove, as ARC's
    /// finalizer removes them.
    pub hooks_clean_up: bool,
}

impl Scenario {
    /// A scenario with no start delay.
    pub const fn new(fate: Fate) -> Scenario {
        Scenario {
            fate,
            start_delay: Duration::ZERO,
            init_delay: Duration::ZERO,
            hooks_clean_up: true,
        }
    }

    /// Takes one job and exits 0.
    pub const fn succeed() -> Scenario {
        Scenario::new(Fate::Succeed)
    }

    /// Exits 1 on start.
    pub const fn fail() -> Scenario {
        Scenario::new(Fate::Fail)
    }

    /// Exits 7 on start.
    pub const fn outdated() -> Scenario {
        Scenario::new(Fate::Outdated)
    }

    /// OOM-killed mid-job.
    pub const fn oom_killed() -> Scenario {
        Scenario::new(Fate::OomKilled)
    }

    /// Runs, never connects.
    pub const fn never_registers() -> Scenario {
        Scenario::new(Fate::NeverRegisters)
    }

    /// Its node disappears once it works.
    pub const fn node_lost() -> Scenario {
        Scenario::new(Fate::NodeLost)
    }

    /// The same scenario with container hooks whose cleanup leaves the
    /// job's pod and Secret behind.
    pub const fn with_hooks_leaving_objects(mut self) -> Scenario {
        self.hooks_clean_up = false;
        self
    }

    /// The same scenario, Pending for `delay` first (a slow start).
    pub const fn with_start_delay(mut self, delay: Duration) -> Scenario {
        self.start_delay = delay;
        self
    }

    /// The same scenario with init containers that run for `delay` before
    /// the runner container starts (a pod without any gets one, `warm-up`).
    pub const fn with_init_delay(mut self, delay: Duration) -> Scenario {
        self.init_delay = delay;
        self
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario::succeed()
    }
}

/// Which pods a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSelector {
    /// Every runner pod.
    Any,
    /// Pods whose name starts with this.
    NamePrefix(String),
    /// Pods carrying this label with this value.
    Label {
        /// The label key.
        key: String,
        /// The label value.
        value: String,
    },
}

impl PodSelector {
    fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            PodSelector::Any => true,
            PodSelector::NamePrefix(prefix) => name.starts_with(prefix),
            PodSelector::Label { key, value } => labels.get(key) == Some(value),
        }
    }
}

/// A scenario for the pods a selector picks, optionally only the next few.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Which pods.
    pub selector: PodSelector,
    /// What they do.
    pub scenario: Scenario,
    /// How many more pods the rule applies to; `None` is unlimited.
    pub remaining: Option<u32>,
}

impl Rule {
    /// Every pod the selector matches.
    pub fn always(selector: PodSelector, scenario: Scenario) -> Rule {
        Rule {
            selector,
            scenario,
            remaining: None,
        }
    }

    /// The next `count` runner pods, whatever they are.
    pub fn next(count: u32, scenario: Scenario) -> Rule {
        Rule {
            selector: PodSelector::Any,
            scenario,
            remaining: Some(count),
        }
    }

    /// Pods whose name starts with `prefix`.
    pub fn name_prefix(prefix: &str, scenario: Scenario) -> Rule {
        Rule::always(PodSelector::NamePrefix(prefix.to_owned()), scenario)
    }

    /// Pods labelled `key=value`.
    pub fn label(key: &str, value: &str, scenario: Scenario) -> Rule {
        Rule::always(
            PodSelector::Label {
                key: key.to_owned(),
                value: value.to_owned(),
            },
            scenario,
        )
    }
}

/// The default scenario and the rules, as the simulator holds them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scenarios {
    pub default: Scenario,
    pub rules: Vec<Rule>,
}

impl Scenarios {
    /// The scenario for a newly seen pod: the first rule that matches (a
    /// counted rule is used up by it), else the default.
    pub fn choose(&mut self, name: &str, labels: &BTreeMap<String, String>) -> Scenario {
        let Some(index) = self
            .rules
            .iter()
            .position(|r| r.remaining != Some(0) && r.selector.matches(name, labels))
        else {
            return self.default;
        };
        let rule = &mut self.rules[index];
        let scenario = rule.scenario;
        if let Some(remaining) = &mut rule.remaining {
            *remaining -= 1;
            if *remaining == 0 {
                self.rules.remove(index);
            }
        }
        scenario
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_first_matching_rule_wins_and_counted_rules_run_out() {
        let mut scenarios = Scenarios {
            default: Scenario::succeed(),
            rules: vec![
                Rule::next(2, Scenario::oom_killed()),
                Rule::name_prefix("old-", Scenario::outdated()),
            ],
        };
        let none = labels(&[]);
        assert_eq!(scenarios.choose("old-1", &none), Scenario::oom_killed());
        assert_eq!(scenarios.choose("a", &none), Scenario::oom_killed());
        assert_eq!(scenarios.choose("old-2", &none), Scenario::outdated());
        assert_eq!(scenarios.choose("a", &none), Scenario::succeed());
        assert_eq!(scenarios.rules.len(), 1);
    }

    #[test]
    fn labels_select_pods() {
        let mut scenarios = Scenarios {
            default: Scenario::succeed(),
            rules: vec![Rule::label("sim", "lost", Scenario::node_lost())],
        };
        assert_eq!(
            scenarios.choose("p", &labels(&[("sim", "lost")])),
            Scenario::node_lost()
        );
        assert_eq!(
            scenarios.choose("p", &labels(&[("sim", "other")])),
            Scenario::succeed()
        );
    }

    #[test]
    fn slow_start_keeps_the_fate() {
        let slow = Scenario::fail().with_start_delay(Duration::from_secs(2));
        assert_eq!(slow.fate, Fate::Fail);
        assert_eq!(slow.start_delay, Duration::from_secs(2));
    }
}
