//! The HTTP client every client command and the MCP server share: where the server is, the API
//! key, and turning any failure (connection, status, body) into one readable sentence.
//!
//! It speaks only HTTP to a running server; it never opens the data directory or Docker, so the
//! CLI works the same on a laptop and against a remote server.

use std::time::Duration;

use clap::Args;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::resource::{is_valid_namespace, object_key, split_key, Kind, DEFAULT_NAMESPACE};

/// Where the resource API lives on the server.
pub const RESOURCE_PREFIX: &str = "/apis/agent-sandbox.io/v1";

/// How long an ordinary request may take. The server itself waits for the controller (create,
/// rollback, fork), so this is generous; streams (exec, watch) have no overall limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Server and credentials, from flags or the same variables the Python SDK reads.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// URL of the agent-sandbox server.
    #[arg(
        long = "server",
        env = "AGENT_SANDBOX_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// API key (sent as `Authorization: Bearer`).
    #[arg(
        long = "api-key",
        env = "AGENT_SANDBOX_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub api_key: Option<String>,
    /// Namespace of the objects named on the command line, and of the lists shown (without
    /// it: `default` for names, every namespace the key reaches for lists).
    #[arg(
        long = "namespace",
        short = 'n',
        env = "AGENT_SANDBOX_NAMESPACE",
        global = true
    )]
    pub namespace: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the server at {url}: {reason} (is it running? set AGENT_SANDBOX_URL or --server)")]
    Unreachable { url: String, reason: String },
    #[error("{}", api_message(*.status, .code, .message))]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    #[error("invalid server URL {0:?}: it must start with http:// or https://")]
    BadUrl(String),
}

fn api_message(status: u16, code: &str, message: &str) -> String {
    if status == 401 {
        return format!(
            "{message} (HTTP 401): set AGENT_SANDBOX_API_KEY or --api-key; a server that \
             generated its own key keeps it in the file api-key of its data directory"
        );
    }
    if code.is_empty() {
        format!("{message} (HTTP {status})")
    } else {
        format!("{message} (HTTP {status} {code})")
    }
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

/// A WebSocket opened by [`Client::websocket`].
pub type WebSocket = tokio_tungstenite::WebSocketStream<reqwest::Upgraded>;

/// A client of one server.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
    namespace: Option<String>,
}

