//! Directory watches of a sandbox: the server's side of the in-sandbox supervisor's inotify
//! watchers (`helper/src/watch.rs`), for any directory the sandbox user may read.
//!
//! Design: like processes, watches belong to the sandbox. Inotify runs inside the sandbox, in
//! its supervisor, so events are real under every runtime (under gVisor its own inotify sees
//! what the sandbox does) and this module keeps no state at all. A streamed watch ([`stream`])
//! holds one supervisor connection for as long as its reader reads, and dropping the stream
//! removes the watch. A detached watcher ([`create`]) lives in the supervisor until [`remove`],
//! until nobody asked for its events for [`IDLE`], or until the container ends (the sandbox is
//! deleted, stopped or replaced). Everything is bounded there: [`MAX_WATCHERS`] per sandbox,
//! [`MAX_DIRS`] per watch, [`MAX_QUEUED`] events waiting, past which the watch fails with a
//! message saying events were lost. This module never knows a wire format (`api/e2b` does) and
//! reaches the supervisor only through [`crate::processes`].

use futures::stream::BoxStream;
use futures::StreamExt;

use crate::processes::{ProcessError, Processes, Target};
use helper_protocol::supervisor::{ErrorCode, FsOp, Reply, SupRequest, WatchStart};

/// Watches that may exist at once in one sandbox (streamed and detached together).
pub const MAX_WATCHERS: u32 = 32;
/// Directories one recursive watch may cover.
pub const MAX_DIRS: u32 = 8192;
/// Events waiting to be read, per watch.
pub const MAX_QUEUED: u32 = 16384;
/// A detached watcher nobody asked for its events for this long is removed.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// What happened to an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change: `name` is the entry's path relative to the watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub op: Op,
    pub name: String,
}

/// What a streamed watch yields after it began.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Event(Event),
    /// The watch ended: lost events, its directory removed, a limit, or the sandbox went away.
    Failed(WatchError),
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WatchError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Denied(String),
    /// A limit: too many watches, too many directories, or events lost.
    #[error("{0}")]
    TooMany(String),
    /// The sandbox is not running, or its supervisor cannot watch.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Backend(String),
}

fn op_of(op: FsOp) -> Op {
    match op {
        FsOp::Create => Op::Create,
        FsOp::Write => Op::Write,
        FsOp::Remove => Op::Remove,
        FsOp::Rename => Op::Rename,
        FsOp::Chmod => Op::Chmod,
    }
}

fn reply_error(code: ErrorCode, message: String) -> WatchError {
    match code {
        ErrorCode::NotFound => WatchError::NotFound(message),
        ErrorCode::Invalid if message.contains("unknown frame kind") => WatchError::Unavailable(
            "this sandbox's supervisor predates directory watching (the sandbox was started by \
             an older server): recreate the sandbox"
                .into(),
        ),
        ErrorCode::Invalid | ErrorCode::Conflict => WatchError::Invalid(message),
        ErrorCode::Denied => WatchError::Denied(message),
        ErrorCode::TooMany => WatchError::TooMany(message),
        ErrorCode::Internal => WatchError::Backend(message),
    }
}

fn process_error(e: ProcessError) -> WatchError {
    match e {
        ProcessError::NotFound(m) => WatchError::NotFound(m),
        ProcessError::Invalid(m) => WatchError::Invalid(m),
        ProcessError::TooMany(m) => WatchError::TooMany(m),
        ProcessError::Conflict(m) | ProcessError::Unavailable(m) => WatchError::Unavailable(m),
        ProcessError::Backend(m) => WatchError::Backend(m),
    }
}

fn start(path: &str, recursive: bool, follow: bool) -> SupRequest {
    SupRequest::Watch(WatchStart {
        path: path.to_string(),
        recursive,
        follow,
        max_watchers: MAX_WATCHERS,
        max_dirs: MAX_DIRS,
        max_queued: MAX_QUEUED,
        idle_ms: IDLE.as_millis() as u64,
    })
}

