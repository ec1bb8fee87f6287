//! The descriptions of the resource routes, each named by the `api_route` that registers its
//! route (`get_with(list::<K>, docs::list::<K>)`), and the schema names the resource kinds carry
//! in the document (`SandboxResource`, `SandboxResourceList`, `SandboxWatchEvent`, ...), chosen so
//! they never clash with the `/v1` wire types.

use std::borrow::Cow;

use aide::transform::TransformOperation;
use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::state::PauseRequest;
use super::DocumentErrors;
use crate::api::openapi::Describe;
use crate::resource::{
    Fork, Kind, ResourceQuota, Sandbox, SandboxPool, SandboxTemplate, Secret, Snapshot, Webhook,
};

/// A resource kind as routed and documented: the kind its routes fix, and the schemas of its
/// document, list and watch events.
pub trait DocumentedKind: JsonSchema + Send + Sync + 'static {
    const KIND: Kind;
    type List: JsonSchema;
    type Event: JsonSchema;
}

macro_rules! documented_kind {
    ($kind:ident, $resource:ident, $list:ident, $event:ident) => {
        documented_kind!($kind, $resource, $list, $event, |_: &mut Schema| {});
    };
    ($kind:ident, $resource:ident, $list:ident, $event:ident, $extend:expr) => {
        /// Schema-only stand-in for the resource kind under its document name.
        pub struct $resource;

        impl DocumentedKind for $resource {
            const KIND: Kind = Kind::$kind;
            type List = $list;
            type Event = $event;
        }

        impl JsonSchema for $resource {
            fn schema_name() -> Cow<'static, str> {
                stringify!($resource).into()
            }

            fn schema_id() -> Cow<'static, str> {
                concat!(module_path!(), "::", stringify!($resource)).into()
            }

            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                let mut schema = <$kind as JsonSchema>::json_schema(generator);
                ($extend)(&mut schema);
                schema
            }
        }

        /// The answer of a list.
        #[derive(JsonSchema)]
        #[serde(rename_all = "camelCase")]
        #[allow(dead_code)]
        pub struct $list {
            #[schemars(extend("const" = "agent-sandbox.io/v1"))]
            api_version: String,
            #[schemars(extend("const" = concat!(stringify!($kind), "List")))]
            kind: String,
            /// Present when the list was asked for with `limit`.
            #[serde(default)]
            metadata: Option<ListMeta>,
            items: Vec<$resource>,
        }

        /// One line of `?watch=true`.
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        pub struct $event {
            #[serde(rename = "type")]
            event_type: WatchEventType,
            object: $resource,
        }
    };
}

/// Where a list asked for with `limit` stands.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct ListMeta {
    /// Pass as `continue` for the next page; absent on the last one.
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
    /// How many objects the pages after this one hold (as of this answer).
    remaining_item_count: u64,
}

#[derive(JsonSchema)]
#[allow(dead_code)]
#[allow(clippy::upper_case_acronyms)]
enum WatchEventType {
    ADDED,
    MODIFIED,
    DELETED,
    ERROR,
}

documented_kind!(
    Sandbox,
    SandboxResource,
    SandboxResourceList,
    SandboxWatchEvent
);
documented_kind!(
    Snapshot,
    SnapshotResource,
    SnapshotResourceList,
    SnapshotWatchEvent
);
documented_kind!(Fork, ForkResource, ForkResourceList, ForkWatchEvent);
documented_kind!(
    SandboxPool,
    SandboxPoolResource,
    SandboxPoolResourceList,
    SandboxPoolWatchEvent
);
documented_kind!(
    SandboxTemplate,
    SandboxTemplateResource,
    SandboxTemplateResourceList,
    SandboxTemplateWatchEvent
);
documented_kind!(
    ResourceQuota,
    ResourceQuotaResource,
    ResourceQuotaResourceList,
    ResourceQuotaWatchEvent
);
documented_kind!(
    Secret,
    SecretResource,
    SecretResourceList,
    SecretWatchEvent,
    with_write_only_value
);

/// A Secret's document as written through the API: its `value` goes beside `spec`, and is never
/// part of an answer.
fn with_write_only_value(schema: &mut Schema) {
    if let Some(properties) = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        properties.insert(
            "value".into(),
            serde_json::json!({
                "description": "The value (write-only: kept by the server, never answered).",
                "type": "string",
                "minLength": 1,
                "maxLength": crate::resource::yaml::MAX_SECRET_VALUE_BYTES,
                "writeOnly": true,
            }),
        );
    }
}
documented_kind!(
    Webhook,
    WebhookResource,
    WebhookResourceList,
    WebhookWatchEvent
);

type Op<'t> = TransformOperation<'t>;

const TAG: &str = "resources";
const NAME: &str = "Resource name";