impl Client {
    pub fn new(connection: &Connection) -> ClientResult<Client> {
        let base = connection.server.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::BadUrl(connection.server.clone()));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("agent-sandbox-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let key = connection
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(String::from);
        let namespace = connection
            .namespace
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from);
        if let Some(bad) = namespace.as_deref().filter(|n| !is_valid_namespace(n)) {
            return Err(ClientError::Protocol(format!(
                "--namespace {bad:?} is not a namespace name (a-z, 0-9 and -, at most 63)"
            )));
        }
        Ok(Client {
            http,
            base,
            key,
            namespace,
        })
    }

    /// The key of the object `name` names on the command line: in `--namespace` when given. A
    /// key already (a `/v1` ID of another namespace) stays as it is.
    pub fn key(&self, name: &str) -> String {
        match &self.namespace {
            Some(namespace) if !name.contains('.') => object_key(namespace, name),
            _ => name.to_string(),
        }
    }

    /// The collection of `kind`: in `--namespace` when given, else across namespaces.
    pub fn collection_path(&self, kind: Kind) -> String {
        match &self.namespace {
            Some(namespace) => format!(
                "{RESOURCE_PREFIX}/namespaces/{}/{}",
                encode(namespace),
                kind.plural()
            ),
            None => Client::resource_path(kind, None),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which starts with `/`) with authentication set.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut builder = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(key) = &self.key {
            builder = builder.bearer_auth(key);
        }
        builder
    }

    /// Sends a request and returns the response when its status is a success; otherwise the
    /// server's error message.
    pub async fn send(&self, builder: reqwest::RequestBuilder) -> ClientResult<reqwest::Response> {
        let response = builder.send().await.map_err(|e| self.unreachable(&e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(error_of(response).await)
    }

    /// Like [`Client::send`] with the ordinary timeout, reading a JSON answer (`null` when empty).
    pub async fn json(&self, builder: reqwest::RequestBuilder) -> ClientResult<Value> {
        let response = self.send(builder.timeout(REQUEST_TIMEOUT)).await?;
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("the body is not JSON: {e}")))
    }

    /// Like [`Client::json`] for a raw body.
    pub async fn bytes(&self, builder: reqwest::RequestBuilder) -> ClientResult<bytes::Bytes> {
        let response = self.send(builder.timeout(REQUEST_TIMEOUT)).await?;
        response.bytes().await.map_err(|e| self.unreachable(&e))
    }

    /// Opens a WebSocket (`GET` upgraded) speaking `protocol`, through the same connection
    /// settings, TLS and key as every other request. A refusal comes back as the server's error,
    /// like [`Client::send`]; the answer's headers are returned with the socket.
    pub async fn websocket(
        &self,
        builder: reqwest::RequestBuilder,
        protocol: &str,
    ) -> ClientResult<(WebSocket, reqwest::header::HeaderMap)> {
        use base64::Engine as _;
        use sha1::Digest as _;
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        let response = builder
            .header(reqwest::header::CONNECTION, "Upgrade")
            .header(reqwest::header::UPGRADE, "websocket")
            .header(reqwest::header::SEC_WEBSOCKET_VERSION, "13")
            .header(reqwest::header::SEC_WEBSOCKET_KEY, &key)
            .header(reqwest::header::SEC_WEBSOCKET_PROTOCOL, protocol)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            if response.status().is_success() {
                return Err(ClientError::Protocol(format!(
                    "the server answered {} instead of switching to a WebSocket",
                    response.status()
                )));
            }
            return Err(error_of(response).await);
        }
        let header = |name: reqwest::header::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let accept = base64::engine::general_purpose::STANDARD.encode(
            sha1::Sha1::new()
                .chain_update(key.as_bytes())
                .chain_update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                .finalize(),
        );
        if header(reqwest::header::SEC_WEBSOCKET_ACCEPT) != accept {
            return Err(ClientError::Protocol(
                "the WebSocket handshake's accept key is wrong".into(),
            ));
        }
        if header(reqwest::header::SEC_WEBSOCKET_PROTOCOL) != protocol {
            return Err(ClientError::Protocol(format!(
                "the server does not speak {protocol}"
            )));
        }
        let headers = response.headers().clone();
        let upgraded = response.upgrade().await.map_err(|e| self.unreachable(&e))?;
        let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
            upgraded,
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        Ok((socket, headers))
    }

    pub fn unreachable(&self, error: &reqwest::Error) -> ClientError {
        if error.is_timeout() {
            return ClientError::Unreachable {
                url: self.base.clone(),
                reason: "the request timed out".into(),
            };
        }
        ClientError::Unreachable {
            url: self.base.clone(),
            reason: root_cause(error),
        }
    }

    // The resource API.

    /// The path of the object of key `name` (namespaced when the key names a namespace other
    /// than `default`), or of the collection across namespaces.
    pub fn resource_path(kind: Kind, name: Option<&str>) -> String {
        match name.map(split_key) {
            Some((DEFAULT_NAMESPACE, name)) => {
                format!("{RESOURCE_PREFIX}/{}/{}", kind.plural(), encode(name))
            }
            Some((namespace, name)) => format!(
                "{RESOURCE_PREFIX}/namespaces/{}/{}/{}",
                encode(namespace),
                kind.plural(),
                encode(name)
            ),
            None => format!("{RESOURCE_PREFIX}/{}", kind.plural()),
        }
    }

    /// One resource, or `None` when the server has no such resource.
    pub async fn get_resource(&self, kind: Kind, name: &str) -> ClientResult<Option<Value>> {
        let path = Client::resource_path(kind, Some(&self.key(name)));
        match self.json(self.request(Method::GET, &path)).await {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every resource of a kind (the `items` of the list), optionally filtered by labels.
    pub async fn list_resources(&self, kind: Kind, selector: Option<&str>) -> ClientResult<Value> {
        let mut builder = self.request(Method::GET, &self.collection_path(kind));
        if let Some(selector) = selector {
            builder = builder.query(&[("labelSelector", selector)]);
        }
        self.json(builder).await
    }

    pub async fn create_resource(
        &self,
        kind: Kind,
        body: &Value,
        dry_run: bool,
    ) -> ClientResult<Value> {
        let mut builder = self
            .request(Method::POST, &self.collection_path(kind))
            .json(body);
        if dry_run {
            builder = builder.query(&[("dryRun", "All")]);
        }
        self.json(builder).await
    }

    pub async fn replace_resource(
        &self,
        kind: Kind,
        name: &str,
        body: &Value,
        dry_run: bool,
    ) -> ClientResult<Value> {
        let mut builder = self
            .request(
                Method::PUT,
                &Client::resource_path(kind, Some(&self.key(name))),
            )
            .json(body);
        if dry_run {
            builder = builder.query(&[("dryRun", "All")]);
        }
        self.json(builder).await
    }

    pub async fn delete_resource(&self, kind: Kind, name: &str) -> ClientResult<Value> {
        let path = Client::resource_path(kind, Some(&self.key(name)));
        self.json(self.request(Method::DELETE, &path)).await
    }

    // The `/v1` wire API.

    pub fn sandbox_path(id: &str, rest: &str) -> String {
        format!("/v1/sandboxes/{}{rest}", encode(id))
    }

    pub fn snapshot_path(id: &str, rest: &str) -> String {
        format!("/v1/snapshots/{}{rest}", encode(id))
    }
}

/// Reads a streamed NDJSON body (exec output, watch events) one JSON object at a time.
pub struct NdjsonReader {
    response: reqwest::Response,
    buffer: Vec<u8>,
    base: String,
}

/// The longest line we accept from a stream; a line past it means a broken server.
const MAX_LINE: usize = 64 * 1024 * 1024;

impl NdjsonReader {
    pub fn new(client: &Client, response: reqwest::Response) -> NdjsonReader {
        NdjsonReader {
            response,
            buffer: Vec::new(),
            base: client.base.clone(),
        }
    }

    /// The next object, or `None` at the end of the stream. Blank lines are skipped.
    pub async fn next(&mut self) -> ClientResult<Option<Value>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return serde_json::from_slice(line).map(Some).map_err(|e| {
                    ClientError::Protocol(format!("a streamed line is not JSON: {e}"))
                });
            }
            if self.buffer.len() > MAX_LINE {
                return Err(ClientError::Protocol("a streamed line is too long".into()));
            }
            let chunk = self
                .response
                .chunk()
                .await
                .map_err(|e| ClientError::Unreachable {
                    url: self.base.clone(),
                    reason: format!("the stream broke: {}", root_cause(&e)),
                })?;
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None if self.buffer.trim_ascii().is_empty() => return Ok(None),
                None => self.buffer.push(b'\n'),
            }
        }
    }
}