/// Watches `path` (absolute) for as long as the stream is read: `Err` when the watch cannot
/// begin (no such directory, a limit), then its events; the stream ends with
/// [`Item::Failed`] when the watch does.
pub async fn stream(
    processes: &Processes,
    target: &Target,
    path: &str,
    recursive: bool,
) -> Result<BoxStream<'static, Item>, WatchError> {
    let (first, rest) = processes
        .supervisor_stream(target, start(path, recursive, true))
        .await
        .map_err(process_error)?;
    match first {
        Reply::Watcher { .. } => {}
        Reply::Error { code, message } => return Err(reply_error(code, message)),
        other => {
            return Err(WatchError::Backend(format!(
                "unexpected answer from the supervisor: {other:?}"
            )))
        }
    }
    let items = rest
        .map(|reply| match reply {
            Reply::FsEvent { op, name } => Item::Event(Event {
                op: op_of(op),
                name,
            }),
            Reply::Error { code, message } => Item::Failed(reply_error(code, message)),
            other => Item::Failed(WatchError::Backend(format!(
                "unexpected answer from the supervisor: {other:?}"
            ))),
        })
        .chain(futures::stream::once(async {
            Item::Failed(WatchError::Unavailable(
                "the watch ended with the sandbox's supervisor (the sandbox stopped?)".into(),
            ))
        }));
    // Nothing is yielded after the first failure.
    let mut ended = false;
    let items = items.take_while(move |item| {
        let keep = !ended;
        ended |= matches!(item, Item::Failed(_));
        futures::future::ready(keep)
    });
    Ok(Box::pin(items))
}

/// Replies of a call, or the error that ended them.
fn answer(replies: Vec<Reply>) -> Result<Vec<Reply>, WatchError> {
    match replies.last() {
        Some(Reply::Ok) => Ok(replies),
        Some(Reply::Error { code, message }) => Err(reply_error(*code, message.clone())),
        other => Err(WatchError::Backend(format!(
            "unexpected answer from the supervisor: {other:?}"
        ))),
    }
}

/// A detached watcher of `path` (absolute), by its id (`w_` + 16 hex digits).
pub async fn create(
    processes: &Processes,
    target: &Target,
    path: &str,
    recursive: bool,
) -> Result<String, WatchError> {
    let replies = processes
        .supervisor_call(target, start(path, recursive, false))
        .await
        .map_err(process_error)?;
    match answer(replies)?.first() {
        Some(Reply::Watcher { id }) => Ok(id.clone()),
        other => Err(WatchError::Backend(format!(
            "unexpected answer from the supervisor: {other:?}"
        ))),
    }
}

/// The events a detached watcher queued since it was last asked. A watcher that failed answers
/// its events first, then its error (once; it is gone after).
pub async fn events(
    processes: &Processes,
    target: &Target,
    id: &str,
) -> Result<Vec<Event>, WatchError> {
    let replies = processes
        .supervisor_call(target, SupRequest::WatchEvents { id: id.to_string() })
        .await
        .map_err(process_error)?;
    let replies = answer(replies).map_err(|e| match e {
        WatchError::NotFound(_) => WatchError::NotFound(format!(
            "watcher {id} not found (removed, not asked for its events for {} s, or its sandbox \
             restarted)",
            IDLE.as_secs()
        )),
        other => other,
    })?;
    Ok(replies
        .into_iter()
        .filter_map(|r| match r {
            Reply::FsEvent { op, name } => Some(Event {
                op: op_of(op),
                name,
            }),
            _ => None,
        })
        .collect())
}

/// Removes a detached watcher (nothing to do for an unknown one).
pub async fn remove(processes: &Processes, target: &Target, id: &str) -> Result<(), WatchError> {
    let replies = processes
        .supervisor_call(target, SupRequest::Unwatch { id: id.to_string() })
        .await
        .map_err(process_error)?;
    answer(replies).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supervisor_refusals_become_watch_errors() {
        assert_eq!(
            reply_error(ErrorCode::Denied, "no".into()),
            WatchError::Denied("no".into())
        );
        assert!(matches!(
            reply_error(
                ErrorCode::Invalid,
                "bad request: unknown frame kind 0x28".into()
            ),
            WatchError::Unavailable(m) if m.contains("predates")
        ));
        assert_eq!(
            reply_error(ErrorCode::TooMany, "lost".into()),
            WatchError::TooMany("lost".into())
        );
        match start("/w", true, false) {
            SupRequest::Watch(w) => {
                assert_eq!((w.max_watchers, w.idle_ms), (MAX_WATCHERS, 600_000));
                assert!(w.recursive && !w.follow);
            }
            other => panic!("{other:?}"),
        }
    }
}
