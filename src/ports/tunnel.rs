//! One TCP connection to `127.0.0.1:PORT` inside a sandbox: either a socket made in the
//! container's network namespace from this host (`direct.rs`, runc on a local daemon), or a
//! `docker exec` of `agent-sandbox-helper relay PORT` (through the engine, like every Docker
//! call) whose stdin and stdout carry the connection's bytes. Both work in a sandbox with no
//! network at all.
//!
//! A [`Tunnel`] is a plain byte stream ([`AsyncRead`] + [`AsyncWrite`]): shutting down its write
//! side or dropping it ends the connection inside the sandbox (the helper exits when its stdin
//! ends, so a client that left stops what the sandbox sends), and the end of its read side is
//! the end of the connection. Nothing is buffered
//! beyond one chunk of the exec's output, so a slow reader slows the sandbox's sender and no one
//! else. A tunnel can count the bytes through it as its sandbox's activity ([`Tunnel::counting`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::PortError;
use crate::activity::Toucher;
use crate::docker::{Engine, EngineResult, ExecOutput, ExecPlan, HELPER_BINARY, HELPER_MOUNT};
use helper_protocol::relay::CONNECTED;

/// How long the helper has to say it connected (or could not).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How much of the helper's stderr is kept for messages.
const STDERR_KEEP: usize = 512;

/// A connection into a sandbox, however it was made.
pub struct Tunnel {
    inner: Inner,
    /// Told whenever bytes pass, either way.
    activity: Option<Toucher>,
}

enum Inner {
    Direct(tokio::net::TcpStream),
    Relay(Relay),
}

/// The relayed kind: the helper's exec, its output read chunk by chunk.
struct Relay {
    output: BoxStream<'static, EngineResult<ExecOutput>>,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    /// Bytes read from the exec and not yet handed out.
    pending: Bytes,
    ended: bool,
}

impl Tunnel {
    /// A socket already connected inside the sandbox.
    pub fn direct(stream: tokio::net::TcpStream) -> Tunnel {
        Tunnel {
            inner: Inner::Direct(stream),
            activity: None,
        }
    }

    /// The same tunnel, counting the bytes through it as activity with `activity`.
    pub fn counting(mut self, activity: Option<Toucher>) -> Tunnel {
        self.activity = activity;
        self
    }

    fn passed(&self, bytes: usize) {
        if bytes > 0 {
            if let Some(activity) = &self.activity {
                activity.touch();
            }
        }
    }

    /// Whether the bytes go through a relay in the sandbox (for logs and tests).
    pub fn is_relayed(&self) -> bool {
        matches!(self.inner, Inner::Relay(_))
    }

    /// Connects to `127.0.0.1:port` in `container`, as `user`, through the in-sandbox relay.
    pub async fn relay(
        engine: &Arc<dyn Engine>,
        container: &str,
        user: &str,
        port: u16,
    ) -> Result<Tunnel, PortError> {
        let plan = ExecPlan {
            argv: vec![
                format!("{HELPER_MOUNT}/{HELPER_BINARY}"),
                "relay".into(),
                port.to_string(),
            ],
            env: Vec::new(),
            workdir: None,
            user: user.to_string(),
            stdin: true,
        };
        let session = engine.exec(container, &plan).await?;
        let input = session
            .input
            .ok_or_else(|| PortError::Relay("docker gave no stdin".into()))?;
        let mut output = session.output;
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut stderr = Vec::new();
            loop {
                match output.next().await {
                    Some(Ok(ExecOutput::Stdout(b))) if b.is_empty() => {}
                    Some(Ok(ExecOutput::Stdout(b))) => return Ok(b),
                    Some(Ok(ExecOutput::Stderr(b))) => {
                        let room = STDERR_KEEP.saturating_sub(stderr.len());
                        stderr.extend_from_slice(&b[..b.len().min(room)]);
                    }
                    Some(Err(e)) => return Err(PortError::Engine(e)),
                    None => {
                        let why = String::from_utf8_lossy(&stderr).trim().to_string();
                        return Err(PortError::NotListening { port, why });
                    }
                }
            }
        })
        .await
        .map_err(|_| PortError::Relay("the in-sandbox relay did not answer".into()))??;
        if connected[0] != CONNECTED {
            return Err(PortError::Relay(
                "the in-sandbox relay answered something unexpected".into(),
            ));
        }
        Ok(Tunnel {
            inner: Inner::Relay(Relay {
                output,
                input,
                pending: connected.slice(1..),
                ended: false,
            }),
            activity: None,
        })
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = match &mut self.inner {
            Inner::Direct(stream) => Pin::new(stream).poll_read(cx, buf),
            Inner::Relay(relay) => Pin::new(relay).poll_read(cx, buf),
        };
        if let Poll::Ready(Ok(())) = polled {
            self.passed(buf.filled().len() - before);
        }
        polled
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = match &mut self.inner {
            Inner::Direct(stream) => Pin::new(stream).poll_write(cx, buf),
            Inner::Relay(relay) => Pin::new(relay).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = polled {
            self.passed(n);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Inner::Direct(stream) => Pin::new(stream).poll_flush(cx),
            Inner::Relay(relay) => Pin::new(relay).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Inner::Direct(stream) => Pin::new(stream).poll_shutdown(cx),
            Inner::Relay(relay) => Pin::new(relay).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Relay {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.output).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(ExecOutput::Stdout(b)))) => self.pending = b,
                // The relay says nothing on stderr once connected; what it might is dropped.
                Poll::Ready(Some(Ok(ExecOutput::Stderr(_)))) => {}
                Poll::Ready(Some(Err(e))) => {
                    self.ended = true;
                    return Poll::Ready(Err(io::Error::other(e.to_string())));
                }
                Poll::Ready(None) => self.ended = true,
            }
        }
    }
}

impl AsyncWrite for Relay {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.input.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.input.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.input.as_mut().poll_shutdown(cx)
    }
}
