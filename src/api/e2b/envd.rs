//! What every envd call shares: which sandbox it is for (`E2b-Sandbox-Id`), the proof that the
//! caller may use it (`X-Access-Token`, the token the create or connect answered), the user it
//! asks for, and the mapping of the server's errors onto Connect codes.

use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use chrono::Utc;

use crate::api::error::ApiError;
use crate::api::AppState;
use crate::dataplane::{DataPlaneError, SandboxTarget};
use crate::e2b::connect::{self, Code, RpcError};
use crate::e2b::paths::{self, UserError};
use crate::e2b::protobuf::Schema;
use crate::processes::ProcessError;
use crate::resource::{split_key, Kind, Sandbox};

/// Runs a unary call: `target` resolves what it acts on (its token and user checked there), its
/// message is decoded, and `call` answers in the request's encoding; any failure is a Connect
/// error.
pub async fn unary<T, Req, Res, TFut, F, Fut>(
    headers: &HeaderMap,
    body: &[u8],
    schemas: (&'static Schema, &'static Schema),
    target: TFut,
    call: F,
) -> Response
where
    TFut: std::future::Future<Output = Result<T, RpcError>>,
    Req: serde::de::DeserializeOwned,
    Res: serde::Serialize,
    F: FnOnce(T, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Res, RpcError>>,
{
    let result: Result<(Res, connect::Encoding), RpcError> = async {
        let target = target.await?;
        let (request, encoding): (Req, _) = connect::unary_request(headers, body, schemas.0)?;
        Ok((call(target, request).await?, encoding))
    }
    .await;
    match result {
        Ok((answer, encoding)) => connect::unary_response(&answer, encoding, schemas.1),
        Err(e) => e.into_response(),
    }
}

/// The store key of the sandbox an envd call names by its E2B ID (a plain name): in the
/// namespace its access token was issued in (tokens are signed, so a forged namespace fails their
/// check), else in the default one.
pub fn sandbox_key(state: &AppState, id: &str, token: Option<&str>) -> String {
    token
        .and_then(|token| state.ports.envd_tokens().signed_name(token))
        .filter(|key| split_key(key).1 == id)
        .unwrap_or_else(|| id.to_string())
}

/// The sandbox an envd call is for, once its access token is checked.
pub fn sandbox(state: &AppState, headers: &HeaderMap) -> Result<Sandbox, RpcError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let id = header("e2b-sandbox-id")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            RpcError::new(
            Code::InvalidArgument,
            "the E2b-Sandbox-Id header is missing: set E2B_SANDBOX_URL to this server's /e2b/envd",
        )
        })?;
    let not_found = || RpcError::new(Code::NotFound, format!("sandbox {id} not found"));
    let token = header("x-access-token").ok_or_else(|| {
        RpcError::new(
            Code::Unauthenticated,
            "the X-Access-Token header is missing: use the envdAccessToken of the create or \
             connect answer",
        )
    })?;
    let key = sandbox_key(state, id, Some(token));
    let sandbox = state
        .store
        .get(Kind::Sandbox, &key)
        .and_then(|e| e.resource.as_sandbox().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .ok_or_else(not_found)?;
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    state
        .ports
        .envd_tokens()
        .verify(token, &key, &uid, 0, Utc::now().timestamp_millis())
        .map_err(|_| {
            RpcError::new(
                Code::Unauthenticated,
                format!("the access token is not valid for sandbox {id}"),
            )
        })?;
    Ok(sandbox)
}

/// Envd access tokens do not expire by themselves: they die with their sandbox (they are bound
/// to its uid). Far ahead, but small enough to count in milliseconds.
const TOKEN_EXPIRY: i64 = i64::MAX / 2000;

/// The envd access token of a sandbox, bound to its key (its name, and namespace outside the
/// default one) and uid. Issued as of the sandbox's
/// creation, so that it is always the same token: signed file URLs are made with it, and the
/// server finds their sandbox by recomputing it.
pub fn access_token(state: &AppState, sandbox: &Sandbox) -> String {
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let created = sandbox
        .metadata
        .creation_timestamp
        .map_or(0, |t| t.timestamp_millis());
    state
        .ports
        .envd_tokens()
        .issue(&sandbox.metadata.key(), &uid, 0, TOKEN_EXPIRY, created)
}

/// What a sandbox's traffic access token signs in place of its name: it is not the access token
/// (no sandbox is named with a `#`), so it opens no envd call.
const TRAFFIC: &str = "#traffic";

