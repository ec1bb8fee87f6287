//! Resource types and their documents: the `Sandbox`, `Snapshot`, `Fork`, `SandboxPool`,
//! `SandboxTemplate`, `Secret`, `Webhook` and `ResourceQuota` kinds with the
//! Kubernetes envelope, their JSON Schemas, and (in [`yaml`]) the only YAML parsing in the crate.
//!
//! This module owns what a valid document is. It knows nothing about disk, Docker or HTTP: the store
//! decides where documents live, the controller what they mean for containers.

mod egress;
mod event;
mod field_error;
mod fork;
pub mod keyfile;
mod meta;
mod pool;
mod quota;
mod sandbox;
pub mod schema;
mod secret;
mod service;
mod snapshot;
mod template;
mod webhook;
pub mod yaml;

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use egress::{
    canonical, parse_allow_list, AllowEntryError, AllowRule, Cidr, EgressSpec, Target,
};
pub use event::{Event, EventMeta, EventSeverity, ObjectReference, Occurrence};
pub use fork::{ForkOverrides, ForkPhase, ForkSpec, ForkStatus};
pub use meta::{
    is_valid_key, is_valid_name, is_valid_namespace, object_key, set_condition, shown_key,
    split_key, Condition, ConditionStatus, ObjectMeta, OwnerReference, API_VERSION,
    DEFAULT_NAMESPACE, NAMESPACE_PATTERN, NAME_PATTERN,
};
pub use pool::{SandboxPoolSpec, SandboxPoolStatus};
pub use quota::{QuotaUsage, ResourceQuotaSpec, ResourceQuotaStatus};
pub use sandbox::{
    AppliedLimits, EffectiveSandbox, ExpiryAction, IdleAction, IdlePolicy, ImagePullPolicy,
    ImagePullProgress, RollbackRecord, RollbackRequest, RootfsRecord, SandboxDefaults,
    SandboxPhase, SandboxSource, SandboxSpec, SandboxState, SandboxStatus, SpecError, Termination,
    TerminationReason,
};
pub use secret::{Injection, SecretSpec, SecretSpecError, SecretStatus, ValueFrom};
pub use service::{
    check_services, ExecCheck, HttpGetCheck, Readiness, RestartPolicy, ServicePort, ServiceSpec,
    ServiceState, ServiceStatus, TcpSocketCheck,
};
pub use snapshot::{SnapshotPhase, SnapshotScope, SnapshotSpec, SnapshotStatus};
pub use template::{
    SandboxTemplateSpec, SandboxTemplateStatus, TemplateError, TemplatePool, TemplateRecord,
};
pub use webhook::{WebhookSpec, WebhookStatus};

/// The kinds this server reconciles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    Sandbox,
    Snapshot,
    Fork,
    SandboxPool,
    Secret,
    Webhook,
    SandboxTemplate,
    ResourceQuota,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Sandbox,
        Kind::Snapshot,
        Kind::Fork,
        Kind::SandboxPool,
        Kind::Secret,
        Kind::Webhook,
        Kind::SandboxTemplate,
        Kind::ResourceQuota,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sandbox => "Sandbox",
            Kind::Snapshot => "Snapshot",
            Kind::Fork => "Fork",
            Kind::SandboxPool => "SandboxPool",
            Kind::Secret => "Secret",
            Kind::Webhook => "Webhook",
            Kind::SandboxTemplate => "SandboxTemplate",
            Kind::ResourceQuota => "ResourceQuota",
        }
    }

    /// The plural used in URLs and data-directory folders.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandboxes",
            Kind::Snapshot => "snapshots",
            Kind::Fork => "forks",
            Kind::SandboxPool => "sandboxpools",
            Kind::Secret => "secrets",
            Kind::Webhook => "webhooks",
            Kind::SandboxTemplate => "sandboxtemplates",
            Kind::ResourceQuota => "resourcequotas",
        }
    }

    pub fn from_plural(plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == plural)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    /// Accepts the kind, its plural and its lower-case singular, like kubectl does.
    fn from_str(s: &str) -> Result<Kind, String> {
        let lower = s.to_ascii_lowercase();
        Kind::ALL
            .into_iter()
            .find(|k| lower == k.as_str().to_ascii_lowercase() || lower == k.plural())
            .ok_or_else(|| {
                format!(
                    "unknown kind {s:?} (expected sandbox, snapshot, fork, sandboxpool, secret, \
                     webhook, sandboxtemplate or resourcequota)"
                )
            })
    }
}

