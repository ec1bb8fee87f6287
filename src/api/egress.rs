//! `GET …/sandboxes/{name}/egress`: a sandbox's egress decision log as NDJSON, one decision a
//! line, oldest first; `follow=true` keeps the response open and streams new decisions.

use std::collections::HashMap;
use std::convert::Infallible;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use super::openapi::Describe;
use super::resources::PREFIX;
use super::AppState;
use crate::egress::Decision;
use crate::resource::Kind;

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new().api_route(
        &format!("{PREFIX}/sandboxes/{{name}}/egress"),
        get_with(decisions, |op| {
            op.id("sandboxEgress")
                .summary("A sandbox's egress decisions")
                .description(
                    "Every lookup and connection the egress gateway decided for the sandbox \
                     (`dns`, `http`, `tls`), allowed or not, with the entry that decided it and \
                     the bytes carried; kept across restarts, bounded per sandbox (the oldest go \
                     first). With `follow=true` the response stays open and new decisions follow \
                     as they happen.",
                )
                .tag("sandboxes")
                .path_param("name", "The sandbox's name")
                .query_with_schema(
                    "follow",
                    false,
                    "Keep streaming new decisions",
                    serde_json::json!({"type": "boolean"}),
                )
                .ndjson::<Decision>(200, "Decisions, one a line")
                .errors(&[400, 404])
        }),
    )
}

fn line(text: &str) -> Bytes {
    let mut text = text.to_string();
    text.push('\n');
    Bytes::from(text)
}

async fn decisions(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let follow = match q.get("follow").map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => {
            return Err(ApiError::InvalidRequest(format!(
                "follow: must be true or false, got {other:?}"
            )))
        }
    };
    if let Some(k) = q.keys().find(|k| k.as_str() != "follow") {
        return Err(ApiError::InvalidRequest(format!(
            "{k}: is not a known query parameter"
        )));
    }
    if state.store.get(Kind::Sandbox, &name).is_none() {
        return Err(ApiError::NotFound(format!("sandbox {name:?} not found")));
    }
    let Some(gateway) = state.egress.clone() else {
        return Err(ApiError::NotFound(
            "this server has no egress gateway".into(),
        ));
    };
    // Subscribed before the kept lines are read, so that nothing falls between them.
    let receiver = follow.then(|| gateway.follow());
    let kept = tokio::task::spawn_blocking({
        let gateway = gateway.clone();
        let name = name.clone();
        move || gateway.decisions(&name)
    })
    .await
    .unwrap_or_default();
    let kept = futures::stream::iter(kept.into_iter().map(|l| Ok::<_, Infallible>(line(&l))));
    let live = futures::stream::unfold(receiver, move |receiver| {
        let name = name.clone();
        async move {
            let mut receiver = receiver?;
            loop {
                match receiver.recv().await {
                    Ok(entry) if entry.0 == name => {
                        return Some((Ok(line(&entry.1)), Some(receiver)));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "an egress follower fell behind");
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        }
    });
    Ok((
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(kept.chain(live)),
    )
        .into_response())
}
