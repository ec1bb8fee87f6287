//! Translation of our resources into Kubernetes objects for the kubernetes-sigs/agent-sandbox
//! controllers (`agents.x-k8s.io/v1beta1` `Sandbox`, `extensions.agents.x-k8s.io/v1beta1`
//! `SandboxTemplate` and `SandboxWarmPool`) plus core `NetworkPolicy` objects, for
//! `agent-sandbox export --to kubernetes`.
//!
//! It owns what each field of our kinds becomes on a cluster and, just as much, the list of what
//! does not carry over ([`Gap`]): nothing is dropped without an entry there. Everything here is a
//! pure function of the resources and [`ExportOptions`] (the clock included), so the output is
//! reproducible and golden-tested. It never reads files, parses YAML (manifests come parsed from
//! `resource`; [`Export::render`] writes through `resource::yaml`), talks to a server or to a
//! cluster.
//!
//! Our kinds have no template yet, so each `SandboxPool` yields a `SandboxTemplate` of its own
//! (same name) beside its `SandboxWarmPool`.

pub mod names;
pub mod network;
pub mod pod;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use crate::resource::{
    AnyResource, Fork, ImagePullPolicy, Sandbox, SandboxDefaults, SandboxPool, SandboxState,
    Snapshot,
};
use network::Egress;
use pod::PodShape;

/// `apiVersion` of the core Sandbox kind.
pub const SANDBOX_API_VERSION: &str = "agents.x-k8s.io/v1beta1";
/// `apiVersion` of `SandboxTemplate`, `SandboxWarmPool` and `SandboxClaim`.
pub const EXTENSIONS_API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";
/// The label on pods of a pool's template.
pub const POOL_LABEL: &str = "agent-sandbox.io/pool";

/// What the server would fill in, and choices the cluster needs that our kinds do not state.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The server's defaults for image, CPUs, memory and process limit.
    pub defaults: SandboxDefaults,
    /// Size of the memory-backed `/tmp`, in MiB.
    pub tmp_size_mb: u64,
    /// The sandbox user; never 0.
    pub run_as_user: u32,
    pub run_as_group: u32,
    /// The server's Docker runtime (`runsc` for gVisor); empty for the daemon's default.
    pub docker_runtime: String,
    /// RuntimeClass that runs pods under gVisor on the cluster.
    pub gvisor_runtime_class: String,
    /// The instant `ttlSeconds` counts from (the Docker mode counts from creation).
    pub start_time: DateTime<Utc>,
    /// Namespace written into every object, if any.
    pub namespace: Option<String>,
    /// Storage request of the workspace claim (a Kubernetes quantity such as `1Gi`).
    pub workspace_size: String,
    /// StorageClass of the workspace claim; the cluster's default when `None`.
    pub storage_class: Option<String>,
}

/// Why nothing could be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("sandboxes never run as root: the sandbox user must not be uid or gid 0")]
    RootUser,
    #[error("cannot write YAML: {0}")]
    Render(String),
}

/// Whether a gap loses something or only expresses it another way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GapKind {
    /// Has no Kubernetes equivalent and is left out of the objects; `--strict` refuses it.
    NotExpressed,
    /// Carried over, but not exactly as the Docker mode does it.
    Differs,
}

/// One thing of ours that does not carry over as it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gap {
    /// `sandbox/demo`, as the CLI names resources.
    pub object: String,
    /// The field to blame, dotted (`spec.pidsLimit`); `None` for the whole resource.
    pub field: Option<String>,
    pub kind: GapKind,
    pub reason: String,
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} {field}: {}", self.object, self.reason),
            None => write!(f, "{}: {}", self.object, self.reason),
        }
    }
}

/// The objects for a set of resources, and what did not carry over.
#[derive(Clone, Debug, Default)]
pub struct Export {
    /// Kubernetes objects, in the order of the resources they come from.
    pub objects: Vec<Value>,
    pub gaps: Vec<Gap>,
    /// How many of our resources went in.
    pub resources: usize,
}

impl Export {
    /// The gaps `--strict` refuses.
    pub fn not_expressed(&self) -> impl Iterator<Item = &Gap> {
        self.gaps.iter().filter(|g| g.kind == GapKind::NotExpressed)
    }

