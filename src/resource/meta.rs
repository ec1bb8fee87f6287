//! The Kubernetes-style envelope shared by every kind: `apiVersion`, `kind`, `metadata`, and the
//! condition type used in status. Server-assigned metadata is accepted on input (so that the output
//! of `GET` can be applied again) but never trusted: the store overwrites it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The one API group and version this server speaks.
pub const API_VERSION: &str = "agent-sandbox.io/v1";

/// Names of user-declared resources: DNS-label-like, underscores allowed so that generated IDs such
/// as `sb_2f10f5a9403f25d0` are valid names too.
pub const NAME_PATTERN: &str = r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$";

/// The namespace of every object that names none, and of everything a data directory held before
/// objects had namespaces.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Namespace names: DNS labels (`a-z`, `0-9`, `-`), as in Kubernetes.
pub const NAMESPACE_PATTERN: &str = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    /// Unique within its kind and namespace. Optional only when creating a Sandbox through the
    /// API, which then generates `sb_<16 hex>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^([a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?)?$"))]
    pub name: String,
    /// The namespace the object lives in; `default` when not given. Names are unique per
    /// namespace, keys reach only their namespaces, and an object refers (Fork, `source`,
    /// `template`, `secrets`) only to objects of its own namespace.
    #[serde(default = "default_namespace")]
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Set by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Set by the server; bumped only when the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Set by the server; bumped on every write. Send it back on `PUT` for optimistic concurrency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Set by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<DateTime<Utc>>,
    /// Set by the server when deletion has been requested and is in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<DateTime<Utc>>,
    /// Set by the server on resources a controller created (Fork children).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

pub(super) fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_string()
}

impl Default for ObjectMeta {
    fn default() -> ObjectMeta {
        ObjectMeta {
            name: String::new(),
            namespace: default_namespace(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            uid: None,
            generation: None,
            resource_version: None,
            creation_timestamp: None,
            deletion_timestamp: None,
            owner_references: Vec::new(),
        }
    }
}

impl ObjectMeta {
    /// The object's key among the objects of its kind: see [`object_key`].
    pub fn key(&self) -> String {
        object_key(&self.namespace, &self.name)
    }

    /// The key of the object named `name` in this object's namespace: what a reference in its
    /// spec (a Fork's snapshot, a sandbox's source, template or secrets) means.
    pub fn sibling(&self, name: &str) -> String {
        object_key(&self.namespace, name)
    }
}

/// The key the store, the controller and Docker know an object by: its name in the `default`
/// namespace (so that everything made before namespaces keeps its files, containers and
/// volumes), `{namespace}.{name}` in any other. Neither a name nor a namespace holds a dot, so
/// keys never collide and [`split_key`] reads them back.
pub fn object_key(namespace: &str, name: &str) -> String {
    if namespace == DEFAULT_NAMESPACE || namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}.{name}")
    }
}

/// The namespace and name of a key made by [`object_key`].
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('.').unwrap_or((DEFAULT_NAMESPACE, key))
}

/// A key as messages show it: `"web"` in `default`, `"web" in namespace "team-a"` elsewhere.
pub fn shown_key(key: &str) -> String {
    match split_key(key) {
        (DEFAULT_NAMESPACE, name) => format!("{name:?}"),
        (namespace, name) => format!("{name:?} in namespace {namespace:?}"),
    }
}

/// Whether `key` is one [`object_key`] makes of a valid namespace and name.
pub fn is_valid_key(key: &str) -> bool {
    match key.split_once('.') {
        None => is_valid_name(key),
        Some((namespace, name)) => {
            namespace != DEFAULT_NAMESPACE && is_valid_namespace(namespace) && is_valid_name(name)
        }
    }
}

/// Whether `namespace` is acceptable as a namespace name.
pub fn is_valid_namespace(namespace: &str) -> bool {
    let bytes = namespace.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// A Kubernetes-style condition: `type` names what is judged, `status` the verdict, `reason` a
/// machine-readable CamelCase word and `message` the human explanation.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_time: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
}

/// Replaces or inserts the condition of the same type, keeping `lastTransitionTime` when the
/// status did not change (the Kubernetes convention).
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time;
            }
            *existing = new;
        }
        None => conditions.push(new),
    }
}

/// Whether `name` is acceptable as a resource name.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 63
        && edge_ok(bytes[0])
        && edge_ok(bytes[bytes.len() - 1])
        && bytes.iter().all(|&b| edge_ok(b) || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_default_names_and_split_back() {
        assert_eq!(object_key("default", "web"), "web");
        assert_eq!(object_key("team-a", "web"), "team-a.web");
        assert_eq!(split_key("web"), ("default", "web"));
        assert_eq!(split_key("team-a.web"), ("team-a", "web"));
        assert!(is_valid_namespace("team-a"));
        assert!(!is_valid_namespace("team_a"));
        assert!(!is_valid_namespace("a.b"));
        assert!(!is_valid_namespace(""));
        let meta: ObjectMeta = serde_json::from_str(r#"{"name":"x"}"#).unwrap();
        assert_eq!(meta.namespace, "default");
        assert_eq!(ObjectMeta::default().namespace, "default");
    }

    #[test]
    fn names() {
        assert!(is_valid_name("demo"));
        assert!(is_valid_name("sb_2f10f5a9403f25d0"));
        assert!(is_valid_name("a"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("-a"));
        assert!(!is_valid_name("a_"));
        assert!(!is_valid_name("Demo"));
        assert!(!is_valid_name("a/b"));
        assert!(!is_valid_name("../x"));
        assert!(!is_valid_name(&"a".repeat(64)));
    }

    #[test]
    fn condition_keeps_transition_time_when_status_is_unchanged() {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let t1 = DateTime::parse_from_rfc3339("2026-01-02T00:00:00Z")
            .unwrap()
            .to_utc();
        let cond = |status, at| Condition {
            type_: "Ready".into(),
            status,
            reason: "R".into(),
            message: String::new(),
            last_transition_time: at,
            observed_generation: None,
        };
        let mut conditions = vec![cond(ConditionStatus::True, t0)];
        set_condition(&mut conditions, cond(ConditionStatus::True, t1));
        assert_eq!(conditions[0].last_transition_time, t0);
        set_condition(&mut conditions, cond(ConditionStatus::False, t1));
        assert_eq!(conditions[0].last_transition_time, t1);
        assert_eq!(conditions.len(), 1);
    }
}
