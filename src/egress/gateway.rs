//! The gateway's shared state: who is speaking (a policed sandbox, by its source address on the
//! internal network), what its list allows (set by the controller, replaced live on edits), how
//! names resolve (the hosts file first, then the host's resolver), and where decisions go (the
//! store's per-sandbox log, live followers, and a [`DecisionObserver`] that counts them for the
//! server's metrics without this module knowing them). The listeners live in `dns` and `proxy`, and
//! `listen.rs` starts them, so that they depend on this state and not the other way round.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::policy::{self, Protected, Verdict};
use crate::docker::{container_name, Engine};
use crate::resource::{AllowRule, Cidr};
use crate::store::Store;

/// The port of the HTTP proxy on the bridge's host address.
pub const PROXY_PORT: u16 = 3128;
/// A lookup of the host's resolver gets this long.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// An unknown source makes the gateway ask Docker again at most this often.
const MEMBERS_REFRESH: Duration = Duration::from_millis(500);
/// Decisions waiting to be written; beyond this, new ones are counted and dropped.
const LOG_QUEUE: usize = 4096;

/// What the gateway needs from the server's settings.
#[derive(Clone, Debug, Default)]
pub struct GatewaySettings {
    /// The internal network of policed sandboxes.
    pub network: String,
    /// `AGENT_SANDBOX_EGRESS_HOSTS`: a hosts-format file consulted before the host's resolver.
    pub hosts_file: Option<PathBuf>,
    /// `AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW`.
    pub private_allow: Vec<Cidr>,
    /// The authority HTTPS to Secrets' hosts is intercepted with; without one such tunnels stay
    /// end to end (and no value goes into them).
    pub authority: Option<Arc<super::Authority>>,
}

/// One line of a sandbox's decision log.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub time: chrono::DateTime<chrono::Utc>,
    /// `dns`, `http`, `tls` (a `CONNECT` tunnel, or TLS past the proxy), `tcp` (other TCP past
    /// the proxy), `udp` or `icmp` (refused packets).
    pub protocol: String,
    pub host: String,
    /// The address connected to (or answered), when there was one.
    pub address: Option<IpAddr>,
    pub port: Option<u16>,
    pub allowed: bool,
    /// The entry that allowed it, or why it was refused.
    pub rule: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// Told of every decision the gateway takes (the server's metrics count them), so that this
/// module never knows who counts. Called on the deciding task: it must be cheap and never block.
pub trait DecisionObserver: Send + Sync {
    /// Sandbox `sandbox` was allowed or refused a lookup (`dns`) or connection (`http`, `tls`).
    fn egress_decision(&self, sandbox: &str, protocol: &str, allowed: bool);
    /// Sandbox `sandbox` was deleted: what was counted for it may go.
    fn egress_forget(&self, sandbox: &str);
}

/// One `spec.secrets` entry of a policed sandbox: the variable, the Secret, and the placeholder
/// the variable holds (which the gateway replaces with the value in requests to the Secret's
/// hosts). The placeholder is no secret: it is worth nothing outside that sandbox's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretBinding {
    pub env: String,
    pub secret: String,
    pub placeholder: String,
}

/// A policed sandbox, as a connection of it sees it.
#[derive(Clone)]
pub(super) struct Tenant {
    pub sandbox: String,
    pub rules: Arc<Vec<AllowRule>>,
    pub secrets: Arc<Vec<SecretBinding>>,
}

struct Policy {
    container: String,
    rules: Arc<Vec<AllowRule>>,
    secrets: Arc<Vec<SecretBinding>>,
}

#[derive(Default)]
struct Members {
    /// Source address → container name, as Docker last said.
    by_address: HashMap<IpAddr, String>,
    refreshed: Option<Instant>,
    /// A policy changed containers since: ask Docker before trusting the map.
    stale: bool,
}