fn dry_run(op: Op<'_>) -> Op<'_> {
    op.query_with_schema(
        "dryRun",
        false,
        "`All`: validate and answer with the would-be object, writing nothing",
        serde_json::json!({"type": "string", "enum": ["All", ""]}),
    )
}

/// `GET {PREFIX}/{plural}`.
pub fn list<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    op.id(&format!("list{kind}"))
        .summary(&format!("List or watch {}", kind.plural()))
        .description(
            "With `watch=true`, streams NDJSON events instead: `ADDED` for every current \
             object, then `ADDED`/`MODIFIED`/`DELETED` as they happen.",
        )
        .tag(TAG)
        .query_with_schema(
            "watch",
            false,
            "Stream changes as NDJSON",
            serde_json::json!({"type": "boolean"}),
        )
        .query_with_schema(
            "timeoutSeconds",
            false,
            "With watch=true: end the stream after this many seconds (default: never)",
            serde_json::json!({"type": "integer", "minimum": 1, "maximum": u32::MAX}),
        )
        .query_with_schema(
            "labelSelector",
            false,
            "`k=v`, `k!=v`, `k`, `!k`, comma-separated; all must hold",
            serde_json::json!({"type": "string", "pattern": super::selector::PATTERN}),
        )
        .query_with_schema(
            "limit",
            false,
            "At most this many objects (in the list's order: oldest first, then by name); \
             `metadata.continue` then names where the next page starts",
            serde_json::json!({"type": "integer", "minimum": 1, "maximum": super::MAX_LIMIT}),
        )
        .query_with_schema(
            "continue",
            false,
            "The `metadata.continue` of the previous page",
            serde_json::json!({"type": "string", "pattern": continue_pattern()}),
        )
        .resource::<K::List>(
            200,
            "The list (or, with watch=true, an NDJSON stream of events)",
        )
        .ndjson::<K::Event>(200, "With watch=true: one event per line")
        .errors(&[400, 404])
}

/// `POST {PREFIX}/{plural}`.
pub fn create<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    let op = op
        .id(&format!("create{kind}"))
        .summary(&format!("Create a {kind}"));
    let op = match kind {
        Kind::Sandbox => {
            op.description("A Sandbox without `metadata.name` gets `sb_` + 16 hex digits.")
        }
        Kind::Secret => op.description(
            "The write-only `value` goes beside `spec`; the server keeps it outside the \
             manifests and never answers it. `spec.valueFrom` is for Secrets declared in a \
             watched folder (422 here).",
        ),
        _ => op,
    };
    dry_run(op.tag(TAG))
        .resource_body::<K>()
        .resource::<K>(201, "Created (with server metadata)")
        .link(
            201,
            &format!("get{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .link(
            201,
            &format!("replace{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .link(
            201,
            &format!("delete{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .errors(&[400, 403, 404, 409, 413, 415, 422])
}

/// `GET {PREFIX}/{plural}/{name}`.
pub fn get<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    op.id(&format!("get{kind}"))
        .summary(&format!("Get a {kind}"))
        .tag(TAG)
        .path_param("name", NAME)
        .resource::<K>(200, "The resource with its status")
        .errors(&[404])
}

/// `PUT {PREFIX}/{plural}/{name}`.
pub fn replace<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    let op = op
        .id(&format!("replace{kind}"))
        .summary(&format!("Replace a {kind}"))
        .description(
            "Replaces labels, annotations and spec. A `metadata.resourceVersion` in the body \
             must be current (else 409).",
        )
        .tag(TAG)
        .path_param("name", NAME);
    dry_run(op)
        .resource_body::<K>()
        .resource::<K>(200, "Replaced")
        .errors(&[400, 403, 404, 409, 413, 415, 422])
}

/// `PATCH {PREFIX}/{plural}/{name}`.
pub fn patch<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    let op = op
        .id(&format!("patch{kind}"))
        .summary(&format!("Patch a {kind}"))
        .description(
            "A JSON merge patch (RFC 7386, `Content-Type: application/merge-patch+json`, as \
             `kubectl patch --type merge` sends) of the document; `null` removes a field. \
             The result is validated and checked for immutable fields as a PUT is; a \
             `metadata.resourceVersion` in the patch must be current (else 409).",
        )
        .tag(TAG)
        .path_param("name", NAME)
        .errors(&[400, 403, 404, 409, 413, 415, 422]);
    dry_run(op)
        .merge_patch_body(kind.as_str())
        .resource::<K>(200, "Patched")
}

