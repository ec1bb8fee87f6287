//! `GET /metrics`, and the middleware that times every request for it by the route template it
//! matched (never its own path, which would make a series per sandbox name or file). Whether
//! the route needs the API key is the server's `metrics_public` setting; the router puts it on
//! the right side of the key check (see `documented_routes`).

use std::time::Instant;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::openapi::Describe;
use super::AppState;
use crate::metrics::CONTENT_TYPE;

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new().api_route(
        "/metrics",
        get_with(metrics, |op| {
            op.id("metrics")
                .summary("Metrics in the OpenMetrics text format, for Prometheus")
                .description(
                    "Sandboxes by namespace and phase, reconciles by kind and result with their \
                     durations, the work queue's depth, Docker call latency by operation, \
                     request latency by route template and code, exec and process start \
                     latency, pool members, snapshot bytes, and each running sandbox's CPU \
                     seconds, memory, memory limit, tasks and workspace bytes (read from its \
                     cgroup on this host; absent when the Docker daemon runs elsewhere). Needs \
                     the API key unless the server runs with AGENT_SANDBOX_METRICS_PUBLIC=true.",
                )
                .tag("health")
                .text(200, "application/openmetrics-text", "The current metrics")
                .errors(&[500])
        }),
    )
}

async fn metrics(State(state): State<AppState>) -> Response {
    let exporter = state.metrics.clone();
    // Reads a few files per running sandbox: off the async threads.
    match tokio::task::spawn_blocking(move || exporter.render()).await {
        Ok(text) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE))],
            text,
        )
            .into_response(),
        Err(e) => ApiError::Internal(format!("cannot read the metrics: {e}")).into_response(),
    }
}

/// Middleware: records how long each request took until its response began, by method, the
/// route template it matched and the status code.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let began = Instant::now();
    let method = known_method(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string());
    let response = next.run(request).await;
    state.metrics.metrics().http_request(
        method,
        route.as_deref(),
        response.status().as_u16(),
        began.elapsed(),
    );
    response
}

/// The method's name, or `OTHER` for one the server never routes (so that a client inventing
/// methods cannot invent series).
fn known_method(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}