pub(super) struct Shared {
    engine: Arc<dyn Engine>,
    /// Where Secrets (their spec and value) are read at each request that may carry one.
    pub(super) store: Arc<Store>,
    pub(super) authority: Option<Arc<super::Authority>>,
    settings: GatewaySettings,
    policies: RwLock<HashMap<String, Policy>>,
    members: tokio::sync::Mutex<Members>,
    /// The host resolver's recent answers.
    answers: RwLock<super::resolve::Answers>,
    /// The addresses the gateway listens on: the host's, so protected.
    pub(super) listening: RwLock<HashSet<IpAddr>>,
    log: mpsc::Sender<(String, Decision)>,
    followers: broadcast::Sender<Arc<(String, String)>>,
    /// What each sandbox may ask of the gateway at once.
    pub(super) bounds: Arc<super::bounds::Bounds>,
    /// Who counts the decisions, once set.
    observer: std::sync::OnceLock<Arc<dyn DecisionObserver>>,
}

/// The egress gateway: a DNS server and an HTTP proxy on the host's address of the internal
/// network, deciding each lookup and connection of a policed sandbox against its list.
pub struct Gateway {
    pub(super) shared: Arc<Shared>,
    store: Arc<Store>,
    pub(super) tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Serializes `listen_on`.
    pub(super) binding: tokio::sync::Mutex<()>,
    /// The NFLOG group the gateway reads refused packets from, once bound.
    pub(super) refused_group: std::sync::Mutex<Option<u16>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().map(std::mem::take).unwrap_or_default() {
            task.abort();
        }
    }
}

impl Gateway {
    /// A gateway not listening yet; decisions are written through `store`.
    pub fn new(settings: GatewaySettings, engine: Arc<dyn Engine>, store: Arc<Store>) -> Gateway {
        let (log, mut queued) = mpsc::channel::<(String, Decision)>(LOG_QUEUE);
        let shared = Arc::new(Shared {
            engine,
            store: Arc::clone(&store),
            authority: settings.authority.clone(),
            settings,
            policies: RwLock::default(),
            members: Default::default(),
            answers: RwLock::default(),
            listening: RwLock::default(),
            log,
            followers: broadcast::channel(1024).0,
            bounds: Arc::default(),
            observer: std::sync::OnceLock::new(),
        });
        let followers = shared.followers.clone();
        let writer_store = Arc::clone(&store);
        let writer = tokio::spawn(async move {
            while let Some((sandbox, decision)) = queued.recv().await {
                let Ok(line) = serde_json::to_string(&decision) else {
                    continue;
                };
                let store = Arc::clone(&writer_store);
                let (name, text) = (sandbox.clone(), line.clone());
                let _ =
                    tokio::task::spawn_blocking(move || store.egress_log().append(&name, &text))
                        .await;
                let _ = followers.send(Arc::new((sandbox, line)));
            }
        });
        Gateway {
            shared,
            store,
            tasks: std::sync::Mutex::new(vec![writer]),
            binding: tokio::sync::Mutex::new(()),
            refused_group: std::sync::Mutex::new(None),
        }
    }

    /// Tells `observer` of every decision from now on (once; a second observer is ignored).
    pub fn observe_with(&self, observer: Arc<dyn DecisionObserver>) {
        let _ = self.shared.observer.set(observer);
    }

    /// The NFLOG group whose packets the gateway logs as refused UDP and ICMP, when it could
    /// bind one.
    pub fn refused_group(&self) -> Option<u16> {
        *self.refused_group.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the gateway listens anywhere yet.
    pub fn is_listening(&self) -> bool {
        !read(&self.shared.listening).is_empty()
    }

    /// Whether the gateway listens on `address` already.
    pub fn is_listening_on(&self, address: IpAddr) -> bool {
        read(&self.shared.listening).contains(&address)
    }

    /// The authority's public directory (for policed containers to mount), when there is one.
    pub fn ca_dir(&self) -> Option<PathBuf> {
        self.shared
            .authority
            .as_ref()
            .map(|a| a.public_dir().to_path_buf())
    }

    /// The environment a policed sandbox gets so that its clients use the proxy at `address`
    /// (and, with `ca`, trust the gateway's authority mounted at [`super::CA_MOUNT`]).
    pub fn proxy_env(address: IpAddr, ca: bool) -> Vec<(String, String)> {
        let url = format!("http://{}", std::net::SocketAddr::new(address, PROXY_PORT));
        let mut env = Vec::new();
        for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push((key.to_string(), url.clone()));
        }
        for key in ["NO_PROXY", "no_proxy"] {
            env.push((key.to_string(), "localhost,127.0.0.1".to_string()));
        }
        if ca {
            env.extend(super::Authority::env());
        }
        env
    }

