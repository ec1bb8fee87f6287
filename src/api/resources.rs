//! The Kubernetes-style resource API: `/apis/agent-sandbox.io/v1/{plural}[/{name}]` to list,
//! watch, create, get, replace, merge-patch (`patch.rs`) and delete `Sandbox`, `Snapshot` and
//! `Fork` documents, a sandbox's `pause` and `resume` (`state.rs`), plus
//! `/apis/agent-sandbox.io/v1/errors` for documents that did not apply.
//!
//! Handlers only parse (through `resource::yaml`), call the store and shape the answer; they never
//! touch Docker. The controller turns what they write into containers and status.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::broadcast;

use super::body::{read_body, request_format, respond, response_format, Format, MAX_JSON_BODY};
use super::error::ApiError;
use super::openapi::Operation;
use super::AppState;
use crate::resource::yaml::{self, DocumentError};
use crate::resource::{is_valid_name, AnyResource, Kind, API_VERSION};
use crate::store::{EventType, Store, WatchEvent, WriteOptions};

mod patch;
mod power_docs;
mod selector;
mod state;

pub use selector::LabelSelector;
pub use state::{PauseMode, PauseRequest};

/// Where the resource API lives.
pub const PREFIX: &str = "/apis/agent-sandbox.io/v1";

/// The routes of the resource API (authentication is added by the caller).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(&format!("{PREFIX}/errors"), get(document_errors))
        .route(&format!("{PREFIX}/{{plural}}"), get(list).post(create))
        .route(
            &format!("{PREFIX}/{{plural}}/{{name}}"),
            get(get_one).put(replace).patch(patch::patch).delete(delete),
        )
        .route(
            &format!("{PREFIX}/sandboxes/{{name}}/pause"),
            axum::routing::post(state::pause),
        )
        .route(
            &format!("{PREFIX}/sandboxes/{{name}}/resume"),
            axum::routing::post(state::resume),
        )
}

fn kind_of(plural: &str) -> Result<Kind, ApiError> {
    Kind::from_plural(plural).ok_or_else(|| {
        ApiError::NotFound(format!(
            "the server has no resource type {plural:?} (expected sandboxes, snapshots or forks)"
        ))
    })
}

fn dry_run(params: &HashMap<String, String>) -> Result<WriteOptions, ApiError> {
    match params.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(WriteOptions::default()),
        Some("All") => Ok(WriteOptions { dry_run: true }),
        Some(other) => Err(ApiError::InvalidRequest(format!(
            "dryRun must be \"All\", got {other:?}"
        ))),
    }
}

fn flag(params: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match params.get(name).map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::InvalidRequest(format!(
            "{name} must be true or false, got {other:?}"
        ))),
    }
}

/// `timeoutSeconds`: how long a watch stays open (unbounded without it).
fn watch_timeout(
    params: &HashMap<String, String>,
) -> Result<Option<std::time::Duration>, ApiError> {
    match params.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => match text.parse::<u32>() {
            Ok(seconds) if seconds >= 1 => Ok(Some(std::time::Duration::from_secs(seconds.into()))),
            _ => Err(ApiError::InvalidRequest(format!(
                "timeoutSeconds must be a whole number of seconds in [1, {}], got {text:?}",
                u32::MAX
            ))),
        },
    }
}

fn selector(params: &HashMap<String, String>) -> Result<LabelSelector, ApiError> {
    LabelSelector::parse(
        params
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or(""),
    )
    .map_err(ApiError::InvalidRequest)
}

/// Parses a request body as a document of `kind`, JSON or YAML by `Content-Type`.
fn parse(headers: &HeaderMap, bytes: &[u8], kind: Kind) -> Result<AnyResource, ApiError> {
    let declared_json = request_format(headers)? == Some(Format::Json);
    if declared_json && !bytes.trim_ascii_start().starts_with(b"{") {
        // Not a JSON object: let the JSON parser say why, with its line.
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ApiError::Validation("the body is not valid UTF-8".into()))?;
        yaml::parse_json(text)?;
        return Err(ApiError::Validation(
            "the body must be a JSON object (a resource document)".into(),
        ));
    }
    Ok(yaml::parse_body(bytes, kind)?)
}

fn generated_name(kind: Kind) -> String {
    let prefix = match kind {
        Kind::Sandbox => "sb",
        Kind::Snapshot => "snap",
        Kind::Fork => "fork",
        Kind::SandboxPool => "pool",
    };
    format!("{prefix}_{}", hex::encode(rand::random::<[u8; 8]>()))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::Validation(format!(
            "metadata.name: {name:?} is not a valid name (lowercase letters, digits, '-' and '_', \
             at most 63, starting and ending with a letter or digit)"
        )))
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    api_version: &'static str,
    kind: String,
    items: Vec<&'a AnyResource>,
}

async fn list(
    State(state): State<AppState>,
    Path(plural): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = kind_of(&plural)?;
    let selector = selector(&params)?;
    let timeout = watch_timeout(&params)?;
    if flag(&params, "watch")? {
        return Ok(watch(&state.store, kind, selector, timeout));
    }
    let entries = state.store.list(kind);
    let items = entries
        .iter()
        .map(|e| &e.resource)
        .filter(|r| selector.matches(&r.metadata().labels))
        .collect();
    let list = List {
        api_version: API_VERSION,
        kind: format!("{kind}List"),
        items,
    };
    respond(StatusCode::OK, &list, response_format(&headers))
}

#[derive(Serialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    event_type: &'a str,
    object: serde_json::Value,
}

