//! Wire protocol between the agent-sandbox server (the "host") and `agent-sandbox-helper serve`, the
//! exec helper that runs inside every sandbox.
//!
//! The host starts the helper with `docker exec -i` as the sandbox user and talks to it over the
//! exec's stdin (requests, host → helper) and stdout (events, helper → host). Both directions carry a
//! stream of frames:
//!
//! ```text
//! +----------------------+-----------+-------------------------+
//! | len: u32 big-endian  | kind: u8  | payload: len - 1 bytes  |
//! +----------------------+-----------+-------------------------+
//! ```
//!
//! `len` counts the kind byte and the payload, so it is at least 1 and at most [`MAX_FRAME_LEN`]
//! (1 MiB). A decoder checks `len` as soon as the four length bytes have arrived and fails before
//! buffering anything larger. Inside a payload, integers are big-endian, `bool` is one byte that must
//! be 0 or 1, a string is a `u32` byte length followed by that many UTF-8 bytes, and a list is a `u32`
//! count followed by the items. Output chunks carry their bytes raw, as the rest of the payload. A
//! payload must be consumed exactly: trailing bytes, unknown kinds, bad UTF-8, out-of-range values or
//! short payloads are all errors ([`ProtocolError`]); decoding never panics and never allocates more
//! than the frame it was given.
//!
//! Requests (kind `0x01..=0x7f`): [`Request::Start`] runs a command, [`Request::Kill`] kills one
//! command's whole process tree, [`Request::Shutdown`] kills everything and makes the helper exit.
//! A file write is one more kind of command: [`Request::WriteFile`] opens it (an id, a path, a
//! mode), any number of [`Request::Data`] frames carry the content (each at most
//! [`MAX_CHUNK_LEN`] bytes), and [`Request::End`] commits it. The helper writes each chunk as it
//! arrives, so it holds no more than one frame of content, and answers like the `write-file`
//! mode: its JSON outcome line as `Stdout`, the reason as `Stderr` on failure, then `Exit` with
//! that mode's exit code. `Kill` abandons a write (the temporary file is removed; `Exit` 137).
//! Events (kind `0x81..=0xff`): [`Event::Hello`] once at startup, then per command `Started` (or
//! `Failed`), any number of `Stdout`/`Stderr` chunks (each at most [`MAX_CHUNK_LEN`] bytes, sent as
//! they are read, no line buffering) and exactly one `Exit`, which is always the last frame for that
//! id. Frames of concurrent commands interleave. [`Event::Error`] reports a protocol violation by the
//! host, after which the helper kills every command and exits.
//!
//! Exit codes follow the shell: a normal exit reports its status, a death by signal `128 + signal`
//! (so a `Kill` usually reports 137), a timeout reports [`EXIT_CODE_TIMEOUT`] (137, the SIGKILL
//! status, as the reference server reports its timeouts) with `timed_out: true`, a command that could not be started reports
//! [`EXIT_CODE_NOT_FOUND`] (127) when it does not exist and [`EXIT_CODE_CANNOT_EXECUTE`] (126) for
//! everything else (not executable, workdir missing, fork failed, invalid request); in that case
//! the helper sends `Failed` with the reason, then the same reason as a `Stderr` line, then `Exit`.
//!
//! Process trees: each command runs under its own "shepherd" process, a child subreaper, in a new
//! process group, with stdin from `/dev/null` and exactly the environment of the request. Daemons
//! that `setsid` or double-fork stay under the shepherd. A timeout, a `Kill`, a `Shutdown`, the
//! helper's stdin closing, or a malformed frame kill the process group and then every remaining
//! descendant. When the main process has exited and stdout and stderr have closed, the command is
//! finished: remaining background descendants are killed unless the request set `keep_background`
//! (then they are left running, re-parented to PID 1, like `docker exec` leaves them). A descendant
//! that keeps stdout or stderr open keeps the command running until the timeout, or for at most
//! `linger_ms` after the main process exited (`docker exec` waits 2000 ms); then the helper closes
//! its ends of the pipes and finishes the command without that later output.
//!
//! This file is shared, by `#[path]`, between the helper crate and the server crate: it uses `std`
//! only.
#![allow(dead_code)]

use std::fmt;

/// Version announced in [`Event::Hello`]; bumped on any incompatible change of this file.
pub const PROTOCOL_VERSION: u32 = 2;
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Largest allowed value of the length prefix (kind byte + payload).
pub const MAX_FRAME_LEN: usize = 1 << 20;
/// Largest `Stdout`/`Stderr` chunk the helper sends.
pub const MAX_CHUNK_LEN: usize = 64 * 1024;

