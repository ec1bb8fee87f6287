//! The `SandboxTemplate` kind: a named sandbox shape (image or snapshot, limits, network, env,
//! services, idle policy) that sandboxes name in `spec.template`, and the merge that fills a
//! sandbox's unset fields from it.
//!
//! The shared fields carry the Sandbox spec's types, and their checks are the Sandbox spec's: a
//! template is checked by turning it into the sandbox spec it stands for ([`SandboxTemplateSpec::
//! as_sandbox_spec`]). A test keeps their schemas equal. This module knows nothing of the store or
//! the controller: which template a sandbox was made from is recorded in its status by the
//! controller, and the merge here only reads that record.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress::EgressSpec;
use super::meta::Condition;
use super::sandbox::{IdlePolicy, SandboxSource, SandboxSpec, SpecError};
use super::service::ServiceSpec;
use super::Sandbox;

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplateSpec {
    /// Container image of its sandboxes. Excludes `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Snapshot (Workspace or Full) its sandboxes start from, as `spec.source` would. Excludes
    /// `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub snapshot: Option<String>,
    /// CPU limit in cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1024.0))]
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub memory_mb: Option<u64>,
    /// Maximum number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 1048576))]
    pub pids_limit: Option<u64>,
    /// Join the sandbox bridge network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// What the network may reach (needs `network: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
    /// Environment of its sandboxes' commands; a sandbox's own entries win, key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Keep the root filesystem read-only (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_rootfs: Option<bool>,
    /// Long-running commands; a sandbox that declares any keeps its own list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSpec>,
    /// Idle policy of its sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdlePolicy>,
    /// Warm members of this template's shape kept ready for its sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<TemplatePool>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplatePool {
    /// How many warm members to keep ready.
    #[schemars(range(max = 200))]
    pub size: u32,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplateStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `status.template` of a sandbox: the template it was made from, at which generation, and that
/// generation's spec. Kept so that the sandbox keeps those values across container replacements
/// and restarts of the server however the template changes later.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateRecord {
    pub name: String,
    pub generation: u64,
    /// The template's spec at that generation (its `pool` left out: it shapes no sandbox).
    pub spec: SandboxTemplateSpec,
}

/// A template the schema lets through but that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("spec.snapshot and spec.image exclude each other (the snapshot's image is used)")]
    ImageAndSnapshot,
    #[error(transparent)]
    Spec(SpecError),
}

impl TemplateError {
    /// JSON pointer of the offending value.
    pub fn pointer(&self) -> String {
        match self {
            TemplateError::ImageAndSnapshot => "/spec/snapshot".into(),
            TemplateError::Spec(e) => e.pointer(),
        }
    }
}

impl SandboxTemplateSpec {
    /// The sandbox spec this template stands for on its own: what a sandbox naming it and setting
    /// nothing else gets.
    pub fn as_sandbox_spec(&self) -> SandboxSpec {
        SandboxSpec {
            image: self.image.clone(),
            cpus: self.cpus,
            memory_mb: self.memory_mb,
            pids_limit: self.pids_limit,
            network: self.network,
            egress: self.egress.clone(),
            read_only_rootfs: self.read_only_rootfs,
            env: self.env.clone(),
            source: self
                .snapshot
                .clone()
                .map(|snapshot| SandboxSource { snapshot }),
            idle: self.idle.clone(),
            services: self.services.clone(),
            ..SandboxSpec::default()
        }
    }

    /// What a schema cannot say: `image` and `snapshot` exclude each other, and the rest passes
    /// the Sandbox spec's own check.
    pub fn check(&self) -> Result<(), TemplateError> {
        if self.image.is_some() && self.snapshot.is_some() {
            return Err(TemplateError::ImageAndSnapshot);
        }
        self.as_sandbox_spec().check().map_err(TemplateError::Spec)
    }

    /// `spec` with every field it leaves unset taken from this template. Env merges key by key
    /// (the sandbox's entries win); services are the sandbox's when it declares any. The
    /// template's snapshot becomes `source` unless the sandbox names its own source or image.
    pub fn apply_to(&self, spec: &SandboxSpec) -> SandboxSpec {
        let mut out = spec.clone();
        let base = self.as_sandbox_spec();
        out.image = spec.image.clone().or(base.image);
        out.cpus = spec.cpus.or(base.cpus);
        out.memory_mb = spec.memory_mb.or(base.memory_mb);
        out.pids_limit = spec.pids_limit.or(base.pids_limit);
        out.network = spec.network.or(base.network);
        out.egress = spec.egress.clone().or(base.egress);
        out.read_only_rootfs = spec.read_only_rootfs.or(base.read_only_rootfs);
        out.idle = spec.idle.clone().or(base.idle);
        let mut env = base.env;
        env.extend(spec.env.clone());
        out.env = env;
        if spec.services.is_empty() {
            out.services = base.services;
        }
        if spec.source.is_none() && spec.image.is_none() {
            out.source = base.source;
        }
        out
    }
}