    /// A YAML stream: a comment block listing every gap and what always differs, then one
    /// document per object.
    pub fn render(&self, options: &ExportOptions) -> Result<String, ExportError> {
        let mut out = String::new();
        out.push_str(&format!(
            "# Kubernetes objects for {} agent-sandbox.io/v1 resource(s), for the \
             kubernetes-sigs/agent-sandbox\n# controllers ({SANDBOX_API_VERSION}, \
             {EXTENSIONS_API_VERSION}).\n",
            self.resources
        ));
        let section = |out: &mut String, title: &str, kind: GapKind| {
            out.push_str(&format!("#\n# {title}\n"));
            let mut any = false;
            for gap in self.gaps.iter().filter(|g| g.kind == kind) {
                any = true;
                out.push_str(&format!("#   {}\n", names::comment_safe(&gap.to_string())));
            }
            if !any {
                out.push_str("#   (none)\n");
            }
        };
        section(
            &mut out,
            "Not expressed (left out of the objects below; --strict refuses these):",
            GapKind::NotExpressed,
        );
        section(&mut out, "Expressed differently:", GapKind::Differs);
        out.push_str("#\n# Always different from the Docker mode (see docs/scale-out.md):\n");
        for line in always_different(options) {
            out.push_str(&format!("#   - {}\n", names::comment_safe(&line)));
        }
        let yaml = crate::resource::yaml::to_yaml_stream(&self.objects)
            .map_err(|e| ExportError::Render(e.message))?;
        out.push_str(&yaml);
        Ok(out)
    }
}

/// What no field decides: the differences every exported sandbox has.
pub fn always_different(options: &ExportOptions) -> Vec<String> {
    vec![
        format!(
            "No process limit: Kubernetes has no per-pod pids field (the server's default is {}); \
             set the kubelet's podPidsLimit.",
            options.defaults.pids_limit
        ),
        "/tmp is a memory-backed emptyDir bounded by its sizeLimit; Kubernetes takes no mount \
         options for it, so the noexec of the Docker tmpfs cannot be asked for."
            .into(),
        "The in-sandbox helper is not mounted: the pod idles in /bin/sh (the image needs one), \
         and commands and files go through the pods/exec subresource."
            .into(),
        "Nodes pull images (the Docker mode never pulls); env changes replace the pod (the \
         workspace claim is kept)."
            .into(),
        format!(
            "The workspace is a claim of {}, a quota the Docker mode does not have; \
             NetworkPolicies take effect only with a CNI plugin that enforces them.",
            options.workspace_size
        ),
        format!(
            "shutdownTime is absolute: ttlSeconds are counted from {}. An expired Sandbox is \
             kept (shutdownPolicy Retain) and its pod removed, but its workspace claim stays \
             until the Sandbox is deleted (the Docker mode removes the workspace).",
            rfc3339(options.start_time)
        ),
    ]
}