/// Exit code reported with `timed_out: true`: the tree was SIGKILLed (the reference server reports
/// 137 for a timeout too).
pub const EXIT_CODE_TIMEOUT: i32 = 128 + 9;
/// Exit code when the command could not be started for another reason than "not found".
pub const EXIT_CODE_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command was not found.
pub const EXIT_CODE_NOT_FOUND: i32 = 127;
/// Exit code when the helper lost track of the command (its shepherd was killed from outside).
pub const EXIT_CODE_LOST: i32 = 128 + 9;
/// `linger_ms` value that behaves like `docker exec`.
pub const DOCKER_LINGER_MS: u64 = 2000;

/// Frame kinds.
pub mod kind {
    pub const START: u8 = 0x01;
    pub const KILL: u8 = 0x02;
    pub const SHUTDOWN: u8 = 0x03;
    pub const WRITE_FILE: u8 = 0x04;
    pub const DATA: u8 = 0x05;
    pub const END: u8 = 0x06;

    pub const HELLO: u8 = 0x81;
    pub const STARTED: u8 = 0x82;
    pub const STDOUT: u8 = 0x83;
    pub const STDERR: u8 = 0x84;
    pub const EXIT: u8 = 0x85;
    pub const FAILED: u8 = 0x86;
    pub const ERROR: u8 = 0x87;
}

/// Run one command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StartRequest {
    /// Chosen by the host; must not be the id of a command that is still running.
    pub id: u64,
    /// Program and arguments; `argv[0]` without a `/` is looked up in the request's `PATH`.
    pub argv: Vec<String>,
    /// The complete environment of the command (nothing is inherited from the helper).
    pub env: Vec<(String, String)>,
    /// Working directory; empty means the helper's own.
    pub workdir: String,
    /// Kill the whole tree after this many milliseconds; 0 = no timeout.
    pub timeout_ms: u64,
    /// After the main process exited, wait at most this long for stdout/stderr to close; 0 = no
    /// limit (until the timeout).
    pub linger_ms: u64,
    /// Leave background descendants running when the command finishes normally.
    pub keep_background: bool,
}

/// Host → helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Start(StartRequest),
    Kill {
        id: u64,
    },
    Shutdown,
    /// Start writing a file (strictly under `/workspace`, like `write-file`) with this mode.
    WriteFile {
        id: u64,
        path: String,
        mode: u32,
    },
    /// The next piece of a write's content (at most [`MAX_CHUNK_LEN`] bytes).
    Data {
        id: u64,
        data: Vec<u8>,
    },
    /// All of a write's content was sent: commit it.
    End {
        id: u64,
    },
}

/// Helper → host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Hello {
        version: u32,
    },
    Started {
        id: u64,
        pid: u32,
    },
    Stdout {
        id: u64,
        data: Vec<u8>,
    },
    Stderr {
        id: u64,
        data: Vec<u8>,
    },
    Exit {
        id: u64,
        exit_code: i32,
        timed_out: bool,
        duration_ms: u64,
    },
    Failed {
        id: u64,
        message: String,
    },
    Error {
        message: String,
    },
}

impl Event {
    /// The command id the event belongs to (`None` for `Hello` and `Error`).
    pub fn id(&self) -> Option<u64> {
        match self {
            Event::Started { id, .. }
            | Event::Stdout { id, .. }
            | Event::Stderr { id, .. }
            | Event::Exit { id, .. }
            | Event::Failed { id, .. } => Some(*id),
            Event::Hello { .. } | Event::Error { .. } => None,
        }
    }
}

