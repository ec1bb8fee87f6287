//! File calls of `/v1`: read, write and list. Query parameters and the reference's checks (and
//! their order) live here; the bytes move through the data plane. A write's body is capped at
//! `max_file_bytes` while it streams in, so an oversized upload is refused without being held.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::common::live_sandbox;
use super::request::{query_params, read_capped, ReadError};
use super::wire::{FileInfo, FileList};
use super::{awake_target, dataplane_error, path_id, valid_path};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::dataplane::paths;

fn required_path(query: &Option<String>) -> Result<String, ApiError> {
    query_params(query.as_deref())
        .remove("path")
        .ok_or_else(|| ApiError::Validation("query.path: Field required".into()))
}

pub async fn read(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let file = required_path(&query)?;
    let sandbox = live_sandbox(&state.store, &id)?;
    let file = valid_path(&file)?;
    // Reads may work on a stopped container (the archive API does), so only a container is needed.
    let target = awake_target(&state, sandbox, false).await?;
    let bytes = state
        .dataplane
        .read_file(&target, &file)
        .await
        .map_err(dataplane_error)?;
    let mut response = (StatusCode::OK, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// Whether `mode` is 3 or 4 octal digits (`^[0-7]{3,4}$`).
fn mode_pattern(mode: &str) -> bool {
    (3..=4).contains(&mode.len()) && mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

pub async fn write(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<FileInfo>, ApiError> {
    let id = path_id(path)?;
    let mut params = query_params(query.as_deref());
    let mode = params.remove("mode").unwrap_or_else(|| "644".into());
    let file = params.remove("path");
    let mut errors = Vec::new();
    if file.is_none() {
        errors.push("query.path: Field required".to_string());
    }
    if !mode_pattern(&mode) {
        errors.push("query.mode: String should match pattern '^[0-7]{3,4}$'".to_string());
    }
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors.join("; ")));
    }
    let file = file.unwrap_or_default();

    let limit = state.settings.max_file_bytes;
    let too_large = || ApiError::PayloadTooLarge(format!("file exceeds {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let contents = match read_capped(body, limit).await {
        Ok(bytes) => bytes,
        Err(ReadError::TooLarge) => return Err(too_large()),
        Err(ReadError::Failed(e)) => {
            return Err(ApiError::InvalidRequest(format!(
                "cannot read the body: {e}"
            )))
        }
    };

    let sandbox = live_sandbox(&state.store, &id)?;
    let file = valid_path(&file)?;
    if !paths::is_strictly_in_workspace(&file) {
        return Err(ApiError::InvalidRequest(
            "writes are limited to files under /workspace".into(),
        ));
    }
    let mode = u32::from_str_radix(&mode, 8).unwrap_or(u32::MAX);
    if mode > 0o777 {
        return Err(ApiError::InvalidRequest(
            "mode must be between 0 and 0o777".into(),
        ));
    }
    let target = awake_target(&state, sandbox, true).await?;
    let info = state
        .dataplane
        .write_file(&target, &file, contents, mode)
        .await
        .map_err(dataplane_error)?;
    Ok(Json(info.into()))
}

pub async fn list(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<FileList>, ApiError> {
    let id = path_id(path)?;
    let dir = query_params(query.as_deref())
        .remove("path")
        .unwrap_or_else(|| paths::WORKSPACE.to_string());
    let sandbox = live_sandbox(&state.store, &id)?;
    let dir = valid_path(&dir)?;
    let target = awake_target(&state, sandbox, true).await?;
    let (normalized, entries) = state
        .dataplane
        .list_files(&target, &dir)
        .await
        .map_err(dataplane_error)?;
    let mut entries: Vec<FileInfo> = entries.into_iter().map(FileInfo::from).collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(FileList {
        path: normalized,
        entries,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        for ok in ["644", "0600", "755", "7777", "000"] {
            assert!(mode_pattern(ok), "{ok}");
        }
        for bad in ["64", "abc", "9", "06444", "", "8644", "+644"] {
            assert!(!mode_pattern(bad), "{bad}");
        }
    }
}
