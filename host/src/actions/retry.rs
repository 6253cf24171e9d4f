//! When to retry a call and how long to wait first.
//!
//! Pure functions over a policy, an outcome, the time and a jitter sample, so
//! the schedule is unit-tested without sleeping; the client supplies the
//! clock and the random number.

use std::time::Duration;

use jiff::Timestamp;

use super::Operation;

/// How a failed attempt is retried.
///
/// The defaults follow the Go client (hashicorp/go-retryablehttp with four
/// retries and waits capped at 30 s) with one difference: the wait is
/// jittered. Thousands of listeners share one process here, and after a
/// service hiccup they would otherwise all retry in the same instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; the call is made at most
    /// `max_retries + 1` times.
    pub max_retries: u32,
    /// The nominal wait before the first retry; it doubles on each retry.
    pub base_delay: Duration,
    /// The largest nominal wait between two attempts.
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured. A service asking for more than
    /// this is waited on only this long, so one header cannot park a
    /// reconcile for an hour; the call then fails normally if the service
    /// still refuses.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// What one attempt came to, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// A response with a non-success status and its `Retry-After` header.
    Status {
        /// The HTTP status code.
        status: u16,
        /// The raw `Retry-After` header, if any.
        retry_after: Option<&'a str>,
    },
    /// No connection could be made: the request was never sent.
    Connect,
    /// The connection broke after the request may have been sent, before a
    /// response was read.
    Transport,
    /// No response arrived within the per-attempt timeout.
    Timeout,
    /// The TLS handshake failed because the server's certificate was
    /// rejected (unknown CA, wrong name, expired).
    Certificate,
}

/// Whether an outcome is worth another attempt.
///
/// Connection errors, timeouts, 429 and 5xx other than 501 (which will not
/// change on a retry) are transient. A rejected server certificate is not: it
/// is a configuration problem (a missing custom CA, usually), and retrying it
/// only delays the error that says so. So are 401 and 403 from
/// `runner-registration`, and only there: a registration token that was
/// minted a moment ago may not have reached every replica of the service
/// yet. Every other 4xx is an answer, and asking again would only get it
/// again.
///
/// Calls that create something (a scale set, a runner registration, a
/// message session) are retried only when the service provably did not act:
/// no connection, 429, or 503. After a timeout, a broken connection or
/// another 5xx the first attempt may have succeeded with its answer lost, and
/// a second attempt would then meet the first's result as a conflict (a
/// session nobody holds the id of, a registration whose JIT config is gone)
/// instead of reporting what happened. The caller sees the original error
/// and decides with what it knows (ARC looks the runner up by name).
pub fn is_retryable(operation: Operation, outcome: &Outcome<'_>) -> bool {
    let creates = operation.creates_something();
    match outcome {
        Outcome::Connect => true,
        Outcome::Transport | Outcome::Timeout => !creates,
        Outcome::Certificate => false,
        Outcome::Status { status, .. } => match *status {
            429 | 503 => true,
            501 => false,
            500..=599 => !creates,
            401 | 403 => operation == Operation::RunnerRegistration,
            _ => false,
        },
    }
}

/// Parses a `Retry-After` header: delta seconds or an HTTP date, relative to
/// `now`. A date in the past means "now"; anything unreadable is ignored.
pub fn parse_retry_after(value: &str, now: Timestamp) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()?;
    let millis = at.as_millisecond().saturating_sub(now.as_millisecond());
    Some(Duration::from_millis(u64::try_from(millis).unwrap_or(0)))
}

/// The wait before retry number `retry` (0 for the first retry).
///
/// The nominal wait is `base_delay * 2^retry`, capped at `max_delay`; the
/// actual wait is drawn from its upper half by `jitter` (a sample in
/// `[0, 1)`), so it is spread out but never much shorter than intended. A
/// `Retry-After` from the service raises the wait to what it asked for, up to
/// `max_retry_after`.
pub fn backoff(
    policy: &RetryPolicy,
    retry: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    let nominal = policy
        .base_delay
        .checked_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
        .unwrap_or(policy.max_delay)
        .min(policy.max_delay);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let half = nominal / 2;
    let wait = half + half.mul_f64(jitter);
    match retry_after {
        Some(asked) => wait.max(asked.min(policy.max_retry_after)),
        None => wait,
    }
}

