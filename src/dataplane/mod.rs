//! The imperative data plane: exec (buffered and streamed) and file I/O against a sandbox's running
//! container, like `kubectl exec`. It never changes lifecycle state; it only needs the container ID
//! the controller observed, and it must not know the `/v1` wire format (`api/v1/wire.rs` does).
//!
//! Commands run through the in-sandbox helper (its wire format is the `helper_protocol` crate),
//! which gives each command its own process group under a child subreaper so that a timeout or a
//! vanished client kills the whole tree. File writes also go through the helper, as the sandbox
//! user, confined to `/workspace`.
//!
//! Where things are: an exec's defaults and one start-and-retry path, here
//! ([`DataPlane::exec`], [`DataPlane::exec_stream`]); running and collecting one command,
//! `exec.rs`; one helper connection, `channel.rs`; which channel a command gets and channel
//! reuse, `channels.rs`; files, `files.rs` (archive fallback in `archive_read.rs`).

mod archive_read;
mod channel;
mod channels;
mod exec;
mod files;
pub mod paths;
mod utf8;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;

use crate::config::Settings;
use crate::docker::Engine;

/// The sandbox an operation targets, as the controller last observed it.
#[derive(Clone, Debug)]
pub struct SandboxTarget {
    pub name: String,
    pub container_id: String,
    /// The sandbox's own environment; a request's env is applied on top.
    pub env: BTreeMap<String, String>,
    /// When the controller last started the container. A container started again (a stopped
    /// sandbox resumed) keeps its ID but none of its processes: channels into the run before
    /// are dropped, since some runtimes (gVisor) leave their streams open.
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A command: a string run as `/bin/sh -c`, or an argv list.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

/// What to run; what is left out gets the data plane's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecRequest {
    pub command: Command,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub timeout_seconds: Option<f64>,
}

/// The result of a buffered exec.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

/// One event of a streamed exec.
#[derive(Clone, Debug, PartialEq)]
pub enum ExecEvent {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Exit {
        exit_code: i64,
        timed_out: bool,
        duration_ms: u64,
    },
}

/// A file or directory entry.
#[derive(Clone, Debug, PartialEq)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    pub file_type: FileType,
    pub size: u64,
    pub modified_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    File,
    Directory,
    Symlink,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// A request value the rules refuse (maps to 400).
    #[error("{0}")]
    InvalidRequest(String),
    /// No such file or directory inside the sandbox (maps to 404).
    #[error("{0}")]
    NotFound(String),
    /// Over `max_file_bytes` (maps to 413).
    #[error("{what} is larger than the limit of {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    /// The sandbox has no running container right now (maps to 409).
    #[error("sandbox {0} is not running")]
    NotRunning(String),
    /// Docker or the helper failed (maps to 502).
    #[error("{0}")]
    Backend(String),
}

pub type DataPlaneResult<T> = Result<T, DataPlaneError>;

pub struct DataPlane {
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    /// Whether sandboxes carry the helper (this build embeds one).
    helper: bool,
    channels: channels::Channels,
    /// Where command starts are timed, when the server keeps metrics.
    metrics: Option<crate::metrics::Metrics>,
}

/// A command that has started and been heard of (see [`DataPlane::launch`]).
struct Launched {
    source: exec::Source,
    /// The stream's own channel, for `private` launches on a helper.
    channel: Option<Arc<channel::Channel>>,
    /// When the host gives up on the command: its timeout plus the source's grace.
    deadline: tokio::time::Instant,
}

impl DataPlane {
    pub fn new(engine: Arc<dyn Engine>, settings: Arc<Settings>) -> DataPlane {
        let helper = crate::helper_binary::helper_binary().is_some();
        DataPlane::with_helper(engine, settings, helper)
    }

