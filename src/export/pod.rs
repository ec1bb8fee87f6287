//! The hardened pod template and workspace claim: the Docker plan's security model
//! (`docker::bollard_engine::plan`) written as a Kubernetes pod spec. Nothing in this file may
//! offer a way to weaken it: there is no input for privileged mode, capabilities, host
//! namespaces, host paths or the user, and the same values are written for every pod.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::names::{self, EnvName};
use super::{ExportOptions, Gap, GapKind};

/// Where the workspace is mounted; also `HOME` and the working directory (as in the Docker plan).
pub const WORKSPACE: &str = "/workspace";
/// Name of the workspace volume claim template (the Sandbox controller names the claim
/// `workspace-<sandbox>`) and of its volume in the pod.
pub const WORKSPACE_VOLUME: &str = "workspace";
/// The container's name inside the pod.
pub const CONTAINER: &str = "sandbox";
/// Hostname every sandbox sees, as in the Docker plan.
pub const HOSTNAME: &str = "sandbox";
/// The pod's main process: the Docker plan's idle shell for containers without the helper volume
/// (which a pod does not get), so any image with a POSIX shell works.
pub const SHELL_IDLE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done";
/// Docker's name for the gVisor runtime.
pub const RUNSC: &str = "runsc";

/// What differs between pods: everything else is fixed.
pub struct PodShape<'a> {
    /// `sandbox/demo` or `sandboxpool/busybox`, for gaps.
    pub object: &'a str,
    pub image: &'a str,
    pub cpus: f64,
    pub memory_mb: u64,
    pub read_only_rootfs: bool,
    pub env: &'a BTreeMap<String, String>,
    /// Docker runtime; empty for the daemon's default.
    pub runtime: &'a str,
    pub labels: BTreeMap<String, String>,
    /// The container's `imagePullPolicy`; `None` leaves Kubernetes' default.
    pub image_pull_policy: Option<&'static str>,
}

/// `spec.podTemplate` of a Sandbox or SandboxTemplate.
pub fn pod_template(shape: &PodShape<'_>, options: &ExportOptions, gaps: &mut Vec<Gap>) -> Value {
    let uid = options.run_as_user;
    let gid = options.run_as_group;
    let seccomp = json!({ "type": "RuntimeDefault" });
    let cpu = cpu_quantity(shape.cpus);
    if !cpu.exact {
        gaps.push(Gap {
            object: shape.object.to_string(),
            field: Some("spec.cpus".into()),
            kind: GapKind::Differs,
            reason: format!(
                "Kubernetes counts CPU in thousandths: {} is written as {}",
                shape.cpus, cpu.text
            ),
        });
    }
    let memory = format!("{}Mi", shape.memory_mb);
    let resources = json!({ "cpu": cpu.text, "memory": memory });

    let mut spec = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "hostNetwork": false,
        "hostPID": false,
        "hostIPC": false,
        // The pause process is PID 1 and reaps orphans, as docker-init does for `Init: true`.
        "shareProcessNamespace": true,
        "hostname": HOSTNAME,
        "securityContext": {
            "runAsUser": uid,
            "runAsGroup": gid,
            "runAsNonRoot": true,
            // The claim's root becomes writable by the sandbox's group, as `prepare_workspace`
            // makes the Docker volume's root the sandbox user's.
            "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": seccomp,
        },
        "containers": [{
            "name": CONTAINER,
            "image": shape.image,
            "command": ["/bin/sh", "-c", SHELL_IDLE],
            "workingDir": WORKSPACE,
            "env": env(shape, gaps),
            // Requests equal to limits: the Guaranteed class, which never swaps (the Docker
            // plan sets memory + swap to the memory limit).
            "resources": { "limits": resources, "requests": resources },
            "securityContext": {
                "runAsUser": uid,
                "runAsGroup": gid,
                "runAsNonRoot": true,
                "privileged": false,
                "allowPrivilegeEscalation": false,
                "capabilities": { "drop": ["ALL"] },
                "readOnlyRootFilesystem": shape.read_only_rootfs,
                "seccompProfile": seccomp,
            },
            "volumeMounts": [
                { "name": WORKSPACE_VOLUME, "mountPath": WORKSPACE },
                { "name": "tmp", "mountPath": "/tmp" },
            ],
        }],
        // The workspace volume is added by the Sandbox controller from the claim template.
        "volumes": [{
            "name": "tmp",
            "emptyDir": { "medium": "Memory", "sizeLimit": format!("{}Mi", options.tmp_size_mb) },
        }],
    });
    if let Some(class) = runtime_class(shape, options, gaps) {
        spec["runtimeClassName"] = json!(class);
    }
    if let Some(policy) = shape.image_pull_policy {
        spec["containers"][0]["imagePullPolicy"] = json!(policy);
    }
    json!({ "metadata": { "labels": shape.labels }, "spec": spec })
}

/// `spec.volumeClaimTemplates` of a Sandbox or SandboxTemplate: the one workspace claim, as
/// large as the sandbox's `diskMB` when it has one (the claim's size is its limit), else
/// `--workspace-size`.
pub fn workspace_claims(options: &ExportOptions, disk_mb: Option<u64>) -> Value {
    let size = match disk_mb.filter(|mb| *mb > 0) {
        Some(mb) => format!("{mb}Mi"),
        None => options.workspace_size.clone(),
    };
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": size } },
    });
    if let Some(class) = &options.storage_class {
        spec["storageClassName"] = json!(class);
    }
    json!([{ "metadata": { "name": WORKSPACE_VOLUME }, "spec": spec }])
}

