//! Removing runner registrations from the Actions service off the reconcile
//! path (ARC's `RunnerUnregistrationQueue`, seed 000).
//!
//! Finishing a runner is two unrelated pieces of work: deleting the
//! Kubernetes objects it owns, and removing its registration from the
//! Actions service. Only the first is local and fast. Doing them in sequence
//! puts the reconcile loop behind an external, eventually consistent API, so
//! a burst of completing jobs would leave every reconcile waiting on calls it
//! has no business waiting for.
//!
//! So the EphemeralRunner reconciler hands the registration to an
//! [`UnregistrationPool`] and moves on. [`UnregistrationPool::push`] appends
//! to a queue under a plain mutex and returns; a fixed set of workers makes
//! the API calls. Nothing the Actions service does can extend a reconcile.
//! When a request is done with, the pool calls the `on_finished` callback it
//! was built with, which the controller turns into a reconcile of the runner,
//! and the outcome waits in [`UnregistrationPool::take_finished`]: the pod of
//! a runner that failed may only be deleted once its registration is proven
//! gone (seeds 001 and 002), and this is how the reconciler learns that it is.
//!
//! The queue itself, [`UnregistrationQueue`], is a data structure with the
//! clock passed in and no I/O, so its rules are unit-tested directly and the
//! benchmark (`benches/unregistration.rs`) drains it without a runtime.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// How long a request waits before it is attempted again after the service
/// reported that the runner is still executing a job (ARC's
/// `unregistrationRetryDelay`).
pub const RETRY_DELAY: Duration = Duration::from_secs(30);

/// The lower bound on the number of workers (ARC's
/// `unregistrationMinWorkers`). The reconcilers may run with little
/// concurrency, and sizing the pool off that alone would leave one worker to
/// absorb every burst.
pub const MIN_WORKERS: usize = 4;

/// How long an idle worker sleeps when the queue holds nothing it can act on
/// yet (ARC's `unregistrationMaxIdleWait`). Pushes wake workers directly, so
/// this is only a backstop against a wake-up that was coalesced away.
pub const MAX_IDLE_WAIT: Duration = Duration::from_secs(30);

/// How many outcomes nobody has taken yet are kept for
/// [`UnregistrationPool::take_finished`]. A runner deleted while its request
/// was in flight never asks for its outcome, so the store must forget on its
/// own; this many is far more than are ever waiting to be read, and costs a
/// few hundred kilobytes at most.
pub const FINISHED_CAPACITY: usize = 10_000;

/// Identifies a registration: runner ids are unique only within a GitHub
/// scope, and one controller serves several, so the EphemeralRunner's
/// namespace and name are part of the key (seed 000).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnregistrationKey {
    /// The EphemeralRunner's namespace.
    pub namespace: String,
    /// The EphemeralRunner's name.
    pub name: String,
    /// The runner id the Actions service assigned.
    pub runner_id: i64,
}

/// How one removal attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The service removed the registration.
    Removed,
    /// The registration was already gone, which is the outcome the request
    /// wanted: it counts as done.
    NotFound,
    /// The service refused because the runner is still executing a job. The
    /// pool retries after [`PoolConfig::retry_delay`], keeping the claim;
    /// the job is never cancelled to make the removal go through.
    JobStillRunning,
    /// Anything else. The pool logs it and drops the request; the message
    /// carries no secret.
    Failed(String),
}

impl Removal {
    /// Whether the pool is done with a request that ended this way: every
    /// outcome but [`Removal::JobStillRunning`].
    pub fn is_done(&self) -> bool {
        !matches!(self, Self::JobStillRunning)
    }

    /// Whether the registration is known to be gone, so the runner's pod can
    /// go without racing a job assignment.
    pub fn registration_gone(&self) -> bool {
        matches!(self, Self::Removed | Self::NotFound)
    }

    /// The `outcome` label of `arcwright_unregistrations_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Removed => "removed",
            Self::NotFound => "not_found",
            Self::JobStillRunning => "job_still_running",
            Self::Failed(_) => "failed",
        }
    }
}