    /// The variables commands in `sandbox` get, when it is policed and the gateway listens:
    /// the proxy's, and each `spec.secrets` variable holding its placeholder (commands do not
    /// inherit the container's environment; the API adds these).
    pub fn sandbox_env(&self, sandbox: &str) -> Vec<(String, String)> {
        let policies = read(&self.shared.policies);
        let Some(policy) = policies.get(sandbox) else {
            return Vec::new();
        };
        let address = read(&self.shared.listening).iter().next().copied();
        let Some(address) = address else {
            return Vec::new();
        };
        let mut env = Gateway::proxy_env(address, self.shared.authority.is_some());
        for binding in policy.secrets.iter() {
            env.push((binding.env.clone(), binding.placeholder.clone()));
        }
        env
    }

    /// Sets (or replaces) the list and secrets of `sandbox`, whose container is `container`:
    /// the next lookup or connection is decided by them.
    pub fn set_policy(
        &self,
        sandbox: &str,
        container: &str,
        rules: Vec<AllowRule>,
        secrets: Vec<SecretBinding>,
    ) {
        let mut policies = write(&self.shared.policies);
        if let Some(current) = policies.get(sandbox) {
            if current.container == container
                && *current.rules == rules
                && *current.secrets == secrets
            {
                return;
            }
        }
        let moved = policies
            .get(sandbox)
            .is_none_or(|current| current.container != container);
        policies.insert(
            sandbox.to_string(),
            Policy {
                container: container.to_string(),
                rules: Arc::new(rules),
                secrets: Arc::new(secrets),
            },
        );
        drop(policies);
        if moved {
            if let Ok(mut members) = self.shared.members.try_lock() {
                members.stale = true;
            } else {
                let shared = Arc::clone(&self.shared);
                tokio::spawn(async move { shared.members.lock().await.stale = true });
            }
        }
    }

    /// Forgets `sandbox`'s list: it is no longer policed.
    pub fn forget(&self, sandbox: &str) {
        write(&self.shared.policies).remove(sandbox);
    }

    /// Forgets a deleted sandbox: its list and its decision log (a new sandbox of the name
    /// starts afresh).
    pub fn forget_deleted(&self, sandbox: &str) {
        self.forget(sandbox);
        self.store.egress_log().remove(sandbox);
        if let Some(observer) = self.shared.observer.get() {
            observer.egress_forget(sandbox);
        }
    }

    /// The kept decision lines of `sandbox`, oldest first.
    pub fn decisions(&self, sandbox: &str) -> Vec<String> {
        self.store.egress_log().read(sandbox)
    }

