//! Reading `/v1` requests: JSON bodies only under a JSON content type (as the reference does),
//! bodies capped while they stream in, and query strings decoded the way its clients encode them.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde_json::{Map, Value};

use crate::api::error::ApiError;

/// Largest JSON body accepted; the bodies of this API are a few hundred bytes.
pub const MAX_JSON_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why a capped body could not be read.
#[derive(Debug)]
pub enum ReadError {
    TooLarge,
    Failed(String),
}

/// Reads a body, refusing (without buffering further) as soon as it passes `limit` bytes.
pub async fn read_capped(body: Body, limit: u64) -> Result<Bytes, ReadError> {
    let mut body = body;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Failed(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() as u64).saturating_add(data.len() as u64) > limit {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn validation(loc: &str, msg: &str) -> ApiError {
    ApiError::Validation(format!("{loc}: {msg}"))
}

const NOT_AN_OBJECT: &str = "Input should be a valid dictionary or object to extract fields from";

/// Whether the content type asks for JSON parsing: `application/json` or `application/*+json`,
/// parameters ignored.
fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.split_once('/') {
        Some(("application", sub)) => sub == "json" || sub.ends_with("+json"),
        _ => false,
    }
}

/// Reads a JSON object body. `Ok(None)` means no body (or `null` where the body is optional).
pub async fn json_object(
    headers: &HeaderMap,
    body: Body,
    required: bool,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let bytes = match read_capped(body, MAX_JSON_BODY_BYTES as u64).await {
        Ok(bytes) => bytes,
        Err(ReadError::TooLarge) => {
            return Err(ApiError::PayloadTooLarge(format!(
                "request body exceeds {MAX_JSON_BODY_BYTES} bytes"
            )))
        }
        Err(ReadError::Failed(e)) => {
            return Err(validation("body", &format!("cannot read the body: {e}")))
        }
    };
    parse_object(is_json_content_type(headers), &bytes, required)
}

/// The parsing half of [`json_object`], separate so that it can be tested without HTTP.
pub fn parse_object(
    json_content_type: bool,
    bytes: &[u8],
    required: bool,
) -> Result<Option<Map<String, Value>>, ApiError> {
    if bytes.is_empty() {
        return if required {
            Err(validation("body", "Field required"))
        } else {
            Ok(None)
        };
    }
    if !json_content_type {
        // The reference treats such a body as raw text, which is not an object.
        return Err(validation(
            "body",
            &format!("{NOT_AN_OBJECT} (send Content-Type: application/json)"),
        ));
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| validation("body", &format!("JSON decode error: {e}")))?;
    match value {
        Value::Object(map) => Ok(Some(map)),
        Value::Null if !required => Ok(None),
        _ => Err(validation("body", NOT_AN_OBJECT)),
    }
}

/// One query string, decoded: `+` is a space, `%XX` a byte; invalid UTF-8 is replaced. A
/// parameter given twice keeps its last value, as the reference does.
pub fn query_params(raw: Option<&str>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(percent_decode(key), percent_decode(value));
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let pair = bytes
                    .get(i + 1)
                    .copied()
                    .and_then(hex)
                    .zip(bytes.get(i + 2).copied().and_then(hex));
                match pair {
                    Some((hi, lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_need_json_objects() {
        assert!(parse_object(true, b"", true).is_err());
        assert!(parse_object(true, b"", false).unwrap().is_none());
        assert!(parse_object(true, b"null", false).unwrap().is_none());
        assert!(parse_object(true, b"null", true).is_err());
        assert!(parse_object(true, b"[1]", true).is_err());
        assert!(parse_object(true, b"{not json", true).is_err());
        assert!(parse_object(false, b"{}", true).is_err());
        assert!(parse_object(true, b"{\"a\": 1} x", true).is_err());
        let deep = "[".repeat(100_000);
        assert!(parse_object(true, deep.as_bytes(), true).is_err());
        assert!(parse_object(true, b"{\"a\": \"\xff\"}", true).is_err());
        let dup = parse_object(true, b"{\"a\": 1, \"a\": 2}", true)
            .unwrap()
            .unwrap();
        assert_eq!(dup["a"], 2);
    }

    #[test]
    fn query_strings() {
        let q = query_params(Some("path=a%00b&mode=0644&path=x+y%2Fz&flag"));
        assert_eq!(q["path"], "x y/z");
        assert_eq!(q["mode"], "0644");
        assert_eq!(q["flag"], "");
        assert_eq!(query_params(Some("path=a%00b"))["path"], "a\0b");
        assert_eq!(query_params(Some("p=%zz%4"))["p"], "%zz%4");
        assert!(query_params(None).is_empty());
    }
}
