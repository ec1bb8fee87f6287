//! HTTP/1 request heads as the gateway's proxy and its interception read and forward them: a
//! bounded, timed read of the head, the headers that go on to the upstream (hop-by-hop and proxy
//! headers dropped, the connection closed after one request), and a short refusal. It knows
//! nothing of policies, sandboxes or Secrets.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest request head read.
pub(super) const MAX_HEAD: usize = 16 * 1024;
/// A client gets this long to send its request head.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Headers that concern one hop only, or the proxy: never sent on.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// Appends to `out` the header lines of `lines` (up to the blank line) that go on to the
/// upstream, then `Connection: close` and the end of the head.
pub(super) fn end_to_end_headers<'a>(lines: impl Iterator<Item = &'a str>, out: &mut String) {
    for line in lines.take_while(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if !HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
}

/// Reads the request head; returns it and whatever followed it in the same reads.
pub(super) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<(Vec<u8>, Vec<u8>), &'static str> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD {
            return Err("request head too large");
        }
        let read = stream.read(&mut chunk).await.map_err(|_| "read failed")?;
        if read == 0 {
            return Err("closed before the request head ended");
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

pub(super) async fn reply<S: AsyncWrite + Unpin>(stream: &mut S, status: &str, reason: &str) {
    tracing::debug!(status, reason, "egress proxy refusal");
    let body = format!("{reason}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Sends a request `head` and the bytes the client sent after it (`early`) upstream, then
/// copies both ways until either side ends. Answers the bytes sent and received.
pub(super) async fn send_then_splice<C, U>(
    client: &mut C,
    upstream: &mut U,
    head: &[u8],
    early: &[u8],
) -> Result<(u64, u64), String>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let io = |e: std::io::Error| e.to_string();
    upstream.write_all(head).await.map_err(io)?;
    upstream.write_all(early).await.map_err(io)?;
    let sent = (head.len() + early.len()) as u64;
    let (out, back) = super::relay::streams(client, upstream)
        .await
        .unwrap_or((0, 0));
    Ok((sent + out, back))
}