/// Why encoding or decoding failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The length prefix (or the frame being encoded) exceeds [`MAX_FRAME_LEN`].
    FrameTooLarge { len: usize },
    /// A length prefix of 0 (no kind byte).
    EmptyFrame,
    /// Unknown kind byte, or a request kind where an event was expected and vice versa.
    UnknownKind(u8),
    /// The payload ended before the message did.
    Truncated,
    /// The payload has bytes after the message.
    TrailingBytes,
    /// A string is not UTF-8.
    InvalidUtf8,
    /// A field holds a value that is not allowed.
    InvalidValue(&'static str),
    /// The stream ended inside a frame.
    UnexpectedEof { buffered: usize },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::FrameTooLarge { len } => {
                write!(
                    f,
                    "frame of {len} bytes exceeds the maximum of {MAX_FRAME_LEN}"
                )
            }
            ProtocolError::EmptyFrame => write!(f, "frame without a kind byte"),
            ProtocolError::UnknownKind(k) => write!(f, "unknown frame kind 0x{k:02x}"),
            ProtocolError::Truncated => write!(f, "frame payload is truncated"),
            ProtocolError::TrailingBytes => write!(f, "frame payload has trailing bytes"),
            ProtocolError::InvalidUtf8 => write!(f, "string is not valid UTF-8"),
            ProtocolError::InvalidValue(what) => write!(f, "invalid value: {what}"),
            ProtocolError::UnexpectedEof { buffered } => {
                write!(f, "stream ended inside a frame ({buffered} bytes buffered)")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

/// Appends one frame to `out`; `out` is left unchanged on error.
fn encode_frame(
    out: &mut Vec<u8>,
    kind: u8,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), ProtocolError>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, kind]);
    if let Err(e) = body(out) {
        out.truncate(start);
        return Err(e);
    }
    let len = out.len() - start - LEN_PREFIX;
    if len > MAX_FRAME_LEN {
        out.truncate(start);
        return Err(ProtocolError::FrameTooLarge { len });
    }
    out[start..start + LEN_PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), ProtocolError> {
    if len > MAX_FRAME_LEN {
        return Err(ProtocolError::FrameTooLarge { len });
    }
    put_u32(out, len as u32);
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) -> Result<(), ProtocolError> {
    put_len(out, s.len())?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Appends a `Stdout` (`stderr == false`) or `Stderr` frame without building an [`Event`].
pub fn encode_output(
    out: &mut Vec<u8>,
    id: u64,
    stderr: bool,
    data: &[u8],
) -> Result<(), ProtocolError> {
    if data.len() > MAX_CHUNK_LEN {
        return Err(ProtocolError::InvalidValue(
            "output chunk larger than MAX_CHUNK_LEN",
        ));
    }
    let k = if stderr { kind::STDERR } else { kind::STDOUT };
    encode_frame(out, k, |out| {
        put_u64(out, id);
        out.extend_from_slice(data);
        Ok(())
    })
}

impl Request {
    /// Appends this request as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self {
            Request::Start(s) => encode_frame(out, kind::START, |out| {
                put_u64(out, s.id);
                put_u64(out, s.timeout_ms);
                put_u64(out, s.linger_ms);
                out.push(u8::from(s.keep_background));
                put_str(out, &s.workdir)?;
                put_len(out, s.argv.len())?;
                for a in &s.argv {
                    put_str(out, a)?;
                }
                put_len(out, s.env.len())?;
                for (k, v) in &s.env {
                    put_str(out, k)?;
                    put_str(out, v)?;
                }
                Ok(())
            }),
            Request::Kill { id } => encode_frame(out, kind::KILL, |out| {
                put_u64(out, *id);
                Ok(())
            }),
            Request::Shutdown => encode_frame(out, kind::SHUTDOWN, |_| Ok(())),
            Request::WriteFile { id, path, mode } => encode_frame(out, kind::WRITE_FILE, |out| {
                put_u64(out, *id);
                put_u32(out, *mode);
                put_str(out, path)
            }),
            Request::Data { id, data } => {
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue(
                        "data chunk larger than MAX_CHUNK_LEN",
                    ));
                }
                encode_frame(out, kind::DATA, |out| {
                    put_u64(out, *id);
                    out.extend_from_slice(data);
                    Ok(())
                })
            }
            Request::End { id } => encode_frame(out, kind::END, |out| {
                put_u64(out, *id);
                Ok(())
            }),
        }
    }

    /// This request as one complete frame.
    pub fn to_frame(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes the kind byte and payload of one frame.
    pub fn decode(kind_byte: u8, payload: &[u8]) -> Result<Request, ProtocolError> {
        let mut r = Reader { buf: payload };
        let req = match kind_byte {
            kind::START => {
                let id = r.u64()?;
                let timeout_ms = r.u64()?;
                let linger_ms = r.u64()?;
                let keep_background = r.bool()?;
                let workdir = r.string()?;
                let n = r.count(4)?;
                let mut argv = Vec::with_capacity(n);
                for _ in 0..n {
                    argv.push(r.string()?);
                }
                let n = r.count(8)?;
                let mut env = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.string()?;
                    let v = r.string()?;
                    env.push((k, v));
                }
                Request::Start(StartRequest {
                    id,
                    argv,
                    env,
                    workdir,
                    timeout_ms,
                    linger_ms,
                    keep_background,
                })
            }
            kind::KILL => Request::Kill { id: r.u64()? },
            kind::SHUTDOWN => Request::Shutdown,
            kind::WRITE_FILE => Request::WriteFile {
                id: r.u64()?,
                mode: r.u32()?,
                path: r.string()?,
            },
            kind::DATA => {
                let id = r.u64()?;
                let data = r.rest();
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue(
                        "data chunk larger than MAX_CHUNK_LEN",
                    ));
                }
                Request::Data {
                    id,
                    data: data.to_vec(),
                }
            }
            kind::END => Request::End { id: r.u64()? },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(req)
    }
}

