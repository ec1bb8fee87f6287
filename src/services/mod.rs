//! Declared services (`spec.services`): keeping each one running as a process of its sandbox,
//! started again per its restart policy with a growing delay, and checked for readiness; and the
//! TCP ports something listens on inside a sandbox (`listening.rs`).
//!
//! Design: the controller says which services a sandbox's current container should run
//! ([`Services::ensure`], level-triggered, cheap when nothing changed) and reads what they do
//! ([`Services::observe`]) into `status.services`; it says when to stop looking after a sandbox
//! ([`Services::release`]). Each service has one task (`supervise.rs`) that starts it through
//! [`Processes`] (so `logs` and `attach` work on it), waits for its exit on an output stream that
//! carries nothing but the exit, and starts it again. A task never writes status: it calls the
//! `changed` hook, and the controller looks again. Processes belong to the sandbox, so a server
//! that restarts adopts the process a service's recorded `processId` names instead of starting a
//! second one. This module never touches the store, and talks to Docker only through the engine.

mod listening;
mod probe;
mod supervise;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::docker::Engine;
use crate::processes::{Processes, Target};
use crate::resource::{ServiceSpec, ServiceStatus};
pub use listening::parse_proc_net_tcp;

/// Called with a sandbox's name when what its services do changed.
pub type Changed = Arc<dyn Fn(&str) + Send + Sync>;

/// The container a sandbox runs in now, as the controller observed it.
#[derive(Clone, Debug)]
pub struct Running {
    pub name: String,
    pub uid: String,
    pub container_id: String,
    /// When the container last started: a container started again runs none of what ran before.
    pub started_at: Option<DateTime<Utc>>,
    /// The sandbox's `spec.env`; a service's own env goes on top.
    pub env: BTreeMap<String, String>,
}

impl Running {
    fn target(&self) -> Target {
        Target {
            name: self.name.clone(),
            uid: self.uid.clone(),
            container_id: self.container_id.clone(),
            env: self.env.clone(),
        }
    }
}

/// What the tasks share with this module.
struct Shared {
    processes: Arc<Processes>,
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    changed: Changed,
}