/// What actually calls the Actions service. Production resolves the runner's
/// credentials (`credentials::ActionsClients`) and calls
/// `ActionsClient::remove_runner`; tests use a fake.
pub trait Remover: Send + Sync + 'static {
    /// Whatever the remover needs to find the right credentials for this
    /// runner. The pool keeps it with the request because by the time a
    /// worker gets to it the EphemeralRunner is usually gone from the API
    /// server.
    type Target: Send + Sync + 'static;

    /// Makes one removal attempt. Errors are answers, not panics: whatever
    /// went wrong is a [`Removal::Failed`].
    fn remove(&self, target: &Self::Target, runner_id: i64)
    -> impl Future<Output = Removal> + Send;
}

/// How the pool runs.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// How many workers make API calls; never fewer than [`MIN_WORKERS`].
    pub workers: usize,
    /// How long a request waits after [`Removal::JobStillRunning`].
    pub retry_delay: Duration,
    /// The longest an idle worker sleeps without being woken.
    pub max_idle_wait: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            workers: MIN_WORKERS,
            retry_delay: RETRY_DELAY,
            max_idle_wait: MAX_IDLE_WAIT,
        }
    }
}

/// Reported once per request the pool is done with ([`Removal::Removed`],
/// [`Removal::NotFound`] or [`Removal::Failed`]; never for a
/// [`Removal::JobStillRunning`] retry, which is not done).
#[derive(Clone, Debug)]
pub struct Finished {
    /// The registration the request was for.
    pub key: UnregistrationKey,
    /// How it ended.
    pub removal: Removal,
}

/// One queued attempt to remove one registration.
#[derive(Debug)]
pub struct Request<T> {
    /// The registration to remove.
    pub key: UnregistrationKey,
    /// What the remover needs to reach the right service with the right
    /// credentials.
    pub target: T,
}

/// A request waiting out a retry delay.
#[derive(Debug)]
struct Delayed<T> {
    ready_at: Instant,
    request: Request<T>,
}

/// What a worker should do next.
#[derive(Debug)]
pub enum Next<T> {
    /// Attempt this request now.
    Ready {
        /// The request, now counted as in flight until
        /// [`UnregistrationQueue::finish`] or [`UnregistrationQueue::retry`].
        request: Request<T>,
        /// More is waiting (ready or delayed): wake another worker, because a
        /// burst of pushes leaves at most one wake-up behind and the burst
        /// should spread across the pool rather than be worked through by
        /// whichever worker happened to take the first request.
        hand_on: bool,
    },
    /// Nothing is ready. Sleep at most this long, until the earliest delayed
    /// request comes due (capped at the idle wait); a push cuts it short.
    Idle {
        /// How long to sleep at most.
        wait: Duration,
    },
}

/// The pool's queue without its workers: the claims, the ready requests and
/// the delayed ones, with the clock passed in.
///
/// Public so the benchmark can drain it directly; the pool is the only
/// production user.
#[derive(Debug)]
pub struct UnregistrationQueue<T> {
    /// Requests that can be attempted now, oldest first. A `VecDeque`
    /// because a burst of deletions arrives all at once and taking from the
    /// front of a `Vec` would shift the whole tail on every take, making
    /// the drain quadratic, under the lock `push` needs (the benchmark shows
    /// what that costs at 100,000).
    ready: VecDeque<Request<T>>,
    /// Requests waiting out a retry delay. Only a runner the service reported
    /// as still executing a job ends up here, so it stays short enough to
    /// scan on every take.
    delayed: Vec<Delayed<T>>,
    /// The key of every request that has been taken on and not yet finished
    /// with, whether queued, delayed or in an API call. Pushing a key that
    /// is in here drops the request, so the service is never asked twice to
    /// remove the same registration.
    ///
    /// A retry keeps its claim, which is what this mainly protects: two
    /// copies of a request for a runner still executing a job would sit in
    /// the delayed list retrying in lockstep for as long as the job runs.
    claimed: HashSet<UnregistrationKey>,
    /// Requests handed to a worker and not yet finished or put back.
    in_flight: usize,
    /// The cap on [`Next::Idle`]'s wait.
    max_idle_wait: Duration,
}

