//! The TCP ports something listens on inside a sandbox: for runc asked of the kernel from this
//! host, without entering the container (its socket diagnostics, or its `/proc/net/tcp` and
//! `tcp6` where those are missing); otherwise read from those files by the helper's
//! `read-file`, two short `docker exec`s; never in a frozen one, so a client can find
//! the dev server an agent started. Read only while someone reads the sandbox: every
//! [`REFRESH`] for [`KEEP`] after the last time somebody asked, never for sandboxes nobody looks
//! at.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{lock, Running, Shared};
use crate::docker::{is_gvisor, ExecOutput, ExecPlan, HELPER_BINARY, HELPER_MOUNT};
use crate::ports::{listening_ports, read_net_table};

/// How often the ports of a sandbox someone reads are read again.
const REFRESH: Duration = Duration::from_secs(3);
/// How long after the last read of a sandbox its ports are kept fresh.
const KEEP: Duration = Duration::from_secs(30);
/// The most of one of those files read (a line is 150 bytes; thousands of sockets fit).
const MAX_BYTES: usize = 4 << 20;

/// The state `0A` of `/proc/net/tcp`: listening.
const LISTEN: &str = "0A";

/// The listening ports of a `/proc/net/tcp` or `/proc/net/tcp6` text, ascending.
pub fn parse_proc_net_tcp(text: &str) -> BTreeSet<u16> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let (_, port) = local.rsplit_once(':')?;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

struct Watched {
    container_id: String,
    asked: Instant,
    ports: Option<Vec<u16>>,
}

pub(super) struct Listening {
    shared: Arc<Shared>,
    watched: Arc<Mutex<HashMap<String, Watched>>>,
}

impl Listening {
    pub(super) fn new(shared: Arc<Shared>) -> Listening {
        Listening {
            shared,
            watched: Arc::default(),
        }
    }

    pub(super) fn interest(&self, sandbox: &Running) {
        let mut watched = lock(&self.watched);
        if let Some(w) = watched.get_mut(&sandbox.name) {
            if w.container_id == sandbox.container_id {
                w.asked = Instant::now();
                return;
            }
        }
        watched.insert(
            sandbox.name.clone(),
            Watched {
                container_id: sandbox.container_id.clone(),
                asked: Instant::now(),
                ports: None,
            },
        );
        let (shared, all) = (Arc::clone(&self.shared), Arc::clone(&self.watched));
        let (name, container) = (sandbox.name.clone(), sandbox.container_id.clone());
        tokio::spawn(async move { refresh(shared, all, name, container).await });
    }

    pub(super) fn ports(&self, name: &str, container_id: &str) -> Option<Vec<u16>> {
        let watched = lock(&self.watched);
        let w = watched.get(name)?;
        (w.container_id == container_id).then(|| w.ports.clone())?
    }

    pub(super) fn forget(&self, name: &str) {
        lock(&self.watched).remove(name);
    }
}

/// Reads the ports of one sandbox's container while someone asks; ends when nobody did for
/// [`KEEP`], or when the sandbox was forgotten or got another container.
async fn refresh(
    shared: Arc<Shared>,
    all: Arc<Mutex<HashMap<String, Watched>>>,
    name: String,
    container: String,
) {
    loop {
        let read = read_ports(&shared, &container).await;
        {
            let mut all = lock(&all);
            let Some(w) = all.get_mut(&name).filter(|w| w.container_id == container) else {
                return;
            };
            if w.asked.elapsed() > KEEP {
                all.remove(&name);
                return;
            }
            match read {
                Ok(ports) if w.ports.as_ref() != Some(&ports) => {
                    w.ports = Some(ports);
                    drop(all);
                    (shared.changed)(&name);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(sandbox = %name, %error, "cannot read listening ports")
                }
            }
        }
        tokio::time::sleep(REFRESH).await;
    }
}

async fn read_ports(shared: &Shared, container: &str) -> Result<Vec<u16>, String> {
    let details = shared
        .engine
        .inspect_container(container)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the container is gone")?;
    // An exec into a frozen container waits, holding Docker's lock on it, until it is thawed.
    if !details.running || details.paused {
        return Err("the container is not running".into());
    }
    if details.runtime.as_deref().is_some_and(|r| !is_gvisor(r)) {
        // runc: the namespace's sockets can be asked for from this host, no exec needed; the
        // kernel's socket diagnostics first, the socket tables' text where those are missing.
        let (pid, id) = (details.pid, details.id.clone());
        let host = tokio::task::spawn_blocking(move || {
            match listening_ports(pid, &id) {
                Ok(ports) => return Ok(ports),
                Err(error) => tracing::debug!(%error, "no socket diagnostics, reading /proc"),
            }
            let v4 = read_net_table(pid, &id, "tcp", MAX_BYTES)?;
            let mut ports = parse_proc_net_tcp(&v4);
            let v6 = read_net_table(pid, &id, "tcp6", MAX_BYTES).unwrap_or_default();
            ports.extend(parse_proc_net_tcp(&v6));
            Ok::<_, crate::ports::DirectError>(ports)
        })
        .await;
        if let Ok(Ok(ports)) = host {
            return Ok(ports.into_iter().collect());
        }
    }
    let (v4, v6) = tokio::join!(
        read(shared, container, "/proc/net/tcp"),
        read(shared, container, "/proc/net/tcp6")
    );
    let mut ports = parse_proc_net_tcp(&v4?);
    // A kernel without IPv6 has no tcp6.
    ports.extend(parse_proc_net_tcp(&v6.unwrap_or_default()));
    Ok(ports.into_iter().collect())
}

async fn read(shared: &Shared, container: &str, path: &str) -> Result<String, String> {
    let plan = ExecPlan {
        argv: vec![
            format!("{HELPER_MOUNT}/{HELPER_BINARY}"),
            "read-file".into(),
            path.into(),
            MAX_BYTES.to_string(),
        ],
        env: Vec::new(),
        workdir: None,
        user: shared.settings.sandbox_user.clone(),
        stdin: false,
    };
    let session = shared
        .engine
        .exec(container, &plan)
        .await
        .map_err(|e| e.to_string())?;
    let mut output = session.output;
    let mut text = Vec::new();
    let mut errors = Vec::new();
    while let Some(chunk) = output.next().await {
        match chunk.map_err(|e| e.to_string())? {
            ExecOutput::Stdout(b) if text.len() < MAX_BYTES => text.extend_from_slice(&b),
            ExecOutput::Stdout(_) => {}
            ExecOutput::Stderr(b) if errors.len() < 512 => errors.extend_from_slice(&b),
            ExecOutput::Stderr(_) => {}
        }
    }
    let state = shared
        .engine
        .inspect_exec(&session.exec_id)
        .await
        .map_err(|e| e.to_string())?;
    if state.exit_code != Some(0) {
        return Err(format!(
            "reading {path} failed: {}",
            String::from_utf8_lossy(&errors).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listening_sockets_count() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:1F40 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 100 0 0 10 0\n\
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0\n";
        assert_eq!(
            parse_proc_net_tcp(text).into_iter().collect::<Vec<_>>(),
            [22, 8000]
        );
        let v6 = "  sl  local_address                         remote_address                        st\n\
   0: 00000000000000000000000001000000:1538 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(
            parse_proc_net_tcp(v6).into_iter().collect::<Vec<_>>(),
            [5432]
        );
        assert!(parse_proc_net_tcp("").is_empty());
        assert!(parse_proc_net_tcp("header\ngarbage line\n").is_empty());
    }
}