    /// New decision lines as they are written: `(sandbox, line)`.
    pub fn follow(&self) -> broadcast::Receiver<Arc<(String, String)>> {
        self.shared.followers.subscribe()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The policed sandbox speaking from `source`, if any.
    pub(super) async fn tenant(&self, source: IpAddr) -> Option<Tenant> {
        let source = crate::resource::canonical(source);
        let mut members = self.members.lock().await;
        let fresh_enough = members
            .refreshed
            .is_some_and(|at| at.elapsed() < MEMBERS_REFRESH);
        if let (false, Some(tenant)) = (members.stale, self.tenant_of(&members, source)) {
            return Some(tenant);
        }
        if fresh_enough && !members.stale {
            return None;
        }
        match self.engine.network_members(&self.settings.network).await {
            Ok(list) => {
                members.by_address = list
                    .into_iter()
                    .map(|(container, address)| (crate::resource::canonical(address), container))
                    .collect();
                members.stale = false;
            }
            Err(error) => tracing::warn!(%error, "egress: cannot list the policed sandboxes"),
        }
        members.refreshed = Some(Instant::now());
        self.tenant_of(&members, source)
    }

    fn tenant_of(&self, members: &Members, source: IpAddr) -> Option<Tenant> {
        let container = members.by_address.get(&source)?;
        let policies = read(&self.policies);
        policies
            .iter()
            .find(|(sandbox, _)| container_name(sandbox) == *container)
            .map(|(sandbox, policy)| Tenant {
                sandbox: sandbox.clone(),
                rules: Arc::clone(&policy.rules),
                secrets: Arc::clone(&policy.secrets),
            })
    }

    /// What no sandbox reaches unless told so; the gateway's own addresses included.
    pub(super) fn protected(&self) -> Protected {
        Protected {
            private_allow: self.settings.private_allow.clone(),
            host_addresses: read(&self.listening).iter().copied().collect(),
        }
    }

    /// The addresses `name` resolves to: the hosts file first (read at each call, so edits apply
    /// at once), then the host's resolver (its answers kept for [`super::resolve::ANSWER_LIFETIME`]).
    pub(super) async fn resolve(&self, name: &str) -> Vec<IpAddr> {
        if let Some(path) = &self.settings.hosts_file {
            match tokio::fs::read_to_string(path).await {
                Ok(text) => {
                    let found = super::resolve::from_hosts(&text, name);
                    if !found.is_empty() {
                        return found;
                    }
                }
                Err(error) => tracing::warn!(%error, "egress: cannot read the hosts file"),
            }
        }
        if let Some(kept) = read(&self.answers).get(name, Instant::now()) {
            return kept;
        }
        let lookup = tokio::net::lookup_host((name, 0));
        let addresses = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(found)) => {
                let mut addresses: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                addresses.dedup();
                addresses
            }
            _ => Vec::new(),
        };
        write(&self.answers).keep(name, &addresses, Instant::now());
        addresses
    }

    /// Answers a lookup of `name` by the sandbox at `source`: its addresses, when the list allows
    /// the name and none of them is protected; `None` (NXDOMAIN) otherwise. Nothing is resolved
    /// for a name the list does not allow.
    pub(super) async fn lookup(&self, source: IpAddr, name: &str) -> Option<Vec<IpAddr>> {
        let tenant = self.tenant(source).await?;
        let Some(rule) = policy::rule_for_lookup(&tenant.rules, name) else {
            self.record(
                &tenant.sandbox,
                Decision::new(
                    "dns",
                    name,
                    None,
                    None,
                    false,
                    format!("no entry allows {name}"),
                ),
            );
            return None;
        };
        let addresses = self.resolve(name).await;
        let verdict = answerable(&tenant.rules, &self.protected(), rule, name, &addresses);
        self.record(
            &tenant.sandbox,
            Decision::new(
                "dns",
                name,
                addresses.first().copied(),
                None,
                verdict.allowed,
                verdict.rule,
            ),
        );
        verdict.allowed.then_some(addresses)
    }

    /// Counts `decision` and appends it to `sandbox`'s log (dropped, with a warning, when the
    /// writer is flooded: the gateway never waits on its log; it is counted all the same).
    pub(super) fn record(&self, sandbox: &str, decision: Decision) {
        if let Some(observer) = self.observer.get() {
            observer.egress_decision(sandbox, &decision.protocol, decision.allowed);
        }
        if self.log.try_send((sandbox.to_string(), decision)).is_err() {
            tracing::warn!(
                sandbox,
                "egress decision log is behind; a decision was not logged"
            );
        }
    }
}

/// Whether a lookup of `name`, allowed by `rule`, may be answered with `addresses`: only if
/// every one of them passes the protection check (at the entry's port, if it names one).
fn answerable(
    rules: &[AllowRule],
    protected: &Protected,
    rule: &AllowRule,
    name: &str,
    addresses: &[IpAddr],
) -> Verdict {
    if addresses.is_empty() {
        return Verdict {
            allowed: false,
            rule: format!("{name} does not resolve"),
        };
    }
    let port = rule.port.unwrap_or(0);
    for address in addresses {
        let verdict = policy::decide_address(rules, protected, *address, port, Some(rule));
        if !verdict.allowed {
            return Verdict {
                allowed: false,
                rule: format!("{name} resolves to a {}", verdict.rule),
            };
        }
    }
    Verdict {
        allowed: true,
        rule: rule.text.clone(),
    }
}

impl Decision {
    pub(super) fn new(
        protocol: &'static str,
        host: &str,
        address: Option<IpAddr>,
        port: Option<u16>,
        allowed: bool,
        rule: String,
    ) -> Decision {
        Decision {
            time: chrono::Utc::now(),
            protocol: protocol.to_string(),
            host: host.to_string(),
            address,
            port,
            allowed,
            rule,
            bytes_out: 0,
            bytes_in: 0,
        }
    }
}
