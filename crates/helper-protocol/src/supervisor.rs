//! Wire format between the server and the in-sandbox process supervisor (`agent-sandbox-helper
//! supervise`, the container's main process), which owns a sandbox's long-lived processes.
//!
//! The server reaches the supervisor through `agent-sandbox-helper bridge`, a `docker exec` that
//! relays its stdin and stdout to the supervisor's Unix socket; the bytes are the supervisor's
//! own. Frames are those of the crate root (length, kind, payload; same limits and encodings),
//! with their own kinds: requests `0x20..=0x2f`, replies `0xa0..=0xaf`. On one connection the
//! client sends requests one at a time; the supervisor answers each with zero or more
//! [`Reply::Process`], [`Reply::Chunk`] or [`Reply::Truncated`] frames and then exactly one final
//! frame: [`Reply::Ok`], [`Reply::Error`], [`Reply::Exit`] or [`Reply::Running`]. A start or a get
//! answers one `Process` then `Ok`; a list, one `Process` per process then `Ok`. An output
//! request with `follow` keeps streaming chunks as they are captured and ends only with `Exit`
//! (the process really ended) or when the connection closes. A start with `follow` answers its
//! `Process` and then, in place of `Ok`, what an output request with `follow` from offset 0
//! would: a client that starts and reads a command saves a round trip. Version 2 added that
//! `follow`, as one byte at the end of a start's payload written only when it is set: a start
//! without it is version 1's, which a version 1 supervisor (in a container an older server made)
//! still takes; a client sends `follow` only to a supervisor that said version 2.
//!
//! Offsets are absolute byte positions in a stream since the process started.
//!
//! Directory watches (inotify, in the supervisor) use the same connections. A [`SupRequest::Watch`]
//! with `follow` is a stream: one [`Reply::Watcher`], then [`Reply::FsEvent`] frames as changes
//! happen, ending only with an `Error` (events lost to overflow, the directory removed, a limit
//! reached) or when the connection closes, which removes the watch. Without `follow` it makes a
//! detached watcher that queues its events (answered `Watcher` then `Ok`): [`SupRequest::WatchEvents`]
//! takes what is queued (`FsEvent` frames, then `Ok`, or an `Error` once it has failed), and
//! [`SupRequest::Unwatch`] removes it; one not asked for its events for `idle_ms` is removed too.
//!
//! Like the crate root, this module never does I/O and never panics on input.

use crate::{
    encode_frame, put_len, put_str, put_u32, put_u64, FrameDecoder, ProtocolError, Reader,
    MAX_CHUNK_LEN,
};

/// Version announced by `bridge` before relaying (one `u32`, big-endian, raw, no frame).
pub const SUPERVISOR_VERSION: u32 = 2;
/// The oldest supervisor version a client can talk to: version 1 lacks only a start's `follow`.
pub const MIN_SUPERVISOR_VERSION: u32 = 1;

pub mod kind {
    pub const START: u8 = 0x20;
    pub const LIST: u8 = 0x21;
    pub const GET: u8 = 0x22;
    pub const OUTPUT: u8 = 0x23;
    pub const STDIN: u8 = 0x24;
    pub const SIGNAL: u8 = 0x25;
    pub const RESIZE: u8 = 0x26;
    pub const DELETE: u8 = 0x27;
    pub const WATCH: u8 = 0x28;
    pub const WATCH_EVENTS: u8 = 0x29;
    pub const UNWATCH: u8 = 0x2a;

    pub const PROCESS: u8 = 0xa0;
    pub const CHUNK: u8 = 0xa1;
    pub const TRUNCATED: u8 = 0xa2;
    pub const OK: u8 = 0xa3;
    pub const ERROR: u8 = 0xa4;
    pub const EXIT: u8 = 0xa5;
    pub const RUNNING: u8 = 0xa6;
    pub const WATCHER: u8 = 0xa7;
    pub const FS_EVENT: u8 = 0xa8;
}

