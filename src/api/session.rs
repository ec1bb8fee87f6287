//! The dashboard's session: the API key a browser signed in with, held in an `HttpOnly`,
//! `SameSite=Strict` cookie, and what a request carrying it must also show before it is let in.
//!
//! A request that presents a key in a header (`Authorization`, `X-API-Key`) is judged by
//! [`super::auth`] alone and never looks here. One that presents only the cookie is a browser's:
//!
//! - a state-changing method (anything but `GET`, `HEAD`, `OPTIONS`) must repeat the value of the
//!   [`CSRF_COOKIE`] in the [`CSRF_HEADER`] (a double-submit token: another site can make the
//!   browser send the cookies, but can neither read them nor set a custom header);
//! - a request that says it comes from another origin (`Origin`, or `Sec-Fetch-Site:
//!   cross-site`) is refused whatever its method, which covers WebSocket upgrades;
//! - the proxy into a sandbox never accepts the cookie: pages a sandbox serves must not run in
//!   the dashboard's origin with its session.
//!
//! This module never logs a key or a token, and compares tokens in constant time.

use axum::http::{header, HeaderMap, Method};
use subtle::ConstantTimeEq;

/// The cookie that holds the API key (`HttpOnly`: page scripts never see it).
pub const KEY_COOKIE: &str = "agent_sandbox_key";
/// The double-submit token's cookie, readable by the dashboard's script, and sent with every request so the server can compare.
pub const CSRF_COOKIE: &str = "agent_sandbox_csrf";
/// The header a cookie-authenticated, state-changing request repeats the token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Why a request that carries the session cookie is not let in.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The cookie's key is not one the server accepts (or there is none): 401.
    BadKey,
    /// The key is good, but the request is not the dashboard's own: 403.
    Forged(&'static str),
}

/// The value of the cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Whether a cookie-authenticated request may go on, given that `key_ok` says whether the
/// cookie's key is accepted. `path` is the request's path.
pub fn check(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    key_ok: bool,
) -> Result<(), Refusal> {
    if !key_ok || is_proxy(path) {
        return Err(Refusal::BadKey);
    }
    if cross_origin(headers) {
        return Err(Refusal::Forged(
            "a request from another origin may not use the dashboard's session",
        ));
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let expected = cookie(headers, CSRF_COOKIE).unwrap_or_default();
    let presented = headers
        .get(CSRF_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if expected.len() < 16 || !bool::from(expected.as_bytes().ct_eq(presented)) {
        return Err(Refusal::Forged(
            "a state-changing request made with the dashboard's session must carry its \
             X-CSRF-Token",
        ));
    }
    Ok(())
}

/// The proxy subresource (`…/sandboxes/{name}/proxy/{port}/…`).
fn is_proxy(path: &str) -> bool {
    let mut segments = path.split('/');
    segments.any(|s| s == "sandboxes") && {
        let rest: Vec<&str> = segments.collect();
        rest.get(1) == Some(&"proxy")
    }
}

/// Whether the browser says the request comes from another origin than the server's own.
pub fn cross_origin(headers: &HeaderMap) -> bool {
    let header_text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site" || v.as_bytes() == b"same-site")
    {
        return true;
    }
    match (header_text(header::ORIGIN), header_text(header::HOST)) {
        (None, _) => false,
        (Some(origin), Some(host)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            authority != Some(host)
        }
        (Some(_), None) => true,
    }
}

/// A fresh double-submit token.
pub fn new_csrf_token() -> String {
    hex::encode(rand::random::<[u8; 24]>())
}

/// The `Set-Cookie` values that sign a browser in with `key` (already checked) and `csrf`.
/// `secure` adds `Secure` (the request came over HTTPS, directly or through a proxy that says
/// so).
pub fn sign_in_cookies(key: &str, csrf: &str, secure: bool) -> [String; 2] {
    let secure = if secure { "; Secure" } else { "" };
    [
        format!("{KEY_COOKIE}={key}; Path=/; HttpOnly; SameSite=Strict{secure}"),
        format!("{CSRF_COOKIE}={csrf}; Path=/; SameSite=Strict{secure}"),
    ]
}

/// The `Set-Cookie` values that sign a browser out.
pub fn sign_out_cookies() -> [String; 2] {
    [
        format!("{KEY_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
        format!("{CSRF_COOKIE}=; Path=/; SameSite=Strict; Max-Age=0"),
    ]
}

/// Whether the request reached this server over HTTPS.
pub fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn cookies_are_found_by_exact_name_across_headers() {
        let h = headers(&[
            ("cookie", "a=1; agent_sandbox_keyx=no"),
            ("cookie", "agent_sandbox_key=yes ; b=2"),
        ]);
        assert_eq!(cookie(&h, KEY_COOKIE), Some("yes"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
        assert_eq!(cookie(&headers(&[("cookie", "a=")]), "a"), None);
    }

    #[test]
    fn reads_pass_and_writes_need_the_repeated_token() {
        let with_cookie = format!("{CSRF_COOKIE}={TOKEN}");
        let get = headers(&[("cookie", &with_cookie)]);
        assert_eq!(check(&Method::GET, "/ui", &get, true), Ok(()));
        assert_eq!(
            check(&Method::GET, "/ui", &get, false),
            Err(Refusal::BadKey)
        );
        assert!(matches!(
            check(&Method::POST, "/v1/sandboxes", &get, true),
            Err(Refusal::Forged(_))
        ));
        let wrong = headers(&[("cookie", &with_cookie), (CSRF_HEADER, "0123456789abcdef")]);
        assert!(check(&Method::DELETE, "/v1/sandboxes/x", &wrong, true).is_err());
        let right = headers(&[("cookie", &with_cookie), (CSRF_HEADER, TOKEN)]);
        assert_eq!(
            check(&Method::PUT, "/v1/sandboxes/x/files", &right, true),
            Ok(())
        );
        // A header without any cookie to match proves nothing.
        let no_cookie = headers(&[(CSRF_HEADER, "")]);
        assert!(check(&Method::POST, "/v1/sandboxes", &no_cookie, true).is_err());
    }

    #[test]
    fn other_origins_and_the_proxy_never_use_the_session() {
        let cross = headers(&[("origin", "http://evil.test"), ("host", "127.0.0.1:8080")]);
        assert!(matches!(
            check(&Method::GET, "/v1/sandboxes", &cross, true),
            Err(Refusal::Forged(_))
        ));
        let same = headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080"),
        ]);
        assert_eq!(check(&Method::GET, "/v1/sandboxes", &same, true), Ok(()));
        let site = headers(&[("sec-fetch-site", "cross-site")]);
        assert!(check(&Method::GET, "/v1/sandboxes", &site, true).is_err());
        let proxy = "/apis/agent-sandbox.io/v1/sandboxes/web/proxy/8080/index.html";
        assert_eq!(
            check(&Method::GET, proxy, &HeaderMap::new(), true),
            Err(Refusal::BadKey)
        );
        assert_eq!(
            check(
                &Method::GET,
                "/apis/agent-sandbox.io/v1/sandboxes/proxy",
                &HeaderMap::new(),
                true
            ),
            Ok(())
        );
    }
}