impl<T> UnregistrationQueue<T> {
    /// An empty queue whose idle workers sleep at most `max_idle_wait`.
    pub fn new(max_idle_wait: Duration) -> Self {
        Self {
            ready: VecDeque::new(),
            delayed: Vec::new(),
            claimed: HashSet::new(),
            in_flight: 0,
            max_idle_wait,
        }
    }

    /// Queues a request for a registration that is not already claimed, and
    /// reports whether it took it on. `false` means a request for the same
    /// key is queued, delayed or in flight, and this one was dropped.
    pub fn push(&mut self, key: UnregistrationKey, target: T) -> bool {
        if self.claimed.contains(&key) {
            return false;
        }
        self.claimed.insert(key.clone());
        self.ready.push_back(Request { key, target });
        true
    }

    /// Takes the oldest request that is ready at `now`, first promoting every
    /// delayed request that has come due.
    pub fn next(&mut self, now: Instant) -> Next<T> {
        let wait = self.promote(now);
        match self.ready.pop_front() {
            Some(request) => {
                self.in_flight += 1;
                Next::Ready {
                    request,
                    hand_on: !self.ready.is_empty() || !self.delayed.is_empty(),
                }
            }
            None => Next::Idle { wait },
        }
    }

    /// Puts an in-flight request back, to be attempted no earlier than
    /// `ready_at`. It keeps the claim it holds, so it cannot be turned away
    /// as a duplicate of itself, and nothing can queue beside it.
    pub fn retry(&mut self, request: Request<T>, ready_at: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.delayed.push(Delayed { ready_at, request });
    }

    /// Gives up the claim of an in-flight request that is done with, whatever
    /// the outcome. A later push of the same key is taken on as a new
    /// request.
    pub fn finish(&mut self, key: &UnregistrationKey) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.claimed.remove(key);
    }

    /// Drops everything waiting (ready and delayed) with its claim, and
    /// returns how many requests that was. Only the pool's shutdown does
    /// this; see [`UnregistrationPool`] for why dropping is safe.
    pub fn drop_queued(&mut self) -> usize {
        let dropped = self.ready.len() + self.delayed.len();
        for request in self.ready.drain(..) {
            self.claimed.remove(&request.key);
        }
        for delayed in self.delayed.drain(..) {
            self.claimed.remove(&delayed.request.key);
        }
        dropped
    }

    /// Requests waiting, ready or delayed.
    pub fn depth(&self) -> usize {
        self.ready.len() + self.delayed.len()
    }

    /// Requests handed to a worker and not yet finished or put back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether a request for `key` is queued, delayed or in flight.
    pub fn is_claimed(&self, key: &UnregistrationKey) -> bool {
        self.claimed.contains(key)
    }

    /// Moves every delayed request that has come due onto the ready list, in
    /// one pass, and returns how long to wait for the earliest of the rest,
    /// capped at the idle wait. A burst of runners refused together comes
    /// due together, and taking them out one at a time would shift the rest
    /// of the list on every promotion.
    fn promote(&mut self, now: Instant) -> Duration {
        let mut wait = self.max_idle_wait;
        if self.delayed.is_empty() {
            return wait;
        }
        let due = self.delayed.extract_if(.., |delayed| {
            if delayed.ready_at <= now {
                true
            } else {
                wait = wait.min(delayed.ready_at - now);
                false
            }
        });
        self.ready.extend(due.map(|delayed| delayed.request));
        wait
    }
}

/// Outcomes waiting to be read, the oldest forgotten first once there are
/// more than the capacity.
#[derive(Debug)]
struct FinishedOutcomes {
    /// The outcome of each key and the sequence number it was stored with.
    outcomes: HashMap<UnregistrationKey, (u64, Removal)>,
    /// Keys in the order they were stored. An entry whose sequence number no
    /// longer matches the map (taken, or stored again since) is stale and
    /// skipped; stale entries are swept out when they outnumber the live
    /// ones, so the order never grows beyond twice the capacity.
    order: VecDeque<(u64, UnregistrationKey)>,
    next_seq: u64,
    capacity: usize,
}

impl FinishedOutcomes {
    fn new(capacity: usize) -> Self {
        Self {
            outcomes: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
            capacity: capacity.max(1),
        }
    }

