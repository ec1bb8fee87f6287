//! The data plane against Docker: exec sessions (attached, with stdin when asked) and the
//! archive API, both streamed — nothing here buffers a whole output or archive — plus the
//! archive-based workspace ownership described in the parent module.

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};

use super::{map_err, plan::WORKSPACE, tarball};
use crate::docker::{EngineError, EngineResult, ExecOutput, ExecPlan, ExecSession, ExecState};

fn exec_output(
    item: Result<LogOutput, BollardError>,
    op: &str,
) -> Option<EngineResult<ExecOutput>> {
    match item {
        Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
            Some(Ok(ExecOutput::Stdout(message)))
        }
        Ok(LogOutput::StdErr { message }) => Some(Ok(ExecOutput::Stderr(message))),
        Ok(LogOutput::StdIn { .. }) => None,
        Err(e) => Some(Err(map_err("read exec output", op)(e))),
    }
}

pub async fn exec(
    docker: &bollard::Docker,
    container: &str,
    plan: &ExecPlan,
) -> EngineResult<ExecSession> {
    let what = format!("container {container}");
    let config = ExecConfig {
        attach_stdin: Some(plan.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(plan.env.clone()),
        cmd: Some(plan.argv.clone()),
        privileged: Some(false),
        user: (!plan.user.is_empty()).then(|| plan.user.clone()),
        working_dir: plan.workdir.clone(),
        ..Default::default()
    };
    let created = docker
        .create_exec(container, config)
        .await
        .map_err(map_err("exec in", &what))?;
    let started = docker
        .start_exec(&created.id, Some(StartExecOptions::default()))
        .await
        .map_err(map_err("start exec in", &what))?;
    match started {
        StartExecResults::Attached { output, input } => {
            let op = format!("exec {}", created.id);
            let output = output
                .filter_map(move |item| std::future::ready(exec_output(item, &op)))
                .boxed();
            Ok(ExecSession {
                exec_id: created.id,
                output,
                input: plan.stdin.then_some(input),
            })
        }
        StartExecResults::Detached => Err(EngineError::Docker {
            operation: format!("start exec in {what}"),
            message: "docker did not attach".into(),
        }),
    }
}

pub async fn inspect_exec(docker: &bollard::Docker, exec_id: &str) -> EngineResult<ExecState> {
    let inspected = docker
        .inspect_exec(exec_id)
        .await
        .map_err(map_err("inspect", &format!("exec {exec_id}")))?;
    Ok(ExecState {
        running: inspected.running.unwrap_or(false),
        exit_code: inspected.exit_code,
        pid: inspected.pid.unwrap_or(0),
    })
}

pub async fn archive_get(
    docker: &bollard::Docker,
    container: &str,
    path: &str,
) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>> {
    let what = format!("{path} in container {container}");
    let options = DownloadFromContainerOptions { path: path.into() };
    let mut body = docker
        .download_from_container(container, Some(options))
        .boxed();
    let map = map_err("read", &what);
    // Docker answers 404 before the first byte: surface it here rather than mid-stream.
    match body.next().await {
        None => Ok(stream::empty().boxed()),
        Some(Err(e)) => Err(map(e)),
        Some(Ok(first)) => Ok(stream::once(async move { Ok(first) })
            .chain(body.map(move |chunk| chunk.map_err(&map)))
            .boxed()),
    }
}

pub async fn archive_put(
    docker: &bollard::Docker,
    container: &str,
    path: &str,
    tar: BoxStream<'static, Bytes>,
) -> EngineResult<()> {
    let options = UploadToContainerOptions {
        path: path.into(),
        ..Default::default()
    };
    docker
        .upload_to_container(container, Some(options), bollard::body_stream(tar))
        .await
        .map_err(map_err(
            "write",
            &format!("{path} in container {container}"),
        ))
}

pub async fn prepare_workspace(
    docker: &bollard::Docker,
    container: &str,
    uid: u32,
    gid: u32,
) -> EngineResult<()> {
    let tar = tarball::root_dir(uid, gid, 0o755).map_err(|e| EngineError::Docker {
        operation: "pack workspace owner".into(),
        message: e.to_string(),
    })?;
    let options = UploadToContainerOptions {
        path: WORKSPACE.into(),
        ..Default::default()
    };
    docker
        .upload_to_container(container, Some(options), bollard::body_full(tar.into()))
        .await
        .map_err(map_err(
            "prepare workspace of",
            &format!("container {container}"),
        ))
}
