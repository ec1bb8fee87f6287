//! The `Event` kind: a record, in the shape of Kubernetes' core/v1 Event, that something happened
//! to a resource (a sandbox started, a snapshot became ready, a manifest failed to parse). Events
//! are written by the server only; this module owns their document shape and nothing else (the
//! store keeps them, the controller decides when one happened).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::API_VERSION;

/// Whether an event reports ordinary progress or something that went wrong.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventSeverity {
    Normal,
    Warning,
}

/// The resource an event is about.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectReference {
    /// `Sandbox`, `Snapshot`, `Fork`, `SandboxPool`, or `Manifest` for a manifest file that did
    /// not apply.
    pub kind: String,
    /// The resource's name (for a `Manifest`: the file).
    pub name: String,
    /// The resource's namespace (`default` for a `Manifest`, and for events recorded before
    /// objects had namespaces).
    #[serde(default = "super::meta::default_namespace")]
    pub namespace: String,
    /// The resource's uid, when it has one: it tells apart two resources of one name over time.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// Server-set metadata of an event.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventMeta {
    /// `ev_<16 hex>`.
    pub name: String,
    pub uid: String,
    /// Bumped, across all events, every time this event is recorded again.
    pub resource_version: String,
    pub creation_timestamp: DateTime<Utc>,
}

/// Something that happened to a resource, counted while it keeps happening.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    #[schemars(extend("const" = "agent-sandbox.io/v1"))]
    pub api_version: String,
    #[schemars(extend("const" = "Event"))]
    pub kind: String,
    pub metadata: EventMeta,
    pub involved_object: ObjectReference,
    /// A short CamelCase word: `Started`, `Failed`, `SnapshotReady`, ...
    pub reason: String,
    pub message: String,
    #[serde(rename = "type")]
    pub type_: EventSeverity,
    /// How many times the same thing (object, reason, message) happened.
    pub count: u64,
    pub first_timestamp: DateTime<Utc>,
    pub last_timestamp: DateTime<Utc>,
}

/// What a recorder is told: one occurrence, before the store names and counts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Occurrence {
    pub involved_object: ObjectReference,
    pub type_: EventSeverity,
    pub reason: String,
    pub message: String,
}

impl Event {
    /// A first occurrence, with the metadata the store gave it.
    pub fn first(occurrence: Occurrence, metadata: EventMeta) -> Event {
        let now = metadata.creation_timestamp;
        Event {
            api_version: API_VERSION.to_string(),
            kind: "Event".to_string(),
            metadata,
            involved_object: occurrence.involved_object,
            reason: occurrence.reason,
            message: occurrence.message,
            type_: occurrence.type_,
            count: 1,
            first_timestamp: now,
            last_timestamp: now,
        }
    }

    /// Whether `occurrence` is this event happening again (Kubernetes' deduplication key).
    pub fn is_same(&self, occurrence: &Occurrence) -> bool {
        self.involved_object == occurrence.involved_object
            && self.type_ == occurrence.type_
            && self.reason == occurrence.reason
            && self.message == occurrence.message
    }
}