macro_rules! resource_kind {
    ($(#[$doc:meta])* $name:ident, $spec:ty, $status:ty) => {
        $(#[$doc])*
        #[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub struct $name {
            #[schemars(extend("const" = "agent-sandbox.io/v1"))]
            pub api_version: String,
            #[schemars(extend("const" = stringify!($name)))]
            pub kind: String,
            #[serde(default)]
            pub metadata: ObjectMeta,
            pub spec: $spec,
            /// Written only by the controller; ignored on input.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<$status>,
        }

        impl $name {
            pub fn new(name: impl Into<String>, spec: $spec) -> Self {
                $name {
                    api_version: API_VERSION.to_string(),
                    kind: stringify!($name).to_string(),
                    metadata: ObjectMeta { name: name.into(), ..ObjectMeta::default() },
                    spec,
                    status: None,
                }
            }
        }

        impl From<$name> for AnyResource {
            fn from(r: $name) -> AnyResource {
                AnyResource::$name(r)
            }
        }
    };
}

resource_kind!(
    /// A hardened container plus its `/workspace` volume.
    Sandbox,
    SandboxSpec,
    SandboxStatus
);
resource_kind!(
    /// A stored tar of one sandbox's `/workspace`.
    Snapshot,
    SnapshotSpec,
    SnapshotStatus
);
resource_kind!(
    /// A set of sandboxes started from one snapshot.
    Fork,
    ForkSpec,
    ForkStatus
);
resource_kind!(
    /// Warm, unassigned containers that new sandboxes claim.
    SandboxPool,
    SandboxPoolSpec,
    SandboxPoolStatus
);
resource_kind!(
    /// A write-only value the server uses on a user's behalf.
    Secret,
    SecretSpec,
    SecretStatus
);
resource_kind!(
    /// A receiver of events, POSTed as signed JSON.
    Webhook,
    WebhookSpec,
    WebhookStatus
);
resource_kind!(
    /// A named sandbox shape that sandboxes take their unset fields from.
    SandboxTemplate,
    SandboxTemplateSpec,
    SandboxTemplateStatus
);
resource_kind!(
    /// Limits on what one namespace's sandboxes and snapshots use together.
    ResourceQuota,
    ResourceQuotaSpec,
    ResourceQuotaStatus
);

/// A resource of any kind, as the store keeps it.
// A sandbox is the largest kind by far, and the most common: boxing it would cost every
// sandbox an allocation to save space on the few resources of the other kinds.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AnyResource {
    Sandbox(Sandbox),
    Snapshot(Snapshot),
    Fork(Fork),
    SandboxPool(SandboxPool),
    Secret(Secret),
    Webhook(Webhook),
    SandboxTemplate(SandboxTemplate),
    ResourceQuota(ResourceQuota),
}

impl AnyResource {
    pub fn kind(&self) -> Kind {
        match self {
            AnyResource::Sandbox(_) => Kind::Sandbox,
            AnyResource::Snapshot(_) => Kind::Snapshot,
            AnyResource::Fork(_) => Kind::Fork,
            AnyResource::SandboxPool(_) => Kind::SandboxPool,
            AnyResource::Secret(_) => Kind::Secret,
            AnyResource::Webhook(_) => Kind::Webhook,
            AnyResource::SandboxTemplate(_) => Kind::SandboxTemplate,
            AnyResource::ResourceQuota(_) => Kind::ResourceQuota,
        }
    }

    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    pub fn namespace(&self) -> &str {
        &self.metadata().namespace
    }

