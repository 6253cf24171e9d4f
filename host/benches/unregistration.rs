//! Draining a burst of unregistrations: the pool's queue beside a naive
//! queue of the same semantics that takes from the front of a `Vec`.
//!
//! Seed 000's point is that a burst of deletions arrives all at once, and a
//! queue that shifts its whole tail down on every take drains it in
//! quadratic time, under the lock every push needs. Both queues here claim
//! keys, refuse duplicates, keep ready and delayed requests apart and
//! promote due retries the same way; they differ only in how the ready list
//! gives up its oldest request (`VecDeque::pop_front` against
//! `Vec::remove(0)`, the obvious way to write a FIFO on a `Vec`).
//!
//! `cargo bench -p arcwright --bench unregistration`. After criterion's
//! report, a table gives the median drain time of each queue at each size
//! and the ratio between them; the ratio growing tenfold with the size is
//! the quadratic term.

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arcwright::unregistration::{
    MAX_IDLE_WAIT, Next, Request, UnregistrationKey, UnregistrationQueue,
};
use criterion::{BenchmarkId, Criterion, SamplingMode};

/// A queue a burst can be pushed into and drained from.
trait Drain {
    fn new() -> Self;
    fn push(&mut self, key: UnregistrationKey) -> bool;
    /// Takes the oldest ready request and finishes it, as a worker whose
    /// call succeeded does; `false` when nothing is ready.
    fn take_and_finish(&mut self, now: tokio::time::Instant) -> bool;
}

impl Drain for UnregistrationQueue<()> {
    fn new() -> Self {
        UnregistrationQueue::new(MAX_IDLE_WAIT)
    }

    fn push(&mut self, key: UnregistrationKey) -> bool {
        UnregistrationQueue::push(self, key, ())
    }

    fn take_and_finish(&mut self, now: tokio::time::Instant) -> bool {
        match self.next(now) {
            Next::Ready { request, .. } => {
                self.finish(&request.key);
                true
            }
            Next::Idle { .. } => false,
        }
    }
}

/// The queue written the obvious way: the same claims, ready list, delayed
/// list and promotion as the pool's, with the ready list a `Vec` taken from
/// the front.
struct NaiveQueue {
    ready: Vec<Request<()>>,
    delayed: Vec<(tokio::time::Instant, Request<()>)>,
    claimed: HashSet<UnregistrationKey>,
    in_flight: usize,
}

impl NaiveQueue {
    fn next(&mut self, now: tokio::time::Instant) -> Option<Request<()>> {
        let due = self
            .delayed
            .extract_if(.., |(ready_at, _)| *ready_at <= now);
        self.ready.extend(due.map(|(_, request)| request));
        if self.ready.is_empty() {
            return None;
        }
        self.in_flight += 1;
        Some(self.ready.remove(0))
    }

    fn finish(&mut self, key: &UnregistrationKey) {
        self.in_flight -= 1;
        self.claimed.remove(key);
    }
}

impl Drain for NaiveQueue {
    fn new() -> Self {
        NaiveQueue {
            ready: Vec::new(),
            delayed: Vec::new(),
            claimed: HashSet::new(),
            in_flight: 0,
        }
    }

    fn push(&mut self, key: UnregistrationKey) -> bool {
        if !self.claimed.insert(key.clone()) {
            return false;
        }
        self.ready.push(Request { key, target: () });
        true
    }

    fn take_and_finish(&mut self, now: tokio::time::Instant) -> bool {
        match self.next(now) {
            Some(request) => {
                self.finish(&request.key);
                true
            }
            None => false,
        }
    }
}

fn keys(n: usize) -> Vec<UnregistrationKey> {
    (0..n)
        .map(|i| UnregistrationKey {
            namespace: "ci".into(),
            name: format!("linux-x64-{i:06}"),
            runner_id: i as i64 + 1,
        })
        .collect()
}

/// Pushes every key, then drains the queue; returns how many were drained.
fn burst<Q: Drain>(keys: Vec<UnregistrationKey>) -> usize {
    let now = tokio::time::Instant::now();
    let mut queue = Q::new();
    for key in keys {
        queue.push(key);
    }
    let mut drained = 0;
    while queue.take_and_finish(now) {
        drained += 1;
    }
    drained
}

/// Every timed burst, by (queue, size), for the table.
type Timings = Mutex<HashMap<(&'static str, usize), Vec<Duration>>>;

fn timed<Q: Drain>(
    iters: u64,
    name: &'static str,
    keys: &[UnregistrationKey],
    timings: &Timings,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let batch = keys.to_vec();
        let start = Instant::now();
        let drained = burst::<Q>(batch);
        let elapsed = start.elapsed();
        assert_eq!(black_box(drained), keys.len());
        total += elapsed;
        timings
            .lock()
            .unwrap()
            .entry((name, keys.len()))
            .or_default()
            .push(elapsed);
    }
    total
}

const POOL: &str = "pool (VecDeque)";
const NAIVE: &str = "naive (Vec::remove(0))";

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

fn main() {
    // `cargo test --benches` runs each benchmark once as a smoke test; the
    // full sizes are only worth their minutes under `cargo bench`.
    let benching = std::env::args().any(|arg| arg == "--bench");
    let sizes: &[usize] = if benching {
        &[10_000, 100_000]
    } else {
        &[1_000]
    };
    let timings = Timings::default();
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("unregistration_burst");
        // One naive drain of 100,000 takes seconds: every sample is one
        // drain rather than a growing number of them.
        group.sampling_mode(SamplingMode::Flat);
        for &size in sizes {
            let keys = keys(size);
            group.bench_with_input(BenchmarkId::new("pool", size), &keys, |b, keys| {
                b.iter_custom(|iters| timed::<UnregistrationQueue<()>>(iters, POOL, keys, &timings))
            });
            group.bench_with_input(BenchmarkId::new("naive", size), &keys, |b, keys| {
                b.iter_custom(|iters| timed::<NaiveQueue>(iters, NAIVE, keys, &timings))
            });
        }
        group.finish();
    }
    criterion.final_summary();

    if benching {
        let mut timings = timings.into_inner().unwrap();
        println!(
            "\n{:<12} {:>16} {:>24} {:>10}",
            "burst", POOL, NAIVE, "ratio"
        );
        for &size in sizes {
            let (Some(pool), Some(naive)) = (
                timings.get_mut(&(POOL, size)).map(|t| median(t)),
                timings.get_mut(&(NAIVE, size)).map(|t| median(t)),
            ) else {
                continue;
            };
            println!(
                "{:<12} {:>16.2?} {:>24.2?} {:>9.0}x",
                size,
                pool,
                naive,
                naive.as_secs_f64() / pool.as_secs_f64()
            );
        }
    }
}
