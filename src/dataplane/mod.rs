//! The imperative data plane: exec (buffered and streamed) and file I/O against a sandbox's running
//! container, like `kubectl exec`. It never changes lifecycle state; it only needs the container ID
//! the controller observed.
//!
//! Commands run through the in-sandbox helper (see `helper_protocol`), which gives each command its
//! own process group under a child subreaper so that a timeout or a vanished client kills the whole
//! tree. File writes also go through the helper, as the sandbox user, confined to `/workspace`.

mod archive_read;
mod channel;
mod exec;
mod files;
pub mod paths;
mod utf8;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::docker::Engine;

/// The sandbox an operation targets, as the controller last observed it.
#[derive(Clone, Debug)]
pub struct SandboxTarget {
    pub name: String,
    pub container_id: String,
    /// The sandbox's own environment; a request's env is applied on top.
    pub env: BTreeMap<String, String>,
}

/// A command: a string run as `/bin/sh -c`, or an argv list.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

/// What to run. Field names are the `/v1` wire names.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Command,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

/// The result of a buffered exec (`/v1` ExecResponse).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ExecResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

/// One line of a streamed exec (`/v1` NDJSON events).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
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

/// A file or directory entry (`/v1` FileInfo).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    pub modified_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
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
    pool: channel::Pool,
    /// Opened, idle private channels per container (at most [`SPARES_PER_CONTAINER`]), so that a
    /// stream does not wait for a `docker exec` to start (see [`DataPlane::private_channel`]).
    spares: Spares,
}

/// Idle private channels kept per container: a finished stream's channel plus the one opened in
/// the background when the last was taken, so back-to-back streams never wait for a `docker exec`
/// and never start one either. Each is one idle helper process in the sandbox.
const SPARES_PER_CONTAINER: usize = 2;

type Spares = Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<Arc<channel::Channel>>>>>;

/// Keeps `channel` as a spare of `container` if it is idle and there is room; else it is closed.
fn keep_spare(spares: &Spares, container: &str, channel: Arc<channel::Channel>) {
    let mut spares = spares.lock().unwrap_or_else(|p| p.into_inner());
    let list = spares.entry(container.to_string()).or_default();
    list.retain(|c| c.is_idle());
    if list.len() < SPARES_PER_CONTAINER && channel.is_idle() {
        list.push(channel);
    }
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
        DataPlane {
            engine,
            settings,
            helper,
            pool: channel::Pool::default(),
            spares: Arc::default(),
        }
    }

    /// A channel of the stream's own: one of the container's spares if one is ready, else a new
    /// one. When that leaves no spare, another is opened in the background. Spares die with the
    /// container; those of containers that are gone are forgotten on the next take.
    async fn private_channel(
        &self,
        container: &str,
        user: &str,
    ) -> Result<Arc<channel::Channel>, channel::ChannelError> {
        let (spare, refill) = {
            let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
            for list in spares.values_mut() {
                list.retain(|c| c.is_idle());
            }
            spares.retain(|_, list| !list.is_empty());
            let spare = spares.get_mut(container).and_then(Vec::pop);
            let left = spares.get(container).map_or(0, Vec::len);
            (spare, left == 0)
        };
        if refill {
            let (engine, spares) = (Arc::clone(&self.engine), Arc::clone(&self.spares));
            let (container_owned, user_owned) = (container.to_string(), user.to_string());
            tokio::spawn(async move {
                if let Ok(next) =
                    channel::Channel::open(engine.as_ref(), &container_owned, &user_owned).await
                {
                    keep_spare(&spares, &container_owned, next);
                }
            });
        }
        match spare {
            Some(channel) => Ok(channel),
            None => channel::Channel::open(self.engine.as_ref(), container, user).await,
        }
    }

    /// How a finished stream's private channel goes back to the container's spares.
    fn recycler(&self, container: &str) -> exec::Recycle {
        let spares = Arc::clone(&self.spares);
        let container = container.to_string();
        Box::new(move |channel| keep_spare(&spares, &container, channel))
    }

    /// Starts a command: on the container's shared helper channel, or on a channel of its own
    /// (`private`, for client-paced streams), or as a plain `docker exec` without a helper.
    async fn start(
        &self,
        target: &SandboxTarget,
        prepared: &exec::Prepared,
        private: bool,
    ) -> DataPlaneResult<(exec::Source, Option<Arc<channel::Channel>>)> {
        let user = &self.settings.sandbox_user;
        let container = &target.container_id;
        let fail = |e| exec::channel_error(&target.name, e);
        if self.helper {
            let opened = if private {
                self.private_channel(container, user).await
            } else {
                self.pool.get(self.engine.as_ref(), container, user).await
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
                            channel::Channel::open(self.engine.as_ref(), container, user).await
                        } else {
                            self.pool.get(self.engine.as_ref(), container, user).await
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
        let plain = exec::Plain::start(Arc::clone(&self.engine), container, prepared, user)
            .await
            .map_err(|e| exec::engine_error(&target.name, e))?;
        Ok((exec::Source::Plain(plain), None))
    }

    /// Runs a command to completion, capturing at most `max_exec_output_bytes` across both streams.
    pub async fn exec(
        &self,
        target: &SandboxTarget,
        request: ExecRequest,
    ) -> DataPlaneResult<ExecResponse> {
        let began = std::time::Instant::now();
        let prepared = exec::Prepared::new(
            &target.env,
            request,
            self.settings.default_exec_timeout_seconds,
        )?;
        let cap = self.settings.max_exec_output_bytes;
        let mut retried = false;
        loop {
            let (mut source, _) = self.start(target, &prepared, false).await?;
            let c = exec::collect(&mut source, prepared.timeout, cap).await;
            match c.exit {
                Ok((exit_code, timed_out)) => {
                    return Ok(ExecResponse {
                        stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&c.stderr).into_owned(),
                        exit_code,
                        timed_out,
                        truncated: c.truncated,
                        duration_ms: exec::duration_ms(began),
                    })
                }
                // The helper died before the command was heard of: it never ran, so run it again.
                Err((why, true)) if !retried => {
                    tracing::debug!(%why, "retrying a command its helper never started");
                    retried = true;
                }
                Err((why, _)) => {
                    return Err(DataPlaneError::Backend(format!(
                        "lost contact with the command: {why}"
                    )))
                }
            }
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
        let prepared = exec::Prepared::new(
            &target.env,
            request,
            self.settings.default_exec_timeout_seconds,
        )?;
        let mut retried = false;
        loop {
            let (mut source, channel) = self.start(target, &prepared, true).await?;
            let deadline = tokio::time::Instant::now() + prepared.timeout + source.grace();
            // Wait for the helper to take the command before answering: a spare whose helper
            // died unnoticed (killed from inside the sandbox) shows up here, while the command
            // can still be started on a fresh channel, as a buffered exec would be. A helper
            // that never answers is left to the stream's own deadline.
            let heard = tokio::time::timeout_at(deadline, source.acknowledged()).await;
            match heard {
                Ok(Err(why)) if !retried => {
                    tracing::debug!(%why, "retrying a streamed command its helper never started");
                    retried = true;
                    continue;
                }
                // A second loss is reported by the stream itself (its queue is already closed).
                Ok(_) | Err(_) => {}
            }
            let private = channel.map(|channel| exec::Private {
                channel,
                recycle: self.recycler(&target.container_id),
            });
            return Ok(exec::events(source, deadline, began, private));
        }
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
        self.write_file_impl(target, path, contents, mode).await
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
