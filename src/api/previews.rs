//! Preview links: `POST …/sandboxes/{name}/previews` issues a token for one port,
//! `DELETE …/sandboxes/{name}/previews` revokes them all, and [`preview_hosts`] serves requests
//! whose `Host` is `{port}-{name}.{domain}` (with `AGENT_SANDBOX_PREVIEW_DOMAIN` set): the API key
//! or a token opens them; the first request with `?token=` trades it for a host-only cookie and
//! is redirected to the same URL without it. Signing is `ports::preview`'s; this file parses,
//! decides who may pass, and maps errors.

use std::net::SocketAddr;

use aide::axum::routing::post_with;
use aide::axum::ApiRouter;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::openapi::Describe;
use super::ports::port_error;
use super::processes::{json_body, target};
use super::resources::PREFIX;
use super::AppState;
use crate::ports::preview::{
    parse_host, PreviewHost, Previews, COOKIE, DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS,
};
use crate::ports::{Forwarded, PortError};
use crate::resource::Kind;

/// The header carrying an E2B sandbox's traffic access token.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// A preview link.
#[derive(Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// Opens the port in a browser: the token is traded for a cookie on first use.
    pub url: String,
    /// The token itself (`?token=` on the preview host).
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new().api_route(
        &format!("{PREFIX}/sandboxes/{{name}}/previews"),
        post_with(create, |op| {
            op.id("createPreview")
                .summary("Make a preview link to a port of the sandbox")
                .tag("ports")
                .path_param("name", "The sandbox's name")
                .description(
                    "A signed token for one port of this sandbox (bound to its uid, so a \
                     sandbox recreated under the same name accepts none of the old ones), and \
                     the URL on the preview host {port}-{name}.{domain} that opens it. Needs \
                     AGENT_SANDBOX_PREVIEW_DOMAIN (409 without it).",
                )
                .json_body_schema(
                    "PreviewRequest",
                    json!({
                        "type": "object",
                        "properties": {
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                            "expiresInSeconds": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_TTL_SECONDS,
                                "description": "Lifetime of the token (default 3600)"
                            }
                        },
                        "required": ["port"],
                        "additionalProperties": false
                    }),
                )
                .json::<Preview>(201, "The preview link")
                .errors(&[400, 404, 409])
        })
        .delete_with(revoke, |op| {
            op.id("revokePreviews")
                .summary("Revoke every preview token of the sandbox")
                .tag("ports")
                .path_param("name", "The sandbox's name")
                .empty(204, "Every token issued so far is refused from now on")
                .errors(&[404, 409])
        }),
    )
}

fn previews(state: &AppState) -> Result<&Previews, ApiError> {
    state.ports.previews().ok_or_else(|| {
        ApiError::Conflict(
            "preview hosts are off: set AGENT_SANDBOX_PREVIEW_DOMAIN (e.g. preview.localhost)"
                .into(),
        )
    })
}

/// The sandbox's uid, or 404 (without waking it or counting as activity).
fn sandbox_uid(state: &AppState, name: &str) -> Result<String, ApiError> {
    state
        .store
        .get(Kind::Sandbox, name)
        .and_then(|e| e.resource.as_sandbox().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .and_then(|s| s.metadata.uid.clone())
        .ok_or_else(|| ApiError::NotFound(format!("sandbox {name:?} not found")))
}

fn integer(v: &Value, name: &str, max: u64) -> Result<u64, ApiError> {
    v.as_u64()
        .or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 1.0)
                .map(|f| f as u64)
        })
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!("{name}: must be an integer from 1 to {max}"))
        })
}

async fn create(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<Preview>), ApiError> {
    let mut fields = json_body(body, 4096).await?;
    let port = match fields.remove("port") {
        Some(v) if !v.is_null() => integer(&v, "port", 65535)? as u16,
        _ => return Err(ApiError::InvalidRequest("port: is required".into())),
    };
    let ttl = match fields.remove("expiresInSeconds") {
        Some(v) if !v.is_null() => integer(&v, "expiresInSeconds", MAX_TTL_SECONDS)?,
        _ => DEFAULT_TTL_SECONDS,
    };
    if let Some(k) = fields.keys().next() {
        return Err(ApiError::InvalidRequest(format!(
            "{k}: is not a known field"
        )));
    }
    let previews = previews(&state)?;
    let uid = sandbox_uid(&state, &name)?;
    let domain = state.settings.preview_domain.as_deref().unwrap_or_default();
    let now = Utc::now();
    let expires_at = now + chrono::Duration::seconds(ttl as i64);
    let token = previews.issue(
        &name,
        &uid,
        port,
        expires_at.timestamp(),
        now.timestamp_millis(),
    );
    let url = format!(
        "http://{}.{domain}:{}/?token={token}",
        crate::ports::preview::host_label(port, &name),
        state.settings.port
    );
    Ok((
        StatusCode::CREATED,
        Json(Preview {
            url,
            token,
            expires_at,
        }),
    ))
}

async fn revoke(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let previews = previews(&state)?;
    let uid = sandbox_uid(&state, &name)?;
    previews
        .revoke(&uid, Utc::now().timestamp_millis())
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The one host a request names: its `Host` header, or the authority of an absolute-form target
/// when they agree. Several `Host` headers, user info, or a disagreement: refused.
fn request_host(request: &Request) -> Result<Option<String>, ApiError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(ApiError::InvalidRequest("more than one Host header".into()));
    }
    let host = host
        .map(|h| {
            h.to_str()
                .map(str::to_string)
                .map_err(|_| ApiError::InvalidRequest("the Host header is not text".into()))
        })
        .transpose()?;
    match (request.uri().authority(), host) {
        (Some(a), _) if a.as_str().contains('@') => Err(ApiError::InvalidRequest(
            "a request target with user info".into(),
        )),
        (Some(a), Some(h)) if !a.as_str().eq_ignore_ascii_case(&h) => Err(
            ApiError::InvalidRequest("the request target and Host disagree".into()),
        ),
        (Some(a), _) => Ok(Some(a.as_str().to_string())),
        (None, h) => Ok(h),
    }
}