    /// Like [`DataPlane::new`], saying whether sandboxes carry the helper.
    pub fn with_helper(
        engine: Arc<dyn Engine>,
        settings: Arc<Settings>,
        helper: bool,
    ) -> DataPlane {
        let channels = channels::Channels::new(Arc::clone(&engine), settings.sandbox_user.clone());
        DataPlane {
            engine,
            settings,
            helper,
            channels,
            metrics: None,
        }
    }

    /// Opens the container's shared helper channel ahead of any request: for a pool member
    /// waiting to be claimed (the claim keeps the container), so the claiming sandbox's first
    /// command or file call does not wait for a `docker exec` first. A failure is only logged and
    /// leaves nothing behind; the first call then opens the channel as usual.
    pub async fn warm(&self, container_id: &str) {
        if !self.helper {
            return;
        }
        if let Err(error) = self.channels.warm(container_id).await {
            tracing::debug!(container = %container_id, %error, "helper channel not warmed");
        }
    }

    /// Times every command start into `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> DataPlane {
        self.metrics = Some(metrics);
        self
    }

    fn started(&self, since: std::time::Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.exec_started(since.elapsed());
        }
    }

    /// Starts a command: on the container's shared helper channel, or on a channel of its own
    /// (`private`, for client-paced streams), or as a plain `docker exec` without a helper.
    async fn start(
        &self,
        target: &SandboxTarget,
        prepared: &exec::Prepared,
        private: bool,
    ) -> DataPlaneResult<(exec::Source, Option<Arc<channel::Channel>>)> {
        let container = &target.container_id;
        let fail = |e| exec::channel_error(&target.name, e);
        if self.helper {
            self.channels
                .renew_if_restarted(container, target.started_at);
            let opened = if private {
                self.channels.private(container).await
            } else {
                self.channels.shared(container).await
            };
            match opened {
                Ok(ch) => match ch.start(prepared.start_request()).await {
                    Ok(running) => {
                        let keep = private.then_some(ch);
                        return Ok((exec::Source::helper(running), keep));
                    }
                    Err(channel::ChannelError::Dead(why)) => {
                        // Nothing started (a stale spare, a shared channel that just died): one
                        // more try on a fresh channel.
                        tracing::debug!(%why, "helper channel died; reopening");
                        let ch = if private {
                            self.channels.fresh(container).await
                        } else {
                            self.channels.shared(container).await
                        }
                        .map_err(fail)?;
                        let running = ch.start(prepared.start_request()).await.map_err(fail)?;
                        let keep = private.then_some(ch);
                        return Ok((exec::Source::helper(running), keep));
                    }
                    Err(e) => return Err(fail(e)),
                },
                Err(channel::ChannelError::NoHelper(_)) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        let user = &self.settings.sandbox_user;
        let plain = exec::Plain::start(Arc::clone(&self.engine), container, prepared, user)
            .await
            .map_err(|e| exec::engine_error(&target.name, e))?;
        Ok((exec::Source::Plain(plain), None))
    }

    /// The one start-and-retry path of buffered and streamed exec: starts the command and waits
    /// for the helper to take it. A helper that died before it heard of the command (a spare
    /// whose helper was killed from inside the sandbox, a shared channel that just closed) never
    /// ran it, so it is started once more on a fresh channel. A second loss is left to the
    /// caller, who reads it from the source; a helper that never answers is left to the
    /// command's deadline.
    async fn launch(
        &self,
        target: &SandboxTarget,
        prepared: &exec::Prepared,
        private: bool,
    ) -> DataPlaneResult<Launched> {
        let mut retried = false;
        loop {
            let (mut source, channel) = self.start(target, prepared, private).await?;
            let deadline = tokio::time::Instant::now() + prepared.timeout + source.grace();
            let heard = tokio::time::timeout_at(deadline, source.acknowledged()).await;
            match heard {
                Ok(Err(why)) if !retried => {
                    tracing::debug!(%why, "retrying a command its helper never started");
                    retried = true;
                }
                Ok(_) | Err(_) => {
                    return Ok(Launched {
                        source,
                        channel,
                        deadline,
                    })
                }
            }
        }
    }

    /// Runs a command to completion, capturing at most `max_exec_output_bytes` across both streams.
    pub async fn exec(
        &self,
        target: &SandboxTarget,
        request: ExecRequest,
    ) -> DataPlaneResult<ExecResponse> {
        let began = std::time::Instant::now();
        let prepared = self.prepare(target, request)?;
        let cap = self.settings.max_exec_output_bytes;
        let launching = std::time::Instant::now();
        let mut launched = self.launch(target, &prepared, false).await?;
        self.started(launching);
        let c = exec::collect_until(&mut launched.source, launched.deadline, cap).await;
        match c.exit {
            Ok((exit_code, timed_out)) => Ok(ExecResponse {
                stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&c.stderr).into_owned(),
                exit_code,
                timed_out,
                truncated: c.truncated,
                duration_ms: exec::duration_ms(began),
            }),
            Err((why, _)) => Err(DataPlaneError::Backend(format!(
                "lost contact with the command: {why}"
            ))),
        }
    }

    /// Runs a command and streams its output as it arrives; the last event is always `Exit`.
    /// Dropping the stream (a client that went away) kills the command's whole tree.
    pub async fn exec_stream(
        &self,
        target: &SandboxTarget,
        request: ExecRequest,
    ) -> DataPlaneResult<BoxStream<'static, ExecEvent>> {
        let began = std::time::Instant::now();
        let prepared = self.prepare(target, request)?;
        // Answered only once the helper has taken the command, so that a dead spare is retried
        // while the command can still be started elsewhere.
        let launching = std::time::Instant::now();
        let launched = self.launch(target, &prepared, true).await?;
        self.started(launching);
        let private = launched.channel.map(|channel| exec::Private {
            channel,
            recycle: self.channels.recycler(&target.container_id),
        });
        Ok(exec::events(
            launched.source,
            launched.deadline,
            began,
            private,
        ))
    }

    /// The request with every default applied (the only place they are): the sandbox's
    /// environment under the request's, `HOME` and `PATH`, `/workspace`, the default timeout.
    fn prepare(
        &self,
        target: &SandboxTarget,
        request: ExecRequest,
    ) -> DataPlaneResult<exec::Prepared> {
        exec::Prepared::new(
            &target.env,
            request,
            self.settings.default_exec_timeout_seconds,
        )
    }

    /// Reads a file anywhere in the sandbox (symlinks followed inside it), at most `max_file_bytes`.
    pub async fn read_file(&self, target: &SandboxTarget, path: &str) -> DataPlaneResult<Bytes> {
        self.read_file_impl(target, path).await
    }

    /// Writes a file strictly under `/workspace`, atomically, owned by the sandbox user.
    pub async fn write_file(
        &self,
        target: &SandboxTarget,
        path: &str,
        contents: Bytes,
        mode: u32,
    ) -> DataPlaneResult<FileInfo> {
        self.write_file_impl(target, path, contents, mode, false)
            .await
    }

    /// Writes a file strictly under `/workspace` into the file itself (created or truncated,
    /// its mode set, then written), as E2B's envd does: readers may see part of it, and a
    /// directory watch sees it created, its mode set and written rather than renamed into place.
    pub async fn write_file_in_place(
        &self,
        target: &SandboxTarget,
        path: &str,
        contents: Bytes,
        mode: u32,
    ) -> DataPlaneResult<FileInfo> {
        self.write_file_impl(target, path, contents, mode, true)
            .await
    }

    /// Lists a directory, sorted by name; returns the normalized path and the entries.
    pub async fn list_files(
        &self,
        target: &SandboxTarget,
        path: &str,
    ) -> DataPlaneResult<(String, Vec<FileInfo>)> {
        self.list_files_impl(target, path).await
    }
}
