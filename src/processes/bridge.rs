//! One connection to a sandbox's process supervisor: a `docker exec` of `agent-sandbox-helper
//! bridge` (through the engine, like every Docker call), whose stdin carries requests and whose
//! stdout carries replies in the `helper_protocol::supervisor` format.
//!
//! Everything the supervisor says is untrusted: frames are bounded by the decoder, and a protocol
//! error or the end of the stream ends the connection ([`Bridge::next`] returns an error). A
//! connection carries one request at a time; idle ones are pooled by the caller and checked with
//! [`Bridge::is_alive`]. Dropping one ends the exec; the supervisor notices and forgets the
//! connection (never the processes). Nothing is buffered beyond one read
//! of the exec's output, so a slow reader slows the supervisor's copy to this connection only.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::docker::{
    Engine, EngineError, EngineResult, ExecOutput, ExecPlan, HELPER_BINARY, HELPER_MOUNT,
};
use helper_protocol::supervisor::{Reply, SupRequest, MIN_SUPERVISOR_VERSION, SUPERVISOR_VERSION};
use helper_protocol::FrameDecoder;

/// How long the bridge has to say it reached the supervisor.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);
/// How much of the bridge's stderr is kept for messages.
const STDERR_KEEP: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Docker refused or failed (container gone, stopped, daemon unreachable).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The container has no supervisor (it predates long-lived processes, or it died).
    #[error("the sandbox's process supervisor is unavailable: {0}")]
    NoSupervisor(String),
    /// The connection broke or the supervisor said something malformed.
    #[error("the connection to the sandbox's process supervisor failed: {0}")]
    Broken(String),
}

pub struct Bridge {
    output: BoxStream<'static, EngineResult<ExecOutput>>,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    decoder: FrameDecoder,
    stderr: Vec<u8>,
    /// The version the supervisor said it speaks.
    version: u32,
}

impl Bridge {
    pub async fn open(
        engine: &Arc<dyn Engine>,
        container: &str,
        user: &str,
    ) -> Result<Bridge, BridgeError> {
        let plan = ExecPlan {
            argv: vec![format!("{HELPER_MOUNT}/{HELPER_BINARY}"), "bridge".into()],
            env: Vec::new(),
            workdir: None,
            user: user.to_string(),
            stdin: true,
        };
        // Docker may never answer an exec (into a frozen container): it gets the greeting's time.
        let session = tokio::time::timeout(HELLO_TIMEOUT, engine.exec(container, &plan))
            .await
            .map_err(|_| {
                BridgeError::NoSupervisor(format!(
                    "docker did not start the bridge within {} s",
                    HELLO_TIMEOUT.as_secs()
                ))
            })??;
        let input = session
            .input
            .ok_or_else(|| BridgeError::NoSupervisor("docker gave no stdin".into()))?;
        let mut bridge = Bridge {
            output: session.output,
            input,
            decoder: FrameDecoder::new(),
            stderr: Vec::new(),
            version: 0,
        };
        match tokio::time::timeout(HELLO_TIMEOUT, bridge.hello()).await {
            Ok(r) => r?,
            Err(_) => return Err(BridgeError::NoSupervisor("no answer".into())),
        }
        Ok(bridge)
    }

    async fn hello(&mut self) -> Result<(), BridgeError> {
        let mut got: Vec<u8> = Vec::new();
        while got.len() < 4 {
            match self.output.next().await {
                Some(Ok(ExecOutput::Stdout(b))) => got.extend_from_slice(&b),
                Some(Ok(ExecOutput::Stderr(b))) => self.keep_stderr(&b),
                Some(Err(e)) => return Err(e.into()),
                None => {
                    let why = String::from_utf8_lossy(&self.stderr).trim().to_string();
                    let why = if why.is_empty() {
                        "the container has none (it may predate this server version)".into()
                    } else {
                        why
                    };
                    return Err(BridgeError::NoSupervisor(why));
                }
            }
        }
        let version = u32::from_be_bytes([got[0], got[1], got[2], got[3]]);
        // A container an older server made runs an older supervisor: it is spoken to in its
        // version.
        if !(MIN_SUPERVISOR_VERSION..=SUPERVISOR_VERSION).contains(&version) {
            return Err(BridgeError::NoSupervisor(format!(
                "it speaks version {version}, this server {MIN_SUPERVISOR_VERSION} to \
                 {SUPERVISOR_VERSION}"
            )));
        }
        self.version = version;
        self.decoder.feed(&got[4..]);
        Ok(())
    }

