//! Request and response bodies shared by the handlers: reading a body within its limit (413 in the
//! common error shape, before reading when `Content-Length` already says too much), choosing JSON
//! or YAML from `Content-Type` / `Accept`, and writing either.
//!
//! YAML itself is `resource::yaml`'s business: this module only picks the format.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;

use super::error::ApiError;
use crate::resource::yaml;

/// Largest JSON or YAML request body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

pub const YAML_TYPES: [&str; 3] = ["application/yaml", "application/x-yaml", "text/yaml"];

/// The format of a request or response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

fn media_type(value: &HeaderValue) -> String {
    value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

fn classify(media: &str) -> Option<Format> {
    if media == "application/json"
        || (media.starts_with("application/") && media.ends_with("+json"))
    {
        Some(Format::Json)
    } else if YAML_TYPES.contains(&media) {
        Some(Format::Yaml)
    } else {
        None
    }
}

/// The format of the request body: `None` without a `Content-Type` (then the content decides);
/// 415 for a type that is neither JSON nor YAML.
pub fn request_format(headers: &HeaderMap) -> Result<Option<Format>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let media = media_type(value);
    classify(&media).map(Some).ok_or_else(|| {
        ApiError::UnsupportedMediaType(format!(
            "unsupported Content-Type {media:?}: send application/json or application/yaml"
        ))
    })
}

/// YAML when `Accept` names a YAML type before any JSON type; JSON otherwise.
pub fn response_format(headers: &HeaderMap) -> Format {
    for value in headers.get_all(header::ACCEPT) {
        for item in value.to_str().unwrap_or_default().split(',') {
            let media = item
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            if let Some(format) = classify(&media) {
                return format;
            }
        }
    }
    Format::Json
}

/// Reads a whole request body of at most `limit` bytes.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::PayloadTooLarge(format!("the request body exceeds {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = err.source();
        }
        ApiError::InvalidRequest(format!("cannot read the request body: {e}"))
    })
}

/// A response in the chosen format.
pub fn respond<T: Serialize>(
    status: StatusCode,
    value: &T,
    format: Format,
) -> Result<Response, ApiError> {
    let (content_type, bytes) = match format {
        Format::Json => (
            "application/json",
            serde_json::to_vec(value)
                .map_err(|e| ApiError::Internal(format!("cannot write JSON: {e}")))?,
        ),
        Format::Yaml => (
            "application/yaml",
            yaml::to_yaml(value)
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .into_bytes(),
        ),
    };
    Ok((
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        bytes,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn formats_from_headers() {
        assert_eq!(request_format(&HeaderMap::new()).unwrap(), None);
        assert_eq!(
            request_format(&with(
                header::CONTENT_TYPE,
                "application/json; charset=utf-8"
            ))
            .unwrap(),
            Some(Format::Json)
        );
        for t in YAML_TYPES {
            assert_eq!(
                request_format(&with(header::CONTENT_TYPE, t)).unwrap(),
                Some(Format::Yaml)
            );
        }
        assert!(request_format(&with(header::CONTENT_TYPE, "text/plain")).is_err());
        assert_eq!(response_format(&HeaderMap::new()), Format::Json);
        assert_eq!(
            response_format(&with(
                header::ACCEPT,
                "text/html, application/yaml;q=0.9, */*"
            )),
            Format::Yaml
        );
        assert_eq!(
            response_format(&with(header::ACCEPT, "application/json, application/yaml")),
            Format::Json
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        let err = read_body(&HeaderMap::new(), Body::from(vec![0u8; 11]), 10)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::PayloadTooLarge(_)), "{err:?}");
        let err = read_body(&with(header::CONTENT_LENGTH, "11"), Body::empty(), 10)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::PayloadTooLarge(_)), "{err:?}");
        let ok = read_body(&HeaderMap::new(), Body::from("abc"), 10)
            .await
            .unwrap();
        assert_eq!(&ok[..], b"abc");
    }
}
