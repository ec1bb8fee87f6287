//! Request bodies and query strings of `/v1`, read the way the reference server reads them: JSON
//! only under a JSON content type, unknown fields refused, and the lenient coercions its clients
//! rely on (numeric strings for numbers, `"yes"`/`0`/`1` for booleans, `64.0` for an integer).
//! Every refusal is a 422 `validation_error` naming the field; range rules that depend on the
//! server's settings are the handlers' business (400), not this module's.

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

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

/// A lower bound from the schema (a 422 when broken, unlike the settings' bounds).
#[derive(Clone, Copy)]
pub enum Bound {
    None,
    /// Strictly greater than.
    Gt(f64),
    /// Greater than or equal.
    Ge(i128),
}

/// Walks one object's fields, collecting every error before answering, like the reference does.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    known: Vec<&'static str>,
    errors: Vec<String>,
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Map<String, Value>) -> Fields<'a> {
        Fields {
            obj,
            known: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn error(&mut self, field: &str, msg: impl Into<String>) {
        self.errors.push(format!("body.{field}: {}", msg.into()));
    }

    /// Present and not null.
    fn take(&mut self, field: &'static str) -> Option<&'a Value> {
        self.known.push(field);
        self.obj.get(field).filter(|v| !v.is_null())
    }

    /// Present, possibly null: for fields whose default is not `null`, where `null` is an error.
    fn take_raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.known.push(field);
        self.obj.get(field)
    }

    pub fn opt_str(&mut self, field: &'static str, max_chars: Option<usize>) -> Option<String> {
        let value = self.take(field)?;
        match value {
            Value::String(s) => match max_chars {
                Some(max) if s.chars().count() > max => {
                    self.error(
                        field,
                        format!("String should have at most {max} characters"),
                    );
                    None
                }
                _ => Some(s.clone()),
            },
            _ => {
                self.error(field, "Input should be a valid string");
                None
            }
        }
    }

    pub fn req_str(&mut self, field: &'static str) -> Option<String> {
        match self.take_raw(field) {
            None => {
                self.error(field, "Field required");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.error(field, "Input should be a valid string");
                None
            }
        }
    }

    pub fn opt_float(&mut self, field: &'static str, bound: Bound) -> Option<f64> {
        let value = self.take(field)?;
        match lax_float(value) {
            Ok(v) => self.check_bound(field, v, bound).then_some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    pub fn opt_int(&mut self, field: &'static str, bound: Bound) -> Option<i128> {
        let value = self.take(field)?;
        self.int_value(field, value, bound)
    }

    pub fn req_int(&mut self, field: &'static str, bound: Bound) -> Option<i128> {
        match self.take_raw(field) {
            None => {
                self.error(field, "Field required");
                None
            }
            Some(value) => self.int_value(field, value, bound),
        }
    }

    fn int_value(&mut self, field: &str, value: &Value, bound: Bound) -> Option<i128> {
        match lax_int(value) {
            Ok(v) => self.check_bound(field, v as f64, bound).then_some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    fn check_bound(&mut self, field: &str, v: f64, bound: Bound) -> bool {
        match bound {
            Bound::Gt(min) if v.is_nan() || v <= min => {
                self.error(
                    field,
                    format!(
                        "Input should be greater than {}",
                        super::wire::py_number(min)
                    ),
                );
                false
            }
            Bound::Ge(min) if v.is_nan() || v < min as f64 => {
                self.error(
                    field,
                    format!("Input should be greater than or equal to {min}"),
                );
                false
            }
            _ => true,
        }
    }

    /// A boolean that may be left out or null.
    pub fn opt_bool(&mut self, field: &'static str) -> Option<bool> {
        let value = self.take(field)?;
        match lax_bool(value) {
            Ok(v) => Some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    /// A boolean with a default; `null` is refused.
    pub fn bool_or(&mut self, field: &'static str, default: bool) -> bool {
        match self.take_raw(field) {
            None => default,
            Some(value) => match lax_bool(value) {
                Ok(v) => v,
                Err(msg) => {
                    self.error(field, msg);
                    default
                }
            },
        }
    }

    /// A string-to-string map defaulting to empty; `null` is refused.
    pub fn env(&mut self, field: &'static str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match self.take_raw(field) {
            None => {}
            Some(Value::Object(map)) => {
                for (key, value) in map {
                    match value {
                        Value::String(s) => {
                            out.insert(key.clone(), s.clone());
                        }
                        _ => {
                            self.error(&format!("{field}.{key}"), "Input should be a valid string")
                        }
                    }
                }
            }
            Some(_) => self.error(field, "Input should be a valid dictionary"),
        }
        out
    }

    /// The raw value of a field that needs its own reading (e.g. a union).
    pub fn raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.take_raw(field)
    }

    pub fn push_error(&mut self, field: &str, msg: impl Into<String>) {
        self.error(field, msg);
    }

    /// Refuses unknown fields and answers with every error found, or `Ok`.
    pub fn finish(mut self) -> Result<(), ApiError> {
        let extra: Vec<String> = self
            .obj
            .keys()
            .filter(|k| !self.known.contains(&k.as_str()))
            .cloned()
            .collect();
        for key in extra {
            self.error(&key, "Extra inputs are not permitted");
        }
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation(self.errors.join("; ")))
        }
    }
}

/// Python's numeric string syntax: surrounding whitespace, and underscores between digits.
fn numeric_text(s: &str) -> Option<String> {
    let s = s.trim();
    let bytes = s.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'_' {
            let digit = |j: Option<&u8>| j.is_some_and(|c| c.is_ascii_digit());
            if i == 0 || !digit(bytes.get(i - 1)) || !digit(bytes.get(i + 1)) {
                return None;
            }
        }
    }
    Some(s.replace('_', ""))
}

fn lax_float(value: &Value) -> Result<f64, &'static str> {
    match value {
        Value::Number(n) => n.as_f64().ok_or("Input should be a valid number"),
        Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => numeric_text(s)
            .and_then(|t| t.parse::<f64>().ok())
            .ok_or("Input should be a valid number, unable to parse string as a number"),
        _ => Err("Input should be a valid number"),
    }
}