/// One supervised service: its spec, what it does now, and its task (aborted when dropped).
struct Supervised {
    spec: ServiceSpec,
    env: BTreeMap<String, String>,
    status: Arc<Mutex<ServiceStatus>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The services of one sandbox's current container.
struct Sandbox {
    uid: String,
    container_id: String,
    started_at: Option<DateTime<Utc>>,
    services: BTreeMap<String, Supervised>,
}

pub struct Services {
    shared: Arc<Shared>,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    listening: listening::Listening,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Services {
    pub fn new(
        processes: Arc<Processes>,
        engine: Arc<dyn Engine>,
        settings: Arc<Settings>,
        changed: Changed,
    ) -> Services {
        let shared = Arc::new(Shared {
            processes,
            engine,
            settings,
            changed,
        });
        Services {
            listening: listening::Listening::new(Arc::clone(&shared)),
            shared,
            sandboxes: Mutex::default(),
        }
    }

    /// Makes the services of `sandbox`'s current container those of `specs`: new ones start,
    /// changed ones (or all, when the sandbox's env changed) are stopped and started again,
    /// removed ones are stopped, the others are left alone. On a container not supervised yet,
    /// a service whose `recorded` status names a process still running there is adopted.
    /// Returns at once; the work happens in the services' tasks.
    pub fn ensure(&self, sandbox: &Running, specs: &[ServiceSpec], recorded: &[ServiceStatus]) {
        let mut all = lock(&self.sandboxes);
        let same_container = all.get(&sandbox.name).is_some_and(|s| {
            s.uid == sandbox.uid
                && s.container_id == sandbox.container_id
                && s.started_at == sandbox.started_at
        });
        let fresh = !same_container;
        if fresh {
            // Another container (or a restart of this one): what ran before ended with it.
            all.insert(
                sandbox.name.clone(),
                Sandbox {
                    uid: sandbox.uid.clone(),
                    container_id: sandbox.container_id.clone(),
                    started_at: sandbox.started_at,
                    services: BTreeMap::new(),
                },
            );
        }
        let Some(current) = all.get_mut(&sandbox.name) else {
            return;
        };
        let target = sandbox.target();
        // Removed services stop.
        let removed: Vec<String> = current
            .services
            .keys()
            .filter(|n| !specs.iter().any(|s| &s.name == *n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(gone) = current.services.remove(&name) {
                let process = lock(&gone.status).process_id.clone();
                drop(gone);
                if let Some(id) = process {
                    let shared = Arc::clone(&self.shared);
                    let target = target.clone();
                    tokio::spawn(async move { supervise::stop(&shared, &target, &id).await });
                }
            }
        }
        for spec in specs {
            let (replacing, adopt, restarts) = match current.services.get(&spec.name) {
                Some(s) if s.spec == *spec && s.env == sandbox.env => continue,
                Some(s) => (lock(&s.status).process_id.clone(), None, 0),
                None if fresh => {
                    let before = recorded.iter().find(|r| r.name == spec.name);
                    (
                        None,
                        before.and_then(|r| r.process_id.clone()),
                        before.map_or(0, |r| r.restarts),
                    )
                }
                None => (None, None, 0),
            };
            let status = Arc::new(Mutex::new(supervise::starting(&spec.name, restarts)));
            let task = tokio::spawn(supervise::run(supervise::Job {
                shared: Arc::clone(&self.shared),
                target: target.clone(),
                spec: spec.clone(),
                status: Arc::clone(&status),
                replacing,
                adopt,
            }));
            current.services.insert(
                spec.name.clone(),
                Supervised {
                    spec: spec.clone(),
                    env: sandbox.env.clone(),
                    status,
                    task,
                },
            );
        }
    }

    /// What the services of sandbox `name` do now, in the order of `specs`; `None` when none of
    /// them is supervised (the sandbox does not run).
    pub fn observe(&self, name: &str, specs: &[ServiceSpec]) -> Option<Vec<ServiceStatus>> {
        let all = lock(&self.sandboxes);
        let sandbox = all.get(name)?;
        Some(
            specs
                .iter()
                .filter_map(|s| sandbox.services.get(&s.name))
                .map(|s| lock(&s.status).clone())
                .collect(),
        )
    }

    /// Stops looking after sandbox `name`'s services (paused, stopped, expired, deleted, or
    /// about to get another container); their processes are left to the sandbox.
    pub fn release(&self, name: &str) {
        lock(&self.sandboxes).remove(name);
        self.listening.forget(name);
    }

    /// Someone reads sandbox `name`: keep its listening ports fresh for a while.
    pub fn interest(&self, sandbox: &Running) {
        self.listening.interest(sandbox);
    }

    /// The TCP ports last seen listening in sandbox `name`'s container `container_id`.
    pub fn listening_ports(&self, name: &str, container_id: &str) -> Option<Vec<u16>> {
        self.listening.ports(name, container_id)
    }
}

impl Services {
    /// Someone read `sandbox`: when it runs, its listening ports are kept fresh for a while.
    pub fn looked_at(&self, sandbox: &crate::resource::Sandbox) {
        if let Some(running) = running_of(sandbox) {
            self.interest(&running);
        }
    }
}

/// The container `sandbox`'s status says it runs in, when it says it runs.
pub fn running_of(sandbox: &crate::resource::Sandbox) -> Option<Running> {
    let status = sandbox.status.as_ref()?;
    if status.phase != crate::resource::SandboxPhase::Running {
        return None;
    }
    Some(Running {
        name: sandbox.metadata.key(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        container_id: status.container_id.clone()?,
        started_at: status.started_at,
        env: sandbox.resolved_spec().env.clone(),
    })
}
