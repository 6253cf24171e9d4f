//! When to retry a call and how long to wait first.
//!
//! Pure functions over a policy, the operation, an attempt's outcome, what
//! the earlier attempts came to, the time and a jitter sample, so both what
//! is safe to repeat ([`verdict`]) and the schedule are unit-tested in
//! tables without sleeping; the client supplies the clock and the random
//! number.

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

impl Outcome<'_> {
    /// Whether the service may have carried the request out even though the
    /// client never saw it succeed.
    ///
    /// Only three outcomes prove it did not: no connection was made, the
    /// service turned the request away before looking at it (429, 501), or
    /// it answered with a 4xx that says why it refused. A 5xx, including the
    /// 502/503/504 a gateway or load balancer sends when the backend is slow
    /// or restarting, may come after the backend acted; a broken connection
    /// or a timeout may come after the request arrived.
    pub fn may_have_acted(&self) -> bool {
        match self {
            Self::Connect | Self::Certificate => false,
            Self::Transport | Self::Timeout => true,
            Self::Status { status, .. } => (500..=599).contains(status) && *status != 501,
        }
    }
}

/// What the attempts of one call have come to so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct History {
    /// Retries already spent.
    pub retries_done: u32,
    /// Whether an earlier attempt may have been carried out by the service
    /// (see [`Outcome::may_have_acted`]). It changes what a later attempt's
    /// answer means: a 404 on a delete, a 409 on a create session.
    pub may_have_acted: bool,
}

/// What to do about an unsuccessful attempt, before the retry budget and
/// the wait are considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Worth another attempt.
    Retry,
    /// Report the attempt's error.
    Report,
    /// The call has done what it was for, although this attempt failed: a
    /// delete that finds nothing to delete after an earlier attempt may have
    /// deleted it.
    Done,
}