/// Watch a directory (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchStart {
    /// An absolute path.
    pub path: String,
    /// Also every directory below it, as they appear.
    pub recursive: bool,
    /// Stream the events on this connection (removed when it closes); otherwise a detached
    /// watcher whose events are taken with [`SupRequest::WatchEvents`].
    pub follow: bool,
    /// Refuse with [`ErrorCode::TooMany`] when this many watchers exist in the sandbox.
    pub max_watchers: u32,
    /// The most directories one watcher watches; beyond, it fails with `TooMany`.
    pub max_dirs: u32,
    /// The most events queued unread; beyond, it fails with `TooMany` (events were lost).
    pub max_queued: u32,
    /// A detached watcher not asked for its events for this long is removed; 0 = never.
    pub idle_ms: u64,
}

/// What happened to an entry (inotify's events, as E2B names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsOp {
    Create = 1,
    Write = 2,
    Remove = 3,
    Rename = 4,
    Chmod = 5,
}

impl FsOp {
    fn from_u8(v: u8) -> Option<FsOp> {
        Some(match v {
            1 => FsOp::Create,
            2 => FsOp::Write,
            3 => FsOp::Remove,
            4 => FsOp::Rename,
            5 => FsOp::Chmod,
            _ => return None,
        })
    }
}

/// Start one long-lived process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcStart {
    /// The command string as the client gave it (empty when it gave an argv); only reported back.
    pub command: String,
    pub argv: Vec<String>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub tty: bool,
    /// Keep stdin open (a pipe, or the terminal for a tty); otherwise it reads as empty.
    pub stdin: bool,
    pub cols: u16,
    pub rows: u16,
    /// Kill the tree after this many milliseconds; 0 = never.
    pub timeout_ms: u64,
    /// Bytes retained per stream (at least 4096).
    pub retain_bytes: u64,
    /// Refuse with [`ErrorCode::TooMany`] when this many are already running.
    pub max_running: u32,
    /// Stream the process's output after its `Process` answer, as an output request with
    /// `follow` from offset 0 would, instead of answering `Ok` (version 2).
    pub follow: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupRequest {
    Start(ProcStart),
    List,
    Get {
        id: String,
    },
    Output {
        id: String,
        stdout_from: u64,
        stderr_from: u64,
        follow: bool,
    },
    /// Write `data` (at most [`MAX_CHUNK_LEN`]) to stdin, then close it when `close`.
    Stdin {
        id: String,
        close: bool,
        data: Vec<u8>,
    },
    Signal {
        id: String,
        signal: u32,
    },
    Resize {
        id: String,
        cols: u16,
        rows: u16,
    },
    /// Kill the whole tree, wait for it, forget the process.
    Delete {
        id: String,
    },
    Watch(WatchStart),
    /// The events a detached watcher queued since it was last asked.
    WatchEvents {
        id: String,
    },
    /// Remove a detached watcher (`Ok` when there is none by that id too).
    Unwatch {
        id: String,
    },
}

/// What the supervisor knows about one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcInfo {
    pub id: String,
    pub pid: u32,
    pub command: String,
    pub argv: Vec<String>,
    pub tty: bool,
    /// Started with stdin kept open and not closed since.
    pub stdin_open: bool,
    pub running: bool,
    /// Set once it exited normally.
    pub exit_code: Option<i32>,
    /// Set once a signal ended it (a number).
    pub signal: Option<u32>,
    /// Unix milliseconds.
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    NotFound = 1,
    /// Not possible in the process's state (stdin closed or never opened, not a tty, exited).
    Conflict = 2,
    TooMany = 3,
    Invalid = 4,
    Internal = 5,
    /// The sandbox user may not do it (a directory it cannot read).
    Denied = 6,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Process(ProcInfo),
    /// `stream` 1 = stdout, 2 = stderr.
    Chunk {
        stream: u8,
        offset: u64,
        data: Vec<u8>,
    },
    Truncated {
        stream: u8,
        requested: u64,
        retained_from: u64,
    },
    Ok,
    Error {
        code: ErrorCode,
        message: String,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<u32>,
        finished_at_ms: u64,
    },
    Running {
        stdout_offset: u64,
        stderr_offset: u64,
    },
    /// A watch began (its id, `w_` + 16 hex digits).
    Watcher {
        id: String,
    },
    /// `name` is the entry's path relative to the watched directory.
    FsEvent {
        op: FsOp,
        name: String,
    },
}