    fn store(&mut self, key: UnregistrationKey, removal: Removal) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outcomes.insert(key.clone(), (seq, removal));
        self.order.push_back((seq, key));
        while self.outcomes.len() > self.capacity {
            let Some((seq, key)) = self.order.pop_front() else {
                break;
            };
            if self.outcomes.get(&key).is_some_and(|(s, _)| *s == seq) {
                self.outcomes.remove(&key);
            }
        }
        if self.order.len() > 2 * self.capacity {
            let outcomes = &self.outcomes;
            self.order
                .retain(|(seq, key)| outcomes.get(key).is_some_and(|(s, _)| s == seq));
        }
    }

    fn take(&mut self, key: &UnregistrationKey) -> Option<Removal> {
        self.outcomes.remove(key).map(|(_, removal)| removal)
    }

    fn contains(&self, key: &UnregistrationKey) -> bool {
        self.outcomes.contains_key(key)
    }
}

/// Labels of `arcwright_unregistrations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// [`Removal::metric_label`].
    pub outcome: String,
}

/// What one pool last added to the shared gauges.
#[derive(Debug, Default)]
struct Reported {
    depth: AtomicI64,
    in_flight: AtomicI64,
}

/// The pool's metrics. Clones share the same series.
#[derive(Clone, Debug, Default)]
pub struct UnregistrationMetrics {
    /// `arcwright_unregistrations_total{outcome}`: removal attempts by how
    /// they ended (`job_still_running` counts each refused attempt).
    pub attempts: Family<OutcomeLabels, Counter>,
    /// `arcwright_unregistration_queue_depth`: requests waiting, ready or
    /// delayed.
    pub queue_depth: Gauge,
    /// `arcwright_unregistration_in_flight`: requests in an API call.
    pub in_flight: Gauge,
}

impl UnregistrationMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "arcwright_unregistrations",
            "Runner registration removal attempts by outcome",
            metrics.attempts.clone(),
        );
        registry.register(
            "arcwright_unregistration_queue_depth",
            "Runner registration removals waiting, ready or delayed",
            metrics.queue_depth.clone(),
        );
        registry.register(
            "arcwright_unregistration_in_flight",
            "Runner registration removals in an API call",
            metrics.in_flight.clone(),
        );
        // Every outcome's series exists from the start, at zero: `rate()`
        // then sees the first failure, and the alert on failed removals
        // finds its metric before anything failed.
        for removal in [
            Removal::Removed,
            Removal::NotFound,
            Removal::JobStillRunning,
            Removal::Failed(String::new()),
        ] {
            let _ = metrics.attempts.get_or_create(&OutcomeLabels {
                outcome: removal.metric_label().to_string(),
            });
        }
        metrics
    }

    /// Moves the gauges by what changed in `queue` since this pool last
    /// reported (`reported`), rather than setting them: a host watching
    /// several namespaces runs one pool per namespace, and the gauges are
    /// the sum of them all, not whichever pool spoke last.
    fn observe<T>(&self, queue: &UnregistrationQueue<T>, reported: &Reported) {
        let depth = i64::try_from(queue.depth()).unwrap_or(i64::MAX);
        let in_flight = i64::try_from(queue.in_flight()).unwrap_or(i64::MAX);
        self.queue_depth
            .inc_by(depth - reported.depth.swap(depth, Ordering::Relaxed));
        self.in_flight
            .inc_by(in_flight - reported.in_flight.swap(in_flight, Ordering::Relaxed));
    }

    fn count(&self, removal: &Removal) {
        self.attempts
            .get_or_create(&OutcomeLabels {
                outcome: removal.metric_label().to_string(),
            })
            .inc();
    }
}

