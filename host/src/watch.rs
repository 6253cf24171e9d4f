//! How every watch of the host behaves: how long one request lasts, and
//! how long it waits before trying again after an error. Found by the
//! fault matrix (`cargo xtask faults`), where a 30 s API server outage
//! cost two minutes without a runner created.
//!
//! **Retrying.** kube-runtime's `default_backoff` doubles from 0.8 s up to
//! 30 s and resets only when the stream yields an item. After an outage
//! that cap is what a controller waits between the tries that matter: the
//! first watch on the restarted server meets `410 Gone` (its
//! resourceVersion predates the new watch cache), the relist may meet a
//! `403` while the authorizer warms up or a `404` while the CRDs are
//! installed again, and each wait is up to 30 s. The cap here is 5 s. The
//! 30 s cap protects an API server from a fleet of clients each holding
//! many watches; this host holds nine per watched namespace (six for the
//! controllers, two for the listeners' cache, one per policy ConfigMap),
//! so retrying them every 5 s costs the server nothing it would notice,
//! and API priority and fairness is the server's own guard.
//!
//! **Hanging.** A request sent while the API server was starting again
//! (a watch's initial list among them) was accepted and not answered, and
//! what waited on it waited for the client's read timeout, 295 s by
//! default, because the same timeout must let a quiet watch live: the
//! runners' watch, and with it every runner's reconcile, stood still. Here
//! every request that receives nothing for [`READ_TIMEOUT`] fails and is
//! retried, and every watch asks the server to end it after
//! [`WATCH_SECONDS`], before that timeout, and resumes from where it was: a
//! re-watch, not a relist, so a quiet watch costs one small request every
//! 25 s (one request every 3 s for the nine watches of a cluster-wide
//! host; a host given many namespaces with `--namespace` holds nine per
//! namespace, and pays as many times that).
//!
//! **Waiting twice.** A kube-runtime `Controller` wraps all its trigger
//! streams, merged, in a backoff of its own (`default_backoff`, up to
//! 30 s, reset only by an item), and while it waits it polls none of them.
//! After a restart the errors of every watch (each already retried by its
//! own [`WatchBackoff`]) reached that one backoff in turn and pushed it to
//! 22 and 26 s: the runners' events, all of them, waited that long, and a
//! job assigned during the outage outlived the service's assignment
//! timeout. The controllers' trigger backoff is [`Undelayed`]: each watch
//! waits on its own, and one failing watch never holds the others.

use std::time::Duration;

use kube::runtime::watcher;

/// How long the client waits for the next byte of an answer.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the API server keeps one watch request open (its
/// `timeoutSeconds`); below [`READ_TIMEOUT`], so a quiet watch ends on the
/// server's word, not as a timeout.
pub const WATCH_SECONDS: u32 = 25;

/// The watch configuration every watch of the host starts from.
pub fn config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_SECONDS)
}

/// Drops what no reconcile reads and every cache would otherwise keep: the
/// `managedFields` the API server records per field manager. On the
/// scale sets and runner sets, written by three managers with server-side
/// apply, they are a good part of each object, and a thousand scale sets
/// keep three caches of them (the two controllers' and the listeners').
pub fn without_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The first wait after an error.
pub const FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two tries.
pub const MOST: Duration = Duration::from_secs(5);

/// Doubling waits from [`FIRST`] up to [`MOST`], each shortened by up to a
/// half at random so that watches failing together do not retry together;
/// reset by the stream whenever it yields an item.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (self.next * 2).min(MOST);
        Some(wait.mul_f64(rand::random_range(0.5..=1.0)))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// The backoff of a `Controller`'s merged trigger streams: none, because
/// each stream already backs off on its own errors ([`WatchBackoff`]) and
/// a wait here would hold every stream for the errors of one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Undelayed;

impl Iterator for Undelayed {
    type Item = Duration;

    /// Never `None`, which would end the controller's trigger stream.
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for Undelayed {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use kube::runtime::utils::Backoff as _;

    use super::*;

    #[test]
    fn a_quiet_watch_ends_on_the_servers_word_before_the_read_timeout() {
        assert!(u64::from(WATCH_SECONDS) < READ_TIMEOUT.as_secs());
        assert_eq!(config().timeout, Some(WATCH_SECONDS));
    }

    #[test]
    fn waits_double_up_to_the_cap_and_start_again_after_a_reset() {
        let mut backoff = WatchBackoff::default();
        let waits: Vec<Duration> = backoff.by_ref().take(8).collect();
        for (n, wait) in waits.iter().enumerate() {
            let ceiling = (FIRST * 2u32.pow(n as u32)).min(MOST);
            assert!(
                *wait <= ceiling && *wait >= ceiling / 2,
                "wait {n}: {wait:?}"
            );
        }
        assert!(waits[7] >= MOST / 2, "the cap is reached: {waits:?}");
        backoff.reset();
        assert!(backoff.next().unwrap() <= FIRST);
    }

    #[test]
    fn the_trigger_backoff_never_waits_and_never_ends_the_stream() {
        assert!(Undelayed.take(100).all(|wait| wait.is_zero()));
        assert_eq!(Undelayed.take(100).count(), 100);
    }
}
