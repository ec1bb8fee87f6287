//! `GET /apis/agent-sandbox.io/v1/events[/{name}]`: the events the server recorded, listed or
//! watched, optionally only those about one object (`?involvedObject=NAME`). Events are the
//! server's own record, so there is nothing to create, replace or delete: any other method answers
//! 405 saying so (in the router's method fallback). This module reads the store's event log and
//! shapes answers; it records nothing.

use std::collections::HashMap;
use std::convert::Infallible;

use aide::transform::TransformOperation;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use futures::StreamExt;
use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::broadcast;

use super::{flag, line, watch_timeout, PREFIX};
use crate::api::body::{respond, response_format};
use crate::api::error::ApiError;
use crate::api::namespace::RequestNamespace;
use crate::api::openapi::Describe;
use crate::api::AppState;
use crate::authz::Principal;
use crate::resource::{Event, API_VERSION};
use crate::store::{EventChange, EventLog, EventType};

/// The path of the events collection.
pub fn collection() -> String {
    format!("{PREFIX}/events")
}

/// The message of a write to the events: they are not anyone's to write.
pub const READ_ONLY: &str =
    "events are recorded by the server and are read-only: list or watch them with GET";

/// The answer of a list.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventList {
    #[schemars(extend("const" = "agent-sandbox.io/v1"))]
    api_version: &'static str,
    #[schemars(extend("const" = "EventList"))]
    kind: &'static str,
    items: Vec<Event>,
}

/// One line of `?watch=true` on the events.
#[derive(Serialize, JsonSchema)]
pub struct EventWatchEvent {
    /// `ADDED`, `MODIFIED` (recorded again: `count` bumped), `DELETED` (dropped for age or
    /// number), or `ERROR` (the watch fell behind; the object then holds `error`).
    #[serde(rename = "type")]
    event_type: String,
    object: Event,
}

fn involved(params: &HashMap<String, String>) -> Option<&str> {
    params
        .get("involvedObject")
        .map(String::as_str)
        .filter(|name| !name.is_empty())
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(asked): Extension<RequestNamespace>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let timeout = watch_timeout(&params)?;
    let involved = involved(&params).map(str::to_string);
    // An event is the caller's when its object's namespace is (and is the one the path named).
    let reaches = move |event: &Event| shown(&principal, &asked, &event.involved_object.namespace);
    if flag(&params, "watch")? {
        return Ok(watch(state.store.events(), involved, reaches, timeout));
    }
    let mut items = state.store.events().list(involved.as_deref());
    items.retain(|e| reaches(e));
    let list = EventList {
        api_version: API_VERSION,
        kind: "EventList",
        items,
    };
    respond(StatusCode::OK, &list, response_format(&headers))
}

/// Whether an event about an object of `namespace` is shown to this caller on this path.
fn shown(principal: &Principal, asked: &RequestNamespace, namespace: &str) -> bool {
    principal.reaches(namespace) && asked.shows(namespace)
}

pub async fn get_one(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // Events are named on their own; a namespaced path finds those about its namespace's objects.
    let (namespace, name) = crate::resource::split_key(&key);
    let event = state
        .store
        .events()
        .get(name)
        .filter(|e| e.involved_object.namespace == namespace)
        .ok_or_else(|| ApiError::NotFound(format!("Event {name:?} not found")))?;
    respond(StatusCode::OK, &event, response_format(&headers))
}

fn change_line(change: &EventChange) -> Bytes {
    let word = match change.event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    };
    line(&serde_json::json!({"type": word, "object": change.event}))
}

/// `ADDED` for every current event, then changes as they happen, as NDJSON; a watcher too slow
/// to keep up gets one `ERROR` line and the end of the stream. Without `reaches`, no event is
/// the caller's: the stream stays open and silent.
fn watch(
    log: &EventLog,
    involved: Option<String>,
    reaches: impl Fn(&Event) -> bool + Send + Sync + 'static,
    timeout: Option<std::time::Duration>,
) -> Response {
    // Subscribe before listing, so nothing between the two is lost (at worst seen twice).
    let receiver = log.subscribe();
    let initial: Vec<Result<Bytes, Infallible>> = log
        .list(involved.as_deref())
        .into_iter()
        .filter(|e| reaches(e))
        .map(|event| {
            Ok(change_line(&EventChange {
                event_type: EventType::Added,
                event,
            }))
        })
        .collect();
    let reaches = std::sync::Arc::new(reaches);
    let live = futures::stream::unfold(Some((receiver, involved)), move |state| {
        let reaches = reaches.clone();
        async move {
            let (mut receiver, involved) = state?;
            loop {
                match receiver.recv().await {
                    Ok(change) => {
                        let wanted = reaches(&change.event)
                            && involved
                                .as_deref()
                                .is_none_or(|name| change.event.involved_object.name == name);
                        if wanted {
                            return Some((Ok(change_line(&change)), Some((receiver, involved))));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        let error = serde_json::json!({"type": "ERROR", "object": {"error": {
                            "code": "conflict",
                            "message": format!("the watch fell behind by {missed} events; list again and re-watch"),
                        }}});
                        return Some((Ok(line(&error)), None));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let ends = match timeout {
        Some(after) => futures::future::Either::Left(tokio::time::sleep(after)),
        None => futures::future::Either::Right(futures::future::pending::<()>()),
    };
    let stream = futures::stream::iter(initial).chain(live).take_until(ends);
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

type Op<'t> = TransformOperation<'t>;

/// `GET {PREFIX}/events`.
pub fn list_docs(op: Op<'_>) -> Op<'_> {
    op.id("listEvent")
        .summary("List or watch events")
        .description(
            "What happened to resources (Kubernetes' Event shape), oldest first. Recorded by \
             the server, deduplicated (the same object, type, reason and message again bumps \
             `count` and `lastTimestamp`), bounded in number and age, kept across restarts. \
             With `watch=true`, streams NDJSON: `ADDED` for every current event, then \
             `ADDED`/`MODIFIED`/`DELETED` as they happen. Read-only: other methods answer 405.",
        )
        .tag("resources")
        .query(
            "involvedObject",
            false,
            "Only events about the object of this name",
        )
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
        .resource::<EventList>(
            200,
            "The events (or, with watch=true, an NDJSON stream of changes)",
        )
        .ndjson::<EventWatchEvent>(200, "With watch=true: one change per line")
        .errors(&[400])
}

/// `GET {PREFIX}/events/{name}`.
pub fn get_docs(op: Op<'_>) -> Op<'_> {
    op.id("getEvent")
        .summary("Get an event")
        .tag("resources")
        .path_param("name", "Event name (`ev_` + 16 hex digits)")
        .resource::<Event>(200, "The event")
        .errors(&[404])
}
