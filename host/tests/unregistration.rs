//! The unregistration pool's properties (seed 000), one test each, with a
//! remover that records its calls, can block, and can answer
//! `JobStillRunning` a given number of times. Delays run on tokio's paused
//! clock, so a 30 s retry costs nothing and "before the idle wait ran out"
//! is an exact statement about virtual time, not a race.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arcwright::unregistration::{
    Finished, PoolConfig, Removal, Remover, UnregistrationKey, UnregistrationPool,
};
use arcwright_harness::eventually;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The idle wait of the pools under test: long, so a worker that only its
/// idle timer woke shows up as a call made after virtual time passed.
const LONG_IDLE: Duration = Duration::from_secs(3600);

/// How long (virtual) a test waits for an event before failing.
const PATIENCE: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
struct FakeState {
    /// Every call: the runner id and when it was made.
    calls: Mutex<Vec<(i64, Instant)>>,
    /// Scripted answers by runner id, used up in order; `Removed` after.
    answers: Mutex<HashMap<i64, VecDeque<Removal>>>,
    /// When set, each call waits for a permit before answering.
    gate: Option<Semaphore>,
}

/// A remover that records calls, can block, and answers as scripted.
#[derive(Clone)]
struct FakeRemover {
    state: Arc<FakeState>,
    started: mpsc::UnboundedSender<i64>,
}

impl FakeRemover {
    /// A remover answering `Removed` at once, and the stream of call ids.
    fn new() -> (Self, mpsc::UnboundedReceiver<i64>) {
        Self::with(FakeState::default())
    }

    /// A remover whose calls block until [`FakeRemover::release`].
    fn blocking() -> (Self, mpsc::UnboundedReceiver<i64>) {
        Self::with(FakeState {
            gate: Some(Semaphore::new(0)),
            ..FakeState::default()
        })
    }

    fn with(state: FakeState) -> (Self, mpsc::UnboundedReceiver<i64>) {
        let (started, calls) = mpsc::unbounded_channel();
        (
            Self {
                state: Arc::new(state),
                started,
            },
            calls,
        )
    }

    fn answer(&self, runner_id: i64, answers: impl IntoIterator<Item = Removal>) {
        self.state
            .answers
            .lock()
            .unwrap()
            .entry(runner_id)
            .or_default()
            .extend(answers);
    }

    fn release(&self, calls: usize) {
        self.state
            .gate
            .as_ref()
            .expect("a blocking remover")
            .add_permits(calls);
    }

    fn calls(&self) -> Vec<(i64, Instant)> {
        self.state.calls.lock().unwrap().clone()
    }
}

impl Remover for FakeRemover {
    type Target = ();

    async fn remove(&self, _target: &(), runner_id: i64) -> Removal {
        self.state
            .calls
            .lock()
            .unwrap()
            .push((runner_id, Instant::now()));
        let _ = self.started.send(runner_id);
        if let Some(gate) = &self.state.gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        self.state
            .answers
            .lock()
            .unwrap()
            .get_mut(&runner_id)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Removal::Removed)
    }
}

type Pool = UnregistrationPool<FakeRemover>;

fn key(runner_id: i64) -> UnregistrationKey {
    UnregistrationKey {
        namespace: "ci".into(),
        name: format!("runner-{runner_id}"),
        runner_id,
    }
}

fn config() -> PoolConfig {
    PoolConfig {
        max_idle_wait: LONG_IDLE,
        ..PoolConfig::default()
    }
}

/// A pool reporting finished requests on a channel.
fn pool(
    remover: &FakeRemover,
    config: PoolConfig,
) -> (Arc<Pool>, mpsc::UnboundedReceiver<Finished>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let pool = UnregistrationPool::new(remover.clone(), config, move |finished| {
        let _ = tx.send(finished);
    });
    (pool, rx)
}

/// Runs the pool's workers in the background until the token is cancelled.
fn start(pool: &Arc<Pool>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(Arc::clone(pool).run(shutdown.clone()));
    (shutdown, handle)
}

/// The next event on `rx`, failing the test if none comes.
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} came"))
        .unwrap_or_else(|| panic!("the {what} channel closed"))
}

