//! envd's HTTP API: `GET /files` (download), `POST /files` (upload, multipart with one part per
//! file, or one file as `application/octet-stream`) and `/health`, through the data plane's
//! file reads and writes (writes confined to the workspace, as the sandbox user). The same
//! calls at the server's root `/files` take E2B's signed URLs instead of headers.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::envd;
use super::E2bError;
use crate::api::AppState;
use crate::dataplane::SandboxTarget;
use crate::e2b::connect::RpcError;
use crate::e2b::signing::{self, Operation};
use crate::e2b::{multipart, paths};
use crate::resource::Kind;

#[derive(Debug, Default, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

fn rpc(e: RpcError) -> E2bError {
    E2bError::new(e.code.status(), e.message)
}

/// The sandbox of a file call, its token and user checked.
async fn target(
    state: &AppState,
    headers: &HeaderMap,
    query: &FileQuery,
) -> Result<SandboxTarget, E2bError> {
    let sandbox = envd::sandbox(state, headers).map_err(rpc)?;
    paths::check_user(query.username.as_deref()).map_err(|e| rpc(envd::user_error(e)))?;
    envd::data_target(state, sandbox).await.map_err(rpc)
}

pub async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<FileQuery>,
) -> Result<Response, E2bError> {
    let target = target(&state, &headers, &query).await?;
    serve_download(&state, target, &query).await
}

async fn serve_download(
    state: &AppState,
    target: SandboxTarget,
    query: &FileQuery,
) -> Result<Response, E2bError> {
    let path = query
        .path
        .as_deref()
        .map(paths::resolve)
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "path is required"))?;
    let bytes = state
        .dataplane
        .read_file(&target, &path)
        .await
        .map_err(|e| rpc(envd::dataplane_error(e)))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        bytes,
    )
        .into_response())
}

pub async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<FileQuery>,
    body: Body,
) -> Result<Json<Vec<serde_json::Value>>, E2bError> {
    let target = target(&state, &headers, &query).await?;
    serve_upload(&state, target, &headers, &query, body).await
}

async fn serve_upload(
    state: &AppState,
    target: SandboxTarget,
    headers: &HeaderMap,
    query: &FileQuery,
    body: Body,
) -> Result<Json<Vec<serde_json::Value>>, E2bError> {
    if headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
    {
        return Err(E2bError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "compressed uploads (gzip) are not supported by this server yet; upload uncompressed",
        ));
    }
    // One file at the limit, with room for the multipart framing.
    let limit = usize::try_from(state.settings.max_file_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1024 * 1024);
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the upload is larger than this server's limit of {} bytes per file",
                state.settings.max_file_bytes
            ),
        )
    })?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let files: Vec<(String, Vec<u8>)> = if content_type.starts_with("multipart/") {
        let bad =
            |e: multipart::MultipartError| E2bError::new(StatusCode::BAD_REQUEST, e.to_string());
        let boundary = multipart::boundary(content_type).map_err(bad)?;
        let parts = multipart::parse(&bytes, &boundary).map_err(bad)?;
        let single = parts.len() == 1;
        parts
            .into_iter()
            .map(|part| {
                let path = match (&query.path, part.filename) {
                    (Some(p), _) if single => p.clone(),
                    (_, Some(f)) if !f.is_empty() => f,
                    _ => {
                        return Err(E2bError::new(
                            StatusCode::BAD_REQUEST,
                            format!("part {:?} names no file path (its filename)", part.name),
                        ))
                    }
                };
                Ok((path, part.data))
            })
            .collect::<Result<_, _>>()?
    } else {
        let path = query.path.clone().ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                "path is required for an octet-stream upload",
            )
        })?;
        vec![(path, bytes.to_vec())]
    };
    let mut written = Vec::with_capacity(files.len());
    for (path, data) in files {
        let info = state
            .dataplane
            .write_file_in_place(&target, &paths::resolve(&path), data.into(), 0o644)
            .await
            .map_err(|e| rpc(envd::dataplane_error(e)))?;
        written.push(serde_json::json!({"name": info.name, "type": "file", "path": info.path}));
    }
    Ok(Json(written))
}

/// envd answers 204 while it runs; here, while the sandbox is running. Otherwise 502 with E2B's
/// proxy's words ("… was not found"): the SDK's `is_running` is `False`, and its probe after a
/// failed call tells the sandbox is not running (a `SandboxNotRunningException`).
pub async fn health(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<StatusCode, E2bError> {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let not_found = |why: &str| {
        E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!("sandbox {id} was not found: {why}"),
        )
    };
    let token = headers.get("x-access-token").and_then(|v| v.to_str().ok());
    let key = envd::sandbox_key(&state, id, token);
    let sandbox = crate::api::v1::common::live_sandbox(&state.store, &key)
        .map_err(|_| not_found("it does not exist or is being deleted"))?;
    // A paused or stopped sandbox's envd would not answer.
    if crate::e2b::control::state_of(&sandbox) != Some("running") {
        return Err(not_found("it is not running"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox a signed URL was made for: the one whose access token makes its signature.
async fn signed_target(
    state: &AppState,
    query: &FileQuery,
    operation: Operation,
) -> Result<SandboxTarget, E2bError> {
    let denied = |why: &str| E2bError::new(StatusCode::UNAUTHORIZED, why.to_string());
    let signature = query.signature.as_deref().ok_or_else(|| {
        denied("this URL is not signed: use download_url/upload_url of a sandbox")
    })?;
    if let Some(expiration) = query.signature_expiration {
        if expiration <= chrono::Utc::now().timestamp() {
            return Err(denied("signature is already expired"));
        }
    }
    paths::check_user(query.username.as_deref()).map_err(|e| rpc(envd::user_error(e)))?;
    let path = query.path.as_deref().unwrap_or("");
    let user = query.username.as_deref().unwrap_or("");
    let sandbox = state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .find(|s| {
            let token = envd::access_token(state, s);
            let expected =
                signing::file_signature(path, operation, user, &token, query.signature_expiration);
            signing::same(signature, &expected)
        })
        .cloned()
        .ok_or_else(|| denied("the signature is not valid for any sandbox"))?;
    envd::data_target(state, sandbox).await.map_err(rpc)
}

/// `GET /files?…&signature=…`: a download through a signed URL.
pub async fn signed_download(
    State(state): State<AppState>,
    Query(query): Query<FileQuery>,
) -> Result<Response, E2bError> {
    let target = signed_target(&state, &query, Operation::Read).await?;
    serve_download(&state, target, &query).await
}

/// `POST /files?…&signature=…`: an upload through a signed URL.
pub async fn signed_upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<FileQuery>,
    body: Body,
) -> Result<Json<Vec<serde_json::Value>>, E2bError> {
    let target = signed_target(&state, &query, Operation::Write).await?;
    serve_upload(&state, target, &headers, &query, body).await
}
