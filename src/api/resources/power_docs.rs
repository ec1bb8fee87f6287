//! OpenAPI descriptions of the routes that pause, stop and resume sandboxes and of `PATCH`, in
//! one place: `operations()` is added to the resource API's table.

use axum::http::Method;

use super::docs::{ForkResource, SandboxPoolResource, SandboxResource, SnapshotResource};
use super::state::PauseRequest;
use super::PREFIX;
use crate::api::openapi::{Body, Operation};
use crate::resource::Kind;

/// `PATCH` of every kind, and a sandbox's `pause` and `resume`.
pub fn operations() -> Vec<Operation> {
    let tag = "resources";
    let mut ops: Vec<Operation> = Kind::ALL
        .into_iter()
        .map(|kind| {
            let mut op = Operation::new(
                Method::PATCH,
                format!("{PREFIX}/{}/{{name}}", kind.plural()),
                format!("patch{kind}"),
                format!("Patch a {kind}"),
            )
            .description(
                "A JSON merge patch (RFC 7386, `Content-Type: application/merge-patch+json`, as \
                 `kubectl patch --type merge` sends) of the document; `null` removes a field. \
                 The result is validated and checked for immutable fields as a PUT is; a \
                 `metadata.resourceVersion` in the patch must be current (else 409).",
            )
            .tag(tag)
            .path_param("name", "Resource name")
            .query_with_schema(
                "dryRun",
                false,
                "`All`: validate and answer with the would-be object, writing nothing",
                serde_json::json!({"type": "string", "enum": ["All"]}),
            )
            .errors(&[400, 403, 404, 409, 413, 415, 422]);
            op.request = Some(Body::MergePatch);
            op.request_required = true;
            match kind {
                Kind::Sandbox => op.resource::<SandboxResource>(200, "Patched"),
                Kind::Snapshot => op.resource::<SnapshotResource>(200, "Patched"),
                Kind::Fork => op.resource::<ForkResource>(200, "Patched"),
                Kind::SandboxPool => op.resource::<SandboxPoolResource>(200, "Patched"),
            }
        })
        .collect();
    ops.push(
        Operation::new(
            Method::POST,
            format!("{PREFIX}/sandboxes/{{name}}/pause"),
            "pauseSandbox",
            "Pause or stop a sandbox",
        )
        .description(
            "Writes `spec.state` (`Paused` by default: every process frozen, memory kept; \
             `Stopped`: the container stopped, `/workspace` and a writable root filesystem kept) \
             and answers once the controller reports it.",
        )
        .tag(tag)
        .path_param("name", "Sandbox name")
        .optional_json_body::<PauseRequest>()
        .resource::<SandboxResource>(200, "The sandbox, paused or stopped")
        .errors(&[403, 404, 409, 422, 502, 503]),
    );
    ops.push(
        Operation::new(
            Method::POST,
            format!("{PREFIX}/sandboxes/{{name}}/resume"),
            "resumeSandbox",
            "Resume a sandbox",
        )
        .description(
            "Writes `spec.state: Running` and answers once the sandbox runs again: a paused one \
             continues where it was, a stopped one starts its same container again.",
        )
        .tag(tag)
        .path_param("name", "Sandbox name")
        .resource::<SandboxResource>(200, "The sandbox, running")
        .errors(&[403, 404, 409, 502, 503]),
    );
    ops
}
