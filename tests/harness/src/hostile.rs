//! Servers that misbehave as a hostile or broken service would, for tests
//! of what the host does not let them do: fill its memory, hold a call
//! forever. And the process's resident set, to show the memory stayed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How a hostile server answers every request.
#[derive(Clone, Copy)]
pub enum Hostile {
    /// 200 with a chunked body of JSON whitespace that never ends.
    Endless,
    /// 200 claiming a 3 GiB body (a tenant's registration-token answer in
    /// the review that found this).
    Huge,
    /// 500 with a body that never ends.
    EndlessError,
    /// 200, then the body one byte every 100 ms.
    Dribble,
}

/// A server that answers as `how`, and the number of bytes it managed to
/// send in all.
pub async fn hostile_server(how: Hostile) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let count = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let status = match how {
                    Hostile::EndlessError => "500 Internal Server Error",
                    _ => "200 OK",
                };
                let framing = match how {
                    Hostile::Huge => "content-length: 3221225472",
                    _ => "transfer-encoding: chunked",
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = match how {
                    Hostile::Dribble => b"1\r\n \r\n".to_vec(),
                    Hostile::Huge => vec![b' '; 64 * 1024],
                    _ => {
                        let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
                        chunk.extend(std::iter::repeat_n(b' ', 64 * 1024));
                        chunk.extend(b"\r\n");
                        chunk
                    }
                };
                loop {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                    count.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if matches!(how, Hostile::Dribble) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            });
        }
    });
    (addr, sent)
}

/// This process's resident set, from `/proc/self/status`.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}
