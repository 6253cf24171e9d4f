//! Whole lifecycles through the real `arcwright run` binary, against the
//! local API server, the fake Actions service and the runner simulator.
//! Every test ends with the ledger invariant: every registration the fake
//! created was removed, deregistered itself, or belongs to a live runner;
//! no job was cancelled because its pod went; every job completed.
//!
//! One control plane serves the whole binary, a namespace (with its own
//! fake, simulator and host process) per test. Jobs are short and bursts
//! small: what is tested is the sequence of states, not speed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arcwright::api::{AutoscalingRunnerSet, AutoscalingRunnerSetPhase};
use arcwright::policy::PolicyKind;
use arcwright_stack::{RUNNER_ENDPOINTS, ScaleSet, Stack, StackConfig};
use fake_actions::{Endpoint, Fault, FaultKind};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::runtime::{WatchStreamExt, watcher};
use runner_simulator::{Fate, Rule, Scenario, Stage};

const SET: &str = "linux";

async fn stack(name: &str, scenario: Scenario) -> Stack {
    let mut config = StackConfig::new(name);
    config.scenario = scenario;
    Stack::start(config).await.expect("the stack starts")
}

fn scale_set_id(set: &AutoscalingRunnerSet) -> u64 {
    let id = set.status.as_ref().and_then(|s| s.runner_scale_set_id);
    u64::try_from(id.expect("registered")).unwrap()
}

/// Every `spec.replicas` the scale set's EphemeralRunnerSet is seen with.
fn record_replicas(stack: &Stack) -> Arc<Mutex<Vec<i32>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let stream =
        watcher::watcher(stack.runner_sets(), watcher::Config::default()).applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // A watch error (a relist) is not the end of the record.
        while let Some(event) = stream.next().await {
            if let Ok(set) = event {
                sink.lock().unwrap().push(set.spec.replicas);
            }
        }
    });
    seen
}

fn bundled_scaling(name: &str) -> &'static [u8] {
    arcwright::policy::bundled::find(PolicyKind::Scaling, name)
        .expect("a bundled scaling policy")
        .wasm
}

#[tokio::test]
async fn a_burst_scales_up_to_max_and_back_down_to_zero() {
    let stack = stack("burst", Scenario::succeed()).await;
    stack
        .create_scale_set(&ScaleSet::new(SET, 0, 3))
        .await
        .unwrap();
    stack.listening(SET).await.unwrap();
    let replicas = record_replicas(&stack);

    stack.enqueue(SET, 8, Duration::from_millis(300));
    stack.jobs_succeeded(8).await.unwrap();
    stack.settled_at(0).await.unwrap();
    let set = stack
        .scale_set_until(SET, "the last decision is zero", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.scaling.as_ref())
                .is_some_and(|s| s.desired_runners == 0)
        })
        .await
        .unwrap();
    // The watch may deliver the last change after the state settled.
    stack
        .until("the runner set's last replicas seen is 0", || async {
            (replicas.lock().unwrap().last() == Some(&0)).then_some(())
        })
        .await
        .unwrap();
    let replicas = replicas.lock().unwrap().clone();
    assert!(
        replicas.contains(&3),
        "scaled up to maxRunners: {replicas:?}"
    );
    assert!(
        replicas.iter().all(|&r| r <= 3),
        "never above maxRunners: {replicas:?}"
    );

    assert!(!set.status.unwrap().scaling.unwrap().reason.is_empty());
    stack.check_ledger(8).await.unwrap();
}

#[tokio::test]
async fn min_runners_keep_a_warm_pool_through_a_burst() {
    let stack = stack("warm", Scenario::succeed()).await;
    stack
        .create_scale_set(&ScaleSet::new(SET, 2, 4))
        .await
        .unwrap();
    // Two idle runners, registered, before any job.
    stack.settled_at(2).await.unwrap();
    // By pod uid: a runner renewed for another job gets a pod of the
    // same name.
    let warm: BTreeSet<String> = stack.sim().runners().into_iter().map(|r| r.uid).collect();

    stack.enqueue(SET, 5, Duration::from_millis(300));
    stack.jobs_succeeded(5).await.unwrap();
    stack.settled_at(2).await.unwrap();
    // The warm runners took jobs (they were idle and registered), and the
    // pool was refilled with new pods (of renewed runners or new ones).
    let records = stack.sim().runners();
    assert!(
        records
            .iter()
            .filter(|r| warm.contains(&r.uid))
            .all(|r| !r.jobs.is_empty()),
        "{records:?}"
    );
    stack.check_ledger(5).await.unwrap();
}

