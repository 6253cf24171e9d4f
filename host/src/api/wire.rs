//! The names arcwright writes into the cluster besides its own kinds:
//! labels, annotations, finalizers and field managers.
//!
//! They are part of the API as much as the CRDs are: a user selects on the
//! labels, a backup restores the annotations, a finalizer outlives the
//! controller version that wrote it. So they live here, in one place, and
//! every controller and the listener name them from here; none defines a
//! wire name of its own.

/// Labels arcwright puts on the objects it creates, to find them again.
pub mod labels {
    /// The scale set (AutoscalingRunnerSet name) an object belongs to.
    pub const SCALE_SET_NAME: &str = "arcwright.dev/scale-set-name";
    /// The scale set's namespace.
    pub const SCALE_SET_NAMESPACE: &str = "arcwright.dev/scale-set-namespace";
    /// The EphemeralRunner a pod or Secret belongs to.
    pub const EPHEMERAL_RUNNER: &str = "arcwright.dev/ephemeral-runner";
    /// The EphemeralRunnerSet a runner belongs to: how the set lists and
    /// watches its runners, and how the listener finds them.
    pub const EPHEMERAL_RUNNER_SET: &str = "arcwright.dev/ephemeral-runner-set";
    /// `app.kubernetes.io/component`: `runner`, `runner-set`...
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    /// `app.kubernetes.io/part-of`.
    pub const PART_OF: &str = "app.kubernetes.io/part-of";
    /// `app.kubernetes.io/managed-by`.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The value of [`PART_OF`] and [`MANAGED_BY`] on what arcwright makes.
    pub const ARCWRIGHT: &str = "arcwright";

    /// ARC's labels, put on runner pods beside arcwright's own, so the
    /// NetworkPolicies, PodMonitors and dashboards a team wrote for ARC
    /// select arcwright's runner pods unchanged. arcwright itself never
    /// selects on them.
    pub mod arc {
        /// On every runner pod, with the value [`EPHEMERAL_RUNNER_VALUE`].
        pub const EPHEMERAL_RUNNER: &str = "actions-ephemeral-runner";
        /// ARC's value of [`EPHEMERAL_RUNNER`].
        pub const EPHEMERAL_RUNNER_VALUE: &str = "True";
        /// The scale set's name.
        pub const SCALE_SET_NAME: &str = "actions.github.com/scale-set-name";
        /// The scale set's namespace.
        pub const SCALE_SET_NAMESPACE: &str = "actions.github.com/scale-set-namespace";
        /// The enterprise of an enterprise configuration URL.
        pub const ENTERPRISE: &str = "actions.github.com/enterprise";
        /// The organisation (the owner, for a repository URL).
        pub const ORGANIZATION: &str = "actions.github.com/organization";
        /// The repository of a repository configuration URL.
        pub const REPOSITORY: &str = "actions.github.com/repository";
        /// On the pods and Secrets the runner container hooks (the
        /// kubernetes container modes) create for a job, naming the runner
        /// pod they belong to; set by the hooks, not by arcwright.
        pub const HOOK_RUNNER_POD: &str = "runner-pod";
    }
}

/// Annotations arcwright reads or writes.
pub mod annotations {
    /// The cluster autoscaler's: `"false"` keeps the pod's node from being
    /// scaled down, `"true"` lets it go even with local storage.
    pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
    /// Karpenter's: `"true"` keeps the pod's node from being disrupted.
    pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
    /// The listener's patch id a runner was created under (ARC's
    /// `actions.github.com/patch-id`).
    pub const PATCH_ID: &str = "arcwright.dev/patch-id";
    /// The set's `spec.actionableRevision` a runner was built from.
    pub const REVISION: &str = "arcwright.dev/actionable-revision";
    /// The set's `metadata.generation` a runner was built from.
    pub const SET_GENERATION: &str = "arcwright.dev/set-generation";
    /// The scale set's id on its AutoscalingRunnerSet, as ARC keeps it: the
    /// status is lost when objects are restored from a backup, the
    /// annotation is not, and a lost id would register a second scale set.
    pub const SCALE_SET_ID: &str = "arcwright.dev/runner-scale-set-id";
    /// Set to `"true"` on an AutoscalingRunnerSet to let its deletion
    /// finish without deleting the scale set in the Actions service when
    /// its credentials Secret is gone.
    pub const FORCE_DELETE: &str = "arcwright.dev/force-delete";
    /// Set to `"true"` on an AutoscalingRunnerSet before deleting it to
    /// hand its scale set to another controller (another cluster's, or the
    /// way back to ARC): the deletion stops the listener (its session
    /// released), removes idle runners' registrations and waits out busy
    /// ones as always, and leaves the scale set registered.
    pub const KEEP_SCALE_SET: &str = "arcwright.dev/keep-scale-set";
    /// The credentials Secret an AutoscalingRunnerSet holds with
    /// `credentials-in-use`, recorded on the set before the finalizer is
    /// added: when `githubConfigSecret`
    /// is changed to another Secret (rotated credentials), the one it held
    /// is known, and released unless another set names it; without the
    /// record its finalizer would stay, and deleting it would hang.
    pub const CREDENTIALS_SECRET: &str = "arcwright.dev/credentials-secret";
    /// When a held runner's hold ends (RFC 3339), set by the hold API,
    /// Slack's Extend button or `kubectl annotate`. An annotation rather
    /// than a status field or an API of our own: `kubectl annotate` works,
    /// RBAC on `update` of the runner governs who may, and the API server's
    /// audit log records who did.
    pub const HOLD_UNTIL: &str = "arcwright.dev/hold-until";
    /// The renewal of its runner a pod or JIT config Secret was made for
    /// (see `RunnerRenewal`).
    pub const RENEWAL: &str = "arcwright.dev/renewal";
    /// The registration id a JIT config Secret holds the config of, beside
    /// its `runnerId` key: the controller watches Secrets' metadata only
    /// (a tenant can label any Secret as ours, and their data is not the
    /// host's memory to spend), so what it reads of one must be metadata.
    pub const RUNNER_ID: &str = "arcwright.dev/runner-id";
    /// The registration name a JIT config Secret holds the config of (see
    /// [`RUNNER_ID`]).
    pub const RUNNER_NAME: &str = "arcwright.dev/runner-name";
}

