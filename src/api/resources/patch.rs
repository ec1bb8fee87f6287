//! `PATCH` with a JSON merge patch (RFC 7386, `application/merge-patch+json`), as `kubectl patch
//! --type merge` sends it: the patch is merged into the current document (status aside), and the
//! result goes through the same parsing, validation and immutable-field checks as a `PUT`.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Map, Value};

use super::docs::DocumentedKind;
use crate::api::body::{read_body, respond, response_format, MAX_JSON_BODY};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::resource::yaml;
use crate::store::StoreError;

/// The media type a merge patch must be sent as.
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// Merges `patch` into `target` as RFC 7386 says: objects merge key by key, `null` removes a
/// key, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Reads a merge patch body: a JSON object.
pub fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ApiError::Validation("the patch is not valid UTF-8".into()))?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::Validation(format!(
            "the patch is not valid JSON (line {}): {e}",
            e.line()
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::Validation(
            "a merge patch must be a JSON object".into(),
        ));
    }
    Ok(value)
}

/// The document a patch applies to: the current one without its status (which the server owns;
/// a patch naming it is refused when the result is parsed).
pub fn apply(current: Value, patch: &Value) -> Value {
    let mut document = current;
    if let Value::Object(fields) = &mut document {
        fields.remove("status");
    }
    merge(&mut document, patch);
    document
}

/// How often a patch is merged again into a document that changed under it.
const ATTEMPTS: usize = 8;

/// `PATCH {PREFIX}/{plural}/{name}`.
pub(super) async fn patch<K: DocumentedKind>(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let kind = K::KIND;
    let opts = super::dry_run(&params)?;
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    if media != MERGE_PATCH {
        return Err(ApiError::UnsupportedMediaType(format!(
            "PATCH takes a JSON merge patch: send Content-Type {MERGE_PATCH} (got {media:?})"
        )));
    }
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let patch = parse(&bytes)?;
    // A patch that names a resourceVersion applies to that version only; one that does not is
    // merged again into whatever the document became meanwhile.
    let pinned = patch
        .pointer("/metadata/resourceVersion")
        .is_some_and(|v| !v.is_null());
    let mut attempt = 0;
    loop {
        let entry = state.store.get(kind, &name).ok_or_else(|| {
            ApiError::from(StoreError::NotFound {
                kind,
                name: name.clone(),
            })
        })?;
        let document = apply(entry.resource.to_json(), &patch);
        let mut resource = yaml::value_to_resource(document, Some(kind), None)?;
        if resource.key() != name {
            let (_, asked) = crate::resource::split_key(&name);
            return Err(ApiError::InvalidRequest(format!(
                "metadata.name and metadata.namespace cannot be patched (the URL names {asked:?})"
            )));
        }
        super::check_identity(&mut resource, &name)?;
        let _admission = crate::api::quota::lock_for(&state, kind).await;
        crate::api::quota::check(&state, &resource)?;
        let written = state
            .store
            .write(move |store| store.replace(resource, opts))
            .await;
        match written {
            Err(StoreError::Conflict { .. }) if !pinned && attempt + 1 < ATTEMPTS => attempt += 1,
            Err(error) => return Err(error.into()),
            Ok(patched) => return respond(StatusCode::OK, &patched, response_format(&headers)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_as_rfc_7386_says() {
        // The examples of RFC 7386, section 3.
        let mut doc = json!({"title": "Goodbye!", "author": {"givenName": "John",
            "familyName": "Doe"}, "tags": ["example", "sample"], "content": "x"});
        merge(
            &mut doc,
            &json!({"title": "Hello!", "phoneNumber": "+01-123-456-7890",
                "author": {"familyName": null}, "tags": ["example"]}),
        );
        assert_eq!(
            doc,
            json!({"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
                "content": "x", "phoneNumber": "+01-123-456-7890"})
        );
        let mut scalar = json!({"a": "b"});
        merge(&mut scalar, &json!({"a": {"bb": {"ccc": null}}}));
        assert_eq!(scalar, json!({"a": {"bb": {}}}));
    }

    #[test]
    fn the_status_is_not_patched_and_only_objects_are_patches() {
        let doc = apply(
            json!({"spec": {"cpus": 1}, "status": {"phase": "Running"}}),
            &json!({"spec": {"state": "Paused"}}),
        );
        assert_eq!(doc, json!({"spec": {"cpus": 1, "state": "Paused"}}));
        assert!(parse(b"[1]").is_err());
        assert!(parse(b"{").is_err());
        assert!(parse(br#"{"spec": {}}"#).is_ok());
    }
}
