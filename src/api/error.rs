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
    /// `method_not_allowed`, `conflict`, `payload_too_large`, `validation_error`,
    /// `limit_exceeded`, `backend_error`, `unavailable` or `internal_error`.
    pub code: String,
    /// For people.
    pub message: String,
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
    /// 413 `payload_too_large`
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 422 `validation_error`
    #[error("{0}")]
    Validation(String),
    /// 429 `limit_exceeded`
    #[error("{0}")]
    LimitExceeded(String),
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
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_error"),
            ApiError::LimitExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "limit_exceeded"),
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