impl Sandbox {
    /// The spec the sandbox runs with: its own, with what it leaves unset filled from the
    /// template recorded in its status (none recorded yet: its own).
    pub fn resolved_spec(&self) -> Cow<'_, SandboxSpec> {
        match self.status.as_ref().and_then(|s| s.template.as_ref()) {
            Some(record) if self.spec.template.is_some() => {
                Cow::Owned(record.spec.apply_to(&self.spec))
            }
            _ => Cow::Borrowed(&self.spec),
        }
    }

    /// This sandbox with its resolved spec in place of its own.
    pub fn resolved(&self) -> Sandbox {
        match self.resolved_spec() {
            Cow::Borrowed(_) => self.clone(),
            Cow::Owned(spec) => Sandbox {
                spec,
                ..self.clone()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> SandboxTemplateSpec {
        SandboxTemplateSpec {
            image: Some("tmpl-image".into()),
            cpus: Some(2.0),
            memory_mb: Some(300),
            env: BTreeMap::from([("A".into(), "t".into()), ("B".into(), "t".into())]),
            ..SandboxTemplateSpec::default()
        }
    }

    #[test]
    fn unset_fields_come_from_the_template_and_set_ones_win() {
        let spec = SandboxSpec {
            memory_mb: Some(128),
            env: BTreeMap::from([("B".into(), "s".into()), ("C".into(), "s".into())]),
            ..SandboxSpec::default()
        };
        let merged = template().apply_to(&spec);
        assert_eq!(merged.image.as_deref(), Some("tmpl-image"));
        assert_eq!(merged.cpus, Some(2.0));
        assert_eq!(merged.memory_mb, Some(128), "the sandbox's own value wins");
        assert_eq!(
            merged.env,
            BTreeMap::from([
                ("A".into(), "t".into()),
                ("B".into(), "s".into()),
                ("C".into(), "s".into()),
            ])
        );
        assert_eq!(merged.pids_limit, None, "unset in both: the server default");
    }

    #[test]
    fn the_snapshot_becomes_the_source_unless_the_sandbox_names_its_own() {
        let from_snapshot = SandboxTemplateSpec {
            snapshot: Some("snap".into()),
            ..SandboxTemplateSpec::default()
        };
        let merged = from_snapshot.apply_to(&SandboxSpec::default());
        assert_eq!(merged.source.map(|s| s.snapshot).as_deref(), Some("snap"));
        let own = SandboxSpec {
            source: Some(SandboxSource {
                snapshot: "mine".into(),
            }),
            ..SandboxSpec::default()
        };
        assert_eq!(from_snapshot.apply_to(&own).source, own.source);
        let image = SandboxSpec {
            image: Some("other".into()),
            ..SandboxSpec::default()
        };
        assert_eq!(from_snapshot.apply_to(&image).source, None);
    }

    #[test]
    fn image_and_snapshot_exclude_each_other_and_sandbox_checks_apply() {
        let mut both = template();
        both.snapshot = Some("snap".into());
        let error = both.check().unwrap_err();
        assert_eq!(error, TemplateError::ImageAndSnapshot);
        assert_eq!(error.pointer(), "/spec/snapshot");
        let egress = SandboxTemplateSpec {
            egress: Some(EgressSpec {
                allow: vec!["pypi.org".into()],
            }),
            ..SandboxTemplateSpec::default()
        };
        assert_eq!(egress.check().unwrap_err().pointer(), "/spec/egress");
        template().check().unwrap();
    }

    #[test]
    fn a_sandbox_resolves_only_through_its_recorded_template() {
        let mut sandbox = Sandbox::new(
            "s",
            SandboxSpec {
                template: Some("t".into()),
                ..SandboxSpec::default()
            },
        );
        assert_eq!(sandbox.resolved_spec().cpus, None, "nothing recorded yet");
        sandbox.status = Some(crate::resource::SandboxStatus {
            template: Some(TemplateRecord {
                name: "t".into(),
                generation: 1,
                spec: template(),
            }),
            ..Default::default()
        });
        assert_eq!(sandbox.resolved().spec.cpus, Some(2.0));
        assert_eq!(
            sandbox.resolved().spec.template.as_deref(),
            Some("t"),
            "the reference stays"
        );
    }

    #[test]
    fn shared_fields_have_the_sandbox_specs_schema() {
        let of = |kind| crate::resource::schema::schema_of(kind);
        let sandbox = of(crate::resource::Kind::Sandbox);
        let template = of(crate::resource::Kind::SandboxTemplate);
        let props = |root: &serde_json::Value, def: &str| {
            root.pointer(&format!("/$defs/{def}/properties"))
                .cloned()
                .unwrap_or_else(|| panic!("no {def} in schema"))
        };
        let sandbox = props(&sandbox, "SandboxSpec");
        let template = props(&template, "SandboxTemplateSpec");
        for field in [
            "image",
            "cpus",
            "memoryMB",
            "pidsLimit",
            "network",
            "egress",
            "env",
            "readOnlyRootfs",
            "services",
            "idle",
        ] {
            let strip = |v: &serde_json::Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("description");
                }
                v
            };
            assert_eq!(
                strip(&sandbox[field]),
                strip(&template[field]),
                "spec.{field} differs between Sandbox and SandboxTemplate"
            );
        }
    }
}