/// Reads the server's `{"error": {"code", "message"}}` (or whatever else came back).
async fn error_of(response: reqwest::Response) -> ClientError {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let parsed: Option<Value> = serde_json::from_str(&text).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let code = error
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| {
            parsed
                .as_ref()
                .and_then(|v| v.get("detail"))
                .map(|d| d.to_string())
        })
        .unwrap_or_else(|| {
            let line = text.lines().next().unwrap_or_default().trim();
            if line.is_empty() {
                reason_phrase(status)
            } else {
                line.chars().take(300).collect()
            }
        });
    ClientError::Api {
        status: status.as_u16(),
        code,
        message,
    }
}

fn reason_phrase(status: StatusCode) -> String {
    status
        .canonical_reason()
        .unwrap_or("request failed")
        .to_string()
}

/// The innermost cause, which says what actually went wrong ("Connection refused").
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// Percent-encodes one path segment. Names are plain, but a user may type anything.
pub fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode("sb_12ab-x.y"), "sb_12ab-x.y");
        assert_eq!(encode("a/../b c"), "a%2F..%2Fb%20c");
    }

    #[test]
    fn api_errors_read_as_one_line() {
        let e = ClientError::Api {
            status: 404,
            code: "not_found".into(),
            message: "sandbox \"x\" not found".into(),
        };
        assert_eq!(
            e.to_string(),
            "sandbox \"x\" not found (HTTP 404 not_found)"
        );
        assert!(e.is_not_found());
        let e = ClientError::Api {
            status: 401,
            code: "unauthorized".into(),
            message: "missing or invalid API key".into(),
        };
        assert!(e.to_string().contains("AGENT_SANDBOX_API_KEY"));
    }

    #[test]
    fn urls_must_be_http() {
        let c = Connection {
            server: "localhost:8080".into(),
            api_key: None,
            namespace: None,
        };
        assert!(matches!(Client::new(&c), Err(ClientError::BadUrl(_))));
        let c = Connection {
            server: "http://h:1/".into(),
            api_key: Some("  ".into()),
            namespace: None,
        };
        let client = Client::new(&c).unwrap();
        assert_eq!(client.base_url(), "http://h:1");
        assert!(client.key.is_none());
    }
}
