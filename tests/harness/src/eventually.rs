//! Waiting in tests for something that must happen.
//!
//! A test against a real API server cannot know when a controller will
//! act, only that it must within some bound. [`eventually`] polls until the
//! probe answers and fails the test, naming what never happened, once the
//! bound has passed. It is a bound on waiting for an event, never a delay
//! before checking that something did *not* happen: a test that claims an
//! absence waits for the event that proves it (a later write, a count that
//! can only move after the path in question was or was not taken).

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] asks again.
pub const POLL: Duration = Duration::from_millis(50);

/// Polls `probe` every [`POLL`] until it yields a value and returns it;
/// panics with `what` (and, for context, what `explain` says then) if
/// `within` passes first. Uses tokio's clock, so it also works in
/// virtual time.
pub async fn eventually_explained<T, Fut>(
    what: impl Display,
    within: Duration,
    probe: impl FnMut() -> Fut,
    explain: impl Fn() -> String,
) -> T
where
    Fut: Future<Output = Option<T>>,
{
    match poll_within(within, probe).await {
        Some(value) => value,
        None => {
            let context = explain();
            if context.is_empty() {
                panic!("never within {within:?}: {what}");
            }
            panic!("never within {within:?}: {what}\n{context}");
        }
    }
}

/// The polling under [`eventually`], for a caller that reports a timeout
/// as an error rather than a failed test (the demo, which must tear its
/// stack down): `probe`'s first value, or `None` once `within` has passed.
pub async fn poll_within<T, Fut>(within: Duration, mut probe: impl FnMut() -> Fut) -> Option<T>
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually_explained`] without context.
pub async fn eventually<T, Fut>(
    what: impl Display,
    within: Duration,
    probe: impl FnMut() -> Fut,
) -> T
where
    Fut: Future<Output = Option<T>>,
{
    eventually_explained(what, within, probe, String::new).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_answer() {
        let asked = AtomicU32::new(0);
        let found = eventually("the third look", Duration::from_secs(5), || async {
            (asked.fetch_add(1, Ordering::SeqCst) == 2).then_some("found")
        })
        .await;
        assert_eq!(found, "found");
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_once_the_bound_has_passed() {
        let started = tokio::time::Instant::now();
        let found = poll_within(Duration::from_secs(1), || async { None::<()> }).await;
        assert_eq!(found, None);
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "never within 1s: something that never happens\nseen: nothing")]
    async fn names_what_never_happened() {
        eventually_explained(
            "something that never happens",
            Duration::from_secs(1),
            || async { None::<()> },
            || "seen: nothing".to_owned(),
        )
        .await;
    }
}
