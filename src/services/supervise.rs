//! One service's task: start it (or adopt the process it already runs as), wait for its exit,
//! start it again per its restart policy after a delay that doubles from 1 s to 60 s (the first
//! restart is immediate, and a run longer than the cap starts the count over), and run its
//! readiness check while it runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{lock, probe, Shared};
use crate::processes::{OutputEvent, ProcessError, StartSpec, State, Target};
use crate::resource::{RestartPolicy, ServiceSpec, ServiceState, ServiceStatus};

/// The longest wait before a restart; a run at least this long resets the delays.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a stopped service has between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The delay before restart number `n` (0-based) of a crash loop: 0, 1 s, 2 s, 4 s, … 60 s.
pub fn backoff(n: u32) -> Duration {
    match n {
        0 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 1).min(6)).min(MAX_BACKOFF),
    }
}

pub(super) fn starting(name: &str, restarts: u64) -> ServiceStatus {
    ServiceStatus {
        name: name.to_string(),
        state: ServiceState::Starting,
        ready: false,
        restarts,
        last_exit_code: None,
        last_exit_at: None,
        process_id: None,
        message: String::new(),
    }
}

pub(super) struct Job {
    pub shared: Arc<Shared>,
    pub target: Target,
    pub spec: ServiceSpec,
    pub status: Arc<Mutex<ServiceStatus>>,
    /// The process of the service's previous spec, stopped before this one starts.
    pub replacing: Option<String>,
    /// A process the service may already run as (from its recorded status).
    pub adopt: Option<String>,
}

impl Job {
    fn update(&self, f: impl FnOnce(&mut ServiceStatus)) {
        let changed = {
            let mut status = lock(&self.status);
            let before = status.clone();
            f(&mut status);
            *status != before
        };
        if changed {
            (self.shared.changed)(&self.target.name);
        }
    }
}

/// How one run of the service ended.
enum Ended {
    Exit {
        code: Option<i32>,
        at: chrono::DateTime<chrono::Utc>,
    },
    /// The container went away (or the process was deleted by hand and cannot be followed).
    Lost,
}

pub(super) async fn run(mut job: Job) {
    if let Some(old) = job.replacing.take() {
        stop(&job.shared, &job.target, &old).await;
    }
    let mut crashes: u32 = 0;
    let mut adopt = job.adopt.take();
    loop {
        let began = Instant::now();
        let id = match adopt.take() {
            Some(id) => match job.shared.processes.get(&job.target, &id).await {
                Ok(p) if p.state == State::Running => Some(id),
                Ok(p) if p.state == State::Exited => {
                    // It ended while nobody watched: judged like any exit below.
                    job.update(|s| s.process_id = Some(id.clone()));
                    let code = code_of(p.exit_code, p.signal.as_deref());
                    let at = p.finished_at.unwrap_or_else(chrono::Utc::now);
                    if !after_exit(&mut job, code, at, &mut crashes, began).await {
                        return;
                    }
                    continue;
                }
                _ => None,
            },
            None => None,
        };
        let id = match id {
            Some(id) => id,
            None => match start(&job).await {
                Ok(id) => id,
                Err(why) => {
                    // The sandbox cannot take it now (a command that cannot run still starts,
                    // and ends with 127): try again after the next delay.
                    let delay = backoff(crashes.max(1));
                    crashes = crashes.saturating_add(1);
                    job.update(|s| {
                        s.state = ServiceState::BackOff;
                        s.ready = false;
                        s.message = format!("cannot start: {why}");
                    });
                    tokio::time::sleep(delay).await;
                    continue;
                }
            },
        };
        let checked = job.spec.readiness.is_some();
        job.update(|s| {
            s.state = ServiceState::Running;
            s.process_id = Some(id.clone());
            s.ready = !checked;
            s.message.clear();
        });
        let ended = tokio::select! {
            ended = wait_for_exit(&job, &id) => ended,
            _ = probe::keep_checking(&job.shared, &job.target, &job.spec, &job.status, &id) => Ended::Lost,
        };
        match ended {
            Ended::Exit { code, at } => {
                if !after_exit(&mut job, code, at, &mut crashes, began).await {
                    return;
                }
            }
            Ended::Lost => {
                job.update(|s| {
                    s.ready = false;
                    s.message = "its process was lost with the container".into();
                });
                return;
            }
        }
    }
}