impl Event {
    /// Appends this event as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self {
            Event::Hello { version } => encode_frame(out, kind::HELLO, |out| {
                put_u32(out, *version);
                Ok(())
            }),
            Event::Started { id, pid } => encode_frame(out, kind::STARTED, |out| {
                put_u64(out, *id);
                put_u32(out, *pid);
                Ok(())
            }),
            Event::Stdout { id, data } => encode_output(out, *id, false, data),
            Event::Stderr { id, data } => encode_output(out, *id, true, data),
            Event::Exit {
                id,
                exit_code,
                timed_out,
                duration_ms,
            } => encode_frame(out, kind::EXIT, |out| {
                put_u64(out, *id);
                out.extend_from_slice(&exit_code.to_be_bytes());
                out.push(u8::from(*timed_out));
                put_u64(out, *duration_ms);
                Ok(())
            }),
            Event::Failed { id, message } => encode_frame(out, kind::FAILED, |out| {
                put_u64(out, *id);
                put_str(out, message)
            }),
            Event::Error { message } => encode_frame(out, kind::ERROR, |out| put_str(out, message)),
        }
    }

    /// This event as one complete frame.
    pub fn to_frame(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes the kind byte and payload of one frame.
    pub fn decode(kind_byte: u8, payload: &[u8]) -> Result<Event, ProtocolError> {
        let mut r = Reader { buf: payload };
        let ev = match kind_byte {
            kind::HELLO => Event::Hello { version: r.u32()? },
            kind::STARTED => Event::Started {
                id: r.u64()?,
                pid: r.u32()?,
            },
            kind::STDOUT | kind::STDERR => {
                let id = r.u64()?;
                let data = r.rest();
                if data.len() > MAX_CHUNK_LEN {
                    return Err(ProtocolError::InvalidValue(
                        "output chunk larger than MAX_CHUNK_LEN",
                    ));
                }
                let data = data.to_vec();
                if kind_byte == kind::STDOUT {
                    Event::Stdout { id, data }
                } else {
                    Event::Stderr { id, data }
                }
            }
            kind::EXIT => Event::Exit {
                id: r.u64()?,
                exit_code: r.i32()?,
                timed_out: r.bool()?,
                duration_ms: r.u64()?,
            },
            kind::FAILED => Event::Failed {
                id: r.u64()?,
                message: r.string()?,
            },
            kind::ERROR => Event::Error {
                message: r.string()?,
            },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(ev)
    }
}

/// Bounds-checked cursor over one payload.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.buf.len() < n {
            return Err(ProtocolError::Truncated);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, ProtocolError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool, ProtocolError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtocolError::InvalidValue("bool must be 0 or 1")),
        }
    }

    fn string(&mut self) -> Result<String, ProtocolError> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ProtocolError::InvalidUtf8),
        }
    }

    /// A list count whose items take at least `min_item` bytes each: rejected when the rest of the
    /// payload could not possibly hold them, so a forged count never causes a large allocation.
    fn count(&mut self, min_item: usize) -> Result<usize, ProtocolError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.buf.len() {
            return Err(ProtocolError::Truncated);
        }
        Ok(n)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    fn finish(&self) -> Result<(), ProtocolError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Incremental decoding
// ---------------------------------------------------------------------------------------------

/// Sans-IO incremental decoder: `feed` it whatever bytes were read (any split), then pop complete
/// frames with [`next_request`](Self::next_request) / [`next_event`](Self::next_event) until they
/// return `Ok(None)`. Works the same from blocking and async code. After the first error the decoder
/// stays failed and returns that error again. At end of stream call [`finish`](Self::finish) to
/// detect a frame cut short.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    pos: usize,
    error: Option<ProtocolError>,
}

impl FrameDecoder {
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends received bytes. Ignored once the decoder has failed.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if self.pos > 0 && (self.pos == self.buf.len() || self.pos >= 64 * 1024) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The error the decoder failed with, if it did.
    pub fn error(&self) -> Option<&ProtocolError> {
        self.error.as_ref()
    }

