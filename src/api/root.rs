//! `GET /` (no key): a small JSON naming the API roots, so that a person or a client that opens
//! the server's address learns where to go. It answers from constants and changes nothing.

use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

/// Where the APIs of this server are.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ApiRoots {
    /// Always `agent-sandbox`.
    pub name: String,
    /// The server's version.
    pub version: String,
    /// The API roots, by name: `resources` (the declarative resource API), `v1` (the
    /// agent-sandbox wire contract), `health` and `openapi`.
    pub apis: std::collections::BTreeMap<String, String>,
    /// How to authenticate against everything but `health`, `openapi` and this document.
    pub authentication: String,
}

pub async fn index() -> Json<ApiRoots> {
    Json(ApiRoots {
        name: "agent-sandbox".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        apis: [
            ("resources", "/apis/agent-sandbox.io/v1"),
            ("v1", "/v1"),
            ("health", "/healthz"),
            ("openapi", "/openapi.json"),
        ]
        .into_iter()
        .map(|(name, path)| (name.to_string(), path.to_string()))
        .collect(),
        authentication: "Authorization: Bearer <key>, or X-API-Key: <key>".into(),
    })
}
