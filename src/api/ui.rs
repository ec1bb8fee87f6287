//! Routes of the dashboard (`crate::ui` holds what they send): the page and its script answer
//! 401 with the sign-in page unless the browser has a session; signing in checks the key and
//! sets the session cookies (`super::session`); signing out clears them. The style sheet is
//! public (the sign-in page needs it, and it holds nothing of the server's).

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::openapi::Describe;
use super::session;
use super::AppState;
use crate::ui::{self, SignIn};

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new()
        .api_route(
            "/ui",
            get_with(app_page, |op| {
                op.id("dashboard")
                    .summary("The dashboard")
                    .description(
                        "The web dashboard, for a browser signed in through `POST /ui/login` \
                         (the session cookie); without one, 401 with the sign-in page.",
                    )
                    .tag("dashboard")
                    .text(200, "text/html", "The dashboard's page")
                    .text(401, "text/html", "The sign-in page")
            }),
        )
        .api_route(
            "/ui/app.js",
            get_with(script, |op| {
                op.id("dashboardScript")
                    .summary("The dashboard's script")
                    .tag("dashboard")
                    .text(200, "text/javascript", "The script")
                    .text(401, "text/html", "The sign-in page")
            }),
        )
        .api_route(
            "/ui/app.css",
            get_with(style, |op| {
                op.id("dashboardStyle")
                    .summary("The dashboard's style sheet")
                    .tag("dashboard")
                    .text(200, "text/css", "The style sheet")
            }),
        )
        .api_route(
            "/ui/login",
            post_with(sign_in, |op| {
                op.id("dashboardSignIn")
                    .summary("Sign a browser in to the dashboard")
                    .description(
                        "Takes the form field `key`. An accepted key is kept in an HttpOnly, \
                         SameSite=Strict cookie and the browser is sent to `/ui` (303); a \
                         refused one gets the sign-in page again (401). 403 when the form \
                         comes from another origin.",
                    )
                    .tag("dashboard")
                    .form_body_schema(
                        "DashboardSignIn",
                        serde_json::json!({
                            "type": "object",
                            "required": ["key"],
                            "properties": {"key": {"type": "string"}},
                        }),
                    )
                    .empty(303, "Signed in: on to /ui")
                    .text(401, "text/html", "The key is not accepted")
                    .errors(&[403])
            }),
        )
        .api_route(
            "/ui/logout",
            post_with(sign_out, |op| {
                op.id("dashboardSignOut")
                    .summary("Sign a browser out of the dashboard")
                    .description("Clears the session cookies. 403 from another origin.")
                    .tag("dashboard")
                    .empty(204, "Signed out")
                    .errors(&[403])
            }),
        )
}

/// Marks a dashboard document, so that an error status (the 401 sign-in page) keeps its HTML.
#[derive(Clone, Copy, Debug)]
pub struct DashboardDocument;

/// A dashboard document with the headers that keep it to itself.
fn document(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.extensions_mut().insert(DashboardDocument);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in ui::SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn sign_in_page(status: StatusCode, why: SignIn) -> Response {
    document(status, "text/html; charset=utf-8", ui::sign_in_page(why))
}

/// Whether the browser has a session (or authentication is off).
fn signed_in(state: &AppState, headers: &HeaderMap) -> bool {
    state.keys.admit(&Method::GET, "/ui", headers).is_ok()
}

async fn app_page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !signed_in(&state, &headers) {
        return sign_in_page(StatusCode::UNAUTHORIZED, SignIn::Needed);
    }
    document(
        StatusCode::OK,
        "text/html; charset=utf-8",
        ui::APP_PAGE.to_string(),
    )
}

async fn script(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !signed_in(&state, &headers) {
        return sign_in_page(StatusCode::UNAUTHORIZED, SignIn::Needed);
    }
    document(
        StatusCode::OK,
        "text/javascript; charset=utf-8",
        ui::SCRIPT.to_string(),
    )
}

async fn style() -> Response {
    document(
        StatusCode::OK,
        "text/css; charset=utf-8",
        ui::STYLE.to_string(),
    )
}

async fn sign_in(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if session::cross_origin(&headers) {
        return forbidden();
    }
    let key = ui::form_field(&body, "key")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    // A key must also be one a cookie can carry unchanged.
    let usable = !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic() && b != b';');
    if !usable || state.keys.identify(key.as_bytes()).is_none() {
        return sign_in_page(StatusCode::UNAUTHORIZED, SignIn::Refused);
    }
    let cookies = session::sign_in_cookies(
        &key,
        &session::new_csrf_token(),
        session::over_https(&headers),
    );
    let mut response = StatusCode::SEE_OTHER.into_response();
    let out = response.headers_mut();
    out.insert(header::LOCATION, HeaderValue::from_static("/ui"));
    for cookie in cookies {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            out.append(header::SET_COOKIE, value);
        }
    }
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn sign_out(headers: HeaderMap) -> Response {
    if session::cross_origin(&headers) {
        return forbidden();
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    for cookie in session::sign_out_cookies() {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

fn forbidden() -> Response {
    super::error::ApiError::Forbidden("a sign-in from another origin is refused".into())
        .into_response()
}
