//! File reads, writes and listings, done by the in-sandbox helper's one-shot modes as the
//! sandbox user (`helper/src/files.rs` documents them; their exit codes are
//! `helper_protocol::file_exit`, mapped to API errors here).
//!
//! - Writes never use Docker's archive API: it writes as root and follows symlinks, so a link in
//!   the workspace could aim it anywhere. The helper writes on the container's shared channel
//!   (`WriteFile`, the body in bounded `Data` frames, `End`: no extra `docker exec`); a helper of
//!   another protocol version gets its `write-file` mode run in its own `docker exec -i`, the
//!   body on its stdin. Either way the path is resolved component by component, confined to
//!   `/workspace`; anything that leaves it is refused with 400 and nothing is written.
//! - Reads and listings run as commands on the container's shared helper channel: no extra
//!   `docker exec`, the sandbox's own view of the filesystem (under gVisor the archive API cannot
//!   see `/tmp`), and symlinks followed by the sandbox's kernel. A file the sandbox user may not
//!   read, or a container without the helper, falls back to the archive API (root, like the
//!   reference), following links by hand for at most [`MAX_LINKS`] hops.
//!
//! Nothing here holds more than `max_file_bytes` of content (plus bounded framing).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::channel::{helper_path, Channel, ChannelError};
use super::exec::{self, channel_error, engine_error, Source};
use super::{paths, DataPlane, DataPlaneError, DataPlaneResult, FileInfo, FileType, SandboxTarget};
use crate::docker::{ExecOutput, ExecPlan};
use helper_protocol::{file_exit, StartRequest};

/// Symlink hops when following links by hand (the reference's limit).
const MAX_LINKS: usize = 8;
/// How long one file operation may take inside the sandbox.
const FILE_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest listing accepted from the helper.
const MAX_LISTING_BYTES: usize = 64 << 20;
/// Helper messages (stderr, result lines) kept.
const MESSAGE_BYTES: usize = 64 << 10;

/// What a one-shot helper command produced.
struct Outcome {
    /// The exit status: 0, or one of [`file_exit`] (anything else reads as `file_exit::OTHER`).
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Outcome {
    fn message(&self) -> String {
        self.stderr.trim().to_string()
    }
}

#[derive(Deserialize)]
struct WriteResult {
    #[serde(default)]
    error: Option<i64>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    mtime: i64,
    #[serde(default)]
    mtime_nsec: u32,
}

#[derive(Deserialize)]
struct ListEntry {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    size: u64,
    mtime: i64,
}

fn timestamp(secs: i64, nsec: u32) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(secs, nsec).unwrap_or_default()
}

/// The last path component (`/` for the root).
fn base_name(path: &str) -> String {
    path.rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("/")
        .to_string()
}

impl DataPlane {
    /// The container's shared helper channel, opened if need be; `None` when it has no helper.
    async fn shared_channel(
        &self,
        target: &SandboxTarget,
    ) -> DataPlaneResult<Option<Arc<Channel>>> {
        // As for commands: a channel opened before the container was started again would be
        // kept open by gVisor and never answer.
        self.channels
            .renew_if_restarted(&target.container_id, target.started_at);
        match self.channels.shared(&target.container_id).await {
            Ok(channel) => Ok(Some(channel)),
            Err(ChannelError::NoHelper(_)) => Ok(None),
            Err(e) => Err(channel_error(&target.name, e)),
        }
    }

