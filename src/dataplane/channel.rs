//! A connection to `agent-sandbox-helper serve` inside one container, multiplexing commands by id.
//! Which channel a command gets (a container's shared one, or a spare of its own) is
//! `channels.rs`'s business, not this module's.
//!
//! A channel is one `docker exec -i` of the helper: requests go down its stdin under a mutex,
//! and one reader task decodes the frames coming back and routes them to per-command queues.
//! Everything the helper says is untrusted: frames are bounded by the decoder, events for unknown
//! ids are dropped, and any protocol error, write failure or end of stream kills the channel;
//! commands in flight then see their queue close without an `Exit` ([`Running::next`] returns
//! `None`) and decide for themselves whether they may be retried. Each command's queue is bounded
//! and the reader waits for room, so a slow consumer applies backpressure to the whole channel:
//! that is why client-paced streams get a channel of their own and only server-paced consumers
//! share one. This module knows nothing about the `/v1` contract.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::docker::{
    Engine, EngineError, EngineResult, ExecOutput, ExecPlan, HELPER_BINARY, HELPER_MOUNT,
};
use helper_protocol::{
    Event, FrameDecoder, Request, StartRequest, MAX_CHUNK_LEN, PROTOCOL_VERSION,
};

/// How long a freshly started helper has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A write of one request that takes longer than this means the helper stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Events queued per command before the reader waits (each at most 64 KiB of output).
const QUEUE_EVENTS: usize = 16;
/// How much of the helper's own stderr is kept for error messages.
const STDERR_KEEP: usize = 2048;

/// Where the helper lives inside every sandbox built with it.
pub fn helper_path() -> String {
    format!("{HELPER_MOUNT}/{HELPER_BINARY}")
}

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Docker itself refused or failed (container gone, stopped, daemon unreachable).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The container has no working helper (not mounted, wrong version, not executable).
    #[error("the in-sandbox helper is unavailable: {0}")]
    NoHelper(String),
    /// The channel died; nothing was started.
    #[error("the in-sandbox helper channel failed: {0}")]
    Dead(String),
    /// The request cannot be encoded (over the frame limit).
    #[error("{0}")]
    TooLarge(String),
}

type Writer = Pin<Box<dyn AsyncWrite + Send>>;

#[derive(Default)]
struct Routes {
    queues: HashMap<u64, mpsc::Sender<Event>>,
    dead: Option<String>,
}

/// State shared between a channel and its reader task.
#[derive(Default)]
struct Shared {
    routes: Mutex<Routes>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the channel dead; dropping the senders tells every waiting command.
    fn die(&self, reason: String) {
        let mut routes = self.lock();
        if routes.dead.is_none() {
            tracing::debug!(%reason, "helper channel closed");
            routes.dead = Some(reason);
        }
        routes.queues.clear();
    }

    async fn route(&self, event: Event) -> Result<(), String> {
        let id = match &event {
            Event::Error { message } => {
                return Err(format!("the helper reported a protocol error: {message}"))
            }
            Event::Hello { .. } => return Err("the helper greeted twice".into()),
            other => other.id().unwrap_or_default(),
        };
        let sender = {
            let mut routes = self.lock();
            if matches!(event, Event::Exit { .. }) {
                routes.queues.remove(&id)
            } else {
                routes.queues.get(&id).cloned()
            }
        };
        if let Some(sender) = sender {
            // A consumer that went away has already asked for a kill; its events are dropped.
            let _ = sender.send(event).await;
        }
        Ok(())
    }
}

/// One live helper process and the commands running in it.
pub struct Channel {
    writer: tokio::sync::Mutex<Option<Writer>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
}