/// The traffic access token of a sandbox (E2B's `trafficAccessToken`): it opens the sandbox's
/// ports on the preview hosts, sent as `e2b-traffic-access-token`, and nothing else. Bound to the
/// sandbox's key and uid as the access token is, and as lasting.
pub fn traffic_token(state: &AppState, sandbox: &Sandbox) -> String {
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let created = sandbox
        .metadata
        .creation_timestamp
        .map_or(0, |t| t.timestamp_millis());
    let name = format!("{}{TRAFFIC}", sandbox.metadata.key());
    state
        .ports
        .envd_tokens()
        .issue(&name, &uid, 0, TOKEN_EXPIRY, created)
}

/// Whether `token` is the traffic access token of `sandbox`.
pub fn traffic_token_opens(state: &AppState, sandbox: &Sandbox, token: &str) -> bool {
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let name = format!("{}{TRAFFIC}", sandbox.metadata.key());
    state
        .ports
        .envd_tokens()
        .verify(token, &name, &uid, 0, Utc::now().timestamp_millis())
        .is_ok()
}

pub fn user_error(e: UserError) -> RpcError {
    let code = match e {
        UserError::Root => Code::PermissionDenied,
        UserError::Unknown(_) | UserError::Malformed => Code::InvalidArgument,
    };
    RpcError::new(code, e.to_string())
}

/// Checks the user an RPC asks for in its `Authorization: Basic` header.
pub fn check_rpc_user(headers: &HeaderMap) -> Result<(), RpcError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = paths::user_from_basic(header).map_err(user_error)?;
    paths::check_user(user.as_deref()).map_err(user_error)
}

/// The sandbox's data-plane target, woken first (the call is activity; a paused sandbox resumes).
pub async fn data_target(state: &AppState, sandbox: Sandbox) -> Result<SandboxTarget, RpcError> {
    let sandbox = crate::api::power::awake(state, sandbox)
        .await
        .map_err(api_error)?;
    let name = sandbox.metadata.key();
    let status = sandbox.status.as_ref();
    let container_id = status.and_then(|s| s.container_id.clone()).ok_or_else(|| {
        RpcError::new(Code::Unavailable, format!("sandbox {name} is not running"))
    })?;
    Ok(SandboxTarget {
        env: crate::api::v1::with_egress_env(state, &name, sandbox.resolved_spec().env.clone()),
        started_at: status.and_then(|s| s.started_at),
        name,
        container_id,
    })
}

pub fn api_error(e: ApiError) -> RpcError {
    let code = match &e {
        ApiError::InvalidRequest(_) | ApiError::Validation(_) => Code::InvalidArgument,
        ApiError::Unauthorized(_) => Code::Unauthenticated,
        ApiError::Forbidden(_) => Code::PermissionDenied,
        ApiError::NotFound(_) => Code::NotFound,
        ApiError::Conflict(_) | ApiError::SandboxPaused(_) => Code::FailedPrecondition,
        ApiError::PayloadTooLarge(_) | ApiError::LimitExceeded(_) | ApiError::QuotaExceeded(_) => {
            Code::ResourceExhausted
        }
        ApiError::MethodNotAllowed(_) | ApiError::UnsupportedMediaType(_) => Code::Unimplemented,
        ApiError::Backend(_) | ApiError::Unavailable(_) => Code::Unavailable,
        ApiError::Internal(_) => Code::Internal,
    };
    RpcError::new(code, e.to_string())
}

pub fn process_error(e: ProcessError) -> RpcError {
    let code = match &e {
        ProcessError::NotFound(_) => Code::NotFound,
        ProcessError::Conflict(_) => Code::FailedPrecondition,
        ProcessError::TooMany(_) => Code::ResourceExhausted,
        ProcessError::Invalid(_) => Code::InvalidArgument,
        ProcessError::Unavailable(_) => Code::Unavailable,
        ProcessError::Backend(_) => Code::Internal,
    };
    RpcError::new(code, e.to_string())
}

pub fn dataplane_error(e: DataPlaneError) -> RpcError {
    let code = match &e {
        DataPlaneError::InvalidRequest(_) => Code::InvalidArgument,
        DataPlaneError::NotFound(_) => Code::NotFound,
        DataPlaneError::TooLarge { .. } => Code::ResourceExhausted,
        DataPlaneError::NotRunning(_) => Code::Unavailable,
        DataPlaneError::Backend(_) => Code::Internal,
    };
    RpcError::new(code, e.to_string())
}

/// A method envd has that this server does not serve (yet).
pub async fn unimplemented(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().trim_start_matches("/e2b/envd/");
    let why = match path {
        "process.Process/StreamInput" => {
            " (client streaming is not served: send input with SendInput)"
        }
        _ => "",
    };
    let error = RpcError::new(
        Code::Unimplemented,
        format!("{method} {path} is not supported by this server{why}"),
    );
    let streaming = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect+"));
    if streaming {
        connect::stream_error(error, connect::stream_encoding(&headers))
    } else {
        error.into_response()
    }
}