impl Reply {
    /// Whether this reply ends the answer to a request.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Reply::Process(_)
                | Reply::Chunk { .. }
                | Reply::Truncated { .. }
                | Reply::Watcher { .. }
                | Reply::FsEvent { .. }
        )
    }
}

fn put_opt_i32(out: &mut Vec<u8>, v: Option<i32>) {
    out.push(u8::from(v.is_some()));
    out.extend_from_slice(&v.unwrap_or(0).to_be_bytes());
}

fn put_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    out.push(u8::from(v.is_some()));
    put_u64(out, v.unwrap_or(0));
}

fn put_list(out: &mut Vec<u8>, items: &[String]) -> Result<(), ProtocolError> {
    put_len(out, items.len())?;
    for a in items {
        put_str(out, a)?;
    }
    Ok(())
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

impl Reader<'_> {
    fn u16(&mut self) -> Result<u16, ProtocolError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }

    fn opt_i32(&mut self) -> Result<Option<i32>, ProtocolError> {
        let some = self.bool()?;
        let v = self.i32()?;
        Ok(some.then_some(v))
    }

    fn opt_u64(&mut self) -> Result<Option<u64>, ProtocolError> {
        let some = self.bool()?;
        let v = self.u64()?;
        Ok(some.then_some(v))
    }

    fn list(&mut self) -> Result<Vec<String>, ProtocolError> {
        let n = self.count(4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.string()?);
        }
        Ok(v)
    }

    fn stream(&mut self) -> Result<u8, ProtocolError> {
        match self.u8()? {
            s @ (1 | 2) => Ok(s),
            _ => Err(ProtocolError::InvalidValue("stream must be 1 or 2")),
        }
    }
}

