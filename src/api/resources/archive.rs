//! A snapshot's export and import as snapshot archives (`.../snapshots/{name}/export`,
//! `.../snapshots/import?name=`): parse, call [`crate::snapshot_archive`], answer. The import
//! reads its body as a stream (the route has no body limit of its own: the import caps it by
//! the settings while it arrives).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::super::body::{respond, response_format};
use super::super::error::ApiError;
use super::super::AppState;
use crate::snapshot_archive::{self, ImportRequest};

pub(super) async fn export(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let export = snapshot_archive::export(&state.store, state.engine.as_ref(), &name).await?;
    let disposition =
        HeaderValue::from_str(&format!("attachment; filename=\"{}\"", export.file_name))
            .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(export.length)),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        Body::from_stream(export.body),
    )
        .into_response())
}

pub(super) async fn import(
    State(state): State<AppState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = params
        .get("name")
        .filter(|name| !name.is_empty())
        .ok_or_else(|| {
            ApiError::InvalidRequest(
                "the query parameter name (the new snapshot's name) is required".into(),
            )
        })?;
    let content_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let request = ImportRequest {
        name,
        content_length,
    };
    let created = snapshot_archive::import(
        &state.store,
        &state.settings,
        state.engine.as_ref(),
        request,
        body.into_data_stream(),
    )
    .await?;
    respond(StatusCode::CREATED, &created, response_format(&headers))
}