/// Lets freshly spawned workers find the queue empty and park.
async fn let_workers_park() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn push_returns_at_once_while_every_worker_is_stuck_in_a_call() {
    let (remover, mut calls) = FakeRemover::blocking();
    let (pool, mut finished) = pool(&remover, config());
    // Pushing needs no running pool at all.
    for id in 0..4 {
        assert!(pool.push(key(id), ()));
    }
    let _run = start(&pool);
    for _ in 0..4 {
        next(&mut calls, "call").await;
    }
    assert_eq!(pool.in_flight(), 4);

    let before = Instant::now();
    for id in 4..1004 {
        assert!(pool.push(key(id), ()), "push {id} was refused");
    }
    assert_eq!(Instant::now(), before, "pushing waited");
    assert_eq!((pool.depth(), pool.in_flight()), (1000, 4));

    remover.release(1004);
    for _ in 0..1004 {
        next(&mut finished, "finished request").await;
    }
    assert_eq!((pool.depth(), pool.in_flight()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_key_queued_or_in_flight_is_dropped_as_a_duplicate() {
    let (remover, mut calls) = FakeRemover::blocking();
    let (pool, mut finished) = pool(&remover, config());
    assert!(pool.push(key(1), ()));
    assert!(!pool.push(key(1), ()), "a queued key is a duplicate");

    let _run = start(&pool);
    assert_eq!(next(&mut calls, "call").await, 1);
    assert!(pool.is_claimed(&key(1)));
    assert!(!pool.push(key(1), ()), "a key in flight is a duplicate");

    remover.release(1);
    let done = next(&mut finished, "finished request").await;
    assert_eq!((done.key, done.removal), (key(1), Removal::Removed));
    assert_eq!(remover.calls().len(), 1, "the service was asked once");
    assert!(!pool.is_claimed(&key(1)));
    assert!(pool.push(key(1), ()), "a finished key can be pushed again");
    assert_eq!(next(&mut calls, "call").await, 1);
}

#[tokio::test(start_paused = true)]
async fn job_still_running_is_retried_after_the_delay_and_keeps_its_claim() {
    let (remover, mut calls) = FakeRemover::new();
    remover.answer(7, [Removal::JobStillRunning, Removal::JobStillRunning]);
    let retry_delay = Duration::from_secs(30);
    let (pool, mut finished) = pool(
        &remover,
        PoolConfig {
            retry_delay,
            ..config()
        },
    );
    let _run = start(&pool);
    assert!(pool.push(key(7), ()));
    next(&mut calls, "call").await;
    // The refused request waits out its 30 s delay queued; polling every
    // 50 ms of virtual time sees it there long before the retry.
    eventually(
        "the refused request to wait out its delay",
        PATIENCE,
        || async { (pool.depth() == 1 && pool.in_flight() == 0).then_some(()) },
    )
    .await;
    assert!(pool.is_claimed(&key(7)), "a retry keeps its claim");
    assert!(!pool.push(key(7), ()), "so a push beside it is dropped");
    assert!(finished.try_recv().is_err(), "a retry is not finished");

    let done = next(&mut finished, "finished request").await;
    assert_eq!(done.removal, Removal::Removed);
    let times: Vec<Instant> = remover.calls().iter().map(|(_, at)| *at).collect();
    assert_eq!(times.len(), 3, "two refusals, then the removal");
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= retry_delay,
            "retried after {:?}",
            pair[1] - pair[0]
        );
    }
    assert!(!pool.is_claimed(&key(7)));
}

#[tokio::test(start_paused = true)]
async fn not_found_counts_as_done() {
    let (remover, _calls) = FakeRemover::new();
    remover.answer(3, [Removal::NotFound]);
    let (pool, mut finished) = pool(&remover, config());
    let _run = start(&pool);
    pool.push(key(3), ());
    let done = next(&mut finished, "finished request").await;
    assert_eq!((done.key, done.removal), (key(3), Removal::NotFound));
    assert!(Removal::NotFound.registration_gone());
    assert!(pool.has_finished(&key(3)), "looking does not take it");
    assert!(pool.has_finished(&key(3)));
    assert_eq!(pool.take_finished(&key(3)), Some(Removal::NotFound));
    assert_eq!(pool.take_finished(&key(3)), None, "an outcome is read once");
    assert!(!pool.has_finished(&key(3)));
    assert!(!pool.is_claimed(&key(3)));
    assert_eq!((pool.depth(), pool.in_flight()), (0, 0));
    assert_eq!(remover.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn other_errors_are_reported_and_dropped_not_retried() {
    let (remover, mut calls) = FakeRemover::new();
    remover.answer(5, [Removal::Failed("the service answered 500".into())]);
    let (pool, mut finished) = pool(&remover, config());
    let _run = start(&pool);
    pool.push(key(5), ());
    let done = next(&mut finished, "finished request").await;
    assert_eq!(
        done.removal,
        Removal::Failed("the service answered 500".into())
    );
    // Nothing of the request is left anywhere in the pool, so nothing can
    // retry it: that is left to the reconciler, which pushes again.
    assert_eq!((pool.depth(), pool.in_flight()), (0, 0));
    assert!(!pool.is_claimed(&key(5)));
    assert_eq!(remover.calls().len(), 1);
    assert!(pool.push(key(5), ()));
    next(&mut calls, "call").await;
    next(&mut calls, "call").await;
    assert_eq!(
        next(&mut finished, "finished request").await.removal,
        Removal::Removed
    );
}

#[tokio::test(start_paused = true)]
async fn a_push_wakes_a_parked_worker() {
    let (remover, mut calls) = FakeRemover::new();
    let (pool, _finished) = pool(&remover, config());
    let _run = start(&pool);
    let_workers_park().await;

    let pushed = Instant::now();
    pool.push(key(1), ());
    next(&mut calls, "call").await;
    // On the paused clock time moves only when every task waits for a
    // timer; a woken worker needs none.
    assert_eq!(
        Instant::now() - pushed,
        Duration::ZERO,
        "the request waited for the idle timer"
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_pushes_spreads_across_every_worker() {
    let (remover, mut calls) = FakeRemover::blocking();
    let (pool, _finished) = pool(&remover, config());
    let _run = start(&pool);
    let_workers_park().await;

    let pushed = Instant::now();
    for id in 0..8 {
        pool.push(key(id), ());
    }
    // Every call blocks, so four calls at once means four workers at once.
    for _ in 0..4 {
        next(&mut calls, "call").await;
    }
    assert_eq!(
        Instant::now() - pushed,
        Duration::ZERO,
        "a worker slept through the burst"
    );
    assert_eq!((pool.in_flight(), pool.depth()), (4, 4));
}

#[tokio::test(start_paused = true)]
async fn the_pool_never_runs_fewer_than_four_workers() {
    let (remover, mut calls) = FakeRemover::blocking();
    let (pool, _finished) = pool(
        &remover,
        PoolConfig {
            workers: 1,
            ..config()
        },
    );
    let _run = start(&pool);
    for id in 0..4 {
        pool.push(key(id), ());
    }
    for _ in 0..4 {
        next(&mut calls, "call").await;
    }
    assert_eq!(pool.in_flight(), 4);
}

#[tokio::test(start_paused = true)]
async fn what_is_queued_at_shutdown_is_dropped() {
    let (remover, mut calls) = FakeRemover::blocking();
    let (pool, mut finished) = pool(&remover, config());
    let (shutdown, run) = start(&pool);
    for id in 0..10 {
        pool.push(key(id), ());
    }
    for _ in 0..4 {
        next(&mut calls, "call").await;
    }
    assert_eq!((pool.in_flight(), pool.depth()), (4, 6));

    shutdown.cancel();
    run.await.expect("the pool stops cleanly");
    // The pool has stopped: what it did is all it will ever do.
    assert_eq!(remover.calls().len(), 4, "queued requests were attempted");
    assert!(
        finished.try_recv().is_err(),
        "abandoned requests were reported"
    );
    assert_eq!((pool.depth(), pool.in_flight()), (0, 0));
    assert!((0..10).all(|id| !pool.is_claimed(&key(id))));
}

#[tokio::test(start_paused = true)]
async fn the_woken_reconciler_finds_the_claim_released_and_the_outcome_stored() {
    let (remover, _calls) = FakeRemover::new();
    remover.answer(9, [Removal::NotFound]);
    let slot: Arc<OnceLock<Weak<Pool>>> = Arc::default();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let pool = UnregistrationPool::new(remover.clone(), config(), {
        let slot = Arc::clone(&slot);
        move |finished: Finished| {
            // What a reconcile triggered by this call would see.
            let pool = slot.get().and_then(Weak::upgrade).expect("the pool");
            let _ = tx.send((
                pool.is_claimed(&finished.key),
                pool.take_finished(&finished.key),
            ));
        }
    });
    slot.set(Arc::downgrade(&pool)).unwrap();
    let _run = start(&pool);
    pool.push(key(9), ());
    assert_eq!(
        next(&mut seen, "finish").await,
        (false, Some(Removal::NotFound))
    );
}
