//! OpenAPI descriptions of the resource routes, and the schema names the resource kinds carry in
//! the document (`SandboxResource`, `SandboxResourceList`, `SandboxWatchEvent`, ...), chosen so they never
//! clash with the `/v1` wire types.

use std::borrow::Cow;

use axum::http::Method;
use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::PREFIX;
use crate::api::openapi::Operation;
use crate::resource::{Fork, Kind, Sandbox, SandboxPool, Snapshot};

macro_rules! documented_kind {
    ($kind:ident, $resource:ident, $list:ident, $event:ident) => {
        /// Schema-only stand-in for the resource kind under its document name.
        pub struct $resource;

        impl JsonSchema for $resource {
            fn schema_name() -> Cow<'static, str> {
                stringify!($resource).into()
            }

            fn schema_id() -> Cow<'static, str> {
                concat!(module_path!(), "::", stringify!($resource)).into()
            }

            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                <$kind as JsonSchema>::json_schema(generator)
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

fn with_types<R: JsonSchema, L: JsonSchema, E: JsonSchema>(kind: Kind) -> Vec<Operation> {
    let plural = kind.plural();
    let collection = format!("{PREFIX}/{plural}");
    let item = format!("{collection}/{{name}}");
    let dry_run = |op: Operation| {
        op.query_with_schema(
            "dryRun",
            false,
            "`All`: validate and answer with the would-be object, writing nothing",
            serde_json::json!({"type": "string", "enum": ["All", ""]}),
        )
    };
    let tag = "resources";
    vec![
        Operation::new(
            Method::GET,
            collection.clone(),
            format!("list{kind}"),
            format!("List or watch {plural}"),
        )
        .description(
            "With `watch=true`, streams NDJSON events instead: `ADDED` for every current \
             object, then `ADDED`/`MODIFIED`/`DELETED` as they happen.",
        )
        .tag(tag)
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
        .resource::<L>(
            200,
            "The list (or, with watch=true, an NDJSON stream of events)",
        )
        .ndjson::<E>(200, "With watch=true: one event per line")
        .errors(&[400, 404]),
        dry_run(
            Operation::new(
                Method::POST,
                collection,
                format!("create{kind}"),
                format!("Create a {kind}"),
            )
            .description(if kind == Kind::Sandbox {
                "A Sandbox without `metadata.name` gets `sb_` + 16 hex digits."
            } else {
                ""
            })
            .tag(tag)
            .resource_body::<R>(),
        )
        .resource::<R>(201, "Created (with server metadata)")
        .link(
            201,
            format!("get{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .link(
            201,
            format!("replace{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .link(
            201,
            format!("delete{kind}"),
            "name",
            "$response.body#/metadata/name",
        )
        .errors(&[400, 404, 409, 413, 415, 422]),
        Operation::new(
            Method::GET,
            item.clone(),
            format!("get{kind}"),
            format!("Get a {kind}"),
        )
        .tag(tag)
        .path_param("name", "Resource name")
        .resource::<R>(200, "The resource with its status")
        .errors(&[404]),
        dry_run(
            Operation::new(
                Method::PUT,
                item.clone(),
                format!("replace{kind}"),
                format!("Replace a {kind}"),
            )
            .description(
                "Replaces labels, annotations and spec. A `metadata.resourceVersion` in the body \
                 must be current (else 409).",
            )
            .tag(tag)
            .path_param("name", "Resource name")
            .resource_body::<R>(),
        )
        .resource::<R>(200, "Replaced")
        .errors(&[400, 403, 404, 409, 413, 415, 422]),
        dry_run(
            Operation::new(
                Method::DELETE,
                item,
                format!("delete{kind}"),
                format!("Delete a {kind}"),
            )
            .description(
                "Marks the resource for deletion; the controller removes what it owns, then the \
                 resource disappears.",
            )
            .tag(tag)
            .path_param("name", "Resource name"),
        )
        .resource::<R>(202, "Deletion started (the object shows deletionTimestamp)")
        .errors(&[400, 403, 404, 409]),
    ]
}

pub fn operations_of(kind: Kind) -> Vec<Operation> {
    match kind {
        Kind::Sandbox => {
            with_types::<SandboxResource, SandboxResourceList, SandboxWatchEvent>(kind)
        }
        Kind::Snapshot => {
            with_types::<SnapshotResource, SnapshotResourceList, SnapshotWatchEvent>(kind)
        }
        Kind::Fork => with_types::<ForkResource, ForkResourceList, ForkWatchEvent>(kind),
        Kind::SandboxPool => {
            with_types::<SandboxPoolResource, SandboxPoolResourceList, SandboxPoolWatchEvent>(kind)
        }
    }
}
