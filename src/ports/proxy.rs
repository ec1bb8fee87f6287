//! Forwarding HTTP requests over a [`Tunnel`] (kept alive between requests by [`super::Ports`])
//! and streaming the answers back: bodies stream in
//! both directions with no whole-body buffering (hyper's own backpressure, end to end), a client
//! that goes away drops the answer's body, which drops the connection into the sandbox, and an
//! upgrade (a WebSocket) answered `101` becomes a byte pipe between the client and the sandbox.
//!
//! What reaches the sandbox: the method, the path and query it is given, the request's headers
//! without hop-by-hop ones and without credentials meant for this server (`Authorization`,
//! `X-API-Key`, and the cookies the caller names), `Host: 127.0.0.1:PORT` (dev servers refuse
//! other hosts), and `X-Forwarded-For/Proto/Host/Prefix` saying where the request came from.

use std::net::IpAddr;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use super::{PortError, Tunnel};

/// Where a request came from, for the `X-Forwarded-*` headers and what to strip.
#[derive(Clone, Debug, Default)]
pub struct Forwarded {
    /// The client's address.
    pub client: Option<IpAddr>,
    /// The `Host` the client asked for.
    pub host: Option<String>,
    /// The path prefix this server strips before forwarding (none for preview hosts).
    pub prefix: Option<String>,
    /// The path and query to ask the sandbox for.
    pub path_and_query: String,
    /// Cookies that are this server's own (preview sessions): never forwarded.
    pub strip_cookies: Vec<String>,
    /// Ends an upgraded connection's byte pipe when cancelled (the client's key was revoked).
    pub stop: Option<tokio_util::sync::CancellationToken>,
    /// Counts the bytes of the request, the answer and an upgraded connection as the sandbox's
    /// activity.
    pub activity: Option<crate::activity::Toucher>,
}

/// Marks a response that came from a sandbox, so that nothing rewrites it on the way out.
#[derive(Clone, Copy, Debug)]
pub struct FromSandbox;

/// Headers that belong to one hop (RFC 9110 §7.6.1) and the server's own credentials.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
/// What opened the way to the sandbox, never forwarded into it (the last is E2B's header for a
/// sandbox's traffic access token on its preview hosts).
const CREDENTIALS: [&str; 3] = ["authorization", "x-api-key", "e2b-traffic-access-token"];

fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if asks {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

/// Removes hop-by-hop headers, including those a `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The `Cookie` headers without the named cookies (none left: no header).
fn strip_cookies(headers: &mut HeaderMap, names: &[String]) {
    if names.is_empty() || !headers.contains_key(header::COOKIE) {
        return;
    }
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter(|c| {
            let name = c.split_once('=').map_or(*c, |(n, _)| n).trim();
            !names.iter().any(|n| n == name)
        })
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(header::COOKIE, v);
        }
    }
}

/// The headers the sandbox gets for a request with `incoming` headers.
fn outgoing_headers(incoming: &HeaderMap, port: u16, forwarded: &Forwarded) -> HeaderMap {
    let mut headers = incoming.clone();
    let upgrade = upgrade_of(&headers);
    strip_hop_by_hop(&mut headers);
    for name in CREDENTIALS {
        headers.remove(name);
    }
    strip_cookies(&mut headers, &forwarded.strip_cookies);
    // hyper's client sends bodies at once; an `Expect` would wait for nothing.
    headers.remove(header::EXPECT);
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("127.0.0.1:{port}")) {
        headers.insert(header::HOST, v);
    }
    if let Some(client) = forwarded.client {
        let before = incoming
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .map(|v| format!("{v}, "))
            .unwrap_or_default();
        if let Ok(v) = HeaderValue::from_str(&format!("{before}{client}")) {
            headers.insert("x-forwarded-for", v);
        }
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    headers.remove("x-forwarded-host");
    if let Some(host) = forwarded
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        headers.insert("x-forwarded-host", host);
    }
    headers.remove("x-forwarded-prefix");
    if let Some(prefix) = forwarded
        .prefix
        .as_deref()
        .and_then(|p| HeaderValue::from_str(p).ok())
    {
        headers.insert("x-forwarded-prefix", prefix);
    }
    headers
}

/// One HTTP/1.1 connection to a port inside a sandbox, for requests one after another.
pub type Sender = hyper::client::conn::http1::SendRequest<Body>;

/// A request made ready for the sandbox, and the client's side of an upgrade it asks for.
pub struct Prepared {
    pub outgoing: hyper::Request<Body>,
    pub client_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// Turns the client's `request` into the one the sandbox gets (see the module documentation).
pub fn prepare(
    mut request: Request,
    port: u16,
    forwarded: &Forwarded,
) -> Result<Prepared, PortError> {
    let wants_upgrade = upgrade_of(request.headers()).is_some();
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let uri: Uri = forwarded
        .path_and_query
        .parse()
        .map_err(|_| PortError::Relay(format!("bad path {:?}", forwarded.path_and_query)))?;
    let mut outgoing = hyper::Request::new(body);
    *outgoing.method_mut() = parts.method.clone();
    *outgoing.uri_mut() = uri;
    *outgoing.version_mut() = Version::HTTP_11;
    *outgoing.headers_mut() = outgoing_headers(&parts.headers, port, forwarded);
    Ok(Prepared {
        outgoing,
        client_upgrade,
    })
}

/// Starts HTTP/1.1 over `tunnel`; the connection lives in its own task until it closes.
pub async fn handshake(tunnel: Tunnel, port: u16) -> Result<Sender, PortError> {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .map_err(|e| PortError::Upstream {
            port,
            why: e.to_string(),
        })?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "proxied connection ended with an error");
        }
    });
    Ok(sender)
}

/// The client's answer from the sandbox's `answer`: streamed as it comes, or, for a `101`, the
/// start of a byte pipe between the client and the sandbox.
pub fn finish(
    mut answer: hyper::Response<hyper::body::Incoming>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    port: u16,
    stop: Option<tokio_util::sync::CancellationToken>,
) -> Result<Response, PortError> {
    let upstream = |why: String| PortError::Upstream { port, why };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(upstream("it switched protocols unasked".into()));
        };
        let sandbox_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            let (Ok(client), Ok(sandbox)) = (client_upgrade.await, sandbox_upgrade.await) else {
                return;
            };
            let (mut client, mut sandbox) = (TokioIo::new(client), TokioIo::new(sandbox));
            let stop = stop.unwrap_or_default();
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut sandbox) => {}
                _ = stop.cancelled() => {}
            }
        });
        let (mut parts, _) = answer.into_parts();
        parts.extensions = Default::default();
        parts.extensions.insert(FromSandbox);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // This server speaks HTTP/1.1 to its client, whatever the sandbox's server spoke.
    parts.version = Version::HTTP_11;
    parts.extensions = Default::default();
    parts.extensions.insert(FromSandbox);
    Ok(Response::from_parts(parts, Body::new(body)))
}