    /// The key the store, the controller and Docker know this object by ([`object_key`]).
    pub fn key(&self) -> String {
        self.metadata().key()
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            AnyResource::Sandbox(r) => &r.metadata,
            AnyResource::Snapshot(r) => &r.metadata,
            AnyResource::Fork(r) => &r.metadata,
            AnyResource::SandboxPool(r) => &r.metadata,
            AnyResource::Secret(r) => &r.metadata,
            AnyResource::Webhook(r) => &r.metadata,
            AnyResource::SandboxTemplate(r) => &r.metadata,
            AnyResource::ResourceQuota(r) => &r.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            AnyResource::Sandbox(r) => &mut r.metadata,
            AnyResource::Snapshot(r) => &mut r.metadata,
            AnyResource::Fork(r) => &mut r.metadata,
            AnyResource::SandboxPool(r) => &mut r.metadata,
            AnyResource::Secret(r) => &mut r.metadata,
            AnyResource::Webhook(r) => &mut r.metadata,
            AnyResource::SandboxTemplate(r) => &mut r.metadata,
            AnyResource::ResourceQuota(r) => &mut r.metadata,
        }
    }

    /// The spec as JSON, for comparisons and hashing that must not depend on the kind.
    pub fn spec_json(&self) -> serde_json::Value {
        let value = match self {
            AnyResource::Sandbox(r) => serde_json::to_value(&r.spec),
            AnyResource::Snapshot(r) => serde_json::to_value(&r.spec),
            AnyResource::Fork(r) => serde_json::to_value(&r.spec),
            AnyResource::SandboxPool(r) => serde_json::to_value(&r.spec),
            AnyResource::Secret(r) => serde_json::to_value(&r.spec),
            AnyResource::Webhook(r) => serde_json::to_value(&r.spec),
            AnyResource::SandboxTemplate(r) => serde_json::to_value(&r.spec),
            AnyResource::ResourceQuota(r) => serde_json::to_value(&r.spec),
        };
        value.unwrap_or(serde_json::Value::Null)
    }

    pub fn status_json(&self) -> Option<serde_json::Value> {
        match self {
            AnyResource::Sandbox(r) => r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
            AnyResource::Snapshot(r) => {
                r.status.as_ref().and_then(|s| serde_json::to_value(s).ok())
            }
            AnyResource::Fork(r) => r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
            AnyResource::SandboxPool(r) => {
                r.status.as_ref().and_then(|s| serde_json::to_value(s).ok())
            }
            AnyResource::Secret(r) => r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
            AnyResource::Webhook(r) => r.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
            AnyResource::SandboxTemplate(r) => {
                r.status.as_ref().and_then(|s| serde_json::to_value(s).ok())
            }
            AnyResource::ResourceQuota(r) => {
                r.status.as_ref().and_then(|s| serde_json::to_value(s).ok())
            }
        }
    }

    /// Replaces the status with `status` (JSON of this kind's status type).
    pub fn set_status_json(&mut self, status: Option<serde_json::Value>) -> Result<(), String> {
        fn parse<T: serde::de::DeserializeOwned>(
            v: Option<serde_json::Value>,
        ) -> Result<Option<T>, String> {
            v.map(serde_json::from_value)
                .transpose()
                .map_err(|e| e.to_string())
        }
        match self {
            AnyResource::Sandbox(r) => r.status = parse(status)?,
            AnyResource::Snapshot(r) => r.status = parse(status)?,
            AnyResource::Fork(r) => r.status = parse(status)?,
            AnyResource::SandboxPool(r) => r.status = parse(status)?,
            AnyResource::Secret(r) => r.status = parse(status)?,
            AnyResource::Webhook(r) => r.status = parse(status)?,
            AnyResource::SandboxTemplate(r) => r.status = parse(status)?,
            AnyResource::ResourceQuota(r) => r.status = parse(status)?,
        }
        Ok(())
    }

    pub fn clear_status(&mut self) {
        match self {
            AnyResource::Sandbox(r) => r.status = None,
            AnyResource::Snapshot(r) => r.status = None,
            AnyResource::Fork(r) => r.status = None,
            AnyResource::SandboxPool(r) => r.status = None,
            AnyResource::Secret(r) => r.status = None,
            AnyResource::Webhook(r) => r.status = None,
            AnyResource::SandboxTemplate(r) => r.status = None,
            AnyResource::ResourceQuota(r) => r.status = None,
        }
    }

    /// Whether two documents declare the same thing (spec, labels, annotations), ignoring
    /// server-set metadata and status.
    pub fn same_declaration(&self, other: &AnyResource) -> bool {
        self.kind() == other.kind()
            && self.spec_json() == other.spec_json()
            && self.metadata().labels == other.metadata().labels
            && self.metadata().annotations == other.metadata().annotations
    }

    /// The immutable fields that `new`, a later declaration of the same resource, changes, as
    /// paths (`spec.sandbox`); each kind's spec type holds its rule. Empty for kinds without
    /// immutable fields and for documents of another kind.
    pub fn immutable_changes(&self, new: &AnyResource) -> Vec<&'static str> {
        match (self, new) {
            (AnyResource::Sandbox(old), AnyResource::Sandbox(new)) => {
                old.spec.immutable_changes(&new.spec)
            }
            (AnyResource::Snapshot(old), AnyResource::Snapshot(new)) => {
                old.spec.immutable_changes(&new.spec)
            }
            _ => Vec::new(),
        }
    }

    /// Only what a person declares: envelope, name, labels, annotations and spec. This is what
    /// manifest files hold.
    pub fn declaration(&self) -> AnyResource {
        let mut out = self.clone();
        let meta = out.metadata_mut();
        *meta = ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            ..ObjectMeta::default()
        };
        out.clear_status();
        out
    }

    pub fn as_sandbox(&self) -> Option<&Sandbox> {
        match self {
            AnyResource::Sandbox(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_snapshot(&self) -> Option<&Snapshot> {
        match self {
            AnyResource::Snapshot(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_fork(&self) -> Option<&Fork> {
        match self {
            AnyResource::Fork(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_pool(&self) -> Option<&SandboxPool> {
        match self {
            AnyResource::SandboxPool(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_secret(&self) -> Option<&Secret> {
        match self {
            AnyResource::Secret(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_webhook(&self) -> Option<&Webhook> {
        match self {
            AnyResource::Webhook(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_template(&self) -> Option<&SandboxTemplate> {
        match self {
            AnyResource::SandboxTemplate(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_quota(&self) -> Option<&ResourceQuota> {
        match self {
            AnyResource::ResourceQuota(r) => Some(r),
            _ => None,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}
