//! Quotas: what the sandboxes and snapshots of a namespace use ([`usage`]), and whether a new or
//! changed document fits every `ResourceQuota` of its namespace ([`admit`]).
//!
//! These are pure functions over documents, so that usage is always recomputed from what exists
//! and never drifts (nothing is counted up or down, nothing survives a crash but the documents).
//! They take no lock and write nothing: a caller that checks and then writes holds the lock that
//! makes the two one step (the API's create lock). A change is refused only when it raises a use
//! past a limit, as in Kubernetes: lowering a quota below what is used refuses new objects and
//! leaves the existing ones alone.

use crate::authz::namespace_of;
use crate::resource::{
    AnyResource, Kind, QuotaUsage, ResourceQuota, SandboxDefaults, SandboxPhase,
};

/// A change that would take a namespace past one of its quotas.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "ResourceQuota {quota:?} of namespace {namespace:?} allows {limit} {resource}: {used} used, \
     {requested} requested"
)]
pub struct QuotaExceeded {
    pub quota: String,
    pub namespace: String,
    /// The spec field: `sandboxes`, `cpus`, `memoryMB`, `snapshots`, `snapshotBytes` or
    /// `workspaceMB`.
    pub resource: &'static str,
    pub limit: String,
    pub used: String,
    /// What the change asks for: `1 more`, or `a new snapshot` (whose size is not known yet).
    pub requested: String,
}

/// What one document uses: a live sandbox (not being deleted, not expired) its CPU, memory and
/// workspace size limits, a snapshot its size; a Fork nothing (its sandboxes count once they exist).
pub fn usage_of(resource: &AnyResource, defaults: &SandboxDefaults) -> QuotaUsage {
    if resource.metadata().deletion_timestamp.is_some() {
        return QuotaUsage::default();
    }
    match resource {
        AnyResource::Sandbox(sandbox) => {
            let expired = sandbox
                .status
                .as_ref()
                .is_some_and(|s| s.phase == SandboxPhase::Expired);
            if expired {
                return QuotaUsage::default();
            }
            let effective = sandbox.spec.effective(defaults);
            QuotaUsage {
                sandboxes: 1,
                cpus: effective.cpus,
                memory_mb: effective.memory_mb,
                workspace_mb: effective.disk_mb,
                ..QuotaUsage::default()
            }
        }
        AnyResource::Snapshot(snapshot) => QuotaUsage {
            snapshots: 1,
            snapshot_bytes: snapshot
                .status
                .as_ref()
                .and_then(|s| s.size_bytes)
                .unwrap_or(0),
            ..QuotaUsage::default()
        },
        _ => QuotaUsage::default(),
    }
}

/// What a create of `resource` asks for beyond the document itself: a Fork its replicas, with
/// the CPU and memory its overrides (or the defaults) give each, and the default workspace size
/// (its children keep the snapshot's `diskMB`, counted once they exist).
fn demand_of(resource: &AnyResource, defaults: &SandboxDefaults) -> QuotaUsage {
    match resource {
        AnyResource::Fork(fork) => {
            let replicas = u64::from(fork.spec.replicas);
            let cpus = fork.spec.overrides.cpus.unwrap_or(defaults.cpus);
            let memory_mb = fork.spec.overrides.memory_mb.unwrap_or(defaults.memory_mb);
            QuotaUsage {
                sandboxes: replicas,
                cpus: cpus * replicas as f64,
                memory_mb: memory_mb.saturating_mul(replicas),
                workspace_mb: defaults.disk_mb.saturating_mul(replicas),
                ..QuotaUsage::default()
            }
        }
        other => usage_of(other, defaults),
    }
}

/// The kinds [`admit`] and [`usage`] read: the quotas and what they count.
pub const COUNTED_KINDS: [Kind; 3] = [Kind::ResourceQuota, Kind::Sandbox, Kind::Snapshot];

/// Whether a document's kind is limited by quotas (and so worth a check before it is written).
pub fn is_limited(kind: Kind) -> bool {
    matches!(kind, Kind::Sandbox | Kind::Snapshot | Kind::Fork)
}

