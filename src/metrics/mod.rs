//! The server's metrics, served at `GET /metrics` in the OpenMetrics text format (the Prometheus
//! exposition format's successor, which Prometheus reads), written by the `prometheus-client`
//! crate.
//!
//! Two kinds of series. What happens — reconciles, Docker calls, HTTP requests, exec and process
//! starts — is recorded as it happens through a [`Metrics`] handle, which the parts that do the
//! work are given (the controller, the data plane, the processes, the HTTP layer; Docker calls
//! through [`crate::docker::CallObserver`] and egress decisions through
//! [`crate::egress::DecisionObserver`], so neither module knows this one). What is — the
//! sandboxes by phase, the work queue, pools, snapshots, each running sandbox's use of CPU,
//! memory, processes and disk — is read at each scrape by the [`Exporter`] (`exporter.rs`) from
//! the store and the host's cgroups (`usage.rs`, `disk.rs`) and handed to [`Metrics::render`] as
//! a [`State`]. Nothing here changes anything: it only counts and reads.
//!
//! Label values are names the server chose (kinds, phases, operations, route templates such as
//! `/v1/sandboxes/{id}`, never a request's own path) and resource names; never a key, a header,
//! an environment value or anything else a request carried.

mod disk;
mod exporter;
pub mod history;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

pub use disk::disk_usage;
pub use exporter::{Exporter, SandboxUsage, UsageError};

/// The media type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The namespace of every resource until the server has tenants.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DockerLabels {
    operation: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    namespace: String,
    sandbox: String,
    protocol: String,
    decision: String,
}

/// The protocols the egress gateway decides on.
const EGRESS_PROTOCOLS: [&str; 3] = ["dns", "http", "tls"];

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets from 1 ms to about 33 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Where what happens is recorded; cheap to clone, shared by everything that records.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Recorded>,
}

struct Recorded {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_seconds: Histograms<ReconcileLabels>,
    docker_seconds: Histograms<DockerLabels>,
    http_seconds: Histograms<HttpLabels>,
    exec_start_seconds: Histogram,
    process_start_seconds: Histogram,
    egress_decisions: Family<EgressLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("agent_sandbox");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles run, by resource kind and result (ok or error)",
            reconciles.clone(),
        );
        let reconcile_seconds: Histograms<ReconcileLabels> =
            Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register_with_unit(
            "reconcile_duration",
            "How long reconciles took, by resource kind and result",
            Unit::Seconds,
            reconcile_seconds.clone(),
        );
        let docker_seconds: Histograms<DockerLabels> =
            Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register_with_unit(
            "docker_call_duration",
            "How long Docker took to answer, by operation and result (ok or error)",
            Unit::Seconds,
            docker_seconds.clone(),
        );
        let http_seconds: Histograms<HttpLabels> =
            Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register_with_unit(
            "http_request_duration",
            "How long requests took until their response began, by method, route template and \
             status code",
            Unit::Seconds,
            http_seconds.clone(),
        );
        let exec_start_seconds = latency();
        registry.register_with_unit(
            "exec_start_duration",
            "How long a command of /v1 exec took to start in its sandbox",
            Unit::Seconds,
            exec_start_seconds.clone(),
        );
        let process_start_seconds = latency();
        registry.register_with_unit(
            "process_start_duration",
            "How long a long-lived process took to start in its sandbox",
            Unit::Seconds,
            process_start_seconds.clone(),
        );
        let egress_decisions = Family::<EgressLabels, Counter>::default();
        registry.register(
            "egress_decisions",
            "Lookups and connections the egress gateway allowed or refused, by namespace, \
             sandbox, protocol (dns, http, tls) and decision (allowed, refused)",
            egress_decisions.clone(),
        );
        Metrics {
            inner: Arc::new(Recorded {
                egress_decisions,
                registry,
                reconciles,
                reconcile_seconds,
                docker_seconds,
                http_seconds,
                exec_start_seconds,
                process_start_seconds,
            }),
        }
    }

    /// One reconcile of a resource of `kind`, which failed or not.
    pub fn reconciled(&self, kind: &str, failed: bool, elapsed: Duration) {
        let labels = ReconcileLabels {
            kind: kind.to_string(),
            result: result(failed).to_string(),
        };
        self.inner.reconciles.get_or_create(&labels).inc();
        self.inner
            .reconcile_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// One HTTP request, by the route template it matched (`None`: it matched none).
    pub fn http_request(&self, method: &str, route: Option<&str>, code: u16, elapsed: Duration) {
        let labels = HttpLabels {
            method: method.to_string(),
            route: route.unwrap_or("unmatched").to_string(),
            code: code.to_string(),
        };
        self.inner
            .http_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// A command of `/v1` exec started (the helper took it).
    pub fn exec_started(&self, elapsed: Duration) {
        self.inner.exec_start_seconds.observe(elapsed.as_secs_f64());
    }

    /// A long-lived process started.
    pub fn process_started(&self, elapsed: Duration) {
        self.inner
            .process_start_seconds
            .observe(elapsed.as_secs_f64());
    }

    /// The whole exposition: what was recorded, then `state`.
    pub fn render(&self, state: &State) -> String {
        let mut text = String::with_capacity(16 * 1024 + state.sandboxes.len() * 600);
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut text, &self.inner.registry);
        let _ = encode_registry(&mut text, &state.registry());
        let _ = encode_eof(&mut text);
        text
    }
}

