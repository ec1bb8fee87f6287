//! The proxy subresource: `ANY …/sandboxes/{name}/proxy/{port}/{path…}` forwards the request to
//! `127.0.0.1:{port}` inside the sandbox (Kubernetes' convention) and streams the answer back;
//! `GET …/sandboxes/{name}/portforward?port=P` upgrades to a WebSocket whose binary messages
//! carry one raw TCP connection to that port (closing either side closes both). The bytes of
//! both count as the sandbox's activity for its idle policy. This file
//! parses, finds the sandbox's container, frames and maps errors; connecting is `ports`.

use std::net::SocketAddr;

use aide::axum::routing::{get_with, ApiMethodRouter};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::header;
use axum::response::Response;
use axum::Extension;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::ApiError;
use super::openapi::Describe;
use super::processes::target;
use super::resources::PREFIX;
use super::AppState;
use crate::docker::EngineError;
use crate::ports::{parse_port, Forwarded, PortError, Tunnel};

/// The WebSocket subprotocol of a port-forward (asked for by the CLI; optional for others).
pub const PORTFORWARD_PROTOCOL: &str = "portforward.agent-sandbox.io";
/// The largest message a port-forward client may send.
const MAX_FORWARD_MESSAGE: usize = 1 << 20;

/// Maps a port error to the API's errors: nothing listening, or a broken relay, is 502.
pub(super) fn port_error(e: PortError) -> ApiError {
    match e {
        PortError::BadPort(_) => ApiError::InvalidRequest(e.to_string()),
        PortError::Engine(e @ EngineError::NotRunning { .. }) => {
            ApiError::Conflict(format!("the sandbox is not running: {e}"))
        }
        other => ApiError::Backend(other.to_string()),
    }
}

/// The three paths of the proxy: the port's root with and without the slash, and any path
/// under it.
const PATHS: [(&str, &str); 3] = [("/{*path}", ""), ("/", "Root"), ("", "Bare")];

fn describe<'a>(
    op: TransformOperation<'a>,
    id: String,
    has_path: bool,
    body: bool,
) -> TransformOperation<'a> {
    let mut op = op
        .id(&id)
        .summary("Forward a request to a port inside the sandbox")
        .tag("ports")
        .path_param("name", "The sandbox's name")
        .path_param_with_schema(
            "port",
            "The TCP port on 127.0.0.1 inside the sandbox",
            serde_json::json!({"type": "integer", "minimum": 1, "maximum": 65535}),
        )
        .description(
            "Forwards the request to 127.0.0.1:{port} inside the sandbox (through the \
             in-sandbox helper, so it works without network) with the path after the port and \
             the query, and streams the answer back, whatever its status. Bodies stream both \
             ways; WebSocket upgrades pass through. The sandbox gets \
             X-Forwarded-For/Proto/Host/Prefix and never the API key headers. Nothing \
             listening answers 502 naming the port.",
        )
        .binary(200, "What the sandbox's server answered");
    if has_path {
        op = op.path_param("path", "The path to ask the sandbox's server for");
    }
    if body {
        op = op.optional_binary_body();
    }
    op.errors(&[400, 404, 409, 502])
}

pub fn routes() -> ApiRouter<AppState> {
    let mut router = ApiRouter::new();
    for (tail, suffix) in PATHS {
        let path = format!("{PREFIX}/sandboxes/{{name}}/proxy/{{port}}{tail}");
        let has_path = !tail.is_empty() && tail != "/";
        let id = |method: &str| format!("proxy{method}{suffix}");
        let (get, head, post, put, patch, delete, options) = (
            id("Get"),
            id("Head"),
            id("Post"),
            id("Put"),
            id("Patch"),
            id("Delete"),
            id("Options"),
        );
        let methods: ApiMethodRouter<AppState> =
            get_with(proxy, move |op| describe(op, get, has_path, false))
                .head_with(proxy, move |op| describe(op, head, has_path, false))
                .post_with(proxy, move |op| describe(op, post, has_path, true))
                .put_with(proxy, move |op| describe(op, put, has_path, true))
                .patch_with(proxy, move |op| describe(op, patch, has_path, true))
                .delete_with(proxy, move |op| describe(op, delete, has_path, true))
                .options_with(proxy, move |op| describe(op, options, has_path, false));
        router = router.api_route(&path, methods);
    }
    router.api_route(
        &format!("{PREFIX}/sandboxes/{{name}}/portforward"),
        get_with(portforward, |op| {
            op.id("portForward")
                .summary("Forward one TCP connection to a port inside the sandbox (WebSocket)")
                .tag("ports")
                .path_param("name", "The sandbox's name")
                .query_with_schema(
                    "port",
                    true,
                    "The TCP port on 127.0.0.1 inside the sandbox",
                    serde_json::json!({"type": "integer", "minimum": 1, "maximum": 65535}),
                )
                .description(
                    "A WebSocket whose binary messages carry one raw TCP connection to \
                     127.0.0.1:{port} inside the sandbox, both ways (text messages are \
                     ignored); closing either side closes both. The connection is made before \
                     the upgrade, so nothing listening answers 502 naming the port. \
                     Subprotocol portforward.agent-sandbox.io when asked for.",
                )
                .websocket("Switching to the WebSocket protocol")
                .errors(&[400, 404, 409, 502])
        }),
    )
}