/// Translates `resources` (as parsed from manifests, or as a server returns them with status).
pub fn export(resources: &[AnyResource], options: &ExportOptions) -> Result<Export, ExportError> {
    if options.run_as_user == 0 || options.run_as_group == 0 {
        return Err(ExportError::RootUser);
    }
    let mut out = Export {
        resources: resources.len(),
        ..Export::default()
    };
    let mut taken: BTreeMap<(&'static str, String), String> = BTreeMap::new();
    let outer = options;
    for resource in resources {
        // An object of a namespace other than `default` goes to that namespace unless
        // `--namespace` names one for all.
        let scoped;
        let options = match (&outer.namespace, resource.namespace()) {
            (None, namespace) if namespace != crate::resource::DEFAULT_NAMESPACE => {
                scoped = ExportOptions {
                    namespace: Some(namespace.to_string()),
                    ..outer.clone()
                };
                &scoped
            }
            _ => outer,
        };
        let object = reference(resource);
        let mut claim = |k8s_kind: &'static str, name: &str, gaps: &mut Vec<Gap>| -> bool {
            match taken.get(&(k8s_kind, name.to_string())) {
                Some(first) => {
                    gaps.push(Gap {
                        object: object.clone(),
                        field: Some("metadata.name".into()),
                        kind: GapKind::NotExpressed,
                        reason: format!(
                            "its Kubernetes name {name:?} is already taken by {first}; not exported"
                        ),
                    });
                    false
                }
                None => {
                    taken.insert((k8s_kind, name.to_string()), object.clone());
                    true
                }
            }
        };
        match resource {
            AnyResource::Sandbox(s) => {
                let name = kube_name(&object, &s.metadata.name, &mut out.gaps);
                if claim("Sandbox", &name, &mut out.gaps) {
                    out.objects
                        .extend(sandbox(s, &name, &object, options, &mut out.gaps));
                }
            }
            AnyResource::SandboxPool(p) => {
                let name = kube_name(&object, &p.metadata.name, &mut out.gaps);
                if claim("SandboxTemplate", &name, &mut out.gaps) {
                    out.objects
                        .extend(pool(p, &name, &object, options, &mut out.gaps));
                }
            }
            AnyResource::Snapshot(s) => out.gaps.push(snapshot(s, &object)),
            AnyResource::SandboxTemplate(_) => out.gaps.push(Gap {
                object: object.clone(),
                field: None,
                kind: GapKind::NotExpressed,
                reason: "not exported by itself: each sandbox made from it is exported with the \
                         values it took from it"
                    .into(),
            }),
            AnyResource::Fork(f) => out.gaps.push(fork(f, &object)),
            AnyResource::ResourceQuota(_) => out.gaps.push(Gap {
                object: object.clone(),
                field: None,
                kind: GapKind::NotExpressed,
                reason: "not exported: a Kubernetes namespace has ResourceQuotas of its own, \
                         which count pods rather than sandboxes"
                    .into(),
            }),
            AnyResource::Secret(_) | AnyResource::Webhook(_) => out.gaps.push(Gap {
                object: object.clone(),
                field: None,
                kind: GapKind::NotExpressed,
                reason: "not exported: secrets and webhooks serve this server's own event \
                         deliveries, which the Kubernetes controllers do not make"
                    .into(),
            }),
        }
    }
    Ok(out)
}

/// `sandbox/demo`.
fn reference(resource: &AnyResource) -> String {
    format!(
        "{}/{}",
        resource.kind().as_str().to_ascii_lowercase(),
        resource.name()
    )
}