impl crate::docker::CallObserver for Metrics {
    fn docker_call(&self, operation: &'static str, failed: bool, elapsed: Duration) {
        let labels = DockerLabels {
            operation: operation.to_string(),
            result: result(failed).to_string(),
        };
        self.inner
            .docker_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

impl crate::egress::DecisionObserver for Metrics {
    fn egress_decision(&self, sandbox: &str, protocol: &str, allowed: bool) {
        // Only the protocols the gateway knows become labels.
        let Some(protocol) = EGRESS_PROTOCOLS.iter().find(|p| **p == protocol) else {
            return;
        };
        // The gateway names a sandbox by its key.
        let (namespace, name) = crate::resource::split_key(sandbox);
        let labels = EgressLabels {
            namespace: namespace.to_string(),
            sandbox: name.to_string(),
            protocol: (*protocol).to_string(),
            decision: if allowed { "allowed" } else { "refused" }.to_string(),
        };
        self.inner.egress_decisions.get_or_create(&labels).inc();
    }

    fn egress_forget(&self, sandbox: &str) {
        let (namespace, name) = crate::resource::split_key(sandbox);
        for protocol in EGRESS_PROTOCOLS {
            for decision in ["allowed", "refused"] {
                self.inner.egress_decisions.remove(&EgressLabels {
                    namespace: namespace.to_string(),
                    sandbox: name.to_string(),
                    protocol: protocol.to_string(),
                    decision: decision.to_string(),
                });
            }
        }
    }
}

fn result(failed: bool) -> &'static str {
    if failed {
        "error"
    } else {
        "ok"
    }
}

/// What is, read at one scrape.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Every phase a sandbox can be in, so that a phase with no sandbox reads 0, not absent.
    pub phases: Vec<&'static str>,
    pub sandboxes: Vec<SandboxSample>,
    pub pools: Vec<PoolSample>,
    pub snapshots: Vec<SnapshotSample>,
    /// Resources waiting in the controller's work queue.
    pub queue_depth: usize,
}

