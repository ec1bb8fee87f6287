//! The one place errors become HTTP responses: `{"error": {"code": "...", "message": "..."}}` with
//! the status codes of the `/v1` contract.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

/// The body of every error response, as documented in the OpenAPI document.
#[derive(Serialize, JsonSchema, Clone, Debug)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, JsonSchema, Clone, Debug)]
pub struct ErrorDetail {
    /// Machine-readable: `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `conflict`, `sandbox_paused`, `payload_too_large`, `unsupported_media_type`,
    /// `validation_error`,
    /// `limit_exceeded`, `quota_exceeded`, `backend_error`, `unavailable` or `internal_error`.
    pub code: String,
    /// For people.
    pub message: String,
}

/// A route's error statuses are written in its description (`openapi::Describe::errors`): a type
/// cannot say which of its variants a handler answers.
impl aide::OperationOutput for ApiError {
    type Inner = Self;
}

/// Every error a handler can return. The variant fixes status and code; the message is for people.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_request`
    #[error("{0}")]
    InvalidRequest(String),
    /// 401 `unauthorized`
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 409 `conflict`
    #[error("{0}")]
    Conflict(String),
    /// 409 `sandbox_paused`: a call that needs a running sandbox, on one that is paused or
    /// stopped and does not resume by itself (`spec.autoResume: false`).
    #[error("{0}")]
    SandboxPaused(String),
    /// 413 `payload_too_large`
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 415 `unsupported_media_type`
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422 `validation_error`
    #[error("{0}")]
    Validation(String),
    /// 429 `limit_exceeded`
    #[error("{0}")]
    LimitExceeded(String),
    /// 403 `quota_exceeded`: the change would take its namespace past a `ResourceQuota` (the
    /// message names the quota, the resource and the numbers).
    #[error("{0}")]
    QuotaExceeded(String),
    /// 502 `backend_error`
    #[error("{0}")]
    Backend(String),
    /// 503 `unavailable` (e.g. waiting for the controller timed out, Docker down on /healthz)
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal_error`
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::SandboxPaused(_) => (StatusCode::CONFLICT, "sandbox_paused"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_error"),
            ApiError::LimitExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"),
            ApiError::QuotaExceeded(_) => (StatusCode::FORBIDDEN, "quota_exceeded"),
            ApiError::Backend(_) => (StatusCode::BAD_GATEWAY, "backend_error"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: self.to_string(),
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> ApiError {
        use crate::store::StoreError as S;
        match e {
            S::NotFound { .. } => ApiError::NotFound(e.to_string()),
            S::AlreadyExists { .. } | S::Conflict { .. } | S::Terminating { .. } => {
                ApiError::Conflict(e.to_string())
            }
            S::ReadOnly { .. } => ApiError::Forbidden(e.to_string()),
            S::Invalid(message) => ApiError::InvalidRequest(message),
            S::Immutable { .. } => ApiError::Validation(e.to_string()),
            // The path is the server's business; the log has it, the client gets the cause.
            S::Io {
                ref path,
                ref source,
            } => {
                tracing::error!(path = %path.display(), error = %source, "store I/O failed");
                ApiError::Internal(format!("the server could not write its data: {source}"))
            }
            S::Interrupted(_) => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<crate::dataplane::DataPlaneError> for ApiError {
    fn from(e: crate::dataplane::DataPlaneError) -> ApiError {
        use crate::dataplane::DataPlaneError as D;
        match e {
            D::InvalidRequest(message) => ApiError::InvalidRequest(message),
            D::NotFound(message) => ApiError::NotFound(message),
            D::TooLarge { .. } => ApiError::PayloadTooLarge(e.to_string()),
            D::NotRunning(_) => ApiError::Conflict(e.to_string()),
            D::Backend(message) => ApiError::Backend(message),
        }
    }
}

impl From<crate::snapshot_archive::SnapshotArchiveError> for ApiError {
    fn from(e: crate::snapshot_archive::SnapshotArchiveError) -> ApiError {
        use crate::snapshot_archive::SnapshotArchiveError as A;
        match e {
            A::NotFound(message) => ApiError::NotFound(message),
            A::NotReady(message) | A::Exists(message) => ApiError::Conflict(message),
            A::Body(_) => ApiError::InvalidRequest(e.to_string()),
            A::InvalidName(message) => ApiError::InvalidRequest(message),
            A::TooLarge(message) => ApiError::PayloadTooLarge(message),
            A::Refused(message) => ApiError::Validation(message),
            A::Store(error) => error.into(),
            A::Internal(message) => ApiError::Internal(message),
        }
    }
}

/// A document that does not parse or match its schema: 422, naming line and field.
impl From<crate::resource::yaml::DocumentError> for ApiError {
    fn from(e: crate::resource::yaml::DocumentError) -> ApiError {
        ApiError::Validation(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Kind;
    use crate::store::StoreError;

    #[test]
    fn store_errors_map_to_the_contract() {
        let status = |e: StoreError| ApiError::from(e).status_and_code();
        let name = || "x".to_string();
        assert_eq!(
            status(StoreError::NotFound {
                kind: Kind::Sandbox,
                name: name()
            })
            .0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(StoreError::Terminating {
                kind: Kind::Sandbox,
                name: name()
            })
            .0,
            StatusCode::CONFLICT
        );
        let read_only = ApiError::from(StoreError::ReadOnly {
            kind: Kind::Sandbox,
            name: name(),
            folder: "/srv/gitops".into(),
        });
        assert_eq!(
            read_only.status_and_code(),
            (StatusCode::FORBIDDEN, "forbidden")
        );
        assert!(read_only.to_string().contains("/srv/gitops"));
        assert_eq!(
            status(StoreError::Invalid("bad".into())).0,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn unauthorized_carries_www_authenticate() {
        let response = ApiError::Unauthorized("no".into()).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["error"]["code"], "unauthorized");
    }
}
