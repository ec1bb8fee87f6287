//! The audit trail over HTTP: the middleware that appends a line for every audited request
//! ([`crate::audit::describe`]) once it is answered, naming the key the auth middleware found
//! (or `-` when none was accepted), and `GET …/audit?since=…` (admin keys only, see
//! [`crate::authz::classify`]) that reads the lines back.

use std::collections::HashMap;
use std::net::SocketAddr;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use super::error::ApiError;
use super::openapi::Describe;
use super::resources::PREFIX;
use super::AppState;
use crate::audit::{describe, AuditRecord};
use crate::authz::{Principal, DEFAULT_NAMESPACE};

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new().api_route(
        &format!("{PREFIX}/audit"),
        get_with(read, |op| {
            op.id("readAudit")
                .summary("The audit trail")
                .description(
                    "Every request that changed something, and every exec, process start, file \
                     write, preview and port forward, oldest first (at most the newest 10,000): \
                     when, which key (its name), namespace, verb, resource, name, HTTP status and \
                     where it came from. `since` (RFC 3339) keeps the lines at or after it. \
                     Admin keys only.",
                )
                .tag("audit")
                .json::<AuditList>(200, "The audit lines")
                .errors(&[400, 403])
        }),
    )
}

#[derive(Serialize, JsonSchema)]
pub struct AuditList {
    pub items: Vec<AuditRecord>,
}

async fn read(
    State(state): State<AppState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<AuditList>, ApiError> {
    if let Some(other) = params.keys().find(|k| k.as_str() != "since") {
        return Err(ApiError::InvalidRequest(format!(
            "{other}: is not a known query parameter"
        )));
    }
    let since = params
        .get("since")
        .map(|s| {
            chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| t.to_utc())
                .map_err(|e| ApiError::InvalidRequest(format!("since: not an RFC 3339 time: {e}")))
        })
        .transpose()?;
    let items = state
        .store
        .audit()
        .read_since(since)
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    Ok(Json(AuditList { items }))
}

/// Middleware: records audited requests once answered.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((verb, resource, key)) = describe(request.method().as_str(), request.uri().path())
    else {
        return next.run(request).await;
    };
    // Paths name objects by their keys: the namespace is in the key, or, for a create, in the
    // path (else it is the caller's first).
    let asked = request
        .extensions()
        .get::<crate::api::namespace::RequestNamespace>()
        .and_then(|n| n.0.clone());
    let (namespace, name) = match crate::resource::split_key(&key) {
        (_, "") => (asked, String::new()),
        (namespace, name) => (Some(namespace.to_string()), name.to_string()),
    };
    let channel = if request.uri().path().starts_with("/v1/") {
        "v1"
    } else if crate::api::auth::presented_key(request.headers()).is_none()
        && crate::api::session::cookie(request.headers(), crate::api::session::KEY_COOKIE).is_some()
    {
        "dashboard"
    } else {
        "api"
    };
    let source = match request.extensions().get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(addr)) => format!("{channel} {}", addr.ip()),
        None => channel.to_string(),
    };
    let response = next.run(request).await;
    let key_name = response
        .extensions()
        .get::<Principal>()
        .map_or("-", |p| p.name())
        .to_string();
    let namespace = namespace.unwrap_or_else(|| {
        response
            .extensions()
            .get::<Principal>()
            .map_or(DEFAULT_NAMESPACE, |p| p.home_namespace())
            .to_string()
    });
    let record = AuditRecord::new(
        chrono::Utc::now(),
        &key_name,
        &namespace,
        (verb, resource, name),
        response.status().as_u16(),
        source,
    );
    state.store.audit().append(&record.to_line());
    response
}