fn float_to_int(v: f64) -> Result<i128, &'static str> {
    if !v.is_finite() {
        return Err("Input should be a finite number");
    }
    if v.fract() != 0.0 {
        return Err("Input should be a valid integer, got a number with a fractional part");
    }
    // Saturating: anything this large fails the settings' range check anyway.
    Ok(v as i128)
}

fn lax_int(value: &Value) -> Result<i128, &'static str> {
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Ok(i128::from(u))
            } else {
                float_to_int(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::Bool(b) => Ok(i128::from(*b)),
        Value::String(s) => {
            let text = numeric_text(s)
                .ok_or("Input should be a valid integer, unable to parse string as an integer")?;
            if let Ok(i) = text.parse::<i128>() {
                return Ok(i);
            }
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v.fract() == 0.0 => Ok(v as i128),
                _ => Err("Input should be a valid integer, unable to parse string as an integer"),
            }
        }
        _ => Err("Input should be a valid integer"),
    }
}

fn lax_bool(value: &Value) -> Result<bool, &'static str> {
    const MSG: &str = "Input should be a valid boolean, unable to interpret input";
    match value {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            _ => Err(MSG),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(MSG),
        },
        _ => Err("Input should be a valid boolean"),
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
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn coerces_like_the_reference() {
        let o = obj(
            json!({"cpus": "0.5", "memory_mb": "256", "pids_limit": 64.0, "network": 0,
            "read_only_rootfs": "no", "timeout_seconds": " 1_024 ", "big": 1e30}),
        );
        let mut f = Fields::new(&o);
        assert_eq!(f.opt_float("cpus", Bound::Gt(0.0)), Some(0.5));
        assert_eq!(f.opt_int("memory_mb", Bound::Ge(16)), Some(256));
        assert_eq!(f.opt_int("pids_limit", Bound::Ge(8)), Some(64));
        assert!(!f.bool_or("network", true));
        assert!(!f.bool_or("read_only_rootfs", true));
        assert_eq!(f.opt_int("timeout_seconds", Bound::Ge(1)), Some(1024));
        assert!(f.opt_int("big", Bound::Ge(1)).unwrap() > 1_000_000);
        f.finish().unwrap();
    }

    #[test]
    fn refuses_what_the_reference_refuses() {
        let o = obj(
            json!({"cpus": -1, "memory_mb": "x", "pids_limit": 2.5, "network": "maybe",
            "image": 5, "env": {"A": 1}, "zzz": 1}),
        );
        let mut f = Fields::new(&o);
        assert_eq!(f.opt_float("cpus", Bound::Gt(0.0)), None);
        assert_eq!(f.opt_int("memory_mb", Bound::Ge(16)), None);
        assert_eq!(f.opt_int("pids_limit", Bound::Ge(8)), None);
        f.bool_or("network", false);
        assert_eq!(f.opt_str("image", None), None);
        f.env("env");
        let err = f.finish().unwrap_err().to_string();
        for needle in [
            "body.cpus: Input should be greater than 0",
            "body.memory_mb",
            "body.pids_limit",
            "body.network",
            "body.image",
            "body.env.A",
            "body.zzz: Extra inputs are not permitted",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
        let o = obj(json!({"network": null, "memory_mb": true}));
        let mut f = Fields::new(&o);
        f.bool_or("network", false);
        f.opt_int("memory_mb", Bound::Ge(16));
        let err = f.finish().unwrap_err().to_string();
        assert!(err.contains("body.network"), "{err}");
        assert!(err.contains("greater than or equal to 16"), "{err}");
    }

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