/// Middleware before routing: requests for a preview host go to the sandbox (or are refused);
/// every other request goes on to the API.
pub async fn preview_hosts(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(domain) = state.settings.preview_domain.clone() else {
        return next.run(request).await;
    };
    let host = match request_host(&request) {
        Ok(h) => h,
        Err(e) => return e.into_response(),
    };
    match host.as_deref().map(|h| parse_host(h, &domain)) {
        None | Some(PreviewHost::Api) => next.run(request).await,
        Some(PreviewHost::Refused(why)) => ApiError::InvalidRequest(why).into_response(),
        Some(PreviewHost::Preview { port, name }) => {
            serve_preview(&state, port, &name, host.unwrap_or_default(), request)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
    }
}

/// The value of the query parameter `name`, and the query without it.
fn take_query_param(query: &str, name: &str) -> (Option<String>, String) {
    let mut found = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if k == name {
                found.get_or_insert_with(|| v.to_string());
                false
            } else {
                !pair.is_empty()
            }
        })
        .collect();
    (found, rest.join("&"))
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

async fn serve_preview(
    state: &AppState,
    port: u16,
    name: &str,
    host: String,
    request: Request,
) -> Result<Response, ApiError> {
    let unauthorized = |why: String| ApiError::Unauthorized(why);
    let uid = sandbox_uid(state, name)?;
    let now = Utc::now().timestamp_millis();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let (token, rest) = take_query_param(&query, "token");
    if let Some(token) = token {
        let previews = previews(state)?;
        previews
            .verify(&token, name, &uid, port, now)
            .map_err(|e| unauthorized(e.to_string()))?;
        let max_age = previews
            .expiry(&token)
            .map_or(0, |e| (e - now / 1000).max(0));
        let set_cookie =
            format!("{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax");
        let location = if rest.is_empty() {
            path
        } else {
            format!("{path}?{rest}")
        };
        let mut response = StatusCode::SEE_OTHER.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::LOCATION,
            HeaderValue::from_str(&location)
                .map_err(|_| ApiError::InvalidRequest("bad path".into()))?,
        );
        headers.insert(
            header::SET_COOKIE,
            HeaderValue::from_str(&set_cookie).map_err(|_| unauthorized("bad token".into()))?,
        );
        return Ok(response);
    }
    let with_key =
        state.keys.is_enabled() && crate::api::auth::presented_key(request.headers()).is_some();
    let mut stop = None;
    if with_key {
        let principal = state
            .keys
            .principal_of(request.headers())
            .ok_or_else(|| unauthorized("the API key is not valid".into()))?;
        stop = principal.revocation();
        match principal.decide(&crate::authz::inside_sandbox(name)) {
            crate::authz::Decision::Allow => {}
            crate::authz::Decision::NotFound(message) => return Err(ApiError::NotFound(message)),
            crate::authz::Decision::Forbidden(message) => return Err(ApiError::Forbidden(message)),
            crate::authz::Decision::Unauthenticated => {
                return Err(unauthorized("the API key is not valid".into()))
            }
        }
    } else if let Some(token) = request.headers().get(TRAFFIC_TOKEN_HEADER) {
        // An E2B sandbox's traffic access token (`trafficAccessToken`), as E2B's hosts take it.
        let opens = state
            .store
            .get(Kind::Sandbox, name)
            .and_then(|e| e.resource.as_sandbox().cloned())
            .zip(token.to_str().ok())
            .is_some_and(|(sandbox, token)| {
                crate::api::e2b::envd::traffic_token_opens(state, &sandbox, token)
            });
        if !opens {
            return Err(unauthorized(format!(
                "the {TRAFFIC_TOKEN_HEADER} header is not this sandbox's traffic access token"
            )));
        }
    } else if state.keys.is_enabled() {
        let token = cookie(request.headers(), COOKIE)
            .ok_or_else(|| unauthorized("a preview needs the API key or a token".into()))?;
        previews(state)?
            .verify(&token, name, &uid, port, now)
            .map_err(|e| unauthorized(e.to_string()))?;
    }
    let target = target(state, name).await?;
    let forwarded = Forwarded {
        client: request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip()),
        host: Some(host),
        prefix: None,
        path_and_query: request
            .uri()
            .path_and_query()
            .map_or("/".into(), |p| p.as_str().to_string()),
        strip_cookies: vec![
            COOKIE.to_string(),
            crate::api::session::KEY_COOKIE.to_string(),
            crate::api::session::CSRF_COOKIE.to_string(),
        ],
        stop,
        activity: Some(state.activity.toucher(&target.name)),
    };
    state
        .ports
        .proxy(&target.container_id, port, request, &forwarded)
        .await
        .map_err(|e: PortError| port_error(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_out_of_the_query() {
        assert_eq!(
            take_query_param("a=1&token=xyz&b=2", "token"),
            (Some("xyz".into()), "a=1&b=2".into())
        );
        assert_eq!(take_query_param("", "token"), (None, String::new()));
        assert_eq!(
            take_query_param("tokens=1", "token"),
            (None, "tokens=1".into())
        );
    }
}
