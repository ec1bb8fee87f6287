//! `Processes` against a supervisor played by the test on an in-memory bridge: the requests it
//! gets, in the version it said.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use helper_protocol::supervisor::{ProcInfo, Reply, SupRequest};
use helper_protocol::FrameDecoder;
use tokio::io::AsyncReadExt;

use super::bridge::Bridge;
use super::{OutputEvent, Processes, StartSpec, Stream, Target};
use crate::config::Settings;
use crate::docker::fake::FakeEngine;
use crate::docker::ExecOutput;

const CONTAINER: &str = "c0ffee";

fn target() -> Target {
    Target {
        name: "s".into(),
        uid: "u".into(),
        container_id: CONTAINER.into(),
        env: BTreeMap::new(),
    }
}

fn info() -> ProcInfo {
    ProcInfo {
        id: "p_1".into(),
        pid: 42,
        command: String::new(),
        argv: vec!["true".into()],
        tty: false,
        stdin_open: false,
        running: true,
        exit_code: None,
        signal: None,
        started_at_ms: 1,
        finished_at_ms: None,
        stdout_bytes: 0,
        stderr_bytes: 0,
    }
}

/// Processes whose pool holds one bridge to a supervisor of `version`, played by a task that
/// answers each request it reads with what `answer` says; the requests it read come back on
/// the returned channel.
fn with_supervisor(
    version: u32,
    answer: fn(&SupRequest) -> Vec<Reply>,
) -> (Processes, tokio::sync::mpsc::UnboundedReceiver<SupRequest>) {
    let (replies, output) = futures::channel::mpsc::unbounded::<Bytes>();
    let (input, mut requests) = tokio::io::duplex(1 << 16);
    let (seen, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut decoder = FrameDecoder::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            while let Ok(Some(req)) = decoder.next_sup_request() {
                for reply in answer(&req) {
                    let _ = replies.unbounded_send(Bytes::from(reply.to_frame().unwrap()));
                }
                let _ = seen.send(req);
            }
            match requests.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => decoder.feed(&buf[..n]),
            }
        }
    });
    let output = output.map(|b| Ok(ExecOutput::Stdout(b))).boxed();
    let bridge = Bridge::over(output, Box::pin(input), version);
    let settings = Arc::new(Settings::for_tests(std::env::temp_dir()));
    let processes = Processes::new(Arc::new(FakeEngine::new()), settings);
    super::give_back(&processes.pool, CONTAINER, bridge);
    (processes, heard)
}

fn spec() -> StartSpec {
    StartSpec {
        command: None,
        argv: vec!["true".into()],
        env: BTreeMap::new(),
        workdir: None,
        tty: false,
        stdin: false,
        cols: 80,
        rows: 24,
        timeout_seconds: None,
    }
}

fn output_to_exit() -> Vec<Reply> {
    vec![
        Reply::Chunk {
            stream: 1,
            offset: 0,
            data: b"hi\n".to_vec(),
        },
        Reply::Exit {
            exit_code: Some(0),
            signal: None,
            finished_at_ms: 2,
        },
    ]
}

/// What the stream of a started process carries: its stdout, and whether it ended with exit 0.
async fn read_to_end(
    mut output: futures::stream::BoxStream<'static, OutputEvent>,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    while let Some(event) = output.next().await {
        match event {
            OutputEvent::Data {
                stream: Stream::Stdout,
                data,
                ..
            } => out.extend_from_slice(&data),
            OutputEvent::Exit { exit_code, .. } => return (out, exit_code == Some(0)),
            _ => {}
        }
    }
    (out, false)
}

#[tokio::test]
async fn a_version_two_supervisor_starts_and_streams_on_one_request() {
    let (processes, mut heard) = with_supervisor(2, |req| match req {
        SupRequest::Start(s) if s.follow => {
            let mut all = vec![Reply::Process(info())];
            all.extend(output_to_exit());
            all
        }
        _ => vec![Reply::Error {
            code: helper_protocol::supervisor::ErrorCode::Invalid,
            message: format!("unexpected {req:?}"),
        }],
    });
    let (p, output) = processes.start_following(&target(), spec()).await.unwrap();
    assert_eq!((p.id.as_str(), p.pid), ("p_1", 42));
    assert_eq!(read_to_end(output).await, (b"hi\n".to_vec(), true));
    assert!(matches!(heard.recv().await, Some(SupRequest::Start(s)) if s.follow));
    assert!(heard.try_recv().is_err(), "one request");
}

/// A container an older server made runs a version 1 supervisor, which knows no `follow`: it
/// gets version 1's start (no `follow` byte) and then an output request, as before.
#[tokio::test]
async fn a_version_one_supervisor_is_asked_to_start_then_for_the_output() {
    let (processes, mut heard) = with_supervisor(1, |req| match req {
        SupRequest::Start(s) if !s.follow => vec![Reply::Process(info()), Reply::Ok],
        SupRequest::Output { follow: true, .. } => output_to_exit(),
        _ => vec![Reply::Error {
            code: helper_protocol::supervisor::ErrorCode::Invalid,
            message: format!("unexpected {req:?}"),
        }],
    });
    let (p, output) = processes.start_following(&target(), spec()).await.unwrap();
    assert_eq!(p.id, "p_1");
    assert_eq!(read_to_end(output).await, (b"hi\n".to_vec(), true));
    assert!(matches!(heard.recv().await, Some(SupRequest::Start(s)) if !s.follow));
    assert!(matches!(
        heard.recv().await,
        Some(SupRequest::Output { id, stdout_from: 0, stderr_from: 0, follow: true }) if id == "p_1"
    ));
}