    fn keep_stderr(&mut self, b: &[u8]) {
        let room = STDERR_KEEP.saturating_sub(self.stderr.len());
        self.stderr.extend_from_slice(&b[..b.len().min(room)]);
    }

    /// A bridge over the given streams, to a supervisor that said `version` (for tests that
    /// play the supervisor).
    #[cfg(test)]
    pub(super) fn over(
        output: BoxStream<'static, EngineResult<ExecOutput>>,
        input: Pin<Box<dyn AsyncWrite + Send>>,
        version: u32,
    ) -> Bridge {
        Bridge {
            output,
            input,
            decoder: FrameDecoder::new(),
            stderr: Vec::new(),
            version,
        }
    }

    /// Whether the supervisor takes a start with `follow` (version 2 on).
    pub fn starts_following(&self) -> bool {
        self.version >= 2
    }

    /// Whether an idle connection is still usable: its exec has not ended and the supervisor
    /// has said nothing unasked (never blocks).
    pub fn is_alive(&mut self) -> bool {
        use futures::FutureExt;
        self.decoder.buffered() == 0 && self.output.next().now_or_never().is_none()
    }

    pub async fn send(&mut self, req: &SupRequest) -> Result<(), BridgeError> {
        let frame = req
            .to_frame()
            .map_err(|e| BridgeError::Broken(format!("request: {e}")))?;
        self.input
            .write_all(&frame)
            .await
            .map_err(|e| BridgeError::Broken(e.to_string()))?;
        self.input
            .flush()
            .await
            .map_err(|e| BridgeError::Broken(e.to_string()))
    }

    /// The next reply; an error when the connection ended or broke.
    pub async fn next(&mut self) -> Result<Reply, BridgeError> {
        loop {
            match self.decoder.next_reply() {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => return Err(BridgeError::Broken(e.to_string())),
            }
            match self.output.next().await {
                Some(Ok(ExecOutput::Stdout(b))) => self.decoder.feed(&b),
                Some(Ok(ExecOutput::Stderr(b))) => self.keep_stderr(&b),
                Some(Err(e)) => return Err(e.into()),
                None => return Err(BridgeError::Broken("the stream ended".into())),
            }
        }
    }

    /// Sends `req` and collects its whole answer (the final reply last).
    pub async fn call(&mut self, req: &SupRequest) -> Result<Vec<Reply>, BridgeError> {
        self.send(req).await?;
        let mut replies = Vec::new();
        loop {
            let r = self.next().await?;
            let last = r.is_final();
            replies.push(r);
            if last {
                return Ok(replies);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::fake::FakeEngine;

    #[tokio::test(start_paused = true)]
    async fn an_exec_docker_never_answers_fails_in_time() {
        let fake = FakeEngine::new();
        fake.hang_exec();
        let engine: Arc<dyn Engine> = Arc::new(fake);
        let started = tokio::time::Instant::now();
        match Bridge::open(&engine, "frozen", "1000:1000").await {
            Err(BridgeError::NoSupervisor(why)) => assert!(why.contains("did not start"), "{why}"),
            Err(other) => panic!("failed otherwise: {other}"),
            Ok(_) => panic!("a bridge opened through an exec that never answered"),
        }
        assert_eq!(started.elapsed(), HELLO_TIMEOUT);
    }
}
