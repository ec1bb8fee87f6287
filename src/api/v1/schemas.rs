//! The documented shapes of the `/v1` request bodies, written by hand because the handlers read
//! them leniently (`lax`) and check ranges against the server's settings (`rules`): a derived
//! schema would promise `null` where the server refuses it and know none of the limits. Each
//! schema describes what a well-formed request is, exactly as the handlers judge it: every value
//! it allows is accepted, and the limits are the running server's.
//!
//! The coercions the reference's clients rely on (`"0.5"` for a number, `"yes"` for a boolean)
//! still work but are not advertised: a client generated from the document sends the canonical
//! form.

use serde_json::{json, Value};

use crate::config::Settings;

/// Smallest CPU share a sandbox can get (Docker counts in billionths; below this a share rounds
/// to nothing useful).
pub const MIN_CPUS: f64 = 0.01;

/// An environment: names non-empty and without `=` or NUL, values without NUL.
fn env() -> Value {
    json!({
        "type": "object",
        "description": "Environment variables: names non-empty, without `=` or NUL; values without NUL.",
        "propertyNames": {"type": "string", "minLength": 1, "pattern": "^[^=\\u0000]+$"},
        "additionalProperties": {"type": "string", "pattern": "^[^\\u0000]*$"},
    })
}

fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn cpus(settings: &Settings) -> Value {
    json!({
        "type": "number",
        "minimum": MIN_CPUS,
        "maximum": settings.max_cpus,
        "description": "CPU cores.",
    })
}

fn memory_mb(settings: &Settings) -> Value {
    json!({"type": "integer", "minimum": 16, "maximum": settings.max_memory_mb})
}

fn lifetime(settings: &Settings) -> Value {
    json!({
        "type": "integer",
        "minimum": 1,
        "maximum": settings.max_timeout_seconds,
        "description": "Lifetime in seconds.",
    })
}

/// `POST /v1/sandboxes`.
pub fn sandbox_create(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "description": "A new sandbox; every field left out gets the server's default.",
        "additionalProperties": false,
        "examples": [{}, {"memory_mb": 256, "timeout_seconds": 600, "env": {"MODE": "test"}}],
        "properties": {
            "image": nullable(json!({
                "type": "string",
                "description": "Image reference; empty or null for the server's default. It must \
                    match the server's allowlist (else 403).",
            })),
            "cpus": nullable(cpus(settings)),
            "memory_mb": nullable(memory_mb(settings)),
            "pids_limit": nullable(json!({
                "type": "integer", "minimum": 8, "maximum": settings.max_pids_limit,
            })),
            "network": {
                "type": "boolean",
                "default": false,
                "description": "Network access (403 when the server does not allow it).",
            },
            "read_only_rootfs": {"type": "boolean", "default": true},
            "timeout_seconds": nullable(lifetime(settings)),
            "env": env(),
        },
    })
}

/// `POST /v1/sandboxes/{id}/timeout`.
pub fn timeout_request(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["timeout_seconds"],
        "examples": [{"timeout_seconds": 600}],
        "properties": {"timeout_seconds": lifetime(settings)},
    })
}

/// `POST /v1/sandboxes/{id}/exec` and `.../exec/stream`.
pub fn exec_request(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["command"],
        "examples": [{"command": "echo hello"}, {"command": ["ls", "-la"], "timeout_seconds": 5}],
        "properties": {
            "command": {
                "description": "A string run with `/bin/sh -c`, or an argv list.",
                "anyOf": [
                    {"type": "string", "pattern": "\\S"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                ],
            },
            "env": env(),
            "workdir": nullable(json!({
                "type": "string",
                "pattern": "^[^\\u0000]*$",
                "description": "Working directory; empty or null for /workspace, relative paths \
                    are under it.",
            })),
            "timeout_seconds": nullable(json!({
                "type": "number",
                // Below a nanosecond a deadline rounds to nothing, which is refused.
                "minimum": 1e-9,
                "maximum": settings.max_exec_timeout_seconds,
                "description": "Seconds before the command is killed (default: the server's).",
            })),
        },
    })
}

/// A path inside the sandbox: non-empty, without NUL; relative paths are under /workspace.
pub fn path(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "pattern": "^[^\\u0000]+$",
        "description": description,
    })
}

/// A file to write: a relative path (taken under /workspace) that never climbs out of it
/// (no `.` or `..` segment), or an absolute one under `/workspace/`.
pub fn path_in_workspace() -> Value {
    json!({
        "type": "string",
        "description": "Relative (under /workspace, without `.` or `..` segments) or absolute \
            under /workspace/.",
        "pattern": "^(/workspace/)?([^/\\u0000.][^/\\u0000]*/|\\.[^/\\u0000.][^/\\u0000]*/|\\.\\.[^/\\u0000]+/)*([^/\\u0000.][^/\\u0000]*|\\.[^/\\u0000.][^/\\u0000]*|\\.\\.[^/\\u0000]+)$",
    })
}

/// `POST /v1/sandboxes/{id}/snapshots` (optional; a `null` body is no body).
pub fn snapshot_create() -> Value {
    json!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "properties": {
            "name": nullable(json!({
                "type": "string",
                "maxLength": 128,
                "description": "A label for people.",
            })),
            "scope": nullable(json!({
                "type": "string",
                "enum": ["Workspace", "Full"],
                "description": "Workspace (the default): /workspace only. Full: also the root \
                    filesystem's changes of a sandbox with readOnlyRootfs false.",
            })),
        },
    })
}

/// `POST /v1/sandboxes/{id}/rollback`.
pub fn rollback_request() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["snapshot_id"],
        "properties": {"snapshot_id": {"type": "string"}},
    })
}

/// `POST /v1/snapshots/{id}/fork` (optional; a `null` body is no body): overrides of the
/// snapshot's captured spec.
pub fn fork_request(settings: &Settings) -> Value {
    json!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "properties": {
            "timeout_seconds": nullable(lifetime(settings)),
            "network": nullable(json!({"type": "boolean"})),
            "cpus": nullable(cpus(settings)),
            "memory_mb": nullable(memory_mb(settings)),
        },
    })
}