#[derive(Clone, Debug)]
pub struct SandboxSample {
    pub namespace: String,
    pub name: String,
    pub phase: &'static str,
    /// Read from its cgroup when it has a container on this host.
    pub usage: Option<usage::CgroupUsage>,
    /// Its workspace on disk, as last measured.
    pub workspace_bytes: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct PoolSample {
    pub namespace: String,
    pub name: String,
    pub ready: u32,
    pub claimed: u32,
}

#[derive(Clone, Debug)]
pub struct SnapshotSample {
    pub namespace: String,
    pub phase: &'static str,
    pub size_bytes: Option<u64>,
}

type Labels = Vec<(&'static str, String)>;

impl State {
    /// The series of this state, in a registry of their own (made per scrape).
    fn registry(&self) -> Registry {
        let mut registry = Registry::with_prefix("agent_sandbox");

        let sandboxes = Family::<Labels, Gauge>::default();
        let mut namespaces: Vec<&str> = vec![DEFAULT_NAMESPACE];
        namespaces.extend(self.sandboxes.iter().map(|s| s.namespace.as_str()));
        namespaces.sort_unstable();
        namespaces.dedup();
        for namespace in &namespaces {
            for phase in &self.phases {
                sandboxes
                    .get_or_create(&vec![
                        ("namespace", namespace.to_string()),
                        ("phase", phase.to_string()),
                    ])
                    .set(0);
            }
        }
        for sandbox in &self.sandboxes {
            sandboxes
                .get_or_create(&vec![
                    ("namespace", sandbox.namespace.clone()),
                    ("phase", sandbox.phase.to_string()),
                ])
                .inc();
        }
        registry.register(
            "sandboxes",
            "Sandboxes declared, by namespace and phase",
            sandboxes,
        );

        let depth = Gauge::<i64>::default();
        depth.set(i64::try_from(self.queue_depth).unwrap_or(i64::MAX));
        registry.register(
            "workqueue_depth",
            "Resources waiting in the controller's work queue",
            depth,
        );

        let members = Family::<Labels, Gauge>::default();
        for pool in &self.pools {
            for (state, count) in [("ready", pool.ready), ("claimed", pool.claimed)] {
                members
                    .get_or_create(&vec![
                        ("namespace", pool.namespace.clone()),
                        ("pool", pool.name.clone()),
                        ("state", state.to_string()),
                    ])
                    .set(i64::from(count));
            }
        }
        registry.register(
            "pool_members",
            "Members of warm pools, ready to be claimed or claimed",
            members,
        );

        let snapshots = Family::<Labels, Gauge>::default();
        let snapshot_bytes = Family::<Labels, Gauge>::default();
        snapshot_bytes
            .get_or_create(&vec![("namespace", DEFAULT_NAMESPACE.to_string())])
            .set(0);
        for snapshot in &self.snapshots {
            let namespace = ("namespace", snapshot.namespace.clone());
            snapshots
                .get_or_create(&vec![
                    namespace.clone(),
                    ("phase", snapshot.phase.to_string()),
                ])
                .inc();
            snapshot_bytes
                .get_or_create(&vec![namespace])
                .inc_by(saturating_i64(snapshot.size_bytes.unwrap_or(0)));
        }
        registry.register("snapshots", "Snapshots, by namespace and phase", snapshots);
        registry.register_with_unit(
            "snapshot",
            "Bytes of snapshot data kept, by namespace",
            Unit::Bytes,
            snapshot_bytes,
        );

        let cpu = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        let memory = Family::<Labels, Gauge>::default();
        let memory_limit = Family::<Labels, Gauge>::default();
        let pids = Family::<Labels, Gauge>::default();
        let workspace = Family::<Labels, Gauge>::default();
        for sandbox in &self.sandboxes {
            let labels = vec![
                ("namespace", sandbox.namespace.clone()),
                ("sandbox", sandbox.name.clone()),
            ];
            if let Some(usage) = &sandbox.usage {
                cpu.get_or_create(&labels).inc_by(usage.cpu_seconds);
                memory
                    .get_or_create(&labels)
                    .set(saturating_i64(usage.memory_bytes));
                if let Some(limit) = usage.memory_limit_bytes {
                    memory_limit
                        .get_or_create(&labels)
                        .set(saturating_i64(limit));
                }
                pids.get_or_create(&labels).set(saturating_i64(usage.pids));
            }
            if let Some(bytes) = sandbox.workspace_bytes {
                workspace.get_or_create(&labels).set(saturating_i64(bytes));
            }
        }
        registry.register_with_unit(
            "sandbox_cpu",
            "CPU time a running sandbox's container has used",
            Unit::Seconds,
            cpu,
        );
        registry.register_with_unit(
            "sandbox_memory",
            "Memory a running sandbox's container uses, less the page cache it can drop",
            Unit::Bytes,
            memory,
        );
        registry.register_with_unit(
            "sandbox_memory_limit",
            "The memory limit of a running sandbox's container",
            Unit::Bytes,
            memory_limit,
        );
        registry.register(
            "sandbox_pids",
            "Tasks (processes and threads) in a running sandbox's container",
            pids,
        );
        registry.register_with_unit(
            "sandbox_workspace",
            "Bytes a sandbox's workspace takes on disk, as last measured",
            Unit::Bytes,
            workspace,
        );
        registry
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::CallObserver;
    use crate::egress::DecisionObserver;

    #[test]
    fn renders_recorded_and_current_series() {
        let metrics = Metrics::new();
        metrics.reconciled("Sandbox", false, Duration::from_millis(3));
        metrics.docker_call("inspect_container", true, Duration::from_millis(2));
        metrics.http_request(
            "GET",
            Some("/v1/sandboxes/{id}"),
            404,
            Duration::from_millis(1),
        );
        metrics.egress_decision("a", "dns", true);
        metrics.egress_decision("a", "dns", true);
        metrics.egress_decision("a", "tls", false);
        metrics.egress_decision("a", "gopher", false);
        let state = State {
            phases: vec!["Running", "Stopped"],
            sandboxes: vec![SandboxSample {
                namespace: DEFAULT_NAMESPACE.into(),
                name: "a".into(),
                phase: "Running",
                usage: Some(usage::CgroupUsage {
                    cpu_seconds: 1.5,
                    memory_bytes: 4096,
                    memory_limit_bytes: Some(8192),
                    pids: 3,
                }),
                workspace_bytes: Some(12288),
            }],
            pools: vec![],
            snapshots: vec![SnapshotSample {
                namespace: DEFAULT_NAMESPACE.into(),
                phase: "Ready",
                size_bytes: Some(100),
            }],
            queue_depth: 2,
        };
        let text = metrics.render(&state);
        for line in [
            "agent_sandbox_reconciles_total{kind=\"Sandbox\",result=\"ok\"} 1",
            "agent_sandbox_docker_call_duration_seconds_count{operation=\"inspect_container\",result=\"error\"} 1",
            "agent_sandbox_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/sandboxes/{id}\",code=\"404\"} 1",
            "agent_sandbox_sandboxes{namespace=\"default\",phase=\"Running\"} 1",
            "agent_sandbox_sandboxes{namespace=\"default\",phase=\"Stopped\"} 0",
            "agent_sandbox_workqueue_depth 2",
            "agent_sandbox_egress_decisions_total{namespace=\"default\",sandbox=\"a\",protocol=\"dns\",decision=\"allowed\"} 2",
            "agent_sandbox_egress_decisions_total{namespace=\"default\",sandbox=\"a\",protocol=\"tls\",decision=\"refused\"} 1",
            "agent_sandbox_snapshot_bytes{namespace=\"default\"} 100",
            "agent_sandbox_sandbox_cpu_seconds_total{namespace=\"default\",sandbox=\"a\"} 1.5",
            "agent_sandbox_sandbox_memory_bytes{namespace=\"default\",sandbox=\"a\"} 4096",
            "agent_sandbox_sandbox_pids{namespace=\"default\",sandbox=\"a\"} 3",
            "agent_sandbox_sandbox_workspace_bytes{namespace=\"default\",sandbox=\"a\"} 12288",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("gopher"), "an unknown protocol is no label");
        metrics.egress_forget("a");
        assert!(!metrics.render(&state).contains("egress_decisions_total{"));
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }
}