    /// `Ok` when the stream ended at a frame boundary.
    pub fn finish(&self) -> Result<(), ProtocolError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        match self.buffered() {
            0 => Ok(()),
            buffered => Err(ProtocolError::UnexpectedEof { buffered }),
        }
    }

    fn fail<T>(&mut self, e: ProtocolError) -> Result<T, ProtocolError> {
        self.error = Some(e.clone());
        self.buf = Vec::new();
        self.pos = 0;
        Err(e)
    }

    /// Pops the next complete frame and hands its kind byte and payload to `decode`.
    fn next_with<T>(
        &mut self,
        decode: impl FnOnce(u8, &[u8]) -> Result<T, ProtocolError>,
    ) -> Result<Option<T>, ProtocolError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let avail = &self.buf[self.pos..];
        if avail.len() < LEN_PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        if len == 0 {
            return self.fail(ProtocolError::EmptyFrame);
        }
        if len > MAX_FRAME_LEN {
            return self.fail(ProtocolError::FrameTooLarge { len });
        }
        if avail.len() < LEN_PREFIX + len {
            return Ok(None);
        }
        let frame = &avail[LEN_PREFIX..LEN_PREFIX + len];
        let result = decode(frame[0], &frame[1..]);
        self.pos += LEN_PREFIX + len;
        match result {
            Ok(v) => Ok(Some(v)),
            Err(e) => self.fail(e),
        }
    }

    /// Next complete request, `Ok(None)` when more bytes are needed.
    pub fn next_request(&mut self) -> Result<Option<Request>, ProtocolError> {
        self.next_with(Request::decode)
    }

    /// Next complete event, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<Event>, ProtocolError> {
        self.next_with(Event::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_start() -> StartRequest {
        StartRequest {
            id: 0x0102_0304_0506_0708,
            argv: vec!["/bin/sh".into(), "-c".into(), "echo héllo; exit 3".into()],
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("EMPTY".into(), String::new()),
            ],
            workdir: "/workspace".into(),
            timeout_ms: 60_000,
            linger_ms: DOCKER_LINGER_MS,
            keep_background: true,
        }
    }

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Start(sample_start()),
            Request::Start(StartRequest::default()),
            Request::Kill { id: u64::MAX },
            Request::Shutdown,
            Request::WriteFile {
                id: 9,
                path: "/workspace/é.txt".into(),
                mode: 0o644,
            },
            Request::Data {
                id: 9,
                data: vec![0, 1, 0xff],
            },
            Request::Data {
                id: 9,
                data: Vec::new(),
            },
            Request::End { id: 9 },
        ]
    }

    fn all_events() -> Vec<Event> {
        vec![
            Event::Hello {
                version: PROTOCOL_VERSION,
            },
            Event::Started { id: 7, pid: 4242 },
            Event::Stdout {
                id: 7,
                data: b"out\n".to_vec(),
            },
            Event::Stderr {
                id: 7,
                data: vec![0xff, 0x00, 0xfe],
            },
            Event::Stdout {
                id: 8,
                data: Vec::new(),
            },
            Event::Stdout {
                id: 9,
                data: vec![b'x'; MAX_CHUNK_LEN],
            },
            Event::Exit {
                id: 7,
                exit_code: -1,
                timed_out: true,
                duration_ms: 12345,
            },
            Event::Exit {
                id: 7,
                exit_code: 137,
                timed_out: false,
                duration_ms: 0,
            },
            Event::Failed {
                id: 7,
                message: "nosuch: command not found".into(),
            },
            Event::Error {
                message: "bad frame".into(),
            },
        ]
    }

    fn encode_requests(reqs: &[Request]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in reqs {
            r.encode(&mut out).unwrap();
        }
        out
    }

    fn encode_events(evs: &[Event]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in evs {
            e.encode(&mut out).unwrap();
        }
        out
    }

    fn drain_requests(d: &mut FrameDecoder) -> Result<Vec<Request>, ProtocolError> {
        let mut v = Vec::new();
        while let Some(r) = d.next_request()? {
            v.push(r);
        }
        Ok(v)
    }

    fn drain_events(d: &mut FrameDecoder) -> Result<Vec<Event>, ProtocolError> {
        let mut v = Vec::new();
        while let Some(e) = d.next_event()? {
            v.push(e);
        }
        Ok(v)
    }

    #[test]
    fn request_roundtrip() {
        let reqs = all_requests();
        let bytes = encode_requests(&reqs);
        let mut d = FrameDecoder::new();
        d.feed(&bytes);
        assert_eq!(drain_requests(&mut d).unwrap(), reqs);
        assert_eq!(d.buffered(), 0);
        d.finish().unwrap();
    }

    #[test]
    fn event_roundtrip() {
        let evs = all_events();
        let bytes = encode_events(&evs);
        let mut d = FrameDecoder::new();
        d.feed(&bytes);
        assert_eq!(drain_events(&mut d).unwrap(), evs);
        d.finish().unwrap();
    }

    #[test]
    fn roundtrip_byte_by_byte_and_in_odd_chunks() {
        let evs = all_events();
        let bytes = encode_events(&evs);
        for chunk in [1usize, 2, 3, 5, 7, 4096, 70_000] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for piece in bytes.chunks(chunk) {
                d.feed(piece);
                got.extend(drain_events(&mut d).unwrap());
            }
            assert_eq!(got, evs, "chunk size {chunk}");
            d.finish().unwrap();
        }
        let reqs = all_requests();
        let bytes = encode_requests(&reqs);
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in &bytes {
            d.feed(std::slice::from_ref(b));
            got.extend(drain_requests(&mut d).unwrap());
        }
        assert_eq!(got, reqs);
    }

    #[test]
    fn frame_layout_is_documented_one() {
        let f = Request::Kill { id: 5 }.to_frame().unwrap();
        assert_eq!(f, [0, 0, 0, 9, kind::KILL, 0, 0, 0, 0, 0, 0, 0, 5]);
        let f = Request::Shutdown.to_frame().unwrap();
        assert_eq!(f, [0, 0, 0, 1, kind::SHUTDOWN]);
        let f = Event::Stdout {
            id: 1,
            data: b"hi".to_vec(),
        }
        .to_frame()
        .unwrap();
        assert_eq!(
            f,
            [
                0,
                0,
                0,
                11,
                kind::STDOUT,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                1,
                b'h',
                b'i'
            ]
        );
        let f = Event::Exit {
            id: 2,
            exit_code: -2,
            timed_out: true,
            duration_ms: 3,
        }
        .to_frame()
        .unwrap();
        assert_eq!(
            f,
            [
                0,
                0,
                0,
                22,
                kind::EXIT,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                2,
                0xff,
                0xff,
                0xff,
                0xfe,
                1,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                3
            ]
        );
    }

    #[test]
    fn encode_output_matches_event_encoding() {
        let mut a = Vec::new();
        encode_output(&mut a, 9, true, b"abc").unwrap();
        assert_eq!(
            a,
            Event::Stderr {
                id: 9,
                data: b"abc".to_vec()
            }
            .to_frame()
            .unwrap()
        );
        let mut b = vec![1, 2, 3];
        assert!(encode_output(&mut b, 9, false, &vec![0; MAX_CHUNK_LEN + 1]).is_err());
        assert_eq!(b, [1, 2, 3], "failed encode leaves the buffer unchanged");
    }

    #[test]
    fn oversized_frames_are_refused_by_encoder() {
        let big = "x".repeat(MAX_FRAME_LEN);
        let mut out = vec![42];
        let r = Request::Start(StartRequest {
            argv: vec![big.clone()],
            ..Default::default()
        });
        assert!(matches!(
            r.encode(&mut out),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
        assert_eq!(out, [42]);
        let r = Request::Start(StartRequest {
            env: (0..20)
                .map(|i| (format!("K{i}"), "v".repeat(60_000)))
                .collect(),
            ..Default::default()
        });
        assert!(matches!(
            r.encode(&mut out),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
        assert!(Event::Failed {
            id: 1,
            message: big
        }
        .to_frame()
        .is_err());
        // Just under the limit is fine.
        let fits = "y".repeat(MAX_FRAME_LEN - 1 - 8 - 4);
        let f = Event::Failed {
            id: 1,
            message: fits.clone(),
        }
        .to_frame()
        .unwrap();
        assert_eq!(f.len(), LEN_PREFIX + MAX_FRAME_LEN);
        let mut d = FrameDecoder::new();
        d.feed(&f);
        assert_eq!(
            d.next_event().unwrap(),
            Some(Event::Failed {
                id: 1,
                message: fits
            })
        );
    }

    #[test]
    fn oversized_length_prefix_is_rejected_before_buffering() {
        let mut d = FrameDecoder::new();
        d.feed(&((MAX_FRAME_LEN + 1) as u32).to_be_bytes());
        assert_eq!(
            d.next_request(),
            Err(ProtocolError::FrameTooLarge {
                len: MAX_FRAME_LEN + 1
            })
        );
        // Stays failed, and does not buffer further input.
        d.feed(&[0u8; 1000]);
        assert_eq!(d.buffered(), 0);
        assert!(d.next_request().is_err());
        assert!(d.finish().is_err());

        let mut d = FrameDecoder::new();
        d.feed(&[0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            d.next_event(),
            Err(ProtocolError::FrameTooLarge { .. })
        ));

        let mut d = FrameDecoder::new();
        d.feed(&[0, 0, 0, 0]);
        assert_eq!(d.next_event(), Err(ProtocolError::EmptyFrame));
    }

    #[test]
    fn partial_frames_wait_for_more_and_eof_inside_frame_is_an_error() {
        let frame = Request::Start(sample_start()).to_frame().unwrap();
        for cut in 0..frame.len() {
            let mut d = FrameDecoder::new();
            d.feed(&frame[..cut]);
            assert_eq!(d.next_request(), Ok(None), "cut at {cut}");
            if cut == 0 {
                d.finish().unwrap();
            } else {
                assert_eq!(
                    d.finish(),
                    Err(ProtocolError::UnexpectedEof { buffered: cut })
                );
            }
            d.feed(&frame[cut..]);
            assert_eq!(d.next_request(), Ok(Some(Request::Start(sample_start()))));
        }
    }

    /// Rewrites the length prefix so that a shortened payload is a complete frame.
    fn with_payload(kind_byte: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
        f.push(kind_byte);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn truncated_payloads_are_errors_for_every_message() {
        for r in all_requests() {
            let f = r.to_frame().unwrap();
            // Write data is "the rest of the payload" too: only cuts inside the id are errors.
            let min = match r {
                Request::Data { .. } => LEN_PREFIX + 1 + 8,
                _ => f.len(),
            };
            for cut in LEN_PREFIX + 1..min {
                let g = with_payload(f[LEN_PREFIX], &f[LEN_PREFIX + 1..cut]);
                let mut d = FrameDecoder::new();
                d.feed(&g);
                assert!(d.next_request().is_err(), "{r:?} cut at {cut} decoded");
            }
        }
        for e in all_events() {
            let f = e.to_frame().unwrap();
            // Output chunks are "the rest of the payload": only cuts inside the id are errors.
            let min = match e {
                Event::Stdout { .. } | Event::Stderr { .. } => LEN_PREFIX + 1 + 8,
                _ => f.len(),
            };
            for cut in LEN_PREFIX + 1..min {
                let g = with_payload(f[LEN_PREFIX], &f[LEN_PREFIX + 1..cut]);
                let mut d = FrameDecoder::new();
                d.feed(&g);
                assert!(d.next_event().is_err(), "{e:?} cut at {cut} decoded");
            }
        }
    }

    #[test]
    fn trailing_bytes_are_errors() {
        for r in all_requests() {
            if matches!(r, Request::Data { .. }) {
                continue;
            }
            let f = r.to_frame().unwrap();
            let mut payload = f[LEN_PREFIX + 1..].to_vec();
            payload.push(0);
            let mut d = FrameDecoder::new();
            d.feed(&with_payload(f[LEN_PREFIX], &payload));
            assert_eq!(d.next_request(), Err(ProtocolError::TrailingBytes), "{r:?}");
        }
        let f = Event::Hello { version: 1 }.to_frame().unwrap();
        let mut payload = f[LEN_PREFIX + 1..].to_vec();
        payload.push(0);
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(kind::HELLO, &payload));
        assert_eq!(d.next_event(), Err(ProtocolError::TrailingBytes));
    }

    #[test]
    fn wrong_direction_and_unknown_kinds_are_rejected() {
        let mut d = FrameDecoder::new();
        d.feed(&Event::Hello { version: 1 }.to_frame().unwrap());
        assert_eq!(
            d.next_request(),
            Err(ProtocolError::UnknownKind(kind::HELLO))
        );
        let mut d = FrameDecoder::new();
        d.feed(&Request::Shutdown.to_frame().unwrap());
        assert_eq!(
            d.next_event(),
            Err(ProtocolError::UnknownKind(kind::SHUTDOWN))
        );
        for k in [0u8, 0x07, 0x7f, 0x80, 0x88, 0xff] {
            let mut d = FrameDecoder::new();
            d.feed(&with_payload(k, &[]));
            assert!(d.next_request().is_err());
            let mut d = FrameDecoder::new();
            d.feed(&with_payload(k, &[]));
            assert!(d.next_event().is_err());
        }
    }

    #[test]
    fn invalid_field_values_are_rejected() {
        // bool other than 0/1
        let f = Event::Exit {
            id: 1,
            exit_code: 0,
            timed_out: false,
            duration_ms: 0,
        }
        .to_frame()
        .unwrap();
        let mut bad = f.clone();
        bad[LEN_PREFIX + 1 + 8 + 4] = 2;
        let mut d = FrameDecoder::new();
        d.feed(&bad);
        assert!(matches!(
            d.next_event(),
            Err(ProtocolError::InvalidValue(_))
        ));

        // invalid UTF-8 in a string
        let mut payload = 1u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&2u32.to_be_bytes());
        payload.extend_from_slice(&[0xc3, 0x28]);
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(kind::FAILED, &payload));
        assert_eq!(d.next_event(), Err(ProtocolError::InvalidUtf8));

        // string length pointing past the payload
        let mut payload = 1u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&u32::MAX.to_be_bytes());
        payload.extend_from_slice(b"abc");
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(kind::FAILED, &payload));
        assert_eq!(d.next_event(), Err(ProtocolError::Truncated));

        // huge list count with a tiny payload: rejected without allocating
        let mut payload = Vec::new();
        for _ in 0..3 {
            payload.extend_from_slice(&0u64.to_be_bytes());
        }
        payload.push(0);
        payload.extend_from_slice(&0u32.to_be_bytes()); // workdir ""
        payload.extend_from_slice(&u32::MAX.to_be_bytes()); // argv count
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(kind::START, &payload));
        assert_eq!(d.next_request(), Err(ProtocolError::Truncated));

        // an output chunk above MAX_CHUNK_LEN
        let mut payload = 1u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&vec![0u8; MAX_CHUNK_LEN + 1]);
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(kind::STDOUT, &payload));
        assert!(matches!(
            d.next_event(),
            Err(ProtocolError::InvalidValue(_))
        ));
    }

    #[test]
    fn frames_before_an_error_are_still_returned() {
        let mut bytes = Request::Kill { id: 1 }.to_frame().unwrap();
        bytes.extend_from_slice(&[0, 0, 0, 2, 0x55, 0x55]);
        bytes.extend_from_slice(&Request::Shutdown.to_frame().unwrap());
        let mut d = FrameDecoder::new();
        d.feed(&bytes);
        assert_eq!(d.next_request(), Ok(Some(Request::Kill { id: 1 })));
        assert_eq!(d.next_request(), Err(ProtocolError::UnknownKind(0x55)));
        assert_eq!(d.next_request(), Err(ProtocolError::UnknownKind(0x55)));
        assert!(d.error().is_some());
    }

    /// Small deterministic PRNG (xorshift) so the fuzz test needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let valid = [
            encode_requests(&all_requests()),
            encode_events(&all_events()),
        ]
        .concat();
        for round in 0..3000 {
            let mut bytes: Vec<u8> = if round % 2 == 0 {
                let n = (rng.next() % 300) as usize;
                (0..n).map(|_| rng.next() as u8).collect()
            } else {
                // Valid frames with a few bytes flipped: exercises deep decoding paths.
                let mut v = valid.clone();
                for _ in 0..1 + rng.next() % 4 {
                    let i = (rng.next() as usize) % v.len();
                    v[i] = rng.next() as u8;
                }
                v
            };
            if round % 3 == 0 {
                // Small plausible length prefix so garbage reaches the payload decoders.
                let len = (rng.next() % 64) as u32;
                bytes.splice(0..0, len.to_be_bytes());
            }
            let mut d = FrameDecoder::new();
            let mut e = FrameDecoder::new();
            for piece in bytes.chunks(1 + (rng.next() % 17) as usize) {
                d.feed(piece);
                e.feed(piece);
                while let Ok(Some(_)) = d.next_request() {}
                while let Ok(Some(_)) = e.next_event() {}
            }
            let _ = d.finish();
            let _ = e.finish();
        }
    }

    #[test]
    fn decoder_compacts_its_buffer() {
        let frame = Event::Stdout {
            id: 1,
            data: vec![7; 1000],
        }
        .to_frame()
        .unwrap();
        let mut d = FrameDecoder::new();
        for _ in 0..10_000 {
            d.feed(&frame);
            assert!(d.next_event().unwrap().is_some());
        }
        assert_eq!(d.buffered(), 0);
        assert!(
            d.buf.capacity() < 200_000,
            "buffer grew to {}",
            d.buf.capacity()
        );
    }

    #[test]
    fn event_ids() {
        assert_eq!(Event::Hello { version: 1 }.id(), None);
        assert_eq!(
            Event::Stdout {
                id: 3,
                data: vec![]
            }
            .id(),
            Some(3)
        );
        assert_eq!(
            Event::Exit {
                id: 4,
                exit_code: 0,
                timed_out: false,
                duration_ms: 0
            }
            .id(),
            Some(4)
        );
    }

    #[test]
    fn errors_display() {
        for e in [
            ProtocolError::FrameTooLarge { len: 5 },
            ProtocolError::EmptyFrame,
            ProtocolError::UnknownKind(9),
            ProtocolError::Truncated,
            ProtocolError::TrailingBytes,
            ProtocolError::InvalidUtf8,
            ProtocolError::InvalidValue("x"),
            ProtocolError::UnexpectedEof { buffered: 3 },
        ] {
            assert!(!e.to_string().is_empty());
        }
    }
}
