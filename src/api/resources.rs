//! The Kubernetes-style resource API: `/apis/agent-sandbox.io/v1/{plural}[/{name}]` to list,
//! watch, create, get, replace, merge-patch (`patch.rs`) and delete `Sandbox`, `Snapshot` and
//! `Fork` documents, a sandbox's `pause` and `resume` (`state.rs`), plus
//! `/apis/agent-sandbox.io/v1/errors` for documents that did not apply and the read-only
//! `/apis/agent-sandbox.io/v1/events` (`events.rs`).
//!
//! Each kind has its own routes (`.../sandboxes`, `.../snapshots`, ...), each documented with that
//! kind's schemas (`docs.rs`): a handler generic over the kind fixes it and calls the shared code.
//! Any other `{plural}` answers 404 naming the kinds the server has.
//!
//! Handlers only parse (through `resource::yaml`), call the store and shape the answer; they never
//! touch Docker. The controller turns what they write into containers and status.

use std::collections::HashMap;
use std::convert::Infallible;

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Extension;
use bytes::Bytes;
use futures::StreamExt;
use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::broadcast;

use super::body::{read_body, request_format, respond, response_format, Format, MAX_JSON_BODY};
use super::error::ApiError;
use super::namespace::RequestNamespace;
use super::v1::wait::Poll;
use super::AppState;
use crate::authz::{namespace_of, Principal};
use crate::resource::yaml::{self, DocumentError};
use crate::resource::{
    is_valid_key, is_valid_name, split_key, AnyResource, Kind, API_VERSION, DEFAULT_NAMESPACE,
};
use crate::store::{EventType, Store, WatchEvent, WriteOptions};

mod archive;
mod docs;
pub mod events;
mod patch;
mod selector;
mod state;

use docs::{
    DocumentedKind, ForkResource, ResourceQuotaResource, SandboxPoolResource, SandboxResource,
    SandboxTemplateResource, SecretResource, SnapshotResource, WebhookResource,
};

pub use selector::LabelSelector;
pub use state::{PauseMode, PauseRequest};

/// Where the resource API lives.
pub const PREFIX: &str = "/apis/agent-sandbox.io/v1";

/// The routes of the resource API, each with its description (authentication is added by the
/// caller).
pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new()
        .api_route(
            &format!("{PREFIX}/errors"),
            get_with(document_errors, docs::document_errors),
        )
        .api_route(
            &events::collection(),
            get_with(events::list, events::list_docs),
        )
        .api_route(
            &format!("{}/{{name}}", events::collection()),
            get_with(events::get_one, events::get_docs),
        )
        .merge(kind_routes::<SandboxResource>())
        .merge(kind_routes::<SnapshotResource>())
        .merge(kind_routes::<ForkResource>())
        .merge(kind_routes::<SandboxPoolResource>())
        .merge(kind_routes::<SecretResource>())
        .merge(kind_routes::<WebhookResource>())
        .merge(kind_routes::<SandboxTemplateResource>())
        .merge(kind_routes::<ResourceQuotaResource>())
        .api_route(
            &format!("{PREFIX}/sandboxes/{{name}}/pause"),
            post_with(state::pause, docs::pause),
        )
        .api_route(
            &format!("{PREFIX}/sandboxes/{{name}}/resume"),
            post_with(state::resume, docs::resume),
        )
        .api_route(
            &format!("{PREFIX}/snapshots/{{name}}/export"),
            get_with(archive::export, docs::export_snapshot),
        )
        .api_route(
            &format!("{PREFIX}/snapshots/import"),
            post_with(archive::import, docs::import_snapshot)
                // The import caps its body itself, by the settings, while it streams in.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        // Behind the kinds' own routes: a type the server does not have (undocumented).
        .route(&format!("{PREFIX}/{{plural}}"), any(unknown_kind))
        .route(&format!("{PREFIX}/{{plural}}/{{name}}"), any(unknown_kind))
}

/// List, watch, create, get, replace, patch and delete of one kind.
fn kind_routes<K: DocumentedKind>() -> ApiRouter<AppState> {
    let collection = format!("{PREFIX}/{}", K::KIND.plural());
    ApiRouter::new()
        .api_route(
            &collection,
            get_with(list::<K>, docs::list::<K>).post_with(create::<K>, docs::create::<K>),
        )
        .api_route(
            &format!("{collection}/{{name}}"),
            get_with(get_one::<K>, docs::get::<K>)
                .put_with(replace::<K>, docs::replace::<K>)
                .patch_with(patch::patch::<K>, docs::patch::<K>)
                .delete_with(delete::<K>, docs::delete::<K>),
        )
}

