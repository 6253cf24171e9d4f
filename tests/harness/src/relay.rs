//! A TCP relay a test can cut: traffic to a server (the API server, the
//! fake Actions service) goes through it, and [`TcpRelay::cut`] makes the
//! server unreachable the way a partition does, not the way a crash does.
//!
//! Cut, the relay keeps every connection open and accepts new ones, but
//! forwards nothing in either direction: requests hang until the client's
//! own timeout, as they do when packets are dropped. (A refused or reset
//! connection would be the easy case: clients fail fast on it.) Restored,
//! new connections are forwarded again; connections that were open while
//! cut stay dead, as they would after a real partition.
//!
//! [`TcpRelay::delay_answers`] holds what the server sends back for a while
//! before it is forwarded, every chunk by the same time, so answers come
//! late but in order and at the server's pace (a slow link, or a server
//! that does the work and answers late). Requests still go at once: the
//! server acts on them when they are sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running relay; stops when dropped.
pub struct TcpRelay {
    address: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct State {
    cut: AtomicBool,
    /// Bytes dropped while cut, both directions.
    dropped: AtomicU64,
    /// Bytes forwarded from the server to its clients: what a client was
    /// sent, for tests of how much a watch costs on the wire.
    delivered: AtomicU64,
    /// How long the server's answers are held, in milliseconds.
    delay_ms: AtomicU64,
    /// Chunks of answers that were held by a delay.
    held: AtomicU64,
}

impl TcpRelay {
    /// A relay on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accepting = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = accepting.clone();
                tokio::spawn(async move {
                    if state.cut.load(Ordering::SeqCst) {
                        hold(client, &state).await;
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    relay(client, server, state).await;
                });
            }
        });
        Ok(Self {
            address,
            state,
            task,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops forwarding: the server looks partitioned away.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Holds everything the server sends, on every connection, `delay`
    /// before forwarding it, from now on (zero: none).
    pub fn delay_answers(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Chunks of the server's answers that were held by a delay: how
    /// often [`TcpRelay::delay_answers`] struck.
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Bytes that arrived while cut and were dropped.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// Bytes the server sent that were forwarded to clients (TLS records
    /// included: an upper bound on what the clients read).
    pub fn delivered(&self) -> u64 {
        self.state.delivered.load(Ordering::SeqCst)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads and drops what a connection accepted while cut sends.
async fn hold(mut client: TcpStream, state: &State) {
    let mut buffer = [0u8; 16 * 1024];
    while let Ok(read) = client.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        state.dropped.fetch_add(read as u64, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = tokio::spawn(pump(client_read, server_write, state.clone(), None));
    let downstream = tokio::spawn(pump(server_read, client_write, state, Some(Counted)));
    let _ = tokio::join!(upstream, downstream);
}

/// Writes what it is given to `to`, each chunk no sooner than its time:
/// the downstream side of a delayed connection, so a delay costs latency
/// and not throughput.
async fn deliver_late(
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut chunks: tokio::sync::mpsc::UnboundedReceiver<(tokio::time::Instant, Vec<u8>)>,
) {
    while let Some((at, chunk)) = chunks.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// Marks the direction whose forwarded bytes are counted in
/// [`State::delivered`].
struct Counted;

/// Copies `from` to `to` until either ends; once cut, what is read is
/// dropped, and the connection is never forwarded again.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
    counted: Option<Counted>,
) {
    let mut buffer = [0u8; 16 * 1024];
    let mut dead = false;
    // Answers go through a queue once a delay is asked for, and stay on it
    // (in order) for the rest of the connection.
    let mut late: Option<tokio::sync::mpsc::UnboundedSender<_>> = None;
    let mut to = Some(to);
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        dead |= state.cut.load(Ordering::SeqCst);
        if dead {
            state.dropped.fetch_add(read as u64, Ordering::SeqCst);
            continue;
        }
        let delay = state.delay_ms.load(Ordering::SeqCst);
        if counted.is_some() && late.is_none() && delay > 0 {
            let (sender, chunks) = tokio::sync::mpsc::unbounded_channel();
            if let Some(to) = to.take() {
                tokio::spawn(deliver_late(to, chunks));
            }
            late = Some(sender);
        }
        if counted.is_some() && delay > 0 {
            state.held.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(late) = &late {
            let at = tokio::time::Instant::now() + std::time::Duration::from_millis(delay);
            if late.send((at, buffer[..read].to_vec())).is_err() {
                return;
            }
        } else if let Some(to) = to.as_mut()
            && to.write_all(&buffer[..read]).await.is_err()
        {
            return;
        }
        if counted.is_some() {
            state.delivered.fetch_add(read as u64, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A server that sends back what it is sent; its address.
    async fn echo_server() -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 64];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        upstream
    }

    #[tokio::test]
    async fn forwards_until_cut_then_drops_everything() {
        let relay = TcpRelay::start(echo_server().await).await.unwrap();
        let mut client = TcpStream::connect(relay.address()).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut answer = [0u8; 4];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping");

        relay.cut();
        client.write_all(b"lost").await.unwrap();
        let mut fresh = TcpStream::connect(relay.address()).await.unwrap();
        fresh.write_all(b"also").await.unwrap();
        crate::eventually("both writes dropped", Duration::from_secs(5), || async {
            (relay.dropped() == 8).then_some(())
        })
        .await;
        let unanswered =
            tokio::time::timeout(Duration::from_millis(300), client.read(&mut answer)).await;
        assert!(unanswered.is_err(), "nothing comes back while cut");
    }

    #[tokio::test]
    async fn delayed_answers_come_late_and_in_order() {
        let relay = TcpRelay::start(echo_server().await).await.unwrap();
        let mut client = TcpStream::connect(relay.address()).await.unwrap();
        relay.delay_answers(Duration::from_millis(400));
        let sent = tokio::time::Instant::now();
        client.write_all(b"one").await.unwrap();
        client.write_all(b"two").await.unwrap();
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"onetwo");
        assert!(
            sent.elapsed() >= Duration::from_millis(400),
            "{:?}",
            sent.elapsed()
        );
        assert!(relay.held() > 0, "the delay held no answer");
    }
}