fn kube_name(object: &str, ours: &str, gaps: &mut Vec<Gap>) -> String {
    let name = names::object_name(ours);
    if name != ours {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("metadata.name".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "Kubernetes names allow no '_'; exported as {name:?}, which clients of the old \
                 name will not find"
            ),
        });
    }
    name
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn metadata(
    name: &str,
    options: &ExportOptions,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Value {
    let mut meta = json!({ "name": name });
    if let Some(ns) = &options.namespace {
        meta["namespace"] = json!(ns);
    }
    if !labels.is_empty() {
        meta["labels"] = json!(labels);
    }
    if !annotations.is_empty() {
        meta["annotations"] = json!(annotations);
    }
    meta
}

/// Adds our selector label to a pod's labels; a user label of the same key loses, and says so.
fn with_label(
    object: &str,
    mut labels: BTreeMap<String, String>,
    key: &str,
    value: &str,
    gaps: &mut Vec<Gap>,
) -> BTreeMap<String, String> {
    if let Some(old) = labels.insert(key.to_string(), value.to_string()) {
        if old != value {
            gaps.push(Gap {
                object: object.to_string(),
                field: Some(format!("metadata.labels.{key}")),
                kind: GapKind::NotExpressed,
                reason: format!(
                    "the export selects pods by this label; the pod template carries {value:?}"
                ),
            });
        }
    }
    labels
}

fn sandbox(
    s: &Sandbox,
    name: &str,
    object: &str,
    options: &ExportOptions,
    gaps: &mut Vec<Gap>,
) -> Vec<Value> {
    let resolved = s.resolved_spec();
    let spec = resolved.as_ref();
    let effective = spec.effective(&options.defaults);
    if let Some(template) = &spec.template {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.template".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "template {template:?} is not exported; the sandbox carries the values it took \
                 from it"
            ),
        });
    }
    let (labels, annotations) =
        pod::metadata_maps(object, &s.metadata.labels, &s.metadata.annotations, gaps);
    let pod_labels = with_label(object, labels.clone(), network::SANDBOX_LABEL, name, gaps);

    if let Some(pids) = spec.pids_limit {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.pidsLimit".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "Kubernetes has no per-pod process limit; {pids} would need the kubelet's \
                 podPidsLimit on the nodes"
            ),
        });
    }
    if let Some(source) = &spec.source {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.source.snapshot".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "snapshot {:?} is a tar the server keeps; the workspace claim starts empty",
                source.snapshot
            ),
        });
    }
    if let Some(rollback) = &spec.rollback {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.rollback".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "no Kubernetes object restores a workspace (rollback to {:?}, request {:?})",
                rollback.snapshot, rollback.request_id
            ),
        });
    }

    if let Some(state) = spec.state.filter(|state| *state != SandboxState::Running) {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.state".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "{state:?}: a pod cannot be frozen, or stopped with its root filesystem kept; \
                 the exported sandbox runs"
            ),
        });
    }
    if let Some(idle) = &spec.idle {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.idle".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "{:?} after {}s without activity: nothing in Kubernetes sees a sandbox's calls",
                idle.action, idle.after_seconds
            ),
        });
    }
    if !spec.services.is_empty() {
        let names: Vec<&str> = spec.services.iter().map(|s| s.name.as_str()).collect();
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.services".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "{}: the server keeps these running inside the sandbox; a pod would run each \
                 as a container of its own, which is not exported",
                names.join(", ")
            ),
        });
    }
    if !spec.secrets.is_empty() {
        let vars: Vec<&str> = spec.secrets.iter().map(|s| s.env.as_str()).collect();
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.secrets".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "{}: the server's egress gateway puts these Secrets' values into requests;                  nothing in the exported objects does, and the values are not exported",
                vars.join(", ")
            ),
        });
    }
    if let Some(action) = spec
        .expiry_action
        .filter(|a| *a != crate::resource::ExpiryAction::Delete)
    {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.expiryAction".into()),
            kind: GapKind::NotExpressed,
            reason: format!(
                "{action:?}: a pod cannot be frozen or stopped at the end of its lifetime; the \
                 exported deadline ends it"
            ),
        });
    }
    if let Some(auto_resume) = spec.auto_resume {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.autoResume".into()),
            kind: GapKind::NotExpressed,
            reason: format!("{auto_resume}: no Kubernetes object resumes a pod when it is called"),
        });
    }

    // The server's own deadline when it reports one; else the spec's, counted from the start.
    let observed = s.status.as_ref().and_then(|st| st.expires_at);
    let anchor = s
        .status
        .as_ref()
        .and_then(|st| st.active_since)
        .unwrap_or(options.start_time);
    let shutdown = observed.or_else(|| spec.expires_at(anchor));
    if let (Some(ttl), None) = (spec.ttl_seconds, observed) {
        gaps.push(Gap {
            object: object.to_string(),
            field: Some("spec.ttlSeconds".into()),
            kind: GapKind::Differs,
            reason: format!(
                "a lifetime of {ttl}s counted from {} (Kubernetes takes only an absolute \
                 shutdownTime)",
                rfc3339(anchor)
            ),
        });
    }

    let runtime = options.docker_runtime.as_str();
    let shape = PodShape {
        object,
        image: &effective.image,
        cpus: effective.cpus,
        memory_mb: effective.memory_mb,
        read_only_rootfs: effective.read_only_rootfs,
        env: &effective.env,
        runtime,
        labels: pod_labels,
        image_pull_policy: spec.image_pull_policy.map(pull_policy_name),
    };
    let mut k8s_spec = json!({
        "podTemplate": pod::pod_template(&shape, options, gaps),
        "volumeClaimTemplates": pod::workspace_claims(options, spec.disk_mb),
        // No headless Service: a sandbox takes no inbound connections.
        "service": false,
    });
    if let Some(at) = shutdown {
        k8s_spec["shutdownTime"] = json!(rfc3339(at));
        // Kept when it expires, as the Docker mode keeps a sandbox a watched folder declares:
        // deleting it would let a GitOps tool create it again, expired at once.
        k8s_spec["shutdownPolicy"] = json!("Retain");
    }
    let cr = json!({
        "apiVersion": SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": metadata(name, options, &labels, &annotations),
        "spec": k8s_spec,
    });
    let egress = Egress::from_spec(effective.network, spec.egress.as_ref());
    let policy = network::network_policy(
        &format!("{name}-network"),
        options.namespace.as_deref(),
        name,
        &egress,
        object,
        gaps,
    );
    vec![cr, policy]
}

