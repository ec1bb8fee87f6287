//! Interactive sessions with a sandbox's processes, with kubectl's habits: `exec -i`/`-t` (start
//! and attach in one, on the WebSocket exec route) and `attach NAME ID`. Local stdin goes to the
//! process (channel 0; its end closes the process's stdin), output comes back on channels 1 and
//! 2, a terminal's size follows SIGWINCH (channel 4), and the exit status the process really had
//! (channel 3) becomes ours: its exit code, or 128 + the signal that ended it, as a shell says.
//! The frames are Kubernetes' `v5.channel.k8s.io`; the socket comes from [`Client::websocket`].
//!
//! This file frames and relays; the local terminal's modes are `terminal.rs`.

use std::io::{Read, Write};
use std::process::ExitCode;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::client::{ClientError, WebSocket};
use super::CliError;
use crate::processes::signal_name;

pub const PROTOCOL: &str = "v5.channel.k8s.io";
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Docker's detach keys, Ctrl-P then Ctrl-Q: leave an attached terminal, the process running.
const CTRL_P: u8 = 0x10;
const CTRL_Q: u8 = 0x11;

/// How a session treats the local side.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Send our stdin to the process (and close its stdin at our end of input).
    pub stdin: bool,
    /// Our terminal is in raw mode: send its size now and on every SIGWINCH.
    pub terminal: bool,
    /// Ctrl-P Ctrl-Q detaches (an attach to a terminal), leaving the process running.
    pub detach_keys: bool,
}

enum Input {
    Data(Vec<u8>),
    Detach,
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(channel);
    m.extend_from_slice(data);
    Message::Binary(m.into())
}

fn resize_frame(cols: u16, rows: u16) -> Message {
    frame(
        RESIZE,
        serde_json::json!({"Width": cols, "Height": rows})
            .to_string()
            .as_bytes(),
    )
}

/// Splits out the detach sequence; a lone Ctrl-P is held until the next key decides.
#[derive(Default)]
struct DetachKeys {
    held: bool,
}

impl DetachKeys {
    /// The bytes to send, and whether the sequence was typed (what follows it is dropped).
    fn scan(&mut self, chunk: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(chunk.len() + 1);
        for &b in chunk {
            if self.held {
                self.held = false;
                if b == CTRL_Q {
                    return (out, true);
                }
                out.push(CTRL_P);
            }
            if b == CTRL_P {
                self.held = true;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

/// Reads our stdin on a thread of its own (a blocking read cannot be cancelled, and must not
/// hold up the end of the program); the channel closes at end of input.
fn read_stdin(detach_keys: bool) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut keys = DetachKeys::default();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let (data, detach) = if detach_keys {
                keys.scan(&buf[..n])
            } else {
                (buf[..n].to_vec(), false)
            };
            if !data.is_empty() && tx.blocking_send(Input::Data(data)).is_err() {
                return;
            }
            if detach {
                let _ = tx.blocking_send(Input::Detach);
                return;
            }
        }
    });
    rx
}

/// The signal number of a name as the server reports it (`KILL`, `TERM`, `SIG42`).
fn signal_number(name: &str) -> Option<u8> {
    (1..=64u8).find(|n| signal_name(u32::from(*n)) == name)
}

/// Our exit status from the process's final status: its code, or 128 + the signal.
pub fn exit_status(status: &Value) -> Result<u8, CliError> {
    if let Some(code) = status["exitCode"].as_i64() {
        return Ok(u8::try_from(code).unwrap_or(255));
    }
    if let Some(n) = status["signal"].as_str().and_then(signal_number) {
        return Ok(128u8.saturating_add(n));
    }
    if status["status"] == "Success" {
        return Ok(0);
    }
    Err(CliError::Failed(
        status["message"]
            .as_str()
            .unwrap_or("the process's status is unknown")
            .to_string(),
    ))
}

