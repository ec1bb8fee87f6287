//! The HTTP server: the resource API (`/apis/agent-sandbox.io/v1/...`), the `/v1` wire contract,
//! E2B's control API and envd (`/e2b`, see `e2b`),
//! `/healthz`, `/metrics`, `/openapi.json` and the dashboard's routes (`/ui`). Handlers are thin: parse, call the store or the data plane, and
//! map errors in one place ([`error::ApiError`]). Lifecycle changes only ever go through the store;
//! the controller does the Docker work and the handlers wait for its observed status.

pub mod audit;
pub mod auth;
pub mod body;
pub mod e2b;
pub mod egress;
pub mod error;
pub mod health;
pub mod http;
pub mod metrics;
pub mod namespace;
pub mod openapi;
pub mod ports;
pub mod power;
pub mod previews;
pub mod processes;
pub mod processes_ws;
pub mod quota;
pub mod resources;
pub mod root;
pub mod session;
pub mod stats;
pub mod ui;
pub mod v1;

use std::sync::Arc;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::config::Settings;
use crate::dataplane::DataPlane;
use crate::docker::Engine;
use crate::store::Store;
use error::ApiError;
use openapi::Describe;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<Store>,
    pub dataplane: Arc<DataPlane>,
    /// Long-lived processes of sandboxes.
    pub processes: Arc<crate::processes::Processes>,
    /// Declared services and listening ports (a read of a sandbox keeps its ports fresh).
    pub services: Arc<crate::services::Services>,
    pub engine: Arc<dyn Engine>,
    /// Serializes `/v1` creates so that `max_sandboxes` is never overshot by concurrent requests.
    pub create_lock: Arc<tokio::sync::Mutex<()>>,
    /// The API keys requests must present (or none, when authentication is off).
    pub keys: Arc<auth::ApiKeys>,
    /// Where calls on a sandbox and its running commands are reported, for idle policies.
    pub activity: Arc<crate::activity::Activity>,
    /// Connections to ports inside sandboxes (the proxy, previews, port-forward).
    pub ports: Arc<crate::ports::Ports>,
    /// `GET /metrics`, sandbox usage, and where requests are timed.
    pub metrics: Arc<crate::metrics::Exporter>,
    /// The egress gateway, whose decision logs the API serves (none in tests without Docker).
    pub egress: Option<Arc<crate::egress::Gateway>>,
}

/// Every route with its description, for a server with `settings`: health, the OpenAPI document
/// itself, and behind the API key (`keys`) the resource API and `/v1`. The one place routes are
/// added (see `openapi`'s module documentation).
fn documented_routes(
    settings: &Settings,
    keys: Arc<auth::ApiKeys>,
) -> (Router<AppState>, serde_json::Value) {
    openapi::begin();
    let protected = ApiRouter::new()
        .merge(resources::routes())
        .merge(processes::routes())
        .merge(processes_ws::routes())
        .merge(ports::routes())
        .merge(previews::routes())
        .merge(stats::routes())
        .merge(egress::routes())
        .merge(audit::routes())
        .merge(e2b::control_routes())
        .merge(v1::routes(settings));
    // `/metrics` is behind the key unless the settings make it public.
    let (protected, public) = if settings.metrics_public {
        (protected, metrics::routes())
    } else {
        (protected.merge(metrics::routes()), ApiRouter::new())
    };
    let protected = openapi::behind_api_key(protected)
        .route_layer(middleware::from_fn_with_state(keys, auth::require_key));
    let all = ApiRouter::new()
        .api_route(
            "/",
            get_with(root::index, |op| {
                op.id("apiRoots")
                    .summary("Where the APIs of this server are")
                    .tag("health")
                    .json::<root::ApiRoots>(200, "The API roots")
            }),
        )
        .api_route(
            "/healthz",
            get_with(health::healthz, |op| {
                op.id("healthz")
                    .summary("Server and Docker health")
                    .tag("health")
                    .json::<health::Health>(200, "The server and Docker answer")
                    .errors(&[503])
            }),
        )
        .api_route(
            "/openapi.json",
            get_with(openapi_json, |op| {
                op.id("openapi")
                    .summary("This OpenAPI document")
                    .tag("health")
                    .json_object(200, "The OpenAPI 3.1 document")
            }),
        )
        .merge(public)
        // envd proves each call with the sandbox's access token, not the API key.
        .merge(e2b::envd_routes())
        .merge(ui::routes())
        .merge(protected);
    openapi::finish(all)
}