/// The sum of what the documents of `namespace` use.
pub fn usage<'a>(
    documents: impl IntoIterator<Item = &'a AnyResource>,
    namespace: &str,
    defaults: &SandboxDefaults,
) -> QuotaUsage {
    documents
        .into_iter()
        .filter(|r| namespace_of(r.metadata()) == namespace)
        .fold(QuotaUsage::default(), |sum, r| {
            add(&sum, &usage_of(r, defaults))
        })
}

fn add(a: &QuotaUsage, b: &QuotaUsage) -> QuotaUsage {
    QuotaUsage {
        sandboxes: a.sandboxes.saturating_add(b.sandboxes),
        cpus: a.cpus + b.cpus,
        memory_mb: a.memory_mb.saturating_add(b.memory_mb),
        snapshots: a.snapshots.saturating_add(b.snapshots),
        snapshot_bytes: a.snapshot_bytes.saturating_add(b.snapshot_bytes),
        workspace_mb: a.workspace_mb.saturating_add(b.workspace_mb),
    }
}

/// Whether writing `new` (replacing `old`, the document of the same kind and name if there is
/// one) keeps its namespace within every quota in `documents`, which hold the namespace's
/// quotas and everything that counts (`old` among them, if it exists).
pub fn admit(
    documents: &[AnyResource],
    new: &AnyResource,
    old: Option<&AnyResource>,
    defaults: &SandboxDefaults,
) -> Result<(), Box<QuotaExceeded>> {
    let namespace = namespace_of(new.metadata());
    let quotas: Vec<&ResourceQuota> = documents
        .iter()
        .filter_map(AnyResource::as_quota)
        .filter(|q| q.metadata.deletion_timestamp.is_none())
        .filter(|q| namespace_of(&q.metadata) == namespace)
        .collect();
    if quotas.is_empty() {
        return Ok(());
    }
    let used = usage(documents, namespace, defaults);
    let before = old.map(|o| usage_of(o, defaults)).unwrap_or_default();
    let after = if old.is_some() {
        usage_of(new, defaults)
    } else {
        demand_of(new, defaults)
    };
    for quota in quotas {
        let spec = &quota.spec;
        let exceeded = |resource: &'static str, limit: String, used: String, more: String| {
            Box::new(QuotaExceeded {
                quota: quota.metadata.name.clone(),
                namespace: namespace.to_string(),
                resource,
                limit,
                used,
                requested: more,
            })
        };
        // A sandbox without a workspace limit could fill any amount: where the workspace is
        // limited, a new one (or an edit that drops the limit) is refused, naming the field.
        if let (Some(limit), AnyResource::Sandbox(_)) = (spec.workspace_mb, new) {
            let unlimited = |r: &AnyResource| {
                let usage = usage_of(r, defaults);
                usage.sandboxes > 0 && usage.workspace_mb == 0
            };
            if unlimited(new) && !old.is_some_and(unlimited) {
                return Err(exceeded(
                    "workspaceMB",
                    limit.to_string(),
                    used.workspace_mb.to_string(),
                    "a workspace without a limit (set spec.diskMB)".into(),
                ));
            }
        }
        let counts: [(&'static str, Option<u64>, u64, u64, u64); 5] = [
            (
                "sandboxes",
                spec.sandboxes,
                used.sandboxes,
                before.sandboxes,
                after.sandboxes,
            ),
            (
                "memoryMB",
                spec.memory_mb,
                used.memory_mb,
                before.memory_mb,
                after.memory_mb,
            ),
            (
                "workspaceMB",
                spec.workspace_mb,
                used.workspace_mb,
                before.workspace_mb,
                after.workspace_mb,
            ),
            (
                "snapshots",
                spec.snapshots,
                used.snapshots,
                before.snapshots,
                after.snapshots,
            ),
            (
                "snapshotBytes",
                spec.snapshot_bytes,
                used.snapshot_bytes,
                before.snapshot_bytes,
                after.snapshot_bytes,
            ),
        ];
        for (resource, limit, used, before, after) in counts {
            let Some(limit) = limit else { continue };
            let total = used.saturating_sub(before).saturating_add(after);
            if after > before && total > limit {
                return Err(exceeded(
                    resource,
                    limit.to_string(),
                    used.to_string(),
                    format!("{} more", after - before),
                ));
            }
        }
        // A new snapshot has no size until it is taken (then the controller checks its bytes):
        // it is refused here only when the bytes are used up already.
        if let (Some(limit), AnyResource::Snapshot(_), None) = (spec.snapshot_bytes, new, old) {
            if used.snapshot_bytes >= limit {
                return Err(exceeded(
                    "snapshotBytes",
                    limit.to_string(),
                    used.snapshot_bytes.to_string(),
                    "a new snapshot".into(),
                ));
            }
        }
        if let Some(limit) = spec.cpus {
            let total = used.cpus - before.cpus + after.cpus;
            // A thousandth of a CPU of slack absorbs the sums' rounding.
            if after.cpus > before.cpus && total > limit + 1e-3 {
                return Err(exceeded(
                    "cpus",
                    format!("{}", round(limit)),
                    format!("{}", round(used.cpus)),
                    format!("{} more", round(after.cpus - before.cpus)),
                ));
            }
        }
    }
    Ok(())
}

