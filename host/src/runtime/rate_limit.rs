//! A client-side bound on the host's API server traffic (`--kube-qps`,
//! `--kube-burst`), as client-go's and ARC's
//! `--k8s-client-rate-limiter-qps/-burst`: a token bucket in front of the
//! Kubernetes client, so a host that wakes to thousands of runners at once
//! spreads its writes instead of meeting the API server's priority and
//! fairness as a wall of 429s that every other tenant of the server feels.
//!
//! Off by default: arcwright's reconcilers already write only what changed
//! (one status write per runner transition, pods and Secrets through a
//! cache), and a limit tuned for one cluster slows another's bursts. A
//! platform team that shares its API server sets one.
//!
//! The bucket gates `poll_ready`, not the request: kube's client drives the
//! stack from one buffer worker, so requests wait their turn in order, and
//! a watch counts once, when it is opened.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Requests per second, and how many may go at once after a quiet spell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// The sustained rate.
    pub per_second: u32,
    /// The bucket's size.
    pub burst: u32,
}

impl Rate {
    /// The rate the flags describe: none for a qps of 0; a burst of 0 means
    /// one second's worth.
    pub fn from_flags(qps: u32, burst: u32) -> Option<Self> {
        (qps > 0).then_some(Self {
            per_second: qps,
            burst: if burst == 0 { qps } else { burst },
        })
    }
}

/// The bucket: tokens refill at the rate, up to the burst.
#[derive(Debug)]
struct Bucket {
    rate: Rate,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            state: Mutex::new((f64::from(rate.burst), Instant::now())),
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&self) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = &mut *state;
        let now = Instant::now();
        let per_second = f64::from(self.rate.per_second);
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * per_second)
            .min(f64::from(self.rate.burst));
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / per_second))
        }
    }
}

/// The layer that puts the bucket in front of a client's service.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<Bucket>,
    waited: Counter,
}

impl RateLimitLayer {
    /// A layer letting `rate` through; `waited` counts the requests that
    /// had to wait for a token (`arcwright_kube_client_rate_limited_total`),
    /// so an operator sees the limit bite before the host falls behind.
    pub fn new(rate: Rate, waited: Counter) -> Self {
        Self {
            bucket: Arc::new(Bucket::new(rate)),
            waited,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            waited: self.waited.clone(),
            waiting: None,
            holds_token: false,
        }
    }
}

/// A service whose readiness waits for a token.
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Bucket>,
    waited: Counter,
    waiting: Option<Pin<Box<Sleep>>>,
    /// A token was taken for the next call.
    holds_token: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.holds_token {
            if let Some(sleep) = self.waiting.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.waiting = None;
            }
            match self.bucket.take() {
                Ok(()) => self.holds_token = true,
                Err(wait) => {
                    self.waited.inc();
                    self.waiting = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.holds_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn no_qps_is_no_limit_and_no_burst_is_a_seconds_worth() {
        assert_eq!(Rate::from_flags(0, 30), None);
        assert_eq!(
            Rate::from_flags(20, 0),
            Some(Rate {
                per_second: 20,
                burst: 20
            })
        );
    }

    /// On the paused clock: the burst goes at once, the rest at the rate.
    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        let rate = Rate {
            per_second: 10,
            burst: 5,
        };
        let waited = Counter::default();
        let mut service =
            RateLimitLayer::new(rate, waited.clone()).layer(tower::service_fn(|()| async {
                Ok::<_, std::convert::Infallible>(Instant::now())
            }));
        let start = Instant::now();
        let mut sent = Vec::new();
        for _ in 0..25 {
            sent.push(service.ready().await.unwrap().call(()).await.unwrap() - start);
        }
        assert!(sent[..5].iter().all(|at| at.is_zero()), "{sent:?}");
        assert_eq!(waited.get(), 20, "each past the burst waited once");
        // 20 after the burst at 10 a second: the last at 2 s.
        let last = sent[24];
        assert!(
            last >= Duration::from_millis(1990) && last <= Duration::from_millis(2100),
            "{last:?}"
        );
        // Never faster than the rate past the burst.
        for pair in sent[5..].windows(2) {
            assert!(pair[1] - pair[0] >= Duration::from_millis(99), "{sent:?}");
        }
        // A quiet spell fills the bucket again, to the burst and no more.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let again = Instant::now();
        let mut quick = 0;
        for _ in 0..8 {
            let at = service.ready().await.unwrap().call(()).await.unwrap();
            if at == again {
                quick += 1;
            }
        }
        assert_eq!(quick, 5);
    }
}