impl Channel {
    /// Starts the helper in `container` as `user` and waits for its greeting.
    pub async fn open(
        engine: &dyn Engine,
        container: &str,
        user: &str,
    ) -> Result<Arc<Channel>, ChannelError> {
        let plan = ExecPlan {
            argv: vec![helper_path(), "serve".into()],
            env: Vec::new(),
            workdir: None,
            user: user.to_string(),
            stdin: true,
        };
        // Docker may never answer an exec (into a frozen container): the slot of the container's
        // shared channel is held until it does, so it gets the greeting's time as well.
        let session = tokio::time::timeout(HELLO_TIMEOUT, engine.exec(container, &plan))
            .await
            .map_err(|_| {
                ChannelError::Dead(format!(
                    "docker did not start the helper within {} s",
                    HELLO_TIMEOUT.as_secs()
                ))
            })??;
        let writer = session
            .input
            .ok_or_else(|| ChannelError::NoHelper("docker gave no stdin".into()))?;
        let mut output = session.output;
        let mut decoder = FrameDecoder::new();
        match tokio::time::timeout(HELLO_TIMEOUT, greeting(&mut output, &mut decoder)).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Err(ChannelError::NoHelper(why)),
            Err(_) => return Err(ChannelError::NoHelper("no greeting in time".into())),
        }
        let shared = Arc::new(Shared::default());
        tokio::spawn(read_loop(Arc::clone(&shared), output, decoder));
        Ok(Arc::new(Channel {
            writer: tokio::sync::Mutex::new(Some(writer)),
            shared,
            next_id: AtomicU64::new(1),
        }))
    }

    pub fn is_dead(&self) -> bool {
        self.shared.lock().dead.is_some()
    }

    /// Alive with no command in flight: fit to carry the next private command.
    pub fn is_idle(&self) -> bool {
        let routes = self.shared.lock();
        routes.dead.is_none() && routes.queues.is_empty()
    }

    fn dead_reason(&self) -> String {
        self.shared
            .lock()
            .dead
            .clone()
            .unwrap_or_else(|| "the helper stopped answering".into())
    }

    async fn send(&self, request: &Request) -> Result<(), ChannelError> {
        let frame = request
            .to_frame()
            .map_err(|e| ChannelError::TooLarge(format!("the command is too large: {e}")))?;
        let mut writer = self.writer.lock().await;
        let Some(w) = writer.as_mut() else {
            return Err(ChannelError::Dead("the channel is closing".into()));
        };
        let write = async {
            w.write_all(&frame).await?;
            w.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                let why = format!("cannot write to the helper: {e}");
                self.shared.die(why.clone());
                Err(ChannelError::Dead(why))
            }
            Err(_) => {
                let why = "the helper stopped reading its requests".to_string();
                self.shared.die(why.clone());
                Err(ChannelError::Dead(why))
            }
        }
    }

    /// Starts a command (its `id` is assigned here); its events arrive through the handle.
    pub async fn start(
        self: &Arc<Self>,
        mut request: StartRequest,
    ) -> Result<Running, ChannelError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        {
            let mut routes = self.shared.lock();
            if let Some(reason) = &routes.dead {
                return Err(ChannelError::Dead(reason.clone()));
            }
            routes.queues.insert(id, tx);
        }
        if let Err(e) = self.send(&Request::Start(request)).await {
            self.shared.lock().queues.remove(&id);
            return Err(e);
        }
        Ok(Running {
            id,
            rx,
            channel: Arc::clone(self),
            finished: false,
            peeked: None,
        })
    }

    /// Writes a file through the helper: `WriteFile`, the content in chunks of at most
    /// [`MAX_CHUNK_LEN`] bytes, then `End`. The outcome arrives through the handle like a
    /// command's output (the outcome line on stdout, then `Exit`). The request lock is taken per
    /// frame, so other commands' requests interleave with a large write.
    pub async fn write_file(
        self: &Arc<Self>,
        path: &str,
        mode: u32,
        contents: &[u8],
    ) -> Result<Running, ChannelError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        {
            let mut routes = self.shared.lock();
            if let Some(reason) = &routes.dead {
                return Err(ChannelError::Dead(reason.clone()));
            }
            routes.queues.insert(id, tx);
        }
        // From here on, dropping the handle (also on an error below) tells the helper to abandon
        // the write, which removes its temporary file.
        let running = Running {
            id,
            rx,
            channel: Arc::clone(self),
            finished: false,
            peeked: None,
        };
        self.send(&Request::WriteFile {
            id,
            path: path.to_string(),
            mode,
        })
        .await?;
        for chunk in contents.chunks(MAX_CHUNK_LEN) {
            self.send(&Request::Data {
                id,
                data: chunk.to_vec(),
            })
            .await?;
        }
        self.send(&Request::End { id }).await?;
        Ok(running)
    }

    /// Sends `Kill` for a command without waiting (usable from `Drop`).
    fn kill_soon(self: &Arc<Self>, id: u64) {
        self.shared.lock().queues.remove(&id);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let channel = Arc::clone(self);
            handle.spawn(async move {
                let _ = channel.send(&Request::Kill { id }).await;
            });
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // The last user is gone: ask the helper to kill what is left and exit. Closing stdin alone
        // would do the same, but an explicit Shutdown does not depend on Docker passing EOF on.
        let writer = self.writer.get_mut().take();
        self.shared.die("the channel was closed".into());
        if let (Some(mut w), Ok(handle)) = (writer, tokio::runtime::Handle::try_current()) {
            handle.spawn(async move {
                if let Ok(frame) = Request::Shutdown.to_frame() {
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
                        let _ = w.write_all(&frame).await;
                        let _ = w.shutdown().await;
                    })
                    .await;
                }
            });
        }
    }
}