impl SupRequest {
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self {
            SupRequest::Start(s) => encode_frame(out, kind::START, |out| {
                put_str(out, &s.command)?;
                put_list(out, &s.argv)?;
                put_len(out, s.env.len())?;
                for (k, v) in &s.env {
                    put_str(out, k)?;
                    put_str(out, v)?;
                }
                put_str(out, &s.workdir)?;
                out.push(u8::from(s.tty));
                out.push(u8::from(s.stdin));
                put_u16(out, s.cols);
                put_u16(out, s.rows);
                put_u64(out, s.timeout_ms);
                put_u64(out, s.retain_bytes);
                put_u32(out, s.max_running);
                if s.follow {
                    out.push(1);
                }
                Ok(())
            }),
            SupRequest::List => encode_frame(out, kind::LIST, |_| Ok(())),
            SupRequest::Get { id } => encode_frame(out, kind::GET, |out| put_str(out, id)),
            SupRequest::Output {
                id,
                stdout_from,
                stderr_from,
                follow,
            } => encode_frame(out, kind::OUTPUT, |out| {
                put_str(out, id)?;
                put_u64(out, *stdout_from);
                put_u64(out, *stderr_from);
                out.push(u8::from(*follow));
                Ok(())
            }),
            SupRequest::Stdin { id, close, data } => {
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue("stdin chunk too large"));
                }
                encode_frame(out, kind::STDIN, |out| {
                    put_str(out, id)?;
                    out.push(u8::from(*close));
                    out.extend_from_slice(data);
                    Ok(())
                })
            }
            SupRequest::Signal { id, signal } => encode_frame(out, kind::SIGNAL, |out| {
                put_str(out, id)?;
                put_u32(out, *signal);
                Ok(())
            }),
            SupRequest::Resize { id, cols, rows } => encode_frame(out, kind::RESIZE, |out| {
                put_str(out, id)?;
                put_u16(out, *cols);
                put_u16(out, *rows);
                Ok(())
            }),
            SupRequest::Delete { id } => encode_frame(out, kind::DELETE, |out| put_str(out, id)),
            SupRequest::Watch(w) => encode_frame(out, kind::WATCH, |out| {
                put_str(out, &w.path)?;
                out.push(u8::from(w.recursive));
                out.push(u8::from(w.follow));
                put_u32(out, w.max_watchers);
                put_u32(out, w.max_dirs);
                put_u32(out, w.max_queued);
                put_u64(out, w.idle_ms);
                Ok(())
            }),
            SupRequest::WatchEvents { id } => {
                encode_frame(out, kind::WATCH_EVENTS, |out| put_str(out, id))
            }
            SupRequest::Unwatch { id } => encode_frame(out, kind::UNWATCH, |out| put_str(out, id)),
        }
    }

    pub fn to_frame(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    pub fn decode(kind_byte: u8, payload: &[u8]) -> Result<SupRequest, ProtocolError> {
        let mut r = Reader { buf: payload };
        let req = match kind_byte {
            kind::START => {
                let command = r.string()?;
                let argv = r.list()?;
                let n = r.count(8)?;
                let mut env = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.string()?;
                    let v = r.string()?;
                    env.push((k, v));
                }
                SupRequest::Start(ProcStart {
                    command,
                    argv,
                    env,
                    workdir: r.string()?,
                    tty: r.bool()?,
                    stdin: r.bool()?,
                    cols: r.u16()?,
                    rows: r.u16()?,
                    timeout_ms: r.u64()?,
                    retain_bytes: r.u64()?,
                    max_running: r.u32()?,
                    // Absent in version 1's start, and in version 2's without it.
                    follow: match r.rest() {
                        [] => false,
                        [1] => true,
                        _ => return Err(ProtocolError::InvalidValue("follow must be 1 or absent")),
                    },
                })
            }
            kind::LIST => SupRequest::List,
            kind::GET => SupRequest::Get { id: r.string()? },
            kind::OUTPUT => SupRequest::Output {
                id: r.string()?,
                stdout_from: r.u64()?,
                stderr_from: r.u64()?,
                follow: r.bool()?,
            },
            kind::STDIN => {
                let id = r.string()?;
                let close = r.bool()?;
                let data = r.rest();
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue("stdin chunk too large"));
                }
                SupRequest::Stdin {
                    id,
                    close,
                    data: data.to_vec(),
                }
            }
            kind::SIGNAL => SupRequest::Signal {
                id: r.string()?,
                signal: r.u32()?,
            },
            kind::RESIZE => SupRequest::Resize {
                id: r.string()?,
                cols: r.u16()?,
                rows: r.u16()?,
            },
            kind::DELETE => SupRequest::Delete { id: r.string()? },
            kind::WATCH => SupRequest::Watch(WatchStart {
                path: r.string()?,
                recursive: r.bool()?,
                follow: r.bool()?,
                max_watchers: r.u32()?,
                max_dirs: r.u32()?,
                max_queued: r.u32()?,
                idle_ms: r.u64()?,
            }),
            kind::WATCH_EVENTS => SupRequest::WatchEvents { id: r.string()? },
            kind::UNWATCH => SupRequest::Unwatch { id: r.string()? },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(req)
    }
}