#[tokio::test]
async fn a_scaling_policy_swapped_in_its_config_map_decides_the_next_burst() {
    let stack = stack("policy-swap", Scenario::succeed()).await;
    stack
        .put_policy("scaling", bundled_scaling("default"))
        .await
        .unwrap();
    let set = ScaleSet::new(SET, 0, 2).with_policy_config_map("scaling");
    stack.create_scale_set(&set).await.unwrap();
    stack.listening(SET).await.unwrap();
    let label = format!("configmap:{}/scaling", stack.namespace());

    stack.enqueue(SET, 2, Duration::from_millis(200));
    stack.jobs_succeeded(2).await.unwrap();
    let before = stack
        .scale_set_until(SET, "a decision by the ConfigMap's module", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.scaling.as_ref())
                .is_some_and(|s| s.policy == label && s.fallback_reason.is_none())
        })
        .await
        .unwrap();
    let reason = before.status.unwrap().scaling.unwrap().reason;
    assert!(!reason.contains("buffer"), "ARC's formula: {reason}");

    // The buffered policy replaces the default in place; the host is not
    // restarted and the scale set is not touched.
    stack
        .put_policy("scaling", bundled_scaling("buffered"))
        .await
        .unwrap();
    stack.enqueue(SET, 2, Duration::from_millis(200));
    stack.jobs_succeeded(4).await.unwrap();
    stack
        .scale_set_until(SET, "a decision by the swapped module", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.scaling.as_ref())
                .is_some_and(|s| s.policy == label && s.reason.contains("buffer"))
        })
        .await
        .unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(4).await.unwrap();
}

#[tokio::test]
async fn a_runner_that_keeps_failing_is_retried_then_given_up_and_replaced() {
    // The production backoff (5 s doubling) would spend a minute and a half
    // waiting; the sequence is the same with a short one.
    let mut config = StackConfig::new("failing");
    config.host_args = vec!["--runner-failure-backoff".into(), "200ms".into()];
    let stack = Stack::start(config).await.expect("the stack starts");
    // The first five runner pods crash on start (exit 1, never connecting):
    // the runner's whole retry budget.
    stack.sim().add_rule(Rule::next(5, Scenario::fail()));
    stack
        .create_scale_set(&ScaleSet::new(SET, 1, 1))
        .await
        .unwrap();

    // The warm runner is retried on new pods until its budget is spent, is
    // then Failed, removed, and replaced by a runner that works.
    stack
        .until("five failed pods", || async {
            // Crashed, and then deleted for the next try (or not yet).
            let crashed = stack
                .sim()
                .runners()
                .iter()
                .filter(|r| r.scenario.fate == Fate::Fail)
                .filter(|r| matches!(r.stage, Stage::Exited { code: 1 } | Stage::Deleted))
                .count();
            (crashed == 5).then_some(())
        })
        .await
        .unwrap();
    stack.settled_at(1).await.unwrap();
    // The runner said it gave up, on the fifth failed start.
    let events: kube::Api<Event> = kube::Api::namespaced(stack.client(), stack.namespace());
    let (name, message) = stack
        .until("the runner reports it gave up", || async {
            let events = events.list(&Default::default()).await.ok()?;
            events.items.into_iter().find_map(|e| {
                (e.reason.as_deref() == Some("RunnerFailed")).then(|| {
                    (
                        e.involved_object.name.unwrap_or_default(),
                        e.message.unwrap_or_default(),
                    )
                })
            })
        })
        .await
        .unwrap();
    assert!(message.contains("5 failed starts"), "{message}");
    let records = stack.sim().runners();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.runner_name.as_deref() == Some(name.as_str()))
            .count(),
        5,
        "each try was a new pod of the same runner: {records:?}"
    );
    // Its registration, never used, was removed by the host.
    assert!(stack.fake().control().ledger().removed_by_api >= 1);

    stack.enqueue(SET, 1, Duration::from_millis(200));
    stack.jobs_succeeded(1).await.unwrap();
    stack.settled_at(1).await.unwrap();
    stack.check_ledger(1).await.unwrap();
}