/// Waits for `Hello` with our protocol version; anything else means there is no usable helper.
async fn greeting(
    output: &mut BoxStream<'static, EngineResult<ExecOutput>>,
    decoder: &mut FrameDecoder,
) -> Result<(), String> {
    let mut stderr = Vec::new();
    let mut junk = Vec::new();
    loop {
        match decoder.next_event() {
            Ok(Some(Event::Hello { version })) if version == PROTOCOL_VERSION => return Ok(()),
            Ok(Some(Event::Hello { version })) => {
                return Err(format!(
                    "the helper speaks protocol {version}, not {PROTOCOL_VERSION}"
                ))
            }
            Ok(Some(other)) => return Err(format!("unexpected first message {other:?}")),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "not the helper protocol ({e}): {}",
                    String::from_utf8_lossy(&junk).trim()
                ))
            }
        }
        match output.next().await {
            Some(Ok(ExecOutput::Stdout(bytes))) => {
                if junk.len() < STDERR_KEEP {
                    junk.extend_from_slice(&bytes[..bytes.len().min(STDERR_KEEP)]);
                }
                decoder.feed(&bytes);
            }
            Some(Ok(ExecOutput::Stderr(bytes))) => {
                if stderr.len() < STDERR_KEEP {
                    stderr.extend_from_slice(&bytes[..bytes.len().min(STDERR_KEEP)]);
                }
            }
            Some(Err(e)) => return Err(e.to_string()),
            None => {
                let said = if stderr.is_empty() { &junk } else { &stderr };
                return Err(format!(
                    "the helper exited before greeting: {}",
                    String::from_utf8_lossy(said).trim()
                ));
            }
        }
    }
}

async fn read_loop(
    shared: Arc<Shared>,
    mut output: BoxStream<'static, EngineResult<ExecOutput>>,
    mut decoder: FrameDecoder,
) {
    // The helper's last words, for the reason its channel died (commands' output travels in
    // frames on stdout; stderr only carries the helper's own messages).
    let mut said = Vec::new();
    let reason = 'outer: loop {
        loop {
            match decoder.next_event() {
                Ok(Some(event)) => {
                    if let Err(why) = shared.route(event).await {
                        break 'outer why;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer format!("protocol error from the helper: {e}"),
            }
        }
        match output.next().await {
            Some(Ok(ExecOutput::Stdout(bytes))) => decoder.feed(&bytes),
            Some(Ok(ExecOutput::Stderr(bytes))) => {
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(STDERR_KEEP)]);
                tracing::debug!(stderr = %text.trim(), "helper said");
                said.extend_from_slice(&bytes);
                let excess = said.len().saturating_sub(STDERR_KEEP);
                said.drain(..excess);
            }
            Some(Err(e)) => break format!("the helper's stream failed: {e}"),
            None if said.is_empty() => break "the helper exited".into(),
            None => {
                break format!(
                    "the helper exited: {}",
                    String::from_utf8_lossy(&said).trim()
                )
            }
        }
    };
    shared.die(reason);
}