/// The whole HTTP API. Routing comes first (unknown path 404, wrong method 405, both without a
/// key, as the reference does), then authentication for everything but `/`, `/healthz`,
/// `/openapi.json` (and `/metrics` when it is public), then the handler. Every request is timed
/// for the metrics by the route it matched.
pub fn router(state: AppState) -> Router {
    let (routes, document) = documented_routes(&state.settings, state.keys.clone());
    let templates: Arc<Vec<String>> = Arc::new(
        document["paths"]
            .as_object()
            .map(|paths| paths.keys().cloned().collect())
            .unwrap_or_default(),
    );
    let document = OpenApiText(Arc::from(openapi::to_text(&document)));
    let routes: Router = routes
        .layer(middleware::from_fn_with_state(state.clone(), audit::record))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::record,
        ))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(move |request: Request| not_found(templates, request))
        .layer(Extension(document))
        .layer(middleware::from_fn(common_error_shape))
        .layer(middleware::from_fn(e2b::control_error_shape))
        // Sets the default for body extractors; a route that takes larger bodies sets its own
        // `DefaultBodyLimit` closer to the handler, which wins.
        .layer(DefaultBodyLimit::max(body::MAX_JSON_BODY))
        .layer(
            TraceLayer::new_for_http()
                // Method and path only: headers carry API keys and are never logged.
                .make_span_with(|request: &Request| {
                    tracing::info_span!(
                        "http",
                        method = %request.method(),
                        path = %request.uri().path(),
                    )
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .with_state(state.clone());
    // Namespaced paths are rewritten before the routes above see them, so this wraps the
    // router as a whole; a preview host never reaches the API (nor the rewrite).
    Router::new()
        .fallback_service(routes)
        .layer(middleware::from_fn(namespace::rewrite))
        .layer(middleware::from_fn_with_state(
            state,
            previews::preview_hosts,
        ))
}

/// Unknown path: 404, except that a documented route asked for with a trailing slash is
/// redirected (307) to the route, as the reference server does.
async fn not_found(templates: Arc<Vec<String>>, request: Request) -> Response {
    let path = request.uri().path();
    let trimmed = path.trim_end_matches('/');
    if trimmed.len() < path.len() && !trimmed.is_empty() && matches_any(&templates, trimmed) {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost");
        let query = request
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        if let Ok(location) = HeaderValue::from_str(&format!("http://{host}{trimmed}{query}")) {
            return (
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, location)],
            )
                .into_response();
        }
    }
    ApiError::NotFound("Not Found".into()).into_response()
}

/// Whether `path` is one of the documented path templates (`{x}` matching any segment).
fn matches_any(templates: &[String], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    templates.iter().any(|template| {
        let template: Vec<&str> = template.split('/').collect();
        template.len() == segments.len()
            && template
                .iter()
                .zip(&segments)
                .all(|(t, s)| t == s || (t.starts_with('{') && !s.is_empty()))
    })
}

/// The framework adds the `Allow` header to this response. A write to the events says why
/// there is none.
async fn method_not_allowed(uri: axum::http::Uri) -> ApiError {
    let events = resources::events::collection();
    let path = uri.path();
    if path == events || path.starts_with(&format!("{events}/")) {
        return ApiError::MethodNotAllowed(resources::events::READ_ONLY.into());
    }
    ApiError::MethodNotAllowed("Method Not Allowed".into())
}

/// Rewrites error responses that do not already use the common error shape (the framework's
/// own rejections, which are plain text) into it, keeping status and headers.
async fn common_error_shape(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response
        .extensions()
        .get::<crate::ports::proxy::FromSandbox>()
        .is_some()
        || response
            .extensions()
            .get::<ui::DashboardDocument>()
            .is_some()
    {
        // A sandbox's own answer, whatever its status, goes out as it is.
        return response;
    }
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let error = match status {
        StatusCode::BAD_REQUEST => ApiError::InvalidRequest(text),
        StatusCode::UNAUTHORIZED => ApiError::Unauthorized(text),
        StatusCode::FORBIDDEN => ApiError::Forbidden(text),
        StatusCode::NOT_FOUND => ApiError::NotFound(text),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed(text),
        StatusCode::CONFLICT => ApiError::Conflict(text),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(text),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::Validation(text),
        StatusCode::TOO_MANY_REQUESTS => ApiError::LimitExceeded(text),
        StatusCode::BAD_GATEWAY => ApiError::Backend(text),
        StatusCode::SERVICE_UNAVAILABLE => ApiError::Unavailable(text),
        StatusCode::INTERNAL_SERVER_ERROR => ApiError::Internal(text),
        _ => {
            let body = error::ErrorBody {
                error: error::ErrorDetail {
                    code: "http_error".into(),
                    message: text,
                },
            };
            let mut fresh = (status, axum::Json(body)).into_response();
            keep_headers(&mut parts.headers, &mut fresh);
            return fresh;
        }
    };
    let mut fresh = error.into_response();
    *fresh.status_mut() = status;
    keep_headers(&mut parts.headers, &mut fresh);
    fresh
}

fn keep_headers(old: &mut axum::http::HeaderMap, fresh: &mut Response) {
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
    ] {
        old.remove(name);
    }
    for (name, value) in old.drain().filter_map(|(n, v)| n.map(|n| (n, v))) {
        fresh.headers_mut().insert(name, value);
    }
}

/// The OpenAPI document of the whole API for a server with `settings` (its limits are in the
/// schemas): the description of the routes [`router`] serves. `docs/openapi.json` is the one of
/// the default settings.
pub fn openapi_document(settings: &Settings) -> serde_json::Value {
    documented_routes(settings, Arc::new(auth::ApiKeys::disabled())).1
}

/// The document of a server with the default settings, as committed in `docs/openapi.json`.
pub fn default_openapi_document() -> serde_json::Value {
    openapi_document(&Settings::for_tests(Default::default()))
}

/// The served document, made once with the router (the settings do not change while it runs).
#[derive(Clone)]
struct OpenApiText(Arc<str>);

async fn openapi_json(Extension(OpenApiText(text)): Extension<OpenApiText>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        text.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_openapi_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let current = openapi::to_text(&default_openapi_document());
        assert!(
            committed == current,
            "{} is stale: run `cargo run -- openapi docs/openapi.json` to regenerate it",
            path.display()
        );
    }
}