#[tokio::test]
async fn an_outdated_runner_parks_the_set_until_the_spec_changes() {
    let stack = stack("outdated", Scenario::outdated()).await;
    stack
        .create_scale_set(&ScaleSet::new(SET, 1, 2))
        .await
        .unwrap();
    let set = stack
        .scale_set_until(SET, "the set is Outdated", |set| {
            set.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(AutoscalingRunnerSetPhase::Outdated))
        })
        .await
        .unwrap();
    let id = scale_set_id(&set);
    // Parked: the listener is off and no runner is wanted, whatever
    // minRunners says.
    stack
        .until("the listener is off", || async {
            (!stack.fake().control().has_session(id)).then_some(())
        })
        .await
        .unwrap();
    stack
        .until("the runner set rests at zero", || async {
            let set = stack.runner_sets().list(&Default::default()).await.ok()?;
            set.items.iter().all(|s| s.spec.replicas == 0).then_some(())
        })
        .await
        .unwrap();
    // Every runner pod so far was one that exits 7 (its pod may be gone
    // already: the runner that reported Outdated is cleaned up).
    let outdated = stack.sim().runners();
    assert!(
        outdated.iter().all(|r| r.scenario.fate == Fate::Outdated
            && matches!(r.stage, Stage::Exited { code: 7 } | Stage::Deleted)),
        "{outdated:?}"
    );
    // A job that arrives while parked waits.
    stack.enqueue(SET, 1, Duration::from_millis(200));

    // A new runner version: the spec changes, the set runs again.
    stack.sim().set_default_scenario(Scenario::succeed());
    stack
        .set_image(SET, "ghcr.io/actions/actions-runner:2.331.0")
        .await
        .unwrap();
    stack.listening(SET).await.unwrap();
    stack.jobs_succeeded(1).await.unwrap();
    stack.settled_at(1).await.unwrap();
    stack.check_ledger(1).await.unwrap();
}

#[tokio::test]
async fn a_host_killed_twice_in_a_burst_loses_no_job_and_leaks_nothing() {
    let mut stack = stack("sigkill", Scenario::succeed()).await;
    stack
        .create_scale_set(&ScaleSet::new(SET, 0, 3))
        .await
        .unwrap();
    let set = stack.listening(SET).await.unwrap();
    let id = scale_set_id(&set);
    stack.enqueue(SET, 12, Duration::from_millis(1000));

    for done in [2, 6] {
        stack
            .fake()
            .control()
            .wait_until(arcwright_stack::WAIT, |s| s.ledger.jobs_succeeded >= done)
            .await
            .unwrap();
        stack.kill_host();
        // A killed listener leaves its message session behind; the service
        // expires it after minutes of silence. Dropping it here plays that
        // expiry without the wait.
        stack.fake().control().drop_session(id);
        stack.start_host().await.unwrap();
    }
    stack.jobs_succeeded(12).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(12).await.unwrap();
}