fn runtime_class(
    shape: &PodShape<'_>,
    options: &ExportOptions,
    gaps: &mut Vec<Gap>,
) -> Option<String> {
    match shape.runtime {
        "" => None,
        RUNSC => Some(options.gvisor_runtime_class.clone()),
        other => {
            gaps.push(Gap {
                object: shape.object.to_string(),
                field: Some("runtime".into()),
                kind: GapKind::Differs,
                reason: format!(
                    "Docker runtime {other:?} is written as the RuntimeClass of the same name, \
                     which the cluster must define"
                ),
            });
            Some(other.to_string())
        }
    }
}

/// `HOME` first and fixed, as in the Docker plan; then the spec's variables in name order.
fn env(shape: &PodShape<'_>, gaps: &mut Vec<Gap>) -> Value {
    let mut out = vec![json!({ "name": "HOME", "value": WORKSPACE })];
    for (name, value) in shape.env {
        let gap = |kind, reason: String| Gap {
            object: shape.object.to_string(),
            field: Some(format!("spec.env.{name}")),
            kind,
            reason,
        };
        if name == "HOME" {
            gaps.push(gap(
                GapKind::Differs,
                format!("HOME stays {WORKSPACE}, as in the Docker mode"),
            ));
            continue;
        }
        match names::env_name(name) {
            EnvName::Portable => {}
            EnvName::Relaxed => gaps.push(gap(
                GapKind::Differs,
                "this name needs relaxed environment variable validation (Kubernetes 1.32 or \
                 later)"
                    .into(),
            )),
            EnvName::Invalid => {
                gaps.push(gap(
                    GapKind::NotExpressed,
                    "Kubernetes refuses this environment variable name".into(),
                ));
                continue;
            }
        }
        out.push(json!({ "name": name, "value": value }));
    }
    Value::Array(out)
}

struct CpuQuantity {
    text: String,
    exact: bool,
}

/// CPUs as a Kubernetes quantity: whole cores as `2`, others in millicores (`1500m`).
fn cpu_quantity(cpus: f64) -> CpuQuantity {
    let milli = if cpus.is_finite() {
        (cpus * 1000.0).round().max(1.0)
    } else {
        1.0
    };
    let exact = ((milli / 1000.0) - cpus).abs() < 1e-9;
    let milli = milli as u64;
    let text = if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    };
    CpuQuantity { text, exact }
}

/// Labels and annotations Kubernetes accepts, from ours; the rest is reported. A label whose
/// value is not a valid label value becomes an annotation.
pub fn metadata_maps(
    object: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    gaps: &mut Vec<Gap>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut out_labels = BTreeMap::new();
    let mut out_annotations = BTreeMap::new();
    for (key, value) in annotations {
        if names::is_label_key(key) {
            out_annotations.insert(key.clone(), value.clone());
        } else {
            gaps.push(Gap {
                object: object.to_string(),
                field: Some(format!("metadata.annotations.{key}")),
                kind: GapKind::NotExpressed,
                reason: "not a valid Kubernetes annotation key".into(),
            });
        }
    }
    for (key, value) in labels {
        if !names::is_label_key(key) {
            gaps.push(Gap {
                object: object.to_string(),
                field: Some(format!("metadata.labels.{key}")),
                kind: GapKind::NotExpressed,
                reason: "not a valid Kubernetes label key".into(),
            });
        } else if !names::is_label_value(value) {
            let (kind, reason) = if out_annotations.contains_key(key) {
                (
                    GapKind::NotExpressed,
                    "the value is not a valid Kubernetes label value, and an annotation of the \
                     same key is declared too",
                )
            } else {
                out_annotations.insert(key.clone(), value.clone());
                (
                    GapKind::Differs,
                    "the value is not a valid Kubernetes label value; it is written as an \
                     annotation",
                )
            };
            gaps.push(Gap {
                object: object.to_string(),
                field: Some(format!("metadata.labels.{key}")),
                kind,
                reason: reason.into(),
            });
        } else {
            out_labels.insert(key.clone(), value.clone());
        }
    }
    (out_labels, out_annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_kubernetes_refuses_are_moved_or_reported() {
        let labels = BTreeMap::from([
            ("team".to_string(), "research".to_string()),
            ("note".to_string(), "two words".to_string()),
            ("clash".to_string(), "a b".to_string()),
            ("bad key!".to_string(), "x".to_string()),
        ]);
        let annotations = BTreeMap::from([("clash".to_string(), "kept".to_string())]);
        let mut gaps = Vec::new();
        let (l, a) = metadata_maps("sandbox/x", &labels, &annotations, &mut gaps);
        assert_eq!(l, BTreeMap::from([("team".into(), "research".into())]));
        assert_eq!(a.get("note").map(String::as_str), Some("two words"));
        assert_eq!(a.get("clash").map(String::as_str), Some("kept"));
        let lost: Vec<_> = gaps
            .iter()
            .filter(|g| g.kind == GapKind::NotExpressed)
            .filter_map(|g| g.field.as_deref())
            .collect();
        assert_eq!(lost, ["metadata.labels.bad key!", "metadata.labels.clash"]);
    }

    #[test]
    fn cpu_quantities() {
        let q = |c| cpu_quantity(c).text;
        assert_eq!(q(1.0), "1");
        assert_eq!(q(2.0), "2");
        assert_eq!(q(1.5), "1500m");
        assert_eq!(q(0.01), "10m");
        assert!(cpu_quantity(0.25).exact);
        assert!(!cpu_quantity(0.0105).exact);
        assert_eq!(q(f64::NAN), "1m");
    }
}