fn pool(
    p: &SandboxPool,
    name: &str,
    object: &str,
    options: &ExportOptions,
    gaps: &mut Vec<Gap>,
) -> Vec<Value> {
    let spec = &p.spec;
    let (labels, annotations) =
        pod::metadata_maps(object, &p.metadata.labels, &p.metadata.annotations, gaps);
    let pod_labels = with_label(object, labels.clone(), POOL_LABEL, name, gaps);
    let runtime = spec
        .runtime
        .clone()
        .unwrap_or_else(|| options.docker_runtime.clone());
    let no_env = BTreeMap::new();
    let shape = PodShape {
        object,
        image: &spec.image,
        cpus: options.defaults.cpus,
        memory_mb: options.defaults.memory_mb,
        read_only_rootfs: spec.read_only_rootfs.unwrap_or(true),
        env: &no_env,
        runtime: &runtime,
        labels: pod_labels,
        image_pull_policy: None,
    };
    gaps.push(Gap {
        object: object.to_string(),
        field: None,
        kind: GapKind::Differs,
        reason: "warm pods have the default CPU and memory limits, and a SandboxClaim cannot \
                 change them, where the Docker mode applies the claiming sandbox's limits"
            .into(),
    });
    let egress = Egress::from_network(spec.network.unwrap_or(false));
    let template = json!({
        "apiVersion": EXTENSIONS_API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": metadata(name, options, &labels, &annotations),
        "spec": {
            "podTemplate": pod::pod_template(&shape, options, gaps),
            "volumeClaimTemplates": pod::workspace_claims(options, None),
            "service": false,
            "networkPolicyManagement": "Managed",
            "networkPolicy": network::template_network_policy(&egress, object, gaps),
            "envVarsInjectionPolicy": "Disallowed",
            "volumeClaimTemplatesPolicy": "Disallowed",
        },
    });
    let warm_pool = json!({
        "apiVersion": EXTENSIONS_API_VERSION,
        "kind": "SandboxWarmPool",
        "metadata": metadata(name, options, &labels, &annotations),
        "spec": {
            "replicas": spec.size,
            "sandboxTemplateRef": { "name": name },
        },
    });
    vec![template, warm_pool]
}

/// What a resource left out whole declares (labels and annotations included), so that the
/// comment block holds all of it.
fn declared(resource: AnyResource) -> String {
    let json = resource.declaration().to_json();
    let what = json!({ "metadata": json["metadata"], "spec": json["spec"] });
    serde_json::to_string(&what).unwrap_or_default()
}

fn snapshot(s: &Snapshot, object: &str) -> Gap {
    Gap {
        object: object.to_string(),
        field: None,
        kind: GapKind::NotExpressed,
        reason: format!(
            "not exported: a snapshot is a tar of a workspace that the server keeps; no \
             agents.x-k8s.io kind holds one (a CSI VolumeSnapshot of the workspace claim is the \
             nearest; see docs/scale-out.md); it declares {}",
            declared(s.clone().into())
        ),
    }
}

fn fork(f: &Fork, object: &str) -> Gap {
    Gap {
        object: object.to_string(),
        field: None,
        kind: GapKind::NotExpressed,
        reason: format!(
            "not exported: a fork starts sandboxes from a snapshot's workspace, which needs the \
             server; it declares {}",
            declared(f.clone().into())
        ),
    }
}

/// Every Kubernetes kind (with apiVersion) the export writes, for documentation and tests.
pub fn written_kinds() -> BTreeSet<(&'static str, &'static str)> {
    BTreeSet::from([
        (SANDBOX_API_VERSION, "Sandbox"),
        (EXTENSIONS_API_VERSION, "SandboxTemplate"),
        (EXTENSIONS_API_VERSION, "SandboxWarmPool"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    ])
}

/// Kubernetes spells a container's pull policy as the resource does.
fn pull_policy_name(policy: ImagePullPolicy) -> &'static str {
    match policy {
        ImagePullPolicy::IfNotPresent => "IfNotPresent",
        ImagePullPolicy::Always => "Always",
        ImagePullPolicy::Never => "Never",
    }
}