/// A finalizer: the name written now, and the names earlier versions
/// wrote, which are still honoured and removed, so an object finalized by
/// an older controller is cleaned up by this one and never stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finalizer {
    /// The name written now: `arcwright.dev/<kind>`.
    pub name: &'static str,
    /// Names written by earlier versions.
    pub formerly: &'static [&'static str],
}

impl Finalizer {
    /// Whether `finalizers` hold this finalizer, under its name or a
    /// former one.
    pub fn held_in(&self, finalizers: &[String]) -> bool {
        finalizers.iter().any(|f| self.is(f))
    }

    /// Whether `name` is this finalizer's name or a former one.
    pub fn is(&self, name: &str) -> bool {
        name == self.name || self.formerly.contains(&name)
    }

    /// `finalizers` with this one added, unless it is held already.
    pub fn added_to(&self, finalizers: &[String]) -> Vec<String> {
        let mut out = finalizers.to_vec();
        if !self.held_in(finalizers) {
            out.push(self.name.to_owned());
        }
        out
    }

    /// `finalizers` without this one, under any of its names.
    pub fn removed_from(&self, finalizers: &[String]) -> Vec<String> {
        finalizers.iter().filter(|f| !self.is(f)).cloned().collect()
    }
}

/// The finalizers arcwright's controllers hold their objects with.
pub mod finalizers {
    use super::Finalizer;

    /// Holds an EphemeralRunner until its registration, pod and Secret are
    /// gone.
    pub const EPHEMERAL_RUNNER: Finalizer = Finalizer {
        name: "arcwright.dev/ephemeral-runner",
        formerly: &[],
    };
    /// Holds an EphemeralRunnerSet until its runners are gone.
    pub const EPHEMERAL_RUNNER_SET: Finalizer = Finalizer {
        name: "arcwright.dev/ephemeral-runner-set",
        formerly: &["ephemeralrunnerset.arcwright.dev/finalizer"],
    };
    /// Holds an AutoscalingRunnerSet until its listener, runners and scale
    /// set are gone.
    pub const AUTOSCALING_RUNNER_SET: Finalizer = Finalizer {
        name: "arcwright.dev/autoscaling-runner-set",
        formerly: &["autoscalingrunnerset.arcwright.dev/finalizer"],
    };
    /// Holds a scale set's GitHub credentials Secret while a scale set uses
    /// it: `helm uninstall` deletes the set and its Secret together, and
    /// without the Secret no runner's registration nor the scale set could
    /// be removed from the service (ARC's `cleanup-protection` does the
    /// same).
    pub const CREDENTIALS_IN_USE: Finalizer = Finalizer {
        name: "arcwright.dev/credentials-in-use",
        formerly: &[],
    };
}

/// The field managers of arcwright's writes, one per writer, so
/// `kubectl get --show-managed-fields` says who wrote what.
pub mod field_managers {
    /// The EphemeralRunner controller.
    pub const EPHEMERAL_RUNNER: &str = "arcwright-ephemeral-runner";
    /// The EphemeralRunnerSet controller.
    pub const EPHEMERAL_RUNNER_SET: &str = "arcwright-ephemeral-runner-set";
    /// The AutoscalingRunnerSet controller.
    pub const AUTOSCALING_RUNNER_SET: &str = "arcwright-autoscaling-runner-set";
    /// The listeners (scaling decisions, job records, the scale set's
    /// listener status).
    pub const LISTENER: &str = "arcwright-listener";
    /// Leader election's Lease.
    pub const LEADER_ELECTION: &str = "arcwright-leader-election";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_former_finalizer_name_counts_as_held_and_is_removed_with_the_current_one() {
        let set = finalizers::EPHEMERAL_RUNNER_SET;
        let old = names(&[
            "other.example/keep",
            "ephemeralrunnerset.arcwright.dev/finalizer",
        ]);
        assert!(set.held_in(&old));
        assert_eq!(
            set.added_to(&old),
            old,
            "held under its old name: not added twice"
        );
        assert_eq!(set.removed_from(&old), names(&["other.example/keep"]));
        let none = names(&["other.example/keep"]);
        assert!(!set.held_in(&none));
        assert_eq!(
            set.added_to(&none),
            names(&["other.example/keep", "arcwright.dev/ephemeral-runner-set"])
        );
    }

    #[test]
    fn finalizers_are_named_in_one_style() {
        for finalizer in [
            finalizers::EPHEMERAL_RUNNER,
            finalizers::EPHEMERAL_RUNNER_SET,
            finalizers::AUTOSCALING_RUNNER_SET,
        ] {
            let kind = finalizer.name.strip_prefix("arcwright.dev/").unwrap();
            assert!(
                kind.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
                "{}",
                finalizer.name
            );
        }
    }
}
