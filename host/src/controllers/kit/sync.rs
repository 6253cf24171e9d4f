//! Start-up and shutdown of a controller: when its cache has listed, and
//! how a shutdown asked for before then ends it.

use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// Told once a controller's cache holds its first full listing, which is
/// what `/readyz` waits for: before that, a controller would act on a
/// partial picture of the cluster (a runner set with runners it cannot see
/// yet would create them again). The default tells no one.
///
/// It watches the watcher's events for the end of the first listing rather
/// than waiting on `Store::wait_until_ready`: in kube-runtime 5 that future
/// wakes only the last of several waiters, and the controller's own applier
/// is one of them, so a second waiter either hangs or stalls the applier.
#[derive(Clone, Default)]
pub struct Synced(Option<Arc<dyn Fn() + Send + Sync>>);

impl Synced {
    /// Calls `announce` once per watch it is given, at the end of the
    /// watch's first listing.
    pub fn new(announce: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(announce)))
    }

    /// Announces now.
    pub fn announce(&self) {
        if let Some(announce) = &self.0 {
            announce();
        }
    }

    /// Passes a watch's events through, announcing once, at the first
    /// `InitDone` (later relists are not news); the [`Listed`] says the same
    /// to [`until_shutdown`].
    pub fn on_listed<K, S>(
        &self,
        events: S,
    ) -> (impl Stream<Item = S::Item> + Send + use<K, S>, Listed)
    where
        K: Send + 'static,
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    {
        let mut pending = self.0.clone();
        let (listed, seen) = tokio::sync::watch::channel(false);
        let events = events.inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                listed.send_replace(true);
                if let Some(announce) = pending.take() {
                    announce();
                }
            }
        });
        (events, Listed(seen))
    }
}

/// Whether a controller's own watch has finished its first listing.
#[derive(Clone, Debug)]
pub struct Listed(tokio::sync::watch::Receiver<bool>);

/// Runs a controller to its end, except that a shutdown asked for before
/// its watch first listed its objects ends it at once.
///
/// kube-runtime holds every reconcile until the controller's store has
/// listed, and while it waits it does not notice that its trigger streams
/// ended: a controller told to shut down in the middle of its first list
/// (a process stopped during start-up, or failing at once for another
/// reason) would wait for a list that is never finished, and the process
/// would sit out its whole shutdown bound. Until that list nothing can have
/// been reconciled, so dropping the controller then loses nothing; after
/// it, the controller's own graceful shutdown lets reconciles in flight
/// finish.
pub async fn until_shutdown(
    controller: impl Future<Output = ()>,
    shutdown: &CancellationToken,
    listed: Listed,
) {
    let before_listing = async {
        shutdown.cancelled().await;
        if *listed.0.borrow() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = controller => {}
        () = before_listing => {
            tracing::debug!("shut down before the first listing: nothing was reconciled yet");
        }
    }
}