impl Reply {
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self {
            Reply::Process(p) => encode_frame(out, kind::PROCESS, |out| {
                put_str(out, &p.id)?;
                put_u32(out, p.pid);
                put_str(out, &p.command)?;
                put_list(out, &p.argv)?;
                out.push(u8::from(p.tty));
                out.push(u8::from(p.stdin_open));
                out.push(u8::from(p.running));
                put_opt_i32(out, p.exit_code);
                put_opt_u64(out, p.signal.map(u64::from));
                put_u64(out, p.started_at_ms);
                put_opt_u64(out, p.finished_at_ms);
                put_u64(out, p.stdout_bytes);
                put_u64(out, p.stderr_bytes);
                Ok(())
            }),
            Reply::Chunk {
                stream,
                offset,
                data,
            } => {
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue("output chunk too large"));
                }
                encode_frame(out, kind::CHUNK, |out| {
                    out.push(*stream);
                    put_u64(out, *offset);
                    out.extend_from_slice(data);
                    Ok(())
                })
            }
            Reply::Truncated {
                stream,
                requested,
                retained_from,
            } => encode_frame(out, kind::TRUNCATED, |out| {
                out.push(*stream);
                put_u64(out, *requested);
                put_u64(out, *retained_from);
                Ok(())
            }),
            Reply::Ok => encode_frame(out, kind::OK, |_| Ok(())),
            Reply::Error { code, message } => encode_frame(out, kind::ERROR, |out| {
                out.push(*code as u8);
                put_str(out, message)
            }),
            Reply::Exit {
                exit_code,
                signal,
                finished_at_ms,
            } => encode_frame(out, kind::EXIT, |out| {
                put_opt_i32(out, *exit_code);
                put_opt_u64(out, signal.map(u64::from));
                put_u64(out, *finished_at_ms);
                Ok(())
            }),
            Reply::Running {
                stdout_offset,
                stderr_offset,
            } => encode_frame(out, kind::RUNNING, |out| {
                put_u64(out, *stdout_offset);
                put_u64(out, *stderr_offset);
                Ok(())
            }),
            Reply::Watcher { id } => encode_frame(out, kind::WATCHER, |out| put_str(out, id)),
            Reply::FsEvent { op, name } => encode_frame(out, kind::FS_EVENT, |out| {
                out.push(*op as u8);
                put_str(out, name)
            }),
        }
    }

    pub fn to_frame(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    pub fn decode(kind_byte: u8, payload: &[u8]) -> Result<Reply, ProtocolError> {
        let mut r = Reader { buf: payload };
        let signal = |r: &mut Reader| -> Result<Option<u32>, ProtocolError> {
            match r.opt_u64()? {
                None => Ok(None),
                Some(s) => u32::try_from(s)
                    .map(Some)
                    .map_err(|_| ProtocolError::InvalidValue("signal out of range")),
            }
        };
        let reply = match kind_byte {
            kind::PROCESS => Reply::Process(ProcInfo {
                id: r.string()?,
                pid: r.u32()?,
                command: r.string()?,
                argv: r.list()?,
                tty: r.bool()?,
                stdin_open: r.bool()?,
                running: r.bool()?,
                exit_code: r.opt_i32()?,
                signal: signal(&mut r)?,
                started_at_ms: r.u64()?,
                finished_at_ms: r.opt_u64()?,
                stdout_bytes: r.u64()?,
                stderr_bytes: r.u64()?,
            }),
            kind::CHUNK => {
                let stream = r.stream()?;
                let offset = r.u64()?;
                let data = r.rest();
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue("output chunk too large"));
                }
                Reply::Chunk {
                    stream,
                    offset,
                    data: data.to_vec(),
                }
            }
            kind::TRUNCATED => Reply::Truncated {
                stream: r.stream()?,
                requested: r.u64()?,
                retained_from: r.u64()?,
            },
            kind::OK => Reply::Ok,
            kind::ERROR => {
                let code = match r.u8()? {
                    1 => ErrorCode::NotFound,
                    2 => ErrorCode::Conflict,
                    3 => ErrorCode::TooMany,
                    4 => ErrorCode::Invalid,
                    5 => ErrorCode::Internal,
                    6 => ErrorCode::Denied,
                    _ => return Err(ProtocolError::InvalidValue("unknown error code")),
                };
                Reply::Error {
                    code,
                    message: r.string()?,
                }
            }
            kind::EXIT => Reply::Exit {
                exit_code: r.opt_i32()?,
                signal: signal(&mut r)?,
                finished_at_ms: r.u64()?,
            },
            kind::RUNNING => Reply::Running {
                stdout_offset: r.u64()?,
                stderr_offset: r.u64()?,
            },
            kind::WATCHER => Reply::Watcher { id: r.string()? },
            kind::FS_EVENT => Reply::FsEvent {
                op: FsOp::from_u8(r.u8()?)
                    .ok_or(ProtocolError::InvalidValue("unknown filesystem event"))?,
                name: r.string()?,
            },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(reply)
    }
}