async fn unknown_kind(Path(params): Path<HashMap<String, String>>) -> ApiError {
    let plural = params.get("plural").map(String::as_str).unwrap_or_default();
    ApiError::NotFound(format!(
        "the server has no resource type {plural:?} (expected {})",
        Kind::ALL.map(Kind::plural).join(", ")
    ))
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
    // An empty value is refused as any other that is not a number (the document says integer).
    match params.get("timeoutSeconds").map(String::as_str) {
        None => Ok(None),
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

/// [`parse`], and for a `Secret` also the write-only `value` beside its spec. A Secret written
/// through the API carries its value in the request: `spec.valueFrom` (a server file or
/// variable) is for Secrets declared in a folder by whoever runs the server.
fn parse_with_value(
    headers: &HeaderMap,
    bytes: &[u8],
    kind: Kind,
) -> Result<(AnyResource, Option<String>), ApiError> {
    if kind != Kind::Secret {
        return Ok((parse(headers, bytes, kind)?, None));
    }
    request_format(headers)?;
    let (resource, value) = yaml::parse_secret_body(bytes)?;
    if resource
        .as_secret()
        .is_some_and(|s| s.spec.value_from.is_some())
    {
        return Err(ApiError::Validation(
            "spec.valueFrom: only a Secret declared in a watched folder reads its value from \
             the server's environment or files; through the API, give `value`"
                .into(),
        ));
    }
    Ok((resource, value))
}

fn generated_name(kind: Kind) -> String {
    let prefix = match kind {
        Kind::Sandbox => "sb",
        Kind::Snapshot => "snap",
        Kind::Fork => "fork",
        Kind::SandboxPool => "pool",
        Kind::Secret => "secret",
        Kind::Webhook => "webhook",
        Kind::SandboxTemplate => "template",
        Kind::ResourceQuota => "quota",
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

/// Puts a new object in its namespace: the one its path named, else the one its document names,
/// else the caller's first. A document naming another namespace than its path is refused, and a
/// caller may create only in namespaces it reaches.
fn place(
    resource: &mut AnyResource,
    asked: &RequestNamespace,
    principal: &Principal,
) -> Result<(), ApiError> {
    let declared = resource.namespace().to_string();
    let namespace = match &asked.0 {
        Some(path) if declared == DEFAULT_NAMESPACE || declared == *path => path.clone(),
        Some(path) => {
            return Err(ApiError::InvalidRequest(format!(
                "metadata.namespace {declared:?} does not match the namespace in the URL \
                 ({path:?})"
            )))
        }
        None if declared == DEFAULT_NAMESPACE => principal.home_namespace().to_string(),
        None => declared,
    };
    if !principal.reaches(&namespace) {
        return Err(ApiError::Forbidden(format!(
            "key {:?} may not create objects in namespace {namespace:?}",
            principal.name()
        )));
    }
    resource.metadata_mut().namespace = namespace;
    Ok(())
}

/// Checks that a document sent to the object of key `key` (from the URL) names that object,
/// filling in the name and namespace it leaves out.
pub(crate) fn check_identity(resource: &mut AnyResource, key: &str) -> Result<(), ApiError> {
    let (namespace, name) = split_key(key);
    let meta = resource.metadata_mut();
    if meta.name.is_empty() {
        meta.name = name.to_string();
    } else if meta.name != name {
        return Err(ApiError::InvalidRequest(format!(
            "metadata.name {:?} does not match the name in the URL ({name:?})",
            meta.name
        )));
    }
    if meta.namespace == DEFAULT_NAMESPACE {
        meta.namespace = namespace.to_string();
    } else if meta.namespace != namespace {
        return Err(ApiError::InvalidRequest(format!(
            "metadata.namespace {:?} does not match the namespace in the URL ({namespace:?})",
            meta.namespace
        )));
    }
    Ok(())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    api_version: &'static str,
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<ListMeta>,
    items: Vec<&'a AnyResource>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_: Option<String>,
    remaining_item_count: usize,
}

/// The largest `limit` of a list.
pub(crate) const MAX_LIMIT: u32 = 10_000;

/// `limit`, when given.
fn limit(params: &HashMap<String, String>) -> Result<Option<usize>, ApiError> {
    match params.get("limit").map(String::as_str) {
        None => Ok(None),
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(Some(n as usize)),
            _ => Err(ApiError::InvalidRequest(format!(
                "limit must be a whole number in [1, {MAX_LIMIT}], got {text:?}"
            ))),
        },
    }
}

/// Where a page ends in the list's order (creation time, then key): `<unix nanos>.<key>`.
fn continue_token(resource: &AnyResource) -> String {
    let nanos = resource
        .metadata()
        .creation_timestamp
        .and_then(|t| t.timestamp_nanos_opt())
        .unwrap_or(0);
    format!("{nanos}.{}", resource.key())
}

/// A place in a list's order: creation time, then key.
type ListPosition = (Option<chrono::DateTime<chrono::Utc>>, String);

/// The position after which `continue` resumes: the key the list is ordered by.
fn continue_from(params: &HashMap<String, String>) -> Result<Option<ListPosition>, ApiError> {
    let Some(token) = params.get("continue").filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::InvalidRequest(format!(
            "continue must be the metadata.continue of a previous page, got {token:?}"
        ))
    };
    let (nanos, name) = token.split_once('.').ok_or_else(invalid)?;
    // Any whole number the document's pattern allows; beyond i64 it lies past every object.
    let nanos: i128 = nanos.parse().map_err(|_| invalid())?;
    let nanos = nanos.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    if !is_valid_key(name) {
        return Err(invalid());
    }
    let at = (nanos != 0).then(|| chrono::DateTime::from_timestamp_nanos(nanos));
    Ok(Some((at, name.to_string())))
}

async fn list<K: DocumentedKind>(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(asked): Extension<RequestNamespace>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let selector = selector(&params)?;
    let timeout = watch_timeout(&params)?;
    // Checked even for a watch, which pages nothing: a bad value is still a bad request.
    let limit = limit(&params)?;
    let after = continue_from(&params)?;
    if flag(&params, "watch")? {
        return Ok(watch(
            &state.store,
            kind,
            selector,
            principal,
            asked,
            timeout,
        ));
    }
    let entries = state.store.list(kind);
    let all: Vec<&AnyResource> = entries
        .iter()
        .map(|e| &e.resource)
        .filter(|r| principal.reaches(namespace_of(r.metadata())))
        .filter(|r| asked.shows(namespace_of(r.metadata())))
        .filter(|r| selector.matches(&r.metadata().labels))
        .filter(|r| {
            // The store lists by creation time, then key; a page resumes past its token.
            after.as_ref().is_none_or(|(at, key)| {
                (r.metadata().creation_timestamp, r.key()) > (*at, key.clone())
            })
        })
        .collect();
    let (items, metadata) = match limit {
        Some(limit) if all.len() > limit => {
            let items = all[..limit].to_vec();
            let metadata = ListMeta {
                continue_: items.last().map(|r| continue_token(r)),
                remaining_item_count: all.len() - limit,
            };
            (items, Some(metadata))
        }
        Some(_) => (
            all,
            Some(ListMeta {
                continue_: None,
                remaining_item_count: 0,
            }),
        ),
        None => (all, None),
    };
    let list = List {
        api_version: API_VERSION,
        kind: format!("{kind}List"),
        metadata,
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
    principal: Principal,
    asked: RequestNamespace,
    timeout: Option<std::time::Duration>,
) -> Response {
    // Subscribe before listing, so nothing between the two is lost (at worst seen twice).
    let receiver = store.subscribe();
    let visible = move |r: &AnyResource| {
        let namespace = namespace_of(r.metadata());
        principal.reaches(namespace)
            && asked.shows(namespace)
            && selector.matches(&r.metadata().labels)
    };
    let initial: Vec<Result<Bytes, Infallible>> = store
        .list(kind)
        .iter()
        .filter(|e| visible(&e.resource))
        .map(|e| Ok(event_line(EventType::Added, &e.resource)))
        .collect();
    let live = futures::stream::unfold(Some((receiver, visible)), move |state| async move {
        let (mut receiver, visible) = state?;
        loop {
            match receiver.recv().await {
                Ok(WatchEvent {
                    event_type,
                    resource,
                }) => {
                    if resource.kind() == kind && visible(&resource) {
                        let bytes = event_line(event_type, &resource);
                        return Some((Ok(bytes), Some((receiver, visible))));
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

async fn create<K: DocumentedKind>(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(asked): Extension<RequestNamespace>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let opts = dry_run(&params)?;
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let (mut resource, secret_value) = parse_with_value(&headers, &bytes, kind)?;
    if resource.name().is_empty() {
        resource.metadata_mut().name = generated_name(kind);
    }
    check_name(resource.name())?;
    place(&mut resource, &asked, &principal)?;
    let _admission = super::quota::lock_for(&state, kind).await;
    super::quota::check(&state, &resource)?;
    let created = state
        .store
        .write(move |store| {
            // The value is in place before the Secret exists, so the controller sees it at once;
            // a dry run first keeps a refused create from touching another Secret's value.
            if let (Some(value), false) = (secret_value, opts.dry_run) {
                store.create(resource.clone(), WriteOptions { dry_run: true })?;
                store.set_secret_value(&resource.key(), value.as_bytes())?;
            }
            store.create(resource, opts)
        })
        .await?;
    respond(StatusCode::CREATED, &created, response_format(&headers))
}

async fn get_one<K: DocumentedKind>(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let entry = state.store.get(kind, &name).ok_or_else(|| {
        ApiError::from(crate::store::StoreError::NotFound {
            kind,
            name: name.clone(),
        })
    })?;
    if let Some(sandbox) = entry.resource.as_sandbox() {
        state.services.looked_at(sandbox);
    }
    respond(StatusCode::OK, &entry.resource, response_format(&headers))
}

async fn replace<K: DocumentedKind>(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let opts = dry_run(&params)?;
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let (mut resource, secret_value) = parse_with_value(&headers, &bytes, kind)?;
    check_identity(&mut resource, &name)?;
    let _admission = super::quota::lock_for(&state, kind).await;
    super::quota::check(&state, &resource)?;
    let replaced = state
        .store
        .write(move |store| {
            if let (Some(value), false) = (secret_value, opts.dry_run) {
                store.replace(resource.clone(), WriteOptions { dry_run: true })?;
                store.set_secret_value(&resource.key(), value.as_bytes())?;
            }
            store.replace(resource, opts)
        })
        .await?;
    respond(StatusCode::OK, &replaced, response_format(&headers))
}

async fn delete<K: DocumentedKind>(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let opts = dry_run(&params)?;
    // A sandbox's deletion is waited for unless `wait=false`: it is short (its processes killed
    // and its container renamed away; the removal finishes in the background).
    let wait = kind == Kind::Sandbox
        && !opts.dry_run
        && (!params.contains_key("wait") || flag(&params, "wait")?);
    // Subscribed before the write, so the controller's finalization cannot slip by unseen.
    let events = state.store.subscribe();
    let target = name.clone();
    let deleted = state
        .store
        .write(move |store| store.delete(kind, &target, opts))
        .await?;
    if wait && sandbox_gone(&state.store, events, &name, &deleted).await {
        return respond(StatusCode::OK, &deleted, response_format(&headers));
    }
    // Deletion finishes asynchronously: the controller removes what the resource owns first.
    respond(StatusCode::ACCEPTED, &deleted, response_format(&headers))
}

/// How long a sandbox's DELETE waits for the controller before it answers 202 instead.
const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether sandbox `name` (the one `deleted` is: a sandbox of that name created since is
/// another) is gone from the store within [`DELETE_WAIT`].
async fn sandbox_gone(
    store: &Store,
    events: broadcast::Receiver<WatchEvent>,
    name: &str,
    deleted: &AnyResource,
) -> bool {
    let uid = deleted.metadata().uid.clone();
    let waited = super::v1::wait::until(
        store,
        events,
        Kind::Sandbox,
        name,
        DELETE_WAIT,
        "the deletion",
        |entry| match entry {
            Some(e) if e.resource.metadata().uid == uid => Poll::Pending(String::new()),
            _ => Poll::Done(()),
        },
    )
    .await;
    waited.is_ok()
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
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // An error is shown to the keys of its document's namespace; one whose document could not
    // be read far enough to tell is shown to keys of every namespace only.
    let errors = state
        .store
        .document_errors()
        .iter()
        .filter(|e| match &e.identity {
            Some((_, key)) => principal.reaches(split_key(key).0),
            None => principal.reaches("*"),
        })
        .map(DocumentErrorInfo::from)
        .collect();
    respond(
        StatusCode::OK,
        &DocumentErrors { errors },
        response_format(&headers),
    )
}
