//! Stale views, in the manner of Sieve (OSDI'22): a controller that reads
//! an object from a cache, or restarts behind a lagging API server, may
//! reconcile from a copy far older than the cluster. Here every version of
//! every EphemeralRunner and EphemeralRunnerSet the cluster held during a
//! burst is recorded; once three runners run jobs, each earlier version is
//! replayed through its controller's planner against the cluster as it is
//! then, and no plan may take a harmful step:
//!
//! - a busy runner's pod deleted, or its registration handed for removal
//!   (either cancels the job);
//! - a second registration for a runner whose Secret holds one;
//! - a busy runner deleted or renewed by its set (the set shrunk below its
//!   busy runners).
//!
//! The replays are the planners the controllers run (`replay` in each
//! controller's `observe`), fed as a host that just started would be: no
//! memory of the object, the unregistration pool idle.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arcwright::api::{EphemeralRunner, EphemeralRunnerSet};
use arcwright::controllers::ephemeral_runner::plan::{Need, Settings, Step};
use arcwright::controllers::{ephemeral_runner, ephemeral_runner_set};
use arcwright_stack::{ScaleSet, Stack, StackConfig};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const SET: &str = "stale";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_earlier_view_of_a_runner_or_a_set_leads_to_a_harmful_step() {
    let stack = Stack::start(StackConfig::new("stale-views"))
        .await
        .expect("the stack starts");
    let runner_versions = arcwright_stack::record(stack.runners());
    let set_versions = arcwright_stack::record(stack.runner_sets());
    stack
        .create_scale_set(&ScaleSet::new(SET, 1, 3))
        .await
        .unwrap();
    stack.listening(SET).await.unwrap();
    // Jobs that outlast the test: the runners stay busy while the
    // versions are replayed.
    stack.enqueue(SET, 3, Duration::from_secs(3600));
    stack
        .until("three runners run jobs", || async {
            let busy = stack
                .fake()
                .control()
                .snapshot()
                .runners
                .iter()
                .filter(|r| r.job_id.is_some())
                .count();
            let runners = stack.runners().list(&ListParams::default()).await.ok()?;
            let recorded = runners
                .items
                .iter()
                .all(|r| r.status.as_ref().is_some_and(|s| s.has_job()));
            (busy == 3 && runners.items.len() == 3 && recorded).then_some(())
        })
        .await
        .unwrap();

    // The cluster now.
    let runners = stack.runners().list(&ListParams::default()).await.unwrap();
    let pods: BTreeMap<String, Pod> = stack
        .pods()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    let secrets: Api<Secret> = Api::namespaced(stack.client(), stack.namespace());
    let secrets: BTreeMap<String, Secret> = secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect();
    let service = stack.fake().control().snapshot().runners;
    let busy: BTreeSet<String> = service
        .iter()
        .filter(|r| r.job_id.is_some())
        .map(|r| r.name.clone())
        .collect();
    let registered: BTreeMap<String, i64> = service
        .iter()
        .map(|r| (r.name.clone(), i64::try_from(r.id).unwrap()))
        .collect();
    let live: BTreeMap<String, &EphemeralRunner> = runners
        .items
        .iter()
        .map(|r| (r.uid().unwrap(), r))
        .collect();
    let now = jiff::Timestamp::now();
    let settings = Settings::default();

    let mut harms = Vec::new();
    let mut replayed = 0;
    let mut asked = 0;
    let versions: Vec<EphemeralRunner> = runner_versions.lock().unwrap().clone();
    for version in &versions {
        let Some(current) = version.uid().and_then(|uid| live.get(&uid).copied()) else {
            continue;
        };
        if version.resource_version() == current.resource_version() {
            continue;
        }
        let name = current.name_any();
        let plan = ephemeral_runner::replay(
            version,
            pods.get(&name),
            secrets.get(&name),
            Some(registered.get(&name).copied()),
            &settings,
            now,
        );
        let plan = match plan {
            Ok(plan) => plan,
            // A question to the service or a policy is answered before any
            // step; what it would lead to is not replayed here.
            Err(
                Need::HeldCount
                | Need::Presence(_)
                | Need::Verdict(_)
                | Need::HookObjects
                | Need::Renewal,
            ) => {
                asked += 1;
                continue;
            }
            Err(Need::RegistrationByName | Need::Admission { .. }) => {
                unreachable!("answered in the replay")
            }
        };
        replayed += 1;
        let version_label = format!(
            "runner {name} at resourceVersion {}",
            version.resource_version().unwrap_or_default()
        );
        for step in &plan.steps {
            let harmful = match step {
                Step::DeletePod { .. }
                | Step::ForceDeletePod { .. }
                | Step::Deregister { .. }
                | Step::Renew { .. } => busy.contains(&name),
                Step::Register { .. } => secrets.contains_key(&name),
                _ => false,
            };
            if harmful {
                harms.push(format!("{version_label}: {step:?}"));
            }
        }
    }

    let sets: Vec<EphemeralRunnerSet> = set_versions.lock().unwrap().clone();
    let mut set_replays = 0;
    for version in &sets {
        let plan = ephemeral_runner_set::replay(version, &runners.items, 1000, now);
        set_replays += 1;
        let label = format!(
            "set at resourceVersion {} (replicas {})",
            version.resource_version().unwrap_or_default(),
            version.spec.replicas
        );
        for (name, reason) in &plan.delete {
            if busy.contains(name) {
                harms.push(format!("{label}: deletes busy {name} ({reason:?})"));
            }
        }
        for name in &plan.renew {
            if busy.contains(name) {
                harms.push(format!("{label}: renews busy {name}"));
            }
        }
    }

    eprintln!(
        "stale views: {replayed} runner versions replayed ({asked} stopped at a question), \
         {set_replays} set versions replayed, {} harmful",
        harms.len()
    );
    // At least one earlier version of each busy runner, and the set's
    // versions before the burst: the recorder saw the history.
    assert!(
        replayed >= live.len() && set_replays >= 3,
        "too few versions to mean anything: {replayed} runner versions, {set_replays} set versions"
    );
    assert!(
        harms.is_empty(),
        "harmful steps from stale views:\n{}",
        harms.join("\n")
    );
}