/// Whether an outcome is worth another attempt, per operation.
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
/// What the call does changes that:
///
/// - A call that creates a scale set or a runner registration is retried
///   only when the service provably did not act (no connection, 429). After
///   any outcome that [may have acted](Outcome::may_have_acted), a 503 from
///   a gateway included, a second attempt would meet the first one's result
///   as a conflict (a registration whose JIT config is gone, a name taken by
///   the scale set being created) instead of reporting what happened. The
///   caller sees the original error and decides with what it knows (ARC
///   looks the runner up by name).
/// - Creating a message session is retried after such an outcome too, and
///   a 409 conflict that follows it is then retried with backoff, as a
///   listener retries a conflict: the session the lost attempt may have
///   opened is held by no one, and the service lets it go when it is not
///   polled. A 409 with no such attempt before it is another listener's
///   session, and is reported at once.
/// - A delete (runner, scale set, session, message) is retried like a read,
///   and a 404 after an attempt that may have acted is [`Verdict::Done`]:
///   the object is gone, which is what the call was for.
pub fn verdict(
    operation: Operation,
    outcome: &Outcome<'_>,
    earlier_may_have_acted: bool,
) -> Verdict {
    let retry_if = |yes: bool| if yes { Verdict::Retry } else { Verdict::Report };
    if let Outcome::Status { status, .. } = outcome
        && earlier_may_have_acted
    {
        if *status == 404 && operation.deletes_something() {
            return Verdict::Done;
        }
        if *status == 409 && operation == Operation::CreateSession {
            return Verdict::Retry;
        }
    }
    if outcome.may_have_acted() {
        return retry_if(!operation.creates_something() || operation == Operation::CreateSession);
    }
    match outcome {
        Outcome::Connect => Verdict::Retry,
        Outcome::Status { status: 429, .. } => Verdict::Retry,
        Outcome::Status {
            status: 401 | 403, ..
        } => retry_if(operation == Operation::RunnerRegistration),
        _ => Verdict::Report,
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

/// What the client does after an unsuccessful attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Attempt again after this wait.
    Retry(Duration),
    /// Give up and report the attempt's error.
    Report,
    /// Report success (see [`Verdict::Done`]).
    Done,
}

/// Decides what to do after an attempt: the [`verdict`], bounded by the
/// policy's retry budget, with the wait before the next attempt.
pub fn next_step(
    policy: &RetryPolicy,
    operation: Operation,
    outcome: &Outcome<'_>,
    history: History,
    now: Timestamp,
    jitter: f64,
) -> Next {
    match verdict(operation, outcome, history.may_have_acted) {
        Verdict::Done => return Next::Done,
        Verdict::Report => return Next::Report,
        Verdict::Retry if history.retries_done >= policy.max_retries => return Next::Report,
        Verdict::Retry => {}
    }
    let retry_after = match outcome {
        Outcome::Status {
            retry_after: Some(value),
            ..
        } => parse_retry_after(value, now),
        _ => None,
    };
    Next::Retry(backoff(policy, history.retries_done, retry_after, jitter))
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

    use Operation as Op;
    use Verdict::{Done, Report, Retry};

    /// Every outcome the tables run through, with a short name for messages.
    fn outcomes() -> Vec<Outcome<'static>> {
        vec![
            Outcome::Connect,
            Outcome::Transport,
            Outcome::Timeout,
            Outcome::Certificate,
            status(400),
            status(401),
            status(403),
            status(404),
            status(409),
            status(429),
            status(500),
            status(501),
            status(502),
            status(503),
            status(504),
        ]
    }

    #[test]
    fn only_connection_failures_and_refusals_prove_nothing_was_done() {
        for outcome in outcomes() {
            let expected = matches!(
                outcome,
                Outcome::Transport
                    | Outcome::Timeout
                    | Outcome::Status {
                        status: 500 | 502 | 503 | 504,
                        ..
                    }
            );
            assert_eq!(outcome.may_have_acted(), expected, "{outcome:?}");
        }
    }

    #[test]
    fn verdicts_per_operation_and_outcome() {
        // (operations, outcome, verdict on a first attempt, verdict after an
        // attempt that may have acted)
        let reads = [
            Op::GetScaleSet,
            Op::GetRunner,
            Op::GetRunnerGroup,
            Op::GetMessage,
        ];
        let creates = [Op::CreateScaleSet, Op::GenerateJitConfig];
        let session = [Op::CreateSession];
        let deletes = [
            Op::RemoveRunner,
            Op::DeleteScaleSet,
            Op::DeleteSession,
            Op::DeleteMessage,
        ];
        let registration = [Op::RunnerRegistration];
        #[rustfmt::skip]
        let table: &[(&[Operation], Outcome<'static>, Verdict, Verdict)] = &[
            // Idempotent reads: every transient failure is retried.
            (&reads, Outcome::Connect, Retry, Retry),
            (&reads, Outcome::Transport, Retry, Retry),
            (&reads, Outcome::Timeout, Retry, Retry),
            (&reads, status(429), Retry, Retry),
            (&reads, status(500), Retry, Retry),
            (&reads, status(502), Retry, Retry),
            (&reads, status(503), Retry, Retry),
            (&reads, status(504), Retry, Retry),
            (&reads, status(501), Report, Report),
            (&reads, Outcome::Certificate, Report, Report),
            (&reads, status(400), Report, Report),
            (&reads, status(401), Report, Report),
            (&reads, status(403), Report, Report),
            (&reads, status(404), Report, Report),
            (&reads, status(409), Report, Report),
            // Creates: only when the service provably did not act.
            (&creates, Outcome::Connect, Retry, Retry),
            (&creates, status(429), Retry, Retry),
            (&creates, Outcome::Transport, Report, Report),
            (&creates, Outcome::Timeout, Report, Report),
            (&creates, status(500), Report, Report),
            (&creates, status(502), Report, Report),
            (&creates, status(503), Report, Report),
            (&creates, status(504), Report, Report),
            (&creates, status(409), Report, Report),
            (&creates, status(404), Report, Report),
            // Create session: retried after an ambiguous failure, and the
            // conflict that may follow it is backed off from, not reported.
            (&session, Outcome::Connect, Retry, Retry),
            (&session, status(429), Retry, Retry),
            (&session, Outcome::Transport, Retry, Retry),
            (&session, Outcome::Timeout, Retry, Retry),
            (&session, status(503), Retry, Retry),
            (&session, status(504), Retry, Retry),
            (&session, status(409), Report, Retry),
            (&session, status(404), Report, Report),
            (&session, status(400), Report, Report),
            // Deletes: retried like reads, and a 404 after an attempt that
            // may have acted means that attempt did the work.
            (&deletes, Outcome::Transport, Retry, Retry),
            (&deletes, Outcome::Timeout, Retry, Retry),
            (&deletes, status(503), Retry, Retry),
            (&deletes, status(502), Retry, Retry),
            (&deletes, status(429), Retry, Retry),
            (&deletes, status(404), Report, Done),
            (&deletes, status(409), Report, Report),
            (&deletes, status(400), Report, Report),
            // A registration token not yet seen by every replica.
            (&registration, status(401), Retry, Retry),
            (&registration, status(403), Retry, Retry),
            (&registration, status(404), Report, Report),
            (&registration, status(503), Retry, Retry),
        ];
        for (operations, outcome, first, after_ambiguous) in table {
            for op in *operations {
                assert_eq!(verdict(*op, outcome, false), *first, "{op} {outcome:?}");
                assert_eq!(
                    verdict(*op, outcome, true),
                    *after_ambiguous,
                    "{op} {outcome:?} after an attempt that may have acted"
                );
            }
        }
    }

    #[test]
    fn every_operation_has_a_verdict_for_every_outcome() {
        // No combination panics, and a create never repeats blindly.
        let all = [
            Op::InstallationToken,
            Op::RegistrationToken,
            Op::RunnerRegistration,
            Op::GetRunnerGroup,
            Op::GetScaleSet,
            Op::GetScaleSetById,
            Op::CreateScaleSet,
            Op::UpdateScaleSet,
            Op::DeleteScaleSet,
            Op::GenerateJitConfig,
            Op::GetRunner,
            Op::GetRunnerByName,
            Op::RemoveRunner,
            Op::CreateSession,
            Op::RefreshSession,
            Op::DeleteSession,
            Op::GetMessage,
            Op::DeleteMessage,
            Op::AcquireJobs,
        ];
        for op in all {
            for outcome in outcomes() {
                for earlier in [false, true] {
                    let v = verdict(op, &outcome, earlier);
                    if op.creates_something() && op != Op::CreateSession && outcome.may_have_acted()
                    {
                        assert_eq!(v, Report, "{op} {outcome:?}");
                    }
                    if v == Done {
                        assert!(op.deletes_something() && earlier, "{op} {outcome:?}");
                    }
                }
            }
        }
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
    fn next_step_is_bounded_by_max_retries() {
        let p = policy();
        let now = Timestamp::UNIX_EPOCH;
        let op = Operation::DeleteMessage;
        let after = |retries_done| History {
            retries_done,
            may_have_acted: retries_done > 0,
        };
        for done in 0..p.max_retries {
            assert!(matches!(
                next_step(&p, op, &status(503), after(done), now, 0.5),
                Next::Retry(_)
            ));
        }
        assert_eq!(
            next_step(&p, op, &status(503), after(p.max_retries), now, 0.5),
            Next::Report
        );
        assert_eq!(
            next_step(&p, op, &status(400), after(0), now, 0.5),
            Next::Report
        );
        // A delete that is done is done whatever the budget says.
        assert_eq!(
            next_step(&p, op, &status(404), after(p.max_retries), now, 0.5),
            Next::Done
        );
        let limited = Outcome::Status {
            status: 429,
            retry_after: Some("7"),
        };
        assert_eq!(
            next_step(&p, op, &limited, after(0), now, 0.0),
            Next::Retry(Duration::from_secs(7))
        );
    }
}