#[tokio::test]
async fn a_thirty_second_actions_outage_is_ridden_out() {
    let stack = stack("outage", Scenario::succeed()).await;
    stack
        .create_scale_set(&ScaleSet::new(SET, 0, 2))
        .await
        .unwrap();
    stack.listening(SET).await.unwrap();
    stack.enqueue(SET, 2, Duration::from_millis(200));
    stack.jobs_succeeded(2).await.unwrap();

    // Every endpoint the host calls answers 503 for 30 s. The runners' own
    // endpoints keep working: a runner already running a job is not the
    // host's to save.
    let control = stack.fake().control();
    let outage = Instant::now();
    for endpoint in Endpoint::ALL {
        if !RUNNER_ENDPOINTS.contains(&endpoint) {
            control.inject(Fault::new(endpoint, FaultKind::status(503), u32::MAX));
        }
    }
    stack.enqueue(SET, 3, Duration::from_millis(200));
    stack
        .until("the host meets the outage", || async {
            (control.counters().faults(Endpoint::GetMessage) > 0).then_some(())
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    control.clear_faults();

    stack.jobs_succeeded(5).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(5).await.unwrap();
}

/// Two replicas; the leader's API server traffic goes through a relay the
/// test cuts, as a partition would, while the Actions service stays
/// reachable. The leader must step down before its Lease can pass: stop
/// polling and delete its sessions, so the standby's listener is the only
/// one and no job is taken by a replica that no longer leads.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_listening_before_the_standby_leads() {
    const LEASE: Duration = Duration::from_secs(10);
    const LEADER: &str = "arcwright-1";
    const STANDBY: &str = "standby";
    let mut config = StackConfig::new("leader");
    config.host_relay = true;
    config.host_args = vec![
        "--leader-elect".into(),
        "--lease-duration".into(),
        format!("{}s", LEASE.as_secs()),
    ];
    let mut stack = Stack::start(config).await.expect("the stack starts");
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(stack.client(), stack.namespace());
    let holder = || async {
        leases
            .get_opt("arcwright-controller")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    };
    stack
        .until("the host leads", || async {
            holder().await.filter(|h| h.starts_with(LEADER)).map(drop)
        })
        .await
        .unwrap();
    let _standby = stack.start_replica(STANDBY).await.unwrap();

    stack
        .create_scale_set(&ScaleSet::new(SET, 0, 2))
        .await
        .unwrap();
    let id = scale_set_id(&stack.listening(SET).await.unwrap());
    stack.enqueue(SET, 2, Duration::from_millis(500));
    stack.jobs_succeeded(2).await.unwrap();

    // The leader's last renewal is at or before the cut; jobs keep coming.
    let cut = SystemTime::now();
    stack.host_relay().unwrap().cut();
    stack.enqueue(SET, 3, Duration::from_millis(500));
    let taken_over = stack
        .until("the standby listens", || async {
            let history = stack.fake().control().session_history();
            history
                .of_scale_set(id)
                .find(|s| s.owner == STANDBY)
                .cloned()
        })
        .await
        .unwrap();
    stack
        .until("the standby leads", || async {
            holder().await.filter(|h| h.starts_with(STANDBY)).map(drop)
        })
        .await
        .unwrap();
    stack.jobs_succeeded(5).await.unwrap();

    let history = stack.fake().control().session_history();
    assert!(
        history.conflicts.is_empty(),
        "a session was refused because another lived: {:?}",
        history.conflicts
    );
    let sessions: Vec<_> = history.of_scale_set(id).collect();
    for pair in sessions.windows(2) {
        assert!(
            pair[0].ended.is_some_and(|ended| ended <= pair[1].created),
            "two sessions at once: {pair:?}"
        );
    }
    let leaders: Vec<_> = sessions.iter().filter(|s| s.owner == LEADER).collect();
    assert!(!leaders.is_empty(), "{sessions:?}");
    for session in &leaders {
        let last_poll = session.last_poll.unwrap_or(session.created);
        assert!(
            last_poll < cut + LEASE,
            "the old leader polled {:?} after the cut, past its lease",
            last_poll.duration_since(cut).unwrap_or_default()
        );
        assert!(session.ended.is_some(), "{session:?}");
    }
    for acquisition in &history.acquisitions {
        if leaders.iter().any(|s| s.id == acquisition.session) {
            assert!(
                acquisition.at < taken_over.created,
                "the old leader acquired {:?} after the standby listened",
                acquisition.jobs
            );
        }
    }
    assert!(
        sessions
            .last()
            .is_some_and(|s| s.owner == STANDBY && s.ended.is_none()),
        "{sessions:?}"
    );

    // Stepping down ends the process (its pod restarts as a standby).
    let host = stack.host_mut().unwrap();
    let exited = arcwright_harness::poll_within(arcwright_stack::WAIT, || {
        let running = host.is_running();
        async move { (!running).then_some(()) }
    })
    .await;
    assert!(exited.is_some(), "the old leader still runs");
    let log = std::fs::read_to_string(stack.host().unwrap().log_path()).unwrap();
    assert!(log.contains("leadership was lost"), "{log}");
    stack.check_ledger(5).await.unwrap();
}

/// Moving a scale set from ARC (docs/migrating.md): ARC registered the scale
/// set, and its listener holds the message session and polls. arcwright's
/// set of the same name adopts that scale set by name, waits out the held
/// session as a conflict, and takes over once ARC's listener stops and
/// deletes its session: every job queued before and after the cut-over
/// runs, on the one scale set, and no registration is left. ARC is not run
/// here (no ARC binary is built); its listener's part is played through the
/// protocol, which is all arcwright sees of it.
#[tokio::test]
async fn a_scale_set_taken_over_from_another_controller_mid_stream_loses_no_job() {
    use arcwright::actions::{
        ActionsClient, ClientOptions, ConfigUrl, Credentials, RunnerScaleSet, Secret,
    };
    let stack = stack("cutover", Scenario::succeed()).await;
    let other = ActionsClient::new(
        ConfigUrl::parse(&stack.fake().org_url("octo")).unwrap(),
        Credentials::Token(Secret::new(stack.fake().pat())),
        ClientOptions {
            allow_plain_http: true,
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let registered = other
        .create_runner_scale_set(&RunnerScaleSet::new(SET, 1, &[]))
        .await
        .unwrap();
    let session = other
        .create_message_session(registered.id, "arc-gha-rs-listener")
        .await
        .unwrap();
    // ARC's listener, polling until it is stopped; what it is offered it
    // leaves on offer, as a listener being stopped does.
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    message = session.get_message(last, 0) => {
                        if let Ok(Some(message)) = message {
                            last = message.id;
                            let _ = session.delete_message(message.id).await;
                        }
                    }
                }
            }
            // Stopped: the session goes with it.
            session.close().await.unwrap();
        })
    };
    stack.enqueue(SET, 4, Duration::from_millis(500));

    stack
        .create_scale_set(&ScaleSet::new(SET, 0, 3))
        .await
        .unwrap();
    stack
        .scale_set_until(
            SET,
            "arcwright adopts the scale set and waits out the held session",
            |set| {
                set.status.as_ref().is_some_and(|status| {
                    status.runner_scale_set_id == Some(registered.id)
                        && status.listener.as_ref().is_some_and(|listener| {
                            listener.reason.as_deref() == Some("SessionConflict")
                        })
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(
        stack.fake().control().ledger().jobs_succeeded,
        0,
        "ARC's session held them"
    );

    // The cut-over: ARC's listener stopped, its session deleted.
    stop.cancel();
    polling.await.unwrap();
    stack.enqueue(SET, 4, Duration::from_millis(500));
    stack.jobs_succeeded(8).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(8).await.unwrap();
    let scale_sets = stack.fake().control().scale_sets();
    assert_eq!(
        scale_sets.len(),
        1,
        "adopted, not registered again: {scale_sets:?}"
    );
    let history = stack.fake().control().session_history();
    assert!(
        history
            .sessions
            .iter()
            .any(|s| s.owner != "arc-gha-rs-listener"),
        "{history:?}"
    );
}

/// Three replicas split thirty scale sets into six shards: each holds two
/// shards and serves their sets, one listener per set in the whole fleet.
/// One replica is killed mid-burst (SIGKILL: its sessions are not deleted,
/// its Leases not released); the survivors take its shards once their
/// Leases have gone unrenewed for a lease duration, and serve its sets
/// again. No session is ever polled once a newer one exists for its set
/// (two listeners never poll one set at once), the only refused sessions
/// are the survivors' attempts while the killed replica's sessions had not
/// yet expired, and every job is done with no registration left.
#[tokio::test]
async fn three_replicas_split_the_fleet_and_a_killed_ones_sets_are_served_again() {
    use std::collections::BTreeMap;
    const LEASE: Duration = Duration::from_secs(6);
    const SHARDS: u32 = 6;
    const SETS: usize = 30;
    const KILLED: &str = "replica-b";
    let mut config = StackConfig::new("shards");
    config.host_args = vec![
        "--shards".into(),
        SHARDS.to_string(),
        "--lease-duration".into(),
        format!("{}s", LEASE.as_secs()),
    ];
    // The service expires a killed listener's session once it has gone
    // unpolled for a while; shorter than the lease here, so what is
    // measured is the shards' hand-over, not the service's expiry.
    config.fake = fake_actions::FakeConfig {
        session_idle_expiry: Duration::from_secs(3),
        ..fake_actions::FakeConfig::default()
    };
    let stack = Stack::start(config).await.expect("the stack starts");
    let replica_b = stack.start_replica(KILLED).await.unwrap();
    let _replica_c = stack.start_replica("replica-c").await.unwrap();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(stack.client(), stack.namespace());
    // A replica's identity is its HOSTNAME, a dash and eight hex digits.
    let replica = |identity: &str| identity[..identity.len().saturating_sub(9)].to_owned();
    let holders = || async {
        let mut holders = Vec::new();
        for shard in 0..SHARDS {
            let lease = leases
                .get_opt(&arcwright::runtime::shards::shard_lease(shard))
                .await
                .ok()??;
            holders.push(replica(&lease.spec?.holder_identity?));
        }
        Some(holders)
    };
    let spread = stack
        .until("two shards for each of the three replicas", || async {
            let holders = holders().await?;
            let mut count: BTreeMap<String, usize> = BTreeMap::new();
            for holder in &holders {
                *count.entry(holder.clone()).or_default() += 1;
            }
            (count.len() == 3 && count.values().all(|n| *n == 2)).then_some(holders)
        })
        .await
        .unwrap();

    let names: Vec<String> = (0..SETS).map(|i| format!("set-{i:02}")).collect();
    for name in &names {
        stack
            .create_scale_set(&ScaleSet::new(name, 0, 2))
            .await
            .unwrap();
    }
    let shard_of =
        |name: &str| arcwright::sharding::shard_of(stack.namespace(), name, SHARDS) as usize;
    let control = stack.fake().control();
    let ids = |names: &[String]| -> Option<Vec<(String, u64)>> {
        let sets = control.scale_sets();
        names
            .iter()
            .map(|name| {
                let set = sets.iter().find(|s| &s.name == name)?;
                Some((name.clone(), set.id))
            })
            .collect()
    };
    // Every set served by the replica holding its shard, and only by it.
    let served_by = |holders: &[String], names: &[String]| -> Option<()> {
        let history = control.session_history();
        for (name, id) in ids(names)? {
            let live: Vec<_> = history
                .of_scale_set(id)
                .filter(|s| s.ended.is_none())
                .collect();
            if live.len() != 1 || live[0].owner != holders[shard_of(&name)] {
                return None;
            }
        }
        Some(())
    };
    stack
        .until("every set served by its shard's holder", || async {
            served_by(&spread, &names)
        })
        .await
        .unwrap();
    let killed_sets: Vec<String> = names
        .iter()
        .filter(|name| spread[shard_of(name)] == KILLED)
        .cloned()
        .collect();
    assert!(!killed_sets.is_empty(), "{spread:?}");

    // A burst over every set; the replica is killed once it is under way.
    for name in &names {
        stack.enqueue(name, 2, Duration::from_secs(2));
    }
    let jobs = u64::try_from(2 * SETS).unwrap();
    stack.jobs_succeeded(jobs / 4).await.unwrap();
    let killed_at = Instant::now();
    let killed_wall = SystemTime::now();
    replica_b.kill();

    let after = stack
        .until(
            "the killed replica's shards taken by the survivors",
            || async {
                let holders = holders().await?;
                holders.iter().all(|h| h != KILLED).then_some(holders)
            },
        )
        .await
        .unwrap();
    stack
        .until("the killed replica's sets served again", || async {
            served_by(&after, &names)
        })
        .await
        .unwrap();
    let served_again = killed_at.elapsed();
    println!(
        "the killed replica's {} sets served again {} ms after the kill (lease {} s)",
        killed_sets.len(),
        served_again.as_millis(),
        LEASE.as_secs()
    );
    assert!(
        served_again < LEASE * 4,
        "served again only after {served_again:?}"
    );

    stack.jobs_succeeded(jobs).await.unwrap();
    stack.settled_at(0).await.unwrap();
    stack.check_ledger(jobs).await.unwrap();

    let history = control.session_history();
    for (name, id) in ids(&names).unwrap() {
        let mut sessions: Vec<_> = history.of_scale_set(id).collect();
        sessions.sort_by_key(|s| s.created);
        for pair in sessions.windows(2) {
            let last_poll = pair[0].last_poll.unwrap_or(pair[0].created);
            assert!(
                pair[0].ended.is_some() && last_poll <= pair[1].created,
                "{name}: a session polled after the next was created: {pair:?}"
            );
        }
        let moved = killed_sets.contains(&name);
        for conflict in history.conflicts.iter().filter(|c| c.scale_set_id == id) {
            assert!(
                moved && conflict.at >= killed_wall,
                "{name}: a session refused while its holder lived: {conflict:?}"
            );
        }
    }
}