impl FrameDecoder {
    /// Next complete supervisor request, `Ok(None)` when more bytes are needed.
    pub fn next_sup_request(&mut self) -> Result<Option<SupRequest>, ProtocolError> {
        self.next_with(SupRequest::decode)
    }

    /// Next complete supervisor reply, `Ok(None)` when more bytes are needed.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, ProtocolError> {
        self.next_with(Reply::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let reqs = [
            SupRequest::Start(ProcStart {
                command: "echo hi".into(),
                argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
                env: vec![("A".into(), "b".into())],
                workdir: "/workspace".into(),
                tty: true,
                stdin: true,
                cols: 80,
                rows: 24,
                timeout_ms: 5,
                retain_bytes: 1 << 23,
                max_running: 64,
                follow: true,
            }),
            SupRequest::List,
            SupRequest::Output {
                id: "p_1".into(),
                stdout_from: 3,
                stderr_from: 4,
                follow: true,
            },
            SupRequest::Stdin {
                id: "p_1".into(),
                close: true,
                data: b"x\xff".to_vec(),
            },
            SupRequest::Resize {
                id: "p".into(),
                cols: 1,
                rows: 2,
            },
            SupRequest::Watch(WatchStart {
                path: "/workspace/d".into(),
                recursive: true,
                follow: false,
                max_watchers: 16,
                max_dirs: 4096,
                max_queued: 1 << 16,
                idle_ms: 600_000,
            }),
            SupRequest::WatchEvents { id: "w_1".into() },
            SupRequest::Unwatch { id: "w_1".into() },
        ];
        for q in reqs {
            let f = q.to_frame().unwrap();
            let mut d = FrameDecoder::new();
            d.feed(&f);
            assert_eq!(d.next_sup_request().unwrap(), Some(q));
        }
        let replies = [
            Reply::Process(ProcInfo {
                id: "p_1".into(),
                signal: Some(9),
                finished_at_ms: Some(7),
                ..Default::default()
            }),
            Reply::Chunk {
                stream: 2,
                offset: 1 << 40,
                data: vec![0, 255],
            },
            Reply::Error {
                code: ErrorCode::TooMany,
                message: "m".into(),
            },
            Reply::Exit {
                exit_code: Some(3),
                signal: None,
                finished_at_ms: 9,
            },
            Reply::Watcher { id: "w_1".into() },
            Reply::FsEvent {
                op: FsOp::Rename,
                name: "sub/a b".into(),
            },
            Reply::Error {
                code: ErrorCode::Denied,
                message: "no".into(),
            },
        ];
        for r in replies {
            let f = r.to_frame().unwrap();
            let mut d = FrameDecoder::new();
            d.feed(&f);
            assert_eq!(d.next_reply().unwrap(), Some(r));
        }
    }

