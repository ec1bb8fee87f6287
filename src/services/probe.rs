//! Readiness checks of a running service: an HTTP GET or a TCP connection to `127.0.0.1:PORT`
//! inside the sandbox (through the helper's relay, so they work with no network), or a command
//! that must exit 0 (a `docker exec` of its own, which no process list shows).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use super::{lock, Shared};
use crate::docker::ExecPlan;
use crate::processes::Target;
use crate::resource::{Readiness, ServiceSpec, ServiceStatus};

/// How often a service not ready yet since its start is checked, at most.
const UNTIL_FIRST_READY: Duration = Duration::from_secs(1);

/// Runs the service's readiness check for as long as it runs (never returns); a service with
/// no check is ready once it runs.
pub(super) async fn keep_checking(
    shared: &Arc<Shared>,
    target: &Target,
    spec: &ServiceSpec,
    status: &Arc<Mutex<ServiceStatus>>,
    _process: &str,
) {
    let Some(readiness) = &spec.readiness else {
        return std::future::pending().await;
    };
    tokio::time::sleep(spec.initial_delay()).await;
    let period = spec.period();
    let timeout = period.min(Duration::from_secs(10));
    let mut ready_once = false;
    loop {
        let result = tokio::time::timeout(timeout, check(shared, target, spec, readiness)).await;
        let (ready, message) = match result {
            Ok(Ok(())) => (true, String::new()),
            Ok(Err(why)) => (false, format!("readiness check failed: {why}")),
            Err(_) => (
                false,
                format!(
                    "readiness check failed: no answer within {} s",
                    timeout.as_secs()
                ),
            ),
        };
        ready_once |= ready;
        let changed = {
            let mut s = lock(status);
            let before = (s.ready, s.message.clone());
            s.ready = ready;
            s.message = message;
            before != (s.ready, s.message.clone())
        };
        if changed {
            (shared.changed)(&target.name);
        }
        let wait = if ready_once {
            period
        } else {
            period.min(UNTIL_FIRST_READY)
        };
        tokio::time::sleep(wait).await;
    }
}

async fn check(
    shared: &Shared,
    target: &Target,
    spec: &ServiceSpec,
    readiness: &Readiness,
) -> Result<(), String> {
    if let Some(http) = &readiness.http_get {
        let path = http.path.as_deref().unwrap_or("/");
        return http_get(shared, &target.container_id, http.port, path).await;
    }
    if let Some(tcp) = &readiness.tcp_socket {
        let user = &shared.settings.sandbox_user;
        crate::ports::Tunnel::relay(&shared.engine, &target.container_id, user, tcp.port)
            .await
            .map(drop)
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    if let Some(exec) = &readiness.exec {
        return run(shared, target, spec, &exec.command).await;
    }
    Ok(())
}

async fn http_get(shared: &Shared, container: &str, port: u16, path: &str) -> Result<(), String> {
    let user = &shared.settings.sandbox_user;
    let tunnel = crate::ports::Tunnel::relay(&shared.engine, container, user, port)
        .await
        .map_err(|e| e.to_string())?;
    let mut sender = crate::ports::proxy::handshake(tunnel, port)
        .await
        .map_err(|e| e.to_string())?;
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
        .header(hyper::header::USER_AGENT, "agent-sandbox-readiness")
        .header(hyper::header::CONNECTION, "close")
        .body(axum::body::Body::empty())
        .map_err(|e| e.to_string())?;
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let code = answer.status().as_u16();
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("GET {path} on port {port} answered {code}"))
    }
}

/// Runs `command` as the sandbox user with the service's environment; Ok when it exits 0.
async fn run(
    shared: &Shared,
    target: &Target,
    spec: &ServiceSpec,
    command: &str,
) -> Result<(), String> {
    let mut env = std::collections::BTreeMap::from([
        (
            "HOME".to_string(),
            crate::processes::DEFAULT_WORKDIR.to_string(),
        ),
        (
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
    ]);
    env.extend(target.env.clone());
    env.extend(spec.env.clone());
    let plan = ExecPlan {
        argv: vec!["/bin/sh".into(), "-c".into(), command.to_string()],
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        workdir: Some(
            spec.workdir
                .clone()
                .unwrap_or_else(|| crate::processes::DEFAULT_WORKDIR.to_string()),
        ),
        user: shared.settings.sandbox_user.clone(),
        stdin: false,
    };
    let session = shared
        .engine
        .exec(&target.container_id, &plan)
        .await
        .map_err(|e| e.to_string())?;
    // Its output is not kept; reading it lets the command finish.
    let mut output = session.output;
    while let Some(chunk) = output.next().await {
        chunk.map_err(|e| e.to_string())?;
    }
    let state = shared
        .engine
        .inspect_exec(&session.exec_id)
        .await
        .map_err(|e| e.to_string())?;
    match state.exit_code {
        Some(0) => Ok(()),
        Some(code) => Err(format!("{command:?} exited with {code}")),
        None => Err(format!("{command:?} did not say how it ended")),
    }
}