fn round(cpus: f64) -> f64 {
    (cpus * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{
        Fork, ForkSpec, ResourceQuotaSpec, Sandbox, SandboxSpec, Snapshot, SnapshotSpec,
        SnapshotStatus,
    };

    fn defaults() -> SandboxDefaults {
        SandboxDefaults {
            image: "img".into(),
            cpus: 1.0,
            memory_mb: 512,
            pids_limit: 256,
            disk_mb: 0,
            egress_by_default: false,
        }
    }

    fn sandbox(name: &str, cpus: Option<f64>) -> AnyResource {
        Sandbox::new(
            name,
            SandboxSpec {
                cpus,
                ..SandboxSpec::default()
            },
        )
        .into()
    }

    fn quota(spec: ResourceQuotaSpec) -> AnyResource {
        ResourceQuota::new("team", spec).into()
    }

    fn snapshot(name: &str, bytes: u64) -> AnyResource {
        let mut s = Snapshot::new(
            name,
            SnapshotSpec {
                sandbox: "a".into(),
                ..SnapshotSpec::default()
            },
        );
        s.status = Some(SnapshotStatus {
            size_bytes: Some(bytes),
            ..SnapshotStatus::default()
        });
        s.into()
    }

    #[test]
    fn the_third_sandbox_of_a_quota_of_two_is_refused_with_the_numbers() {
        let docs = vec![
            quota(ResourceQuotaSpec {
                sandboxes: Some(2),
                ..ResourceQuotaSpec::default()
            }),
            sandbox("a", None),
        ];
        assert_eq!(admit(&docs, &sandbox("b", None), None, &defaults()), Ok(()));
        let mut docs = docs;
        docs.push(sandbox("b", None));
        let err = admit(&docs, &sandbox("c", None), None, &defaults()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceQuota \"team\" of namespace \"default\" allows 2 sandboxes: 2 used, 1 more requested"
        );
        // An edit that does not raise the count passes even at the limit.
        assert_eq!(
            admit(&docs, &sandbox("b", Some(0.5)), Some(&docs[2]), &defaults()),
            Ok(())
        );
    }

    #[test]
    fn cpus_memory_and_forks_count_what_they_ask_for() {
        let docs = vec![
            quota(ResourceQuotaSpec {
                cpus: Some(2.0),
                memory_mb: Some(4096),
                ..ResourceQuotaSpec::default()
            }),
            sandbox("a", Some(1.5)),
        ];
        assert_eq!(
            admit(&docs, &sandbox("b", Some(0.5)), None, &defaults()),
            Ok(())
        );
        let err = admit(&docs, &sandbox("b", None), None, &defaults()).unwrap_err();
        assert_eq!(
            (err.resource, err.used.as_str(), err.requested.as_str()),
            ("cpus", "1.5", "1 more")
        );
        // Raising a running sandbox's CPUs counts only the difference.
        let err = admit(&docs, &sandbox("a", Some(3.0)), Some(&docs[1]), &defaults()).unwrap_err();
        assert_eq!(err.requested, "1.5 more");
        let fork: AnyResource = Fork::new(
            "f",
            ForkSpec {
                snapshot: "s".into(),
                replicas: 8,
                overrides: Default::default(),
            },
        )
        .into();
        let err = admit(&docs[..1], &fork, None, &defaults()).unwrap_err();
        assert_eq!((err.resource, err.requested.as_str()), ("cpus", "8 more"));
    }

    #[test]
    fn snapshots_count_their_bytes_and_deleted_or_expired_things_count_nothing() {
        let mut docs = vec![
            quota(ResourceQuotaSpec {
                snapshots: Some(3),
                snapshot_bytes: Some(1000),
                ..ResourceQuotaSpec::default()
            }),
            snapshot("s1", 600),
            snapshot("s2", 500),
        ];
        let err = admit(&docs, &snapshot("s3", 0), None, &defaults()).unwrap_err();
        // A new snapshot has no size yet: refused only when the bytes are used up already.
        assert_eq!(
            err.to_string(),
            "ResourceQuota \"team\" of namespace \"default\" allows 1000 snapshotBytes: 1100 \
             used, a new snapshot requested"
        );
        let err = admit(&docs, &snapshot("s2", 900), Some(&docs[2]), &defaults()).unwrap_err();
        assert_eq!(
            (
                err.resource,
                err.limit.as_str(),
                err.used.as_str(),
                err.requested.as_str()
            ),
            ("snapshotBytes", "1000", "1100", "400 more")
        );
        docs[1].metadata_mut().deletion_timestamp = Some(chrono::Utc::now());
        let used = usage(&docs, "default", &defaults());
        assert_eq!((used.snapshots, used.snapshot_bytes), (1, 500));
    }

    #[test]
    fn workspace_mb_sums_disk_limits_and_refuses_unlimited_sandboxes() {
        let limited = |name: &str, disk_mb: Option<u64>| -> AnyResource {
            Sandbox::new(
                name,
                SandboxSpec {
                    disk_mb,
                    ..SandboxSpec::default()
                },
            )
            .into()
        };
        let docs = vec![
            quota(ResourceQuotaSpec {
                workspace_mb: Some(1000),
                ..ResourceQuotaSpec::default()
            }),
            limited("a", Some(600)),
        ];
        assert_eq!(usage(&docs, "default", &defaults()).workspace_mb, 600);
        assert_eq!(
            admit(&docs, &limited("b", Some(400)), None, &defaults()),
            Ok(())
        );
        let err = admit(&docs, &limited("b", Some(500)), None, &defaults()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceQuota \"team\" of namespace \"default\" allows 1000 workspaceMB: 600 used, \
             500 more requested"
        );
        let err = admit(&docs, &limited("b", None), None, &defaults()).unwrap_err();
        assert_eq!(err.resource, "workspaceMB");
        assert!(err.requested.contains("spec.diskMB"), "{err}");
        let err = admit(&docs, &limited("b", Some(0)), None, &defaults()).unwrap_err();
        assert_eq!(err.resource, "workspaceMB");
        // Raising a sandbox's limit counts the difference; lowering always passes.
        let err = admit(
            &docs,
            &limited("a", Some(1200)),
            Some(&docs[1]),
            &defaults(),
        )
        .unwrap_err();
        assert_eq!(err.requested, "600 more");
        assert_eq!(
            admit(&docs, &limited("a", Some(100)), Some(&docs[1]), &defaults()),
            Ok(())
        );
    }

    #[test]
    fn without_a_quota_everything_is_admitted() {
        let docs: Vec<AnyResource> = (0..50).map(|i| sandbox(&format!("s{i}"), None)).collect();
        assert_eq!(admit(&docs, &sandbox("x", None), None, &defaults()), Ok(()));
    }
}