/// Records an exit and waits out the delay before the next start; false when the policy says
/// the service stays down.
async fn after_exit(
    job: &mut Job,
    code: Option<i32>,
    at: chrono::DateTime<chrono::Utc>,
    crashes: &mut u32,
    began: Instant,
) -> bool {
    let again = match job.spec.restart_policy() {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != Some(0),
        RestartPolicy::Never => false,
    };
    if began.elapsed() >= MAX_BACKOFF {
        *crashes = 0;
    }
    let delay = backoff(*crashes);
    job.update(|s| {
        s.last_exit_code = code;
        s.last_exit_at = Some(at);
        s.ready = false;
        s.state = if !again {
            ServiceState::Exited
        } else if delay.is_zero() {
            ServiceState::Starting
        } else {
            ServiceState::BackOff
        };
        s.message = if again && !delay.is_zero() {
            format!("exited; starting again in {} s", delay.as_secs())
        } else {
            String::new()
        };
    });
    if !again {
        return false;
    }
    tokio::time::sleep(delay).await;
    *crashes = crashes.saturating_add(1);
    job.update(|s| {
        s.restarts += 1;
        s.state = ServiceState::Starting;
        s.message.clear();
    });
    true
}

async fn start(job: &Job) -> Result<String, ProcessError> {
    let spec = StartSpec {
        command: job.spec.command.clone(),
        argv: match &job.spec.command {
            Some(command) => vec!["/bin/sh".into(), "-c".into(), command.clone()],
            None => job.spec.argv.clone(),
        },
        env: job.spec.env.clone(),
        workdir: job.spec.workdir.clone(),
        tty: false,
        stdin: false,
        cols: 80,
        rows: 24,
        timeout_seconds: None,
    };
    let p = job.shared.processes.start(&job.target, spec).await?;
    Ok(p.id)
}

/// Follows the process's output from past its end, so that nothing but its exit comes.
async fn wait_for_exit(job: &Job, id: &str) -> Ended {
    let stream = job
        .shared
        .processes
        .output(&job.target, id, u64::MAX, u64::MAX, true)
        .await;
    let mut stream = match stream {
        Ok(s) => s,
        // Deleted by hand: it no longer runs, so it ended; when is now.
        Err(ProcessError::NotFound(_)) => {
            return Ended::Exit {
                code: None,
                at: chrono::Utc::now(),
            }
        }
        Err(_) => return Ended::Lost,
    };
    while let Some(event) = stream.next().await {
        if let OutputEvent::Exit {
            exit_code,
            signal,
            finished_at,
        } = event
        {
            return Ended::Exit {
                code: code_of(exit_code, signal.as_deref()),
                at: finished_at,
            };
        }
    }
    // The stream broke off: the container went away, or the process was deleted by hand
    // (which only the latter survives to say).
    match job.shared.processes.get(&job.target, id).await {
        Err(ProcessError::NotFound(_)) => Ended::Exit {
            code: None,
            at: chrono::Utc::now(),
        },
        Ok(p) if p.state == State::Exited => Ended::Exit {
            code: code_of(p.exit_code, p.signal.as_deref()),
            at: p.finished_at.unwrap_or_else(chrono::Utc::now),
        },
        _ => Ended::Lost,
    }
}

/// An exit as a shell reports it: the code, or 128 + the number of the signal that ended it.
fn code_of(exit_code: Option<i32>, signal: Option<&str>) -> Option<i32> {
    exit_code.or_else(|| {
        let signal = signal?;
        let n = crate::processes::SIGNALS
            .iter()
            .find(|(name, _)| *name == signal)
            .map(|(_, n)| *n)
            .or_else(|| signal.strip_prefix("SIG")?.parse().ok())
            .unwrap_or(libc::SIGKILL);
        Some(128 + n)
    })
}

/// Stops a service's process: SIGTERM to its group, SIGKILL to its tree after a grace period.
/// It stays listed (with its output) once it ended by the TERM.
pub(super) async fn stop(shared: &Shared, target: &Target, id: &str) {
    // One that already ended is left as it is, with its output.
    match shared.processes.get(target, id).await {
        Ok(p) if p.state == State::Running => {}
        _ => return,
    }
    let term = shared
        .processes
        .signal(target, id, libc::SIGTERM)
        .await
        .is_ok();
    if term {
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            match shared.processes.get(target, id).await {
                Ok(p) if p.state == State::Running => {}
                _ => return,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if let Err(error) = shared.processes.delete(target, id).await {
        tracing::debug!(sandbox = %target.name, process = id, %error, "stopping a service");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_from_one_second_to_the_cap() {
        let delays: Vec<u64> = (0..10).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