    /// Runs a helper file mode on the container's shared channel; `None` when there is no helper.
    async fn oneshot(
        &self,
        target: &SandboxTarget,
        args: &[&str],
        cap: usize,
    ) -> DataPlaneResult<Option<Outcome>> {
        if !self.helper {
            return Ok(None);
        }
        let mut argv = vec![helper_path()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let request = StartRequest {
            id: 0,
            argv,
            env: vec![("PATH".into(), exec::DEFAULT_PATH.into())],
            workdir: "/".into(),
            timeout_ms: FILE_TIMEOUT.as_millis() as u64,
            linger_ms: 0,
            keep_background: false,
        };
        let fail = |e| channel_error(&target.name, e);
        let mut retried = false;
        loop {
            let Some(channel) = self.shared_channel(target).await? else {
                return Ok(None);
            };
            let running = channel.start(request.clone()).await.map_err(fail)?;
            let mut source = Source::helper(running);
            let c = exec::collect(&mut source, FILE_TIMEOUT, cap).await;
            match c.exit {
                Ok((code, _)) => {
                    if c.truncated && code == 0 {
                        return Err(DataPlaneError::Backend(
                            "the helper sent more than it may".into(),
                        ));
                    }
                    let mut stderr = c.stderr;
                    stderr.truncate(MESSAGE_BYTES);
                    return Ok(Some(Outcome {
                        code: i32::try_from(code).unwrap_or(file_exit::OTHER),
                        stdout: c.stdout,
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    }));
                }
                Err((_, true)) if !retried => retried = true,
                Err((why, _)) => return Err(lost_contact(why)),
            }
        }
    }

    pub(super) async fn read_file_impl(
        &self,
        target: &SandboxTarget,
        path: &str,
    ) -> DataPlaneResult<Bytes> {
        let path = paths::normalize(path)?;
        let limit = self.settings.max_file_bytes;
        let max = usize::try_from(limit).unwrap_or(usize::MAX);
        let outcome = self
            .oneshot(
                target,
                &["read-file", &path, &limit.to_string()],
                max.saturating_add(MESSAGE_BYTES),
            )
            .await?;
        let Some(outcome) = outcome else {
            return self.read_via_archive(target, &path).await;
        };
        match outcome.code {
            0 => Ok(Bytes::from(outcome.stdout)),
            file_exit::DENIED => self.read_via_archive(target, &path).await,
            file_exit::NOT_FOUND => Err(DataPlaneError::NotFound(format!("{path}: not found"))),
            file_exit::TOO_LARGE => Err(DataPlaneError::TooLarge { what: path, limit }),
            file_exit::IS_DIR => Err(DataPlaneError::InvalidRequest(format!(
                "{path} is a directory"
            ))),
            file_exit::NOT_REGULAR => Err(DataPlaneError::InvalidRequest(format!(
                "{path} is not a regular file"
            ))),
            file_exit::LOOP => Err(DataPlaneError::InvalidRequest(format!(
                "{path}: too many levels of symbolic links"
            ))),
            _ => Err(DataPlaneError::Backend(format!(
                "cannot read {path}: {}",
                outcome.message()
            ))),
        }
    }

    /// Reads through Docker's archive API (as root), following links by hand.
    async fn read_via_archive(&self, target: &SandboxTarget, path: &str) -> DataPlaneResult<Bytes> {
        let limit = self.settings.max_file_bytes;
        let mut current = path.to_string();
        for _ in 0..=MAX_LINKS {
            match super::archive_read::first_entry(
                self.engine.as_ref(),
                &target.container_id,
                &current,
                limit,
            )
            .await
            .map_err(|e| match e {
                super::archive_read::ReadError::NotFound => {
                    DataPlaneError::NotFound(format!("{current}: not found"))
                }
                super::archive_read::ReadError::Engine(e) => engine_error(&target.name, e),
                super::archive_read::ReadError::Bad(m) => DataPlaneError::Backend(m),
            })? {
                super::archive_read::Entry::File(bytes) => return Ok(bytes),
                super::archive_read::Entry::TooLarge => {
                    return Err(DataPlaneError::TooLarge {
                        what: current,
                        limit,
                    })
                }
                super::archive_read::Entry::Directory => {
                    return Err(DataPlaneError::InvalidRequest(format!(
                        "{current} is a directory"
                    )))
                }
                super::archive_read::Entry::Other => {
                    return Err(DataPlaneError::InvalidRequest(format!(
                        "{current} is not a regular file"
                    )))
                }
                super::archive_read::Entry::Link(to) => {
                    let joined = if to.starts_with('/') {
                        to
                    } else {
                        let parent = current.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                        format!("{parent}/{to}")
                    };
                    current = paths::normalize(&joined)?;
                }
            }
        }
        Err(DataPlaneError::InvalidRequest(format!(
            "{path}: too many levels of symbolic links"
        )))
    }

    pub(super) async fn write_file_impl(
        &self,
        target: &SandboxTarget,
        path: &str,
        contents: Bytes,
        mode: u32,
        in_place: bool,
    ) -> DataPlaneResult<FileInfo> {
        let path = paths::normalize(path)?;
        if !paths::is_strictly_in_workspace(&path) {
            return Err(DataPlaneError::InvalidRequest(
                "writes are limited to files under /workspace".into(),
            ));
        }
        let limit = self.settings.max_file_bytes;
        if contents.len() as u64 > limit {
            return Err(DataPlaneError::TooLarge { what: path, limit });
        }
        if mode > 0o777 {
            return Err(DataPlaneError::InvalidRequest(
                "mode must be between 0 and 0o777".into(),
            ));
        }
        if !self.helper {
            return Err(no_helper_for_writes("this server was built without it"));
        }
        let mode = if in_place {
            mode | helper_protocol::WRITE_IN_PLACE
        } else {
            mode
        };
        let (stdout, stderr) = match self
            .write_over_channel(target, &path, &contents, mode)
            .await?
        {
            Some(said) => said,
            None => self.write_via_exec(target, &path, contents, mode).await?,
        };
        let text = String::from_utf8_lossy(&stdout);
        let line = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let Ok(result) = serde_json::from_str::<WriteResult>(line) else {
            let said = if stderr.is_empty() { &stdout } else { &stderr };
            let said = String::from_utf8_lossy(said).trim().to_string();
            if said.contains("no such file or directory") {
                return Err(no_helper_for_writes(&said));
            }
            return Err(DataPlaneError::Backend(format!(
                "cannot write {path}: {said}"
            )));
        };
        match result
            .error
            .map(|e| i32::try_from(e).unwrap_or(file_exit::OTHER))
        {
            None => Ok(FileInfo {
                name: base_name(&path),
                path,
                file_type: FileType::File,
                size: result.size,
                modified_at: timestamp(result.mtime, result.mtime_nsec),
            }),
            Some(file_exit::OUTSIDE) => Err(DataPlaneError::InvalidRequest(format!(
                "writes are limited to files under /workspace: {}",
                result.message
            ))),
            Some(file_exit::IS_DIR | file_exit::NOT_DIR | file_exit::LOOP | file_exit::USAGE) => {
                Err(DataPlaneError::InvalidRequest(result.message))
            }
            // A directory on the way was removed while the file was being written.
            Some(file_exit::NOT_FOUND) => Err(DataPlaneError::InvalidRequest(format!(
                "{path} changed while it was being written: {}",
                result.message
            ))),
            Some(file_exit::DENIED) => Err(DataPlaneError::InvalidRequest(format!(
                "cannot write {path}: {}",
                result.message
            ))),
            Some(_) => Err(DataPlaneError::Backend(format!(
                "cannot write {path}: {}",
                result.message
            ))),
        }
    }

    /// Writes on the container's shared helper channel; `None` when it has no working helper
    /// (one of another protocol version still has the `write-file` mode). Returns what the
    /// helper said: its outcome line on stdout, its reason on stderr.
    async fn write_over_channel(
        &self,
        target: &SandboxTarget,
        path: &str,
        contents: &[u8],
        mode: u32,
    ) -> DataPlaneResult<Option<(Vec<u8>, Vec<u8>)>> {
        let fail = |e| channel_error(&target.name, e);
        let mut retried = false;
        loop {
            let Some(channel) = self.shared_channel(target).await? else {
                return Ok(None);
            };
            let running = match channel.write_file(path, mode, contents).await {
                Ok(r) => r,
                // The channel died under the request: the helper drops an unfinished write (its
                // temporary file goes), so it can be sent again on a fresh channel.
                Err(ChannelError::Dead(why)) if !retried => {
                    tracing::debug!(%why, "helper channel died during a write; retrying");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(fail(e)),
            };
            let mut source = Source::helper(running);
            let c = exec::collect(&mut source, FILE_TIMEOUT, 2 * MESSAGE_BYTES).await;
            match c.exit {
                Ok((_, true)) => {
                    return Err(DataPlaneError::Backend(format!(
                        "writing {path} took too long"
                    )))
                }
                Ok(_) => return Ok(Some((c.stdout, c.stderr))),
                // Nothing was heard: the write is sent again (writing the same bytes twice is
                // harmless even if the first one had been committed).
                Err((_, true)) if !retried => retried = true,
                Err((why, _)) => return Err(lost_contact(why)),
            }
        }
    }

    /// Writes with a `docker exec -i` of the helper's `write-file` mode, the body on its stdin.
    async fn write_via_exec(
        &self,
        target: &SandboxTarget,
        path: &str,
        contents: Bytes,
        mode: u32,
    ) -> DataPlaneResult<(Vec<u8>, Vec<u8>)> {
        let plan = ExecPlan {
            argv: vec![
                helper_path(),
                "write-file".into(),
                path.to_string(),
                format!("{mode:o}"),
            ],
            env: Vec::new(),
            workdir: None,
            user: self.settings.sandbox_user.clone(),
            stdin: true,
        };
        let session = self
            .engine
            .exec(&target.container_id, &plan)
            .await
            .map_err(|e| engine_error(&target.name, e))?;
        let mut input = session
            .input
            .ok_or_else(|| DataPlaneError::Backend("docker gave no stdin".into()))?;
        // Written concurrently with reading: a helper that refuses early stops reading its stdin.
        let feeder = tokio::spawn(async move {
            input.write_all(&contents).await?;
            input.shutdown().await
        });
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut output = session.output;
        let read = async {
            while let Some(item) = output.next().await {
                match item {
                    Ok(ExecOutput::Stdout(b)) if stdout.len() < MESSAGE_BYTES => {
                        stdout.extend_from_slice(&b)
                    }
                    Ok(ExecOutput::Stderr(b)) if stderr.len() < MESSAGE_BYTES => {
                        stderr.extend_from_slice(&b)
                    }
                    Ok(_) => {}
                    Err(e) => return Err(DataPlaneError::Backend(e.to_string())),
                }
            }
            Ok(())
        };
        let read = tokio::time::timeout(FILE_TIMEOUT, read).await;
        feeder.abort();
        match read {
            Ok(r) => r?,
            Err(_) => {
                return Err(DataPlaneError::Backend(format!(
                    "writing {path} took too long"
                )))
            }
        }
        Ok((stdout, stderr))
    }

    pub(super) async fn list_files_impl(
        &self,
        target: &SandboxTarget,
        path: &str,
    ) -> DataPlaneResult<(String, Vec<FileInfo>)> {
        let path = paths::normalize(path)?;
        let outcome = self
            .oneshot(target, &["list-dir", &path], MAX_LISTING_BYTES)
            .await?
            .ok_or_else(|| {
                DataPlaneError::Backend(
                    "listing files needs the in-sandbox helper, which this sandbox lacks".into(),
                )
            })?;
        match outcome.code {
            0 => {}
            file_exit::NOT_FOUND => {
                return Err(DataPlaneError::NotFound(format!("{path}: not found")))
            }
            file_exit::NOT_DIR | file_exit::DENIED => {
                return Err(DataPlaneError::InvalidRequest(format!(
                    "{path} is not a directory"
                )))
            }
            _ => {
                return Err(DataPlaneError::Backend(format!(
                    "cannot list {path}: {}",
                    outcome.message()
                )))
            }
        }
        let prefix = if path == "/" { "" } else { path.as_str() };
        let mut entries = Vec::new();
        for line in outcome.stdout.split(|&b| b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let e: ListEntry = serde_json::from_slice(line).map_err(|e| {
                DataPlaneError::Backend(format!("the helper sent a bad listing: {e}"))
            })?;
            let file_type = match e.kind.as_str() {
                "file" => FileType::File,
                "directory" => FileType::Directory,
                "symlink" => FileType::Symlink,
                _ => FileType::Other,
            };
            entries.push(FileInfo {
                path: format!("{prefix}/{}", e.name),
                name: e.name,
                file_type,
                size: e.size,
                modified_at: timestamp(e.mtime, 0),
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((path, entries))
    }
}

fn no_helper_for_writes(why: &str) -> DataPlaneError {
    DataPlaneError::Backend(format!(
        "file writes need the in-sandbox helper, which this sandbox lacks: {why}"
    ))
}

fn lost_contact(why: impl std::fmt::Display) -> DataPlaneError {
    DataPlaneError::Backend(format!("lost contact with the helper: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(base_name("/workspace/a/b.txt"), "b.txt");
        assert_eq!(base_name("/"), "/");
        assert_eq!(timestamp(0, 0).timestamp(), 0);
    }
}