fn event_line(event_type: EventType, resource: &AnyResource) -> Bytes {
    let word = match event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    };
    line(&EventLine {
        event_type: word,
        object: resource.to_json(),
    })
}

fn line<T: Serialize>(value: &T) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// `?watch=true`: an `ADDED` line for every current object, then live changes, as NDJSON. A
/// watcher too slow to keep up gets one `ERROR` line and the end of the stream, and re-lists.
/// With a `timeout`, the stream ends (cleanly) when it has passed.
fn watch(
    store: &Store,
    kind: Kind,
    selector: LabelSelector,
    timeout: Option<std::time::Duration>,
) -> Response {
    // Subscribe before listing, so nothing between the two is lost (at worst seen twice).
    let receiver = store.subscribe();
    let initial: Vec<Result<Bytes, Infallible>> = store
        .list(kind)
        .iter()
        .filter(|e| selector.matches(&e.resource.metadata().labels))
        .map(|e| Ok(event_line(EventType::Added, &e.resource)))
        .collect();
    let live = futures::stream::unfold(Some((receiver, selector)), move |state| async move {
        let (mut receiver, selector) = state?;
        loop {
            match receiver.recv().await {
                Ok(WatchEvent {
                    event_type,
                    resource,
                }) => {
                    if resource.kind() == kind && selector.matches(&resource.metadata().labels) {
                        let bytes = event_line(event_type, &resource);
                        return Some((Ok(bytes), Some((receiver, selector))));
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

async fn create(
    State(state): State<AppState>,
    Path(plural): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let kind = kind_of(&plural)?;
    let opts = dry_run(&params)?;
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let mut resource = parse(&headers, &bytes, kind)?;
    if resource.name().is_empty() {
        resource.metadata_mut().name = generated_name(kind);
    }
    check_name(resource.name())?;
    let created = state
        .store
        .write(move |store| store.create(resource, opts))
        .await?;
    respond(StatusCode::CREATED, &created, response_format(&headers))
}

async fn get_one(
    State(state): State<AppState>,
    Path((plural, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = kind_of(&plural)?;
    let entry = state.store.get(kind, &name).ok_or_else(|| {
        ApiError::from(crate::store::StoreError::NotFound {
            kind,
            name: name.clone(),
        })
    })?;
    respond(StatusCode::OK, &entry.resource, response_format(&headers))
}

async fn replace(
    State(state): State<AppState>,
    Path((plural, name)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let kind = kind_of(&plural)?;
    let opts = dry_run(&params)?;
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let mut resource = parse(&headers, &bytes, kind)?;
    if resource.name().is_empty() {
        resource.metadata_mut().name = name.clone();
    } else if resource.name() != name {
        return Err(ApiError::InvalidRequest(format!(
            "metadata.name {:?} does not match the name in the URL ({name:?})",
            resource.name()
        )));
    }
    let replaced = state
        .store
        .write(move |store| store.replace(resource, opts))
        .await?;
    respond(StatusCode::OK, &replaced, response_format(&headers))
}

async fn delete(
    State(state): State<AppState>,
    Path((plural, name)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = kind_of(&plural)?;
    let opts = dry_run(&params)?;
    let deleted = state
        .store
        .write(move |store| store.delete(kind, &name, opts))
        .await?;
    // Deletion finishes asynchronously: the controller removes what the resource owns first.
    respond(StatusCode::ACCEPTED, &deleted, response_format(&headers))
}

/// One document that did not apply, as `GET .../errors` reports it.
#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct DocumentErrorInfo {
    /// The manifest file, when the document came from one.
    pub file: Option<String>,
    /// 1-based line in that file.
    pub line: Option<usize>,
    /// The offending field, dotted (`spec.cpus`).
    pub field: Option<String>,
    pub message: String,
    /// Kind of the document, when it could be read.
    pub kind: Option<String>,
    /// Name of the document, when it could be read.
    pub name: Option<String>,
}

impl From<&DocumentError> for DocumentErrorInfo {
    fn from(e: &DocumentError) -> DocumentErrorInfo {
        DocumentErrorInfo {
            file: e.file.as_ref().map(|f| f.display().to_string()),
            line: e.line,
            field: e.field.clone(),
            message: e.message.clone(),
            kind: e.identity.as_ref().map(|(k, _)| k.to_string()),
            name: e.identity.as_ref().map(|(_, n)| n.clone()),
        }
    }
}

#[derive(Serialize, JsonSchema)]
pub struct DocumentErrors {
    pub errors: Vec<DocumentErrorInfo>,
}

async fn document_errors(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let errors = state
        .store
        .document_errors()
        .iter()
        .map(DocumentErrorInfo::from)
        .collect();
    respond(
        StatusCode::OK,
        &DocumentErrors { errors },
        response_format(&headers),
    )
}

mod docs;

/// The resource API's routes, for the OpenAPI document.
pub fn operations() -> Vec<Operation> {
    let mut ops = Vec::new();
    for kind in Kind::ALL {
        ops.extend(docs::operations_of(kind));
    }
    ops.extend(power_docs::operations());
    ops.push(
        Operation::new(
            Method::GET,
            format!("{PREFIX}/errors"),
            "listDocumentErrors",
            "Documents that did not apply",
        )
        .description(
            "Manifests (in the data directory or a watched folder) that failed to parse or \
             validate, or lost a name clash, with file, line and field.",
        )
        .tag("resources")
        .resource::<DocumentErrors>(200, "The current document errors"),
    );
    ops
}
