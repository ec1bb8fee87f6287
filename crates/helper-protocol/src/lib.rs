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
//! The helper's one-shot file modes (`read-file`, `write-file`, `list-dir`) answer with the exit
//! codes of [`file_exit`]; the server maps them to API errors.
//!
//! This crate owns the wire format and nothing else: it is used by the server (`src/dataplane/`)
//! and by the helper binary (`helper/`), so it must depend on `std` only, never do I/O, spawn or
//! read the clock, and never panic on input. Its tests are in `tests/protocol.rs`.

use std::fmt;

pub mod supervisor;

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

/// The helper's `relay PORT` mode: one TCP connection to `127.0.0.1:PORT` inside the sandbox,
/// carried over the exec's stdin and stdout. Once connected the helper writes [`relay::CONNECTED`]
/// (one byte) and then copies bytes unchanged until either side ends; when it cannot connect it writes nothing to
/// stdout, a one-line reason to stderr, and exits with [`relay::EXIT_REFUSED`].
pub mod relay {
    /// The byte that says the connection is made.
    pub const CONNECTED: u8 = 0x2b;
    /// Bad arguments (a port outside 1-65535).
    pub const EXIT_USAGE: i32 = 2;
    /// Nothing accepted the connection.
    pub const EXIT_REFUSED: i32 = 4;
}

/// A flag beside the permission bits of a write's mode (`WriteFile`, `write-file`): write into
/// the file itself (created or truncated, then written), as E2B's envd does, instead of into a
/// temporary file renamed over it. Readers may then see part of the new content; a directory
/// watch sees the target created, its mode set and written, rather than a rename. A helper that
/// predates the flag refuses the mode as invalid.
pub const WRITE_IN_PLACE: u32 = 0o100000;

/// Exit codes of the helper's one-shot file modes (`read-file`, `write-file`, `list-dir`, and
/// `WriteFile` on a channel), each with a one-line reason on stderr. 0 is success.
pub mod file_exit {
    /// Any other failure (an I/O error, say).
    pub const OTHER: i32 = 1;
    /// Bad arguments.
    pub const USAGE: i32 = 2;
    /// The path leaves `/workspace`.
    pub const OUTSIDE: i32 = 3;
    /// The path, or a directory on the way, does not exist.
    pub const NOT_FOUND: i32 = 4;
    /// A directory where a file was asked for.
    pub const IS_DIR: i32 = 5;
    /// A non-directory where a directory was needed.
    pub const NOT_DIR: i32 = 6;
    /// The file is larger than the limit given.
    pub const TOO_LARGE: i32 = 7;
    /// Not a regular file (a device, a FIFO, a socket).
    pub const NOT_REGULAR: i32 = 8;
    /// Too many symbolic links.
    pub const LOOP: i32 = 9;
    /// The sandbox user may not access it.
    pub const DENIED: i32 = 10;
}

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
pub(crate) fn encode_frame(
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

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), ProtocolError> {
    if len > MAX_FRAME_LEN {
        return Err(ProtocolError::FrameTooLarge { len });
    }
    put_u32(out, len as u32);
    Ok(())
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) -> Result<(), ProtocolError> {
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
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
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

    pub(crate) fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, ProtocolError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub(crate) fn bool(&mut self) -> Result<bool, ProtocolError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtocolError::InvalidValue("bool must be 0 or 1")),
        }
    }

    pub(crate) fn string(&mut self) -> Result<String, ProtocolError> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ProtocolError::InvalidUtf8),
        }
    }

    /// A list count whose items take at least `min_item` bytes each: rejected when the rest of the
    /// payload could not possibly hold them, so a forged count never causes a large allocation.
    pub(crate) fn count(&mut self, min_item: usize) -> Result<usize, ProtocolError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.buf.len() {
            return Err(ProtocolError::Truncated);
        }
        Ok(n)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn finish(&self) -> Result<(), ProtocolError> {
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

/// What needs the decoder's insides; everything else is tested through the public API in
/// `tests/protocol.rs`.
#[cfg(test)]
mod tests {
    use super::*;

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
}