/// A command started on a channel. Dropping it before its `Exit` kills the command's tree.
pub struct Running {
    id: u64,
    rx: mpsc::Receiver<Event>,
    channel: Arc<Channel>,
    finished: bool,
    /// An event received by [`Running::acknowledged`], handed out first by [`Running::next`].
    peeked: Option<Event>,
}

impl Running {
    /// Waits for the command's first event (`Started`, or `Failed` for one that could not
    /// start); `false` when the channel died before the helper said anything about it.
    pub async fn acknowledged(&mut self) -> bool {
        if self.peeked.is_none() {
            self.peeked = self.next().await;
        }
        self.peeked.is_some()
    }

    /// The next event of this command; `None` when the channel died before its `Exit`.
    pub async fn next(&mut self) -> Option<Event> {
        if let Some(event) = self.peeked.take() {
            return Some(event);
        }
        let event = self.rx.recv().await;
        if matches!(event, Some(Event::Exit { .. })) {
            self.finished = true;
        }
        event
    }

    /// Whether the command's `Exit` has been received.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Why the channel died (after `next` returned `None`).
    pub fn lost_reason(&self) -> String {
        self.channel.dead_reason()
    }

    /// Asks the helper to kill the command's tree; its `Exit` still follows.
    pub async fn kill(&self) {
        let _ = self.channel.send(&Request::Kill { id: self.id }).await;
    }

    /// The helper let the command's deadline pass without an `Exit`: it is wedged (under gVisor a
    /// sandbox killed by the OOM killer leaves its exec stream open forever), so the channel is
    /// given up and the next command opens a fresh one.
    pub async fn give_up(&self) {
        self.kill().await;
        self.channel
            .shared
            .die("the helper did not answer within the command's deadline".into());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.finished {
            self.channel.kill_soon(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::fake::FakeEngine;
    use bytes::Bytes;

    #[tokio::test(start_paused = true)]
    async fn an_exec_docker_never_answers_fails_in_time() {
        let engine = FakeEngine::new();
        engine.hang_exec();
        let started = tokio::time::Instant::now();
        let opened = Channel::open(&engine, "frozen", "1000:1000").await;
        match opened {
            Err(ChannelError::Dead(why)) => assert!(why.contains("did not start"), "{why}"),
            Err(other) => panic!("failed otherwise: {other}"),
            Ok(_) => panic!("a channel opened through an exec that never answered"),
        }
        assert_eq!(started.elapsed(), HELLO_TIMEOUT);
    }

    #[tokio::test]
    async fn a_helper_that_dies_leaves_its_last_words_in_the_reason() {
        let shared = Arc::new(Shared::default());
        let long = "x".repeat(3 * STDERR_KEEP);
        let said: Vec<EngineResult<ExecOutput>> = vec![
            Ok(ExecOutput::Stderr(Bytes::from(long))),
            Ok(ExecOutput::Stderr(Bytes::from_static(
                b"helper: poll: out of memory\n",
            ))),
        ];
        read_loop(
            Arc::clone(&shared),
            futures::stream::iter(said).boxed(),
            FrameDecoder::new(),
        )
        .await;
        let reason = shared.lock().dead.clone().expect("the channel died");
        assert!(reason.starts_with("the helper exited: x"), "{reason}");
        assert!(reason.ends_with("helper: poll: out of memory"), "{reason}");
        assert!(
            reason.len() <= STDERR_KEEP + 40,
            "kept {} bytes",
            reason.len()
        );

        let silent = Arc::new(Shared::default());
        read_loop(
            Arc::clone(&silent),
            futures::stream::empty().boxed(),
            FrameDecoder::new(),
        )
        .await;
        assert_eq!(silent.lock().dead.as_deref(), Some("the helper exited"));
    }
}