/// `DELETE {PREFIX}/{plural}/{name}`.
pub fn delete<K: DocumentedKind>(op: Op<'_>) -> Op<'_> {
    let kind = K::KIND;
    let op = op
        .id(&format!("delete{kind}"))
        .summary(&format!("Delete a {kind}"))
        .description(
            "Marks the resource for deletion; the controller removes what it owns, then the \
             resource disappears. A Sandbox's DELETE waits for that (unless `wait=false`): it \
             answers 200 once the sandbox is gone from the API and its processes are killed, \
             with its name free for a new sandbox at once; its container and workspace are \
             removed in the background, and a server restarted meanwhile finishes that. If the \
             controller does not get there within 60 s, or for any other kind, the answer is 202 \
             and the deletion goes on.",
        )
        .tag(TAG)
        .path_param("name", NAME)
        .query_with_schema(
            "wait",
            false,
            "Sandboxes only: `false` answers 202 at once instead of waiting for the deletion \
             (default `true`)",
            serde_json::json!({"type": "boolean"}),
        );
    dry_run(op)
        .resource::<K>(
            200,
            "Deleted (a Sandbox, waited for): the object as its deletion began",
        )
        .resource::<K>(202, "Deletion started (the object shows deletionTimestamp)")
        .errors(&[400, 403, 404, 409])
}

/// `POST {PREFIX}/sandboxes/{name}/pause`.
pub fn pause(op: Op<'_>) -> Op<'_> {
    op.id("pauseSandbox")
        .summary("Pause or stop a sandbox")
        .description(
            "Writes `spec.state` (`Paused` by default: every process frozen, memory kept; \
             `Stopped`: the container stopped, `/workspace` and a writable root filesystem kept) \
             and answers once the controller reports it.",
        )
        .tag(TAG)
        .path_param("name", "Sandbox name")
        .optional_json_body::<PauseRequest>()
        .resource::<SandboxResource>(200, "The sandbox, paused or stopped")
        .errors(&[403, 404, 409, 422, 502, 503])
}

/// `POST {PREFIX}/sandboxes/{name}/resume`.
pub fn resume(op: Op<'_>) -> Op<'_> {
    op.id("resumeSandbox")
        .summary("Resume a sandbox")
        .description(
            "Writes `spec.state: Running` and answers once the sandbox runs again: a paused one \
             continues where it was, a stopped one starts its same container again.",
        )
        .tag(TAG)
        .path_param("name", "Sandbox name")
        .resource::<SandboxResource>(200, "The sandbox, running")
        .errors(&[403, 404, 409, 502, 503])
}

/// `GET {PREFIX}/errors`.
pub fn document_errors(op: Op<'_>) -> Op<'_> {
    op.id("listDocumentErrors")
        .summary("Documents that did not apply")
        .description(
            "Manifests (in the data directory or a watched folder) that failed to parse or \
             validate, or lost a name clash, with file, line and field.",
        )
        .tag(TAG)
        .resource::<DocumentErrors>(200, "The current document errors")
}

/// `GET {PREFIX}/snapshots/{name}/export`.
pub fn export_snapshot(op: Op<'_>) -> Op<'_> {
    op.id("exportSnapshot")
        .summary("Export a snapshot as one archive")
        .description(
            "Streams a snapshot archive (docs/snapshot-archive.md): a tar holding `manifest.json` \
             (format version, the snapshot's spec and status, sizes, digests, base image), then \
             `workspace.tar`, the stored workspace byte for byte, and for a Full snapshot \
             (format version 2) `rootfs.tar`, the top layer of its image byte for byte. Only a \
             Ready snapshot (else 409). `Content-Length` is exact.",
        )
        .tag(TAG)
        .path_param("name", "Snapshot name")
        .binary(200, "The snapshot archive")
        .errors(&[404, 409, 500])
}

/// `POST {PREFIX}/snapshots/import`.
pub fn import_snapshot(op: Op<'_>) -> Op<'_> {
    op.id("importSnapshot")
        .summary("Import a snapshot archive")
        .description(
            "The body is a snapshot archive as `exportSnapshot` answers it, read as hostile \
             input: at most `AGENT_SANDBOX_MAX_SNAPSHOT_BYTES` of workspace and as much of root \
             filesystem layer (413), a manifest of format version 1 (Workspace) or 2 (Full), a \
             workspace tar and a layer tar that pass every rule a restore enforces and match the \
             manifest's sizes and digests (else 422, nothing stored, no image left). Creates the \
             snapshot `name`, Ready (409 when the name exists); for a Full snapshot, its image \
             too. A base image missing here is pulled by the pull policy (during the import for \
             a Full snapshot, else when a sandbox starts from it); with `Never` the import is \
             refused naming it.",
        )
        .tag(TAG)
        .query_with_schema(
            "name",
            true,
            "The new snapshot's name",
            serde_json::json!({
                "type": "string",
                "pattern": crate::resource::NAME_PATTERN,
                "maxLength": 63
            }),
        )
        .binary_body()
        .resource::<SnapshotResource>(201, "The imported snapshot, Ready")
        .link(201, "getSnapshot", "name", "$response.body#/metadata/name")
        .link(
            201,
            "exportSnapshot",
            "name",
            "$response.body#/metadata/name",
        )
        .errors(&[400, 409, 413, 422, 500])
}

/// A `continue` token as the server writes it: `<unix nanos>.<name>` (or empty: the first page).
fn continue_pattern() -> String {
    let name = crate::resource::NAME_PATTERN
        .trim_start_matches('^')
        .trim_end_matches('$');
    format!("^(-?[0-9]{{1,19}}\\.{name})?$")
}