async fn portforward(
    State(state): State<AppState>,
    Extension(principal): Extension<crate::authz::Principal>,
    Path(name): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let mut port = None;
    for (k, v) in &query {
        match k.as_str() {
            "port" if port.is_none() => port = Some(parse_port(v).map_err(port_error)?),
            "port" => return Err(ApiError::InvalidRequest("port: give one port".into())),
            other => {
                return Err(ApiError::InvalidRequest(format!(
                    "{other}: is not a known query parameter"
                )))
            }
        }
    }
    let port = port.ok_or_else(|| ApiError::InvalidRequest("port: is required".into()))?;
    let target = target(&state, &name).await?;
    let tunnel = state
        .ports
        .connect(&target.container_id, port)
        .await
        .map_err(port_error)?
        // The bytes through it are the sandbox's activity, as calls are (idle policies).
        .counting(Some(state.activity.toucher(&target.name)));
    Ok(ws
        .protocols([PORTFORWARD_PROTOCOL])
        .max_message_size(MAX_FORWARD_MESSAGE)
        .max_frame_size(MAX_FORWARD_MESSAGE)
        .on_upgrade(move |socket| async move {
            principal.while_valid(pump(socket, tunnel)).await;
        }))
}

/// Copies the socket's binary messages into the tunnel and the tunnel's bytes out as binary
/// messages, one read at a time, until either side ends; then both are closed.
async fn pump(socket: WebSocket, tunnel: Tunnel) {
    let (mut from_sandbox, mut to_sandbox) = tokio::io::split(tunnel);
    let (mut to_client, mut from_client) = socket.split();
    let up = async {
        while let Some(Ok(message)) = from_client.next().await {
            match message {
                Message::Binary(bytes) if to_sandbox.write_all(&bytes).await.is_err() => return,
                Message::Close(_) => return,
                _ => {}
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_sandbox.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if to_client.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_client.send(Message::Close(None)).await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// `(name, port, the rest of the path with its leading slash, the prefix before it)` of a
/// proxy request's raw path, so that the sandbox gets the path exactly as the client sent it.
fn split_proxy_path(path: &str) -> Option<(&str, &str, &str, &str)> {
    let after = path.strip_prefix(PREFIX)?.strip_prefix("/sandboxes/")?;
    let (name, after) = after.split_once('/')?;
    let after = after.strip_prefix("proxy/")?;
    let (port, rest) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, ""),
    };
    let prefix = &path[..path.len() - rest.len()];
    Some((name, port, rest, prefix))
}

async fn proxy(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let stop = request
        .extensions()
        .get::<crate::authz::Principal>()
        .and_then(|p| p.revocation());
    let path = request.uri().path().to_string();
    let (name, port, rest, prefix) =
        split_proxy_path(&path).ok_or_else(|| ApiError::NotFound("Not Found".into()))?;
    let port = parse_port(port).map_err(port_error)?;
    let target = target(&state, name).await?;
    let rest = if rest.is_empty() { "/" } else { rest };
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let forwarded = Forwarded {
        client: request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip()),
        host: request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string),
        prefix: Some(prefix.to_string()),
        path_and_query: format!("{rest}{query}"),
        // The dashboard's session is this server's, never the sandbox's.
        strip_cookies: vec![
            super::session::KEY_COOKIE.to_string(),
            super::session::CSRF_COOKIE.to_string(),
        ],
        stop,
        activity: Some(state.activity.toucher(&target.name)),
    };
    state
        .ports
        .proxy(&target.container_id, port, request, &forwarded)
        .await
        .map_err(port_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_keep_what_follows_the_port() {
        let p = format!("{PREFIX}/sandboxes/web/proxy/8000/a/b%2Fc/");
        let (name, port, rest, prefix) = split_proxy_path(&p).unwrap();
        assert_eq!((name, port, rest), ("web", "8000", "/a/b%2Fc/"));
        assert_eq!(prefix, format!("{PREFIX}/sandboxes/web/proxy/8000"));
        let p = format!("{PREFIX}/sandboxes/web/proxy/8000");
        assert_eq!(split_proxy_path(&p).unwrap().2, "");
        assert!(split_proxy_path("/v1/sandboxes/web/proxy/1").is_none());
    }
}