    #[test]
    fn bad_stream_and_trailing_bytes_are_refused() {
        let mut f = Reply::Chunk {
            stream: 1,
            offset: 0,
            data: vec![],
        }
        .to_frame()
        .unwrap();
        f[5] = 3;
        let mut d = FrameDecoder::new();
        d.feed(&f);
        assert!(d.next_reply().is_err());
        let mut f = SupRequest::List.to_frame().unwrap();
        f.push(0);
        f[3] += 1;
        let mut d = FrameDecoder::new();
        d.feed(&f);
        assert_eq!(d.next_sup_request(), Err(ProtocolError::TrailingBytes));
    }

    /// A start without `follow` is byte for byte version 1's (which ends with `max_running`), so
    /// a version 1 supervisor takes it; `follow` is one byte more, and nothing else may follow.
    #[test]
    fn a_start_without_follow_is_version_ones() {
        let start = |follow| {
            SupRequest::Start(ProcStart {
                argv: vec!["true".into()],
                max_running: 0x0102_0304,
                follow,
                ..Default::default()
            })
        };
        let plain = start(false).to_frame().unwrap();
        assert_eq!(&plain[plain.len() - 4..], &[1, 2, 3, 4]);
        let following = start(true).to_frame().unwrap();
        assert_eq!(following.len(), plain.len() + 1);
        assert_eq!(following[following.len() - 1], 1);
        for (frame, request) in [(&plain, start(false)), (&following, start(true))] {
            let mut d = FrameDecoder::new();
            d.feed(frame);
            assert_eq!(d.next_sup_request(), Ok(Some(request)));
        }
        for extra in [&[0u8][..], &[2], &[1, 1]] {
            let mut f = plain.clone();
            f.extend_from_slice(extra);
            let len = u32::from_be_bytes([f[0], f[1], f[2], f[3]]) + extra.len() as u32;
            f[..4].copy_from_slice(&len.to_be_bytes());
            let mut d = FrameDecoder::new();
            d.feed(&f);
            assert!(d.next_sup_request().is_err(), "{extra:?} after a start");
        }
    }

    #[test]
    fn watch_frames_have_their_layout_and_bad_ones_are_refused() {
        let f = Reply::FsEvent {
            op: FsOp::Write,
            name: "a".into(),
        }
        .to_frame()
        .unwrap();
        // Length 7: the kind, the op, the name's 4-byte length and the name.
        assert_eq!(&f[..4], &7u32.to_be_bytes());
        assert_eq!(f[4], kind::FS_EVENT);
        assert_eq!(f[5], 2);
        assert!(!Reply::FsEvent {
            op: FsOp::Write,
            name: "a".into()
        }
        .is_final());
        assert!(!Reply::Watcher { id: "w".into() }.is_final());
        // An unknown event type is refused, as is a watch request cut short.
        let mut bad = f.clone();
        bad[5] = 9;
        let mut d = FrameDecoder::new();
        d.feed(&bad);
        assert!(d.next_reply().is_err());
        let mut w = SupRequest::Watch(WatchStart::default()).to_frame().unwrap();
        w.pop();
        w[3] -= 1;
        let mut d = FrameDecoder::new();
        d.feed(&w);
        assert!(d.next_sup_request().is_err());
    }

    #[test]
    fn garbage_watch_frames_never_panic() {
        let valid = [
            SupRequest::Watch(WatchStart {
                path: "/x".into(),
                ..WatchStart::default()
            })
            .to_frame()
            .unwrap(),
            SupRequest::WatchEvents { id: "w".into() }
                .to_frame()
                .unwrap(),
            Reply::FsEvent {
                op: FsOp::Chmod,
                name: "n".into(),
            }
            .to_frame()
            .unwrap(),
        ]
        .concat();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut v = valid.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % v.len();
                v[i] = (x >> 32) as u8;
            }
            let mut d = FrameDecoder::new();
            d.feed(&v);
            while let Ok(Some(_)) = d.next_sup_request() {}
            let mut d = FrameDecoder::new();
            d.feed(&v);
            while let Ok(Some(_)) = d.next_reply() {}
        }
    }
}