/// Removes runners from the Actions service outside of the EphemeralRunner
/// reconcile loop.
///
/// The reconciler pushes and moves on; [`UnregistrationPool::run`] drains
/// the queue with a fixed set of workers. Failures are logged and dropped
/// rather than retried, with one exception: the service refuses to remove a
/// runner it still considers to be executing a job, and that request goes
/// back on the queue after [`PoolConfig::retry_delay`]. There is no caller
/// waiting on anything else, and the reconciler, which is told of every
/// outcome, requeues itself and pushes again when it still needs the
/// registration gone; retrying here as well would only build a backlog of
/// calls the service is already going to make unnecessary.
///
/// The queue is in memory only, and deliberately so. Requests still queued
/// when the controller stops or loses leader election are dropped, and
/// nothing here recovers them. That is acceptable because this is not the
/// only thing that removes a runner: the reconciler of a runner whose pod is
/// still waiting for its registration to go pushes again when it next runs,
/// on whichever replica leads, and the Actions service drops a registration
/// on its own once the runner stops reporting in, so a lost request delays
/// cleanup rather than leaking the registration. Making the queue durable
/// would mean a write to the API server for every deletion, which is the
/// cost this type exists to avoid.
pub struct UnregistrationPool<R: Remover> {
    remover: R,
    config: PoolConfig,
    /// A plain mutex, not an async one: every critical section is a few
    /// pointer moves with no await inside, and `push` must never wait on
    /// anything the pool is doing.
    queue: Mutex<UnregistrationQueue<R::Target>>,
    finished: Mutex<FinishedOutcomes>,
    /// A single stored wake-up for a waiting worker. `notify_one` never
    /// blocks, wakes one parked worker, and when none is parked keeps one
    /// permit (not a count) for whoever waits next, which is why a worker
    /// that takes a request hands the wake-up on while more is waiting.
    wake: Notify,
    on_finished: Box<dyn Fn(Finished) + Send + Sync>,
    metrics: UnregistrationMetrics,
    reported: Reported,
}

