//! The Connect protocol (connectrpc.com/docs/protocol) as envd speaks it, server side: which
//! encoding a request uses, the envelope framing of server-streaming calls, and error codes with
//! their HTTP statuses. It knows nothing of processes or files, and never touches a sandbox.
//!
//! Unary calls carry a bare message (`application/json`); server-streaming calls carry one
//! enveloped request message and answer enveloped messages (`application/connect+json`) ending
//! with an end-of-stream envelope that holds the error, if any. The E2B SDKs send JSON for both
//! kinds; the binary protobuf encoding (`application/proto`, `application/connect+proto`) is
//! served too, translated by [`super::protobuf`] from and to the same JSON values. Errors and
//! the end of a stream are JSON in both encodings, as the protocol says.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::protobuf::{self, Schema};

/// The largest request message taken (envd's requests are small; file content goes over HTTP).
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Flag of the last envelope of a stream.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (compression is never negotiated here).
const COMPRESSED: u8 = 0x01;

/// Connect error codes (the gRPC codes, spelled as Connect spells them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a message for the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

/// A unary call's error answer: the code's status, the error as JSON.
impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// What the `Content-Type` of a request says about its encoding.
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// How a call's messages are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Proto,
}

/// The message of a unary request, decoded from its body (`schema` describes it for protobuf).
pub fn unary_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    schema: &Schema,
) -> Result<(T, Encoding), RpcError> {
    match content_type(headers).as_str() {
        "application/json" | "" => Ok((decode(body)?, Encoding::Json)),
        "application/proto" => Ok((decode_proto(schema, body)?, Encoding::Proto)),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "unsupported content type {other:?} for a unary call; send application/json or \
                 application/proto"
            ),
        )),
    }
}

/// The deadline a call asks for (`Connect-Timeout-Ms`: at most 10 digits of milliseconds);
/// `None` when it names none, or none Connect allows (zero, a sign, more digits, not a number).
pub fn timeout(headers: &HeaderMap) -> Option<std::time::Duration> {
    let value = headers.get("connect-timeout-ms")?.to_str().ok()?;
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms: u64 = value.parse().ok()?;
    (ms > 0).then(|| std::time::Duration::from_millis(ms))
}

/// The encoding a streaming request says it uses (JSON when it says nothing usable).
pub fn stream_encoding(headers: &HeaderMap) -> Encoding {
    match content_type(headers).as_str() {
        "application/connect+proto" => Encoding::Proto,
        _ => Encoding::Json,
    }
}

/// The one message of a server-streaming request: a single enveloped message.
pub fn stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    schema: &Schema,
) -> Result<T, RpcError> {
    let encoding = match content_type(headers).as_str() {
        "application/connect+json" => Encoding::Json,
        "application/connect+proto" => Encoding::Proto,
        other => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!(
                    "unsupported content type {other:?} for a streaming call; send \
                     application/connect+json or application/connect+proto"
                ),
            ))
        }
    };
    let [flags, a, b, c, d, rest @ ..] = body else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the request is not an enveloped message (shorter than its 5-byte prefix)",
        ));
    };
    if flags & COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Unimplemented,
            "compressed messages are not supported; send them uncompressed",
        ));
    }
    let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    if rest.len() != len {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "the request envelope says {len} bytes but {} follow; a server-streaming call \
                 takes exactly one message",
                rest.len()
            ),
        ));
    }
    match encoding {
        Encoding::Json => decode(rest),
        Encoding::Proto => decode_proto(schema, rest),
    }
}

fn decode_proto<T: DeserializeOwned>(schema: &Schema, bytes: &[u8]) -> Result<T, RpcError> {
    let value = protobuf::decode(schema, bytes)
        .map_err(|e| RpcError::new(Code::InvalidArgument, e.to_string()))?;
    serde_json::from_value(value).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("the request message is not valid: {e}"),
        )
    })
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RpcError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("the request message is not valid: {e}"),
        )
    })
}

