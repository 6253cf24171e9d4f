//! How many bearer tokens the hold API reviews for one client.
//!
//! Every request to the hold API costs a TokenReview, a call the API server
//! answers for anyone who can reach the endpoint: a client sending random
//! tokens in a loop would otherwise turn the controller into an amplifier
//! against the API server (and its webhook authenticators). Each client
//! address gets a bucket of [`Throttle::burst`] reviews, refilled one every
//! [`Throttle::refill`]; a request finding its bucket empty is answered 429
//! with `Retry-After` and costs nothing. A person or a chat bot pressing a
//! few buttons never meets the limit.
//!
//! The buckets are kept per address, and the full ones, which say nothing a
//! new bucket would not, are dropped as they are met, so the memory is that
//! of the clients active in the last few minutes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The per-client review budget.
#[derive(Debug)]
pub struct Throttle {
    burst: u32,
    refill: Duration,
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Reviews left at `at`.
    left: u32,
    at: Instant,
}

impl Default for Throttle {
    /// 20 reviews at once, one more every 3 s (20 a minute).
    fn default() -> Self {
        Self::new(20, Duration::from_secs(3))
    }
}

impl Throttle {
    /// A budget of `burst` reviews per client, refilled one every `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        Self {
            burst: burst.max(1),
            refill: refill.max(Duration::from_millis(1)),
            buckets: Mutex::default(),
        }
    }

    /// The most reviews a client gets at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// How often a client's budget grows by one review.
    pub fn refill(&self) -> Duration {
        self.refill
    }

    /// Spends one review of `client`'s budget at `now` (`None`: a client
    /// whose address is unknown, all of whom share one budget); `Err` says
    /// how long until the next is available.
    pub fn spend(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let full = self.refill * self.burst;
        buckets.retain(|_, b| now.saturating_duration_since(b.at) < full);
        let bucket = buckets.entry(client).or_insert(Bucket {
            left: self.burst,
            at: now,
        });
        let grown = now.saturating_duration_since(bucket.at).as_nanos() / self.refill.as_nanos();
        if grown > 0 {
            let grown = u32::try_from(grown).unwrap_or(u32::MAX);
            bucket.left = bucket.left.saturating_add(grown).min(self.burst);
            bucket.at += self.refill * grown.min(self.burst);
            if bucket.left == self.burst {
                bucket.at = now;
            }
        }
        if bucket.left == 0 {
            let next = (bucket.at + self.refill).saturating_duration_since(now);
            return Err(next.max(Duration::from_secs(1)));
        }
        bucket.left -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_bounded_and_the_budget_grows_back_one_per_refill() {
        let throttle = Throttle::new(3, Duration::from_secs(10));
        let start = Instant::now();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        let spent = (0..50).filter(|_| throttle.spend(a, start).is_ok()).count();
        assert_eq!(spent, 3, "a burst of 50 costs 3 reviews");
        assert_eq!(
            throttle.spend(a, start),
            Err(Duration::from_secs(10)),
            "and says when the next is free"
        );
        assert!(
            throttle.spend(b, start).is_ok(),
            "another client has its own"
        );
        let later = start + Duration::from_secs(25);
        assert!(throttle.spend(a, later).is_ok());
        assert!(throttle.spend(a, later).is_ok());
        assert!(throttle.spend(a, later).is_err(), "two grew back in 25 s");
        // Long idle: full again, not more than full.
        let idle = later + Duration::from_secs(3600);
        let spent = (0..50).filter(|_| throttle.spend(a, idle).is_ok()).count();
        assert_eq!(spent, 3);
    }
}