impl<R: Remover> std::fmt::Debug for UnregistrationPool<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnregistrationPool")
            .field("config", &self.config)
            .field("depth", &self.depth())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl<R: Remover> UnregistrationPool<R> {
    /// Builds a pool whose metrics are not registered anywhere.
    ///
    /// `on_finished` is called (synchronously; it must not block) for every
    /// request the pool is done with; the EphemeralRunner controller turns
    /// it into a reconcile trigger. It is called after the claim is released
    /// and the outcome is stored, so the reconcile it triggers can read the
    /// outcome with [`UnregistrationPool::take_finished`] and push again.
    pub fn new(
        remover: R,
        config: PoolConfig,
        on_finished: impl Fn(Finished) + Send + Sync + 'static,
    ) -> Arc<Self> {
        Self::with_metrics(
            remover,
            config,
            UnregistrationMetrics::default(),
            on_finished,
        )
    }

    /// Builds a pool that reports to `metrics` (see
    /// [`UnregistrationMetrics::register`]).
    pub fn with_metrics(
        remover: R,
        config: PoolConfig,
        metrics: UnregistrationMetrics,
        on_finished: impl Fn(Finished) + Send + Sync + 'static,
    ) -> Arc<Self> {
        let config = PoolConfig {
            workers: config.workers.max(MIN_WORKERS),
            ..config
        };
        Arc::new(Self {
            remover,
            queue: Mutex::new(UnregistrationQueue::new(config.max_idle_wait)),
            finished: Mutex::new(FinishedOutcomes::new(FINISHED_CAPACITY)),
            config,
            wake: Notify::new(),
            on_finished: Box::new(on_finished),
            metrics,
            reported: Reported::default(),
        })
    }

    /// Queues the removal of a registration.
    ///
    /// It moves the request into the queue and returns. It never blocks,
    /// never fails and never touches the network, so no reconcile can be
    /// delayed by how far behind the pool is or by how the service behaves.
    ///
    /// A registration already queued, delayed for a retry or in the middle
    /// of being removed is not queued again (`false`), so the service is
    /// asked to remove it once. The caller learns the outcome of the request
    /// that holds the claim.
    pub fn push(&self, key: UnregistrationKey, target: R::Target) -> bool {
        let mut queue = self.queue();
        let taken = queue.push(key.clone(), target);
        self.metrics.observe(&queue, &self.reported);
        drop(queue);
        if taken {
            self.wake.notify_one();
        } else {
            tracing::debug!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                "the runner is already queued for removal from the service"
            );
        }
        taken
    }

    /// Runs the workers until `shutdown` is cancelled.
    ///
    /// Calls in flight are abandoned and whatever is still queued is dropped
    /// (see the type's documentation for why that is safe); neither is
    /// reported to `on_finished`, because neither is done. Meant to be
    /// spawned once, for the life of the controller.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let workers = self.config.workers;
        tracing::info!(workers, "starting the runner unregistration workers");
        let mut tasks = JoinSet::new();
        for worker in 0..workers {
            let pool = Arc::clone(&self);
            let shutdown = shutdown.clone();
            tasks.spawn(
                async move { pool.work(&shutdown).await }
                    .instrument(tracing::info_span!("unregistration_worker", worker)),
            );
        }
        while let Some(joined) = tasks.join_next().await {
            if let Err(err) = joined {
                tracing::error!("a runner unregistration worker stopped abnormally: {err}");
            }
        }
        let mut queue = self.queue();
        let dropped = queue.drop_queued();
        self.metrics.observe(&queue, &self.reported);
        drop(queue);
        tracing::info!(
            dropped,
            "stopped the runner unregistration workers; queued removals are left to the service"
        );
    }

    /// The outcome of the last finished request for `key`, removed as it is
    /// read. Outcomes nobody takes are kept for the last
    /// [`FINISHED_CAPACITY`] requests, oldest forgotten first.
    pub fn take_finished(&self, key: &UnregistrationKey) -> Option<Removal> {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(key)
    }

    /// Whether an outcome for `key` waits to be taken (without taking it).
    pub fn has_finished(&self, key: &UnregistrationKey) -> bool {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
    }

    /// Requests waiting, ready or delayed.
    pub fn depth(&self) -> usize {
        self.queue().depth()
    }

    /// Requests in an API call right now.
    pub fn in_flight(&self) -> usize {
        self.queue().in_flight()
    }

    /// Whether a request for `key` is queued, delayed or in flight.
    pub fn is_claimed(&self, key: &UnregistrationKey) -> bool {
        self.queue().is_claimed(key)
    }

    /// The queue, whatever a panicking thread left it as: every critical
    /// section leaves it consistent, so a poisoned lock is not a reason to
    /// stop removing runners.
    fn queue(&self) -> MutexGuard<'_, UnregistrationQueue<R::Target>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The loop of one worker: take whatever is ready, and when nothing is,
    /// wait for the shorter of the next delayed request coming due and the
    /// next push.
    async fn work(&self, shutdown: &CancellationToken) {
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let next = {
                let mut queue = self.queue();
                let next = queue.next(Instant::now());
                self.metrics.observe(&queue, &self.reported);
                next
            };
            match next {
                Next::Ready { request, hand_on } => {
                    if hand_on {
                        self.wake.notify_one();
                    }
                    self.attempt(request, shutdown).await;
                }
                // The wait is an upper bound, not a commitment: a push cuts
                // it short. That is what keeps a request needing no wait from
                // queueing behind ones that do, even when every worker is
                // parked on a retry half a minute out.
                Next::Idle { wait } => {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return,
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Makes one removal attempt and settles the request by its outcome.
    async fn attempt(&self, request: Request<R::Target>, shutdown: &CancellationToken) {
        let key = &request.key;
        let removal = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            removal = self.remover.remove(&request.target, key.runner_id) => Some(removal),
        };
        let Some(removal) = removal else {
            tracing::info!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                "shutting down before the runner could be removed from the service; leaving it to the service"
            );
            let mut queue = self.queue();
            queue.finish(key);
            self.metrics.observe(&queue, &self.reported);
            return;
        };
        self.metrics.count(&removal);
        match &removal {
            Removal::Removed => tracing::info!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                "removed the runner from the service"
            ),
            Removal::NotFound => tracing::info!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                "the runner was already removed from the service"
            ),
            Removal::JobStillRunning => tracing::info!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                retry_after = ?self.config.retry_delay,
                "the runner is still executing a job; retrying the removal later"
            ),
            Removal::Failed(message) => tracing::warn!(
                namespace = %key.namespace,
                name = %key.name,
                runner_id = key.runner_id,
                "failed to remove the runner from the service, leaving it to the service: {message}"
            ),
        }

        if !removal.is_done() {
            let ready_at = Instant::now() + self.config.retry_delay;
            let mut queue = self.queue();
            queue.retry(request, ready_at);
            self.metrics.observe(&queue, &self.reported);
            drop(queue);
            // A parked worker's wait was computed before this request was
            // delayed; waking one lets it shorten its sleep to the retry.
            self.wake.notify_one();
            return;
        }

        let key = request.key;
        {
            let mut queue = self.queue();
            queue.finish(&key);
            self.metrics.observe(&queue, &self.reported);
        }
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .store(key.clone(), removal.clone());
        (self.on_finished)(Finished { key, removal });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(runner_id: i64) -> UnregistrationKey {
        UnregistrationKey {
            namespace: "ci".into(),
            name: format!("runner-{runner_id}"),
            runner_id,
        }
    }

    fn queue() -> UnregistrationQueue<()> {
        UnregistrationQueue::new(MAX_IDLE_WAIT)
    }

    fn take(queue: &mut UnregistrationQueue<()>, now: Instant) -> (i64, bool) {
        match queue.next(now) {
            Next::Ready { request, hand_on } => (request.key.runner_id, hand_on),
            Next::Idle { wait } => panic!("nothing ready; wait {wait:?}"),
        }
    }

    fn idle_wait(queue: &mut UnregistrationQueue<()>, now: Instant) -> Duration {
        match queue.next(now) {
            Next::Idle { wait } => wait,
            Next::Ready { request, .. } => panic!("{:?} was ready", request.key),
        }
    }

    #[test]
    fn requests_are_taken_in_push_order_and_the_wake_up_is_handed_on_while_more_wait() {
        let now = Instant::now();
        let mut q = queue();
        for id in 1..=3 {
            assert!(q.push(key(id), ()));
        }
        assert_eq!(take(&mut q, now), (1, true));
        assert_eq!(take(&mut q, now), (2, true));
        assert_eq!(take(&mut q, now), (3, false));
        assert_eq!((q.depth(), q.in_flight()), (0, 3));
        assert_eq!(idle_wait(&mut q, now), MAX_IDLE_WAIT);
    }

    #[test]
    fn a_claimed_key_is_refused_until_its_request_is_finished() {
        let now = Instant::now();
        let mut q = queue();
        assert!(q.push(key(1), ()));
        assert!(!q.push(key(1), ()), "queued");
        // Same id in another runner (another GitHub scope) is another key.
        let other = UnregistrationKey {
            namespace: "other".into(),
            ..key(1)
        };
        assert!(q.push(other, ()));
        assert_eq!(take(&mut q, now).0, 1);
        assert!(!q.push(key(1), ()), "in flight");
        q.finish(&key(1));
        assert!(!q.is_claimed(&key(1)));
        assert!(q.push(key(1), ()), "finished");
    }

    #[test]
    fn a_retry_keeps_its_claim_and_waits_out_its_delay() {
        let now = Instant::now();
        let mut q = queue();
        q.push(key(1), ());
        let Next::Ready { request, .. } = q.next(now) else {
            panic!("ready")
        };
        q.retry(request, now + RETRY_DELAY);
        assert_eq!((q.depth(), q.in_flight()), (1, 0));
        assert!(!q.push(key(1), ()), "a delayed request holds its claim");
        assert_eq!(
            idle_wait(&mut q, now + Duration::from_secs(10)),
            Duration::from_secs(20)
        );
        assert_eq!(take(&mut q, now + RETRY_DELAY), (1, false));
    }

    #[test]
    fn the_idle_wait_is_capped_and_a_delayed_request_keeps_the_wake_up_going() {
        let now = Instant::now();
        let mut q = UnregistrationQueue::new(Duration::from_secs(5));
        for id in 1..=2 {
            q.push(key(id), ());
        }
        let Next::Ready { request, .. } = q.next(now) else {
            panic!("ready")
        };
        q.retry(request, now + RETRY_DELAY);
        // One ready, one delayed: taking the ready one hands the wake-up on.
        assert_eq!(take(&mut q, now), (2, true));
        assert_eq!(idle_wait(&mut q, now), Duration::from_secs(5));
    }

    #[test]
    fn due_retries_are_promoted_together_in_order_and_the_rest_stay() {
        let now = Instant::now();
        let mut q = queue();
        for id in 1..=5 {
            q.push(key(id), ());
        }
        let mut requests = Vec::new();
        while let Next::Ready { request, .. } = q.next(now) {
            requests.push(request);
        }
        for (request, secs) in requests.into_iter().zip([1, 9, 2, 9, 3]) {
            q.retry(request, now + Duration::from_secs(secs));
        }
        let later = now + Duration::from_secs(5);
        let promoted: Vec<i64> = (0..3).map(|_| take(&mut q, later).0).collect();
        assert_eq!(promoted, [1, 3, 5]);
        assert_eq!(idle_wait(&mut q, later), Duration::from_secs(4));
        assert_eq!(q.depth(), 2);
    }

    #[test]
    fn shutdown_drops_what_waits_and_releases_its_claims() {
        let now = Instant::now();
        let mut q = queue();
        for id in 1..=3 {
            q.push(key(id), ());
        }
        let Next::Ready { request, .. } = q.next(now) else {
            panic!("ready")
        };
        q.retry(request, now + RETRY_DELAY);
        assert_eq!(q.drop_queued(), 3);
        assert_eq!(q.depth(), 0);
        assert!((1..=3).all(|id| !q.is_claimed(&key(id))));
    }

    #[test]
    fn outcomes_are_taken_once_and_the_oldest_are_forgotten() {
        let mut store = FinishedOutcomes::new(2);
        store.store(key(1), Removal::Removed);
        store.store(key(2), Removal::NotFound);
        assert_eq!(store.take(&key(2)), Some(Removal::NotFound));
        assert_eq!(store.take(&key(2)), None, "taken once");
        store.store(key(3), Removal::Failed("boom".into()));
        store.store(key(4), Removal::Removed);
        assert_eq!(store.take(&key(1)), None, "the oldest is evicted");
        assert_eq!(store.take(&key(3)), Some(Removal::Failed("boom".into())));
        assert_eq!(store.take(&key(4)), Some(Removal::Removed));
    }

    #[test]
    fn storing_a_key_again_renews_it_and_the_order_stays_bounded() {
        let mut store = FinishedOutcomes::new(2);
        store.store(key(1), Removal::Failed("first".into()));
        store.store(key(2), Removal::Removed);
        store.store(key(1), Removal::Removed);
        store.store(key(3), Removal::Removed);
        // key 2 is now the oldest; key 1 was renewed.
        assert_eq!(store.take(&key(2)), None);
        assert_eq!(store.take(&key(1)), Some(Removal::Removed));
        for _ in 0..100 {
            store.store(key(5), Removal::Removed);
        }
        assert!(store.order.len() <= 4, "{}", store.order.len());
        assert_eq!(store.take(&key(5)), Some(Removal::Removed));
    }

    #[test]
    fn outcomes_are_labelled_as_documented() {
        let mut registry = Registry::default();
        let metrics = UnregistrationMetrics::register(&mut registry);
        for removal in [
            Removal::Removed,
            Removal::NotFound,
            Removal::JobStillRunning,
            Removal::JobStillRunning,
            Removal::Failed("x".into()),
        ] {
            metrics.count(&removal);
        }
        let mut q = queue();
        q.push(key(1), ());
        q.push(key(2), ());
        q.next(Instant::now());
        // Two pools (two namespaces) report into the same gauges: they add
        // up, and a pool reporting again the same counts adds nothing.
        let (first, second) = (Reported::default(), Reported::default());
        metrics.observe(&q, &first);
        let mut other = queue();
        other.push(key(3), ());
        other.push(key(4), ());
        metrics.observe(&other, &second);
        metrics.observe(&q, &first);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"arcwright_unregistrations_total{outcome="removed"} 1"#,
            r#"arcwright_unregistrations_total{outcome="not_found"} 1"#,
            r#"arcwright_unregistrations_total{outcome="job_still_running"} 2"#,
            r#"arcwright_unregistrations_total{outcome="failed"} 1"#,
            "arcwright_unregistration_queue_depth 3",
            "arcwright_unregistration_in_flight 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