async fn next_input(input: &mut Option<mpsc::Receiver<Input>>) -> Option<Input> {
    match input {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_signal(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

fn signal_stream(kind: SignalKind) -> Result<Signal, CliError> {
    signal(kind).map_err(|e| CliError::Failed(format!("cannot watch signals: {e}")))
}

fn broken(e: impl std::fmt::Display) -> CliError {
    CliError::Client(ClientError::Protocol(format!("the connection broke: {e}")))
}

/// Relays between our terminal or pipes and the process until it ends (its exit status is
/// ours), we detach (0), or we are told to stop by SIGTERM or SIGHUP (128 + the signal; the
/// process keeps running).
pub async fn run(socket: WebSocket, options: Options) -> Result<ExitCode, CliError> {
    let (mut tx, mut rx) = socket.split();
    let mut input = options.stdin.then(|| read_stdin(options.detach_keys));
    let mut winch = if options.terminal {
        if let Some((cols, rows)) = super::terminal::size() {
            tx.send(resize_frame(cols, rows)).await.map_err(broken)?;
        }
        Some(signal_stream(SignalKind::window_change())?)
    } else {
        None
    };
    let mut term = Some(signal_stream(SignalKind::terminate())?);
    let mut hup = Some(signal_stream(SignalKind::hangup())?);
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        tokio::select! {
            msg = rx.next() => {
                let data = match msg {
                    Some(Ok(Message::Binary(data))) => data,
                    Some(Ok(Message::Close(_))) | None => {
                        return Err(CliError::Failed(
                            "the connection ended before the process's exit status arrived".into(),
                        ))
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(broken(e)),
                };
                // A closed terminal or pipe is the reader's choice; the status still counts.
                match data.split_first() {
                    Some((&STDOUT, d)) => {
                        let _ = stdout.write_all(d).and_then(|_| stdout.flush());
                    }
                    Some((&STDERR, d)) => {
                        let _ = stderr.write_all(d).and_then(|_| stderr.flush());
                    }
                    Some((&STATUS, d)) => {
                        let status: Value = serde_json::from_slice(d).map_err(|e| {
                            CliError::Client(ClientError::Protocol(format!(
                                "the status message is not JSON: {e}"
                            )))
                        })?;
                        let _ = tx.send(Message::Close(None)).await;
                        return exit_status(&status).map(ExitCode::from);
                    }
                    _ => {}
                }
            }
            data = next_input(&mut input) => match data {
                Some(Input::Data(d)) => tx.send(frame(STDIN, &d)).await.map_err(broken)?,
                Some(Input::Detach) => {
                    let _ = tx.send(Message::Close(None)).await;
                    return Ok(ExitCode::SUCCESS);
                }
                None => {
                    input = None;
                    tx.send(frame(CLOSE, &[STDIN])).await.map_err(broken)?;
                }
            },
            _ = next_signal(&mut winch) => {
                if let Some((cols, rows)) = super::terminal::size() {
                    tx.send(resize_frame(cols, rows)).await.map_err(broken)?;
                }
            }
            _ = next_signal(&mut term) => {
                let _ = tx.send(Message::Close(None)).await;
                return Ok(ExitCode::from(128 + libc::SIGTERM as u8));
            }
            _ = next_signal(&mut hup) => {
                let _ = tx.send(Message::Close(None)).await;
                return Ok(ExitCode::from(128 + libc::SIGHUP as u8));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exit_statuses_follow_the_shell() {
        let code = |v: Value| exit_status(&v).ok();
        assert_eq!(code(json!({"status": "Success", "exitCode": 0})), Some(0));
        assert_eq!(code(json!({"status": "Failure", "exitCode": 3})), Some(3));
        assert_eq!(
            code(json!({"status": "Failure", "exitCode": 300})),
            Some(255)
        );
        assert_eq!(
            code(json!({"status": "Failure", "signal": "KILL"})),
            Some(137)
        );
        assert_eq!(
            code(json!({"status": "Failure", "signal": "TERM"})),
            Some(143)
        );
        assert_eq!(
            code(json!({"status": "Failure", "reason": "Lost", "message": "gone"})),
            None
        );
    }

    #[test]
    fn ctrl_p_ctrl_q_detaches_and_a_lone_ctrl_p_passes_on() {
        let mut keys = DetachKeys::default();
        assert_eq!(keys.scan(b"ab"), (b"ab".to_vec(), false));
        assert_eq!(keys.scan(&[b'x', CTRL_P]), (b"x".to_vec(), false));
        assert_eq!(keys.scan(b"y"), (vec![CTRL_P, b'y'], false));
        assert_eq!(keys.scan(&[CTRL_P, CTRL_P]), (vec![CTRL_P], false));
        assert_eq!(keys.scan(&[CTRL_Q, b'z']), (vec![], true));
    }
}