/// Decides whether to retry after an attempt and how long to wait first.
///
/// `retries_done` counts the retries already spent. `None` means give up and
/// report the outcome.
pub fn next_delay(
    policy: &RetryPolicy,
    operation: Operation,
    outcome: &Outcome<'_>,
    retries_done: u32,
    now: Timestamp,
    jitter: f64,
) -> Option<Duration> {
    if retries_done >= policy.max_retries || !is_retryable(operation, outcome) {
        return None;
    }
    let retry_after = match outcome {
        Outcome::Status {
            retry_after: Some(value),
            ..
        } => parse_retry_after(value, now),
        _ => None,
    };
    Some(backoff(policy, retries_done, retry_after, jitter))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
    }

    fn status(status: u16) -> Outcome<'static> {
        Outcome::Status {
            status,
            retry_after: None,
        }
    }

    #[test]
    fn creating_calls_retry_only_when_the_service_did_not_act() {
        for op in [
            Operation::CreateScaleSet,
            Operation::GenerateJitConfig,
            Operation::CreateSession,
        ] {
            for not_acted in [Outcome::Connect, status(429), status(503)] {
                assert!(is_retryable(op, &not_acted), "{op:?} {not_acted:?}");
            }
            for maybe_acted in [
                Outcome::Transport,
                Outcome::Timeout,
                status(500),
                status(502),
                status(504),
            ] {
                assert!(!is_retryable(op, &maybe_acted), "{op:?} {maybe_acted:?}");
            }
        }
        // Reads, deletes and acknowledgements are safe to repeat.
        for op in [
            Operation::GetRunner,
            Operation::RemoveRunner,
            Operation::DeleteMessage,
        ] {
            assert!(is_retryable(op, &Outcome::Timeout), "{op:?}");
        }
    }

    #[test]
    fn transient_failures_retry_answers_do_not() {
        let op = Operation::GetScaleSet;
        for retryable in [
            status(500),
            status(502),
            status(503),
            status(504),
            status(429),
            Outcome::Connect,
            Outcome::Transport,
            Outcome::Timeout,
        ] {
            assert!(is_retryable(op, &retryable), "{retryable:?}");
        }
        for answer in [
            Outcome::Certificate,
            status(400),
            status(401),
            status(403),
            status(404),
            status(409),
            status(501),
        ] {
            assert!(!is_retryable(op, &answer), "{answer:?}");
        }
        assert!(is_retryable(Operation::RunnerRegistration, &status(401)));
        assert!(is_retryable(Operation::RunnerRegistration, &status(403)));
        assert!(!is_retryable(Operation::RunnerRegistration, &status(404)));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = policy();
        // With jitter 1.0 the wait is the nominal wait.
        let waits: Vec<u64> = (0..8)
            .map(|r| backoff(&p, r, None, 1.0).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        // Huge retry numbers do not overflow.
        assert_eq!(backoff(&p, 200, None, 1.0), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let p = policy();
        assert_eq!(backoff(&p, 2, None, 0.0), Duration::from_secs(2));
        assert_eq!(backoff(&p, 2, None, 0.5), Duration::from_secs(3));
        assert_eq!(
            backoff(&p, 2, None, 0.999_999),
            Duration::from_secs(4) - Duration::from_nanos(2000)
        );
        // Samples outside [0, 1) are clamped rather than trusted.
        assert_eq!(backoff(&p, 2, None, 7.0), Duration::from_secs(4));
        assert_eq!(backoff(&p, 2, None, f64::NAN), Duration::from_secs(2));
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let p = policy();
        assert_eq!(
            backoff(&p, 0, Some(Duration::from_secs(20)), 0.0),
            Duration::from_secs(20)
        );
        assert_eq!(
            backoff(&p, 0, Some(Duration::from_secs(3600)), 0.0),
            Duration::from_secs(60)
        );
        // A Retry-After shorter than the backoff does not shorten it.
        assert_eq!(
            backoff(&p, 4, Some(Duration::from_secs(1)), 1.0),
            Duration::from_secs(16)
        );
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        let now: Timestamp = "2015-10-21T07:27:00Z".parse().unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 5 ", now), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn next_delay_is_bounded_by_max_retries() {
        let p = policy();
        let now = Timestamp::UNIX_EPOCH;
        let op = Operation::DeleteMessage;
        for done in 0..p.max_retries {
            assert!(next_delay(&p, op, &status(503), done, now, 0.5).is_some());
        }
        assert_eq!(
            next_delay(&p, op, &status(503), p.max_retries, now, 0.5),
            None
        );
        assert_eq!(next_delay(&p, op, &status(400), 0, now, 0.5), None);
        let limited = Outcome::Status {
            status: 429,
            retry_after: Some("7"),
        };
        assert_eq!(
            next_delay(&p, op, &limited, 0, now, 0.0),
            Some(Duration::from_secs(7))
        );
    }
}