/// A unary call's answer, in the request's encoding.
pub fn unary_response<T: Serialize>(message: &T, encoding: Encoding, schema: &Schema) -> Response {
    let (body, kind) = match encoding {
        Encoding::Json => (serde_json::to_vec(message), "application/json"),
        Encoding::Proto => (
            serde_json::to_value(message).map(|v| protobuf::encode(schema, &v)),
            "application/proto",
        ),
    };
    match body {
        Ok(body) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(kind))],
            body,
        )
            .into_response(),
        Err(e) => {
            RpcError::new(Code::Internal, format!("cannot encode the answer: {e}")).into_response()
        }
    }
}

/// One message of a streaming answer, enveloped, in the request's encoding.
pub fn envelope<T: Serialize>(message: &T, encoding: Encoding, schema: &Schema) -> Bytes {
    let value = serde_json::to_value(message).unwrap_or_default();
    let payload = match encoding {
        Encoding::Json => serde_json::to_vec(&value).unwrap_or_else(|_| b"{}".to_vec()),
        Encoding::Proto => protobuf::encode(schema, &value),
    };
    frame(0, &payload)
}

/// The end of a streaming answer, with its error if it failed.
pub fn end_of_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({"error": e.body()}),
        None => serde_json::json!({}),
    };
    frame(END_STREAM, body.to_string().as_bytes())
}

fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// The headers of a streaming answer (always HTTP 200; errors travel in the last envelope).
pub fn stream_headers(encoding: Encoding) -> [(header::HeaderName, HeaderValue); 1] {
    let kind = match encoding {
        Encoding::Json => "application/connect+json",
        Encoding::Proto => "application/connect+proto",
    };
    [(header::CONTENT_TYPE, HeaderValue::from_static(kind))]
}

/// A streaming call that fails before its first message: 200 and only the end envelope.
pub fn stream_error(error: RpcError, encoding: Encoding) -> Response {
    (stream_headers(encoding), end_of_stream(Some(&error))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_stream() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json"),
        );
        h
    }

    #[test]
    fn an_enveloped_request_is_read_and_answers_are_framed() {
        let body = frame(0, br#"{"path":"/x"}"#);
        let v: serde_json::Value =
            stream_request(&json_stream(), &body, protobuf::PATH_REQUEST).unwrap();
        assert_eq!(v["path"], "/x");
        let out = envelope(
            &serde_json::json!({"a": 1}),
            Encoding::Json,
            protobuf::EMPTY,
        );
        assert_eq!(out[0], 0);
        assert_eq!(&out[1..5], &7u32.to_be_bytes());
        let end = end_of_stream(Some(&RpcError::new(Code::NotFound, "gone")));
        assert_eq!(end[0], END_STREAM);
        let tail: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(tail["error"]["code"], "not_found");
    }

    #[test]
    fn bad_envelopes_are_refused_and_protobuf_is_read() {
        let short = stream_request::<serde_json::Value>(&json_stream(), b"\0\0", protobuf::EMPTY)
            .unwrap_err();
        assert_eq!(short.code, Code::InvalidArgument);
        let mut long = frame(0, b"{}").to_vec();
        long.extend_from_slice(&frame(0, b"{}"));
        assert_eq!(
            stream_request::<serde_json::Value>(&json_stream(), &long, protobuf::EMPTY)
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        let mut proto = HeaderMap::new();
        proto.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/proto"),
        );
        let (v, encoding) =
            unary_request::<serde_json::Value>(&proto, b"\x0a\x02/x", protobuf::PATH_REQUEST)
                .unwrap();
        assert_eq!(
            (v["path"].as_str(), encoding),
            (Some("/x"), Encoding::Proto)
        );
        let err = unary_request::<serde_json::Value>(&proto, b"\x0a\x09", protobuf::PATH_REQUEST)
            .unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(Code::Unimplemented.status().as_u16(), 501);
    }

    #[test]
    fn a_call_deadline_is_read_from_connect_timeout_ms() {
        let with = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("connect-timeout-ms", HeaderValue::from_str(v).unwrap());
            timeout(&headers)
        };
        assert_eq!(with("1500"), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(
            with("9999999999"),
            Some(std::time::Duration::from_millis(9_999_999_999))
        );
        for refused in ["", "0", "-5", "+5", "12345678901", "1.5", "soon"] {
            assert_eq!(with(refused), None, "{refused:?}");
        }
        assert_eq!(timeout(&HeaderMap::new()), None);
    }
}
