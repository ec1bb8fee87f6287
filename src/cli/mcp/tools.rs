//! The MCP tools: the reference's ten, each one or two `/v1` calls, and five for long-lived
//! processes (`process_*`, over the resource API's processes subresource, whose offsets let a
//! model read on from where it stopped); results are shaped like the reference MCP
//! server's: a JSON object becomes one text block (indented JSON) plus `structuredContent`, a list
//! one text block per element plus `{"result": [...]}`, a string text plus `{"result": "..."}`.
//! A failed call is a tool error (`isError`) whose text says what failed and why, so the model can
//! correct itself.

use reqwest::Method;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::cli::client::{Client, ClientError};

/// What the model is told about these tools when it connects.
pub const INSTRUCTIONS: &str =
    "Tools for running code in disposable, isolated sandboxes (hardened \
containers). Typical flow: sandbox_create, then sandbox_exec and the file tools \
(sandbox_write_file, sandbox_read_file, sandbox_list_files). Before a risky change (installing \
packages, a large refactor, deleting files, a migration) call sandbox_snapshot; if the change goes \
wrong, call sandbox_rollback with that snapshot ID to restore the workspace instead of repairing \
it by hand. Use sandbox_fork to try several approaches in parallel from one snapshot. Call \
sandbox_destroy when finished (snapshots are kept). Files live under /workspace; only /workspace \
is kept by snapshots, rollbacks and forks. Sandboxes have no network access unless created with \
network=true, and expire after their timeout.";

#[derive(Deserialize, JsonSchema)]
pub struct CreateArgs {
    /// Container image; the server's default when omitted.
    #[serde(default)]
    pub image: Option<String>,
    /// Allow network access.
    #[serde(default)]
    pub network: bool,
    /// Lifetime in seconds; the server's default when omitted.
    #[serde(default)]
    pub timeout_seconds: Option<i64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<i64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ExecArgs {
    pub sandbox_id: String,
    /// A shell command, run with /bin/sh -c.
    pub command: String,
    /// Working directory (default /workspace).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Kill the command after this many seconds (default 60).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct PathArgs {
    pub sandbox_id: String,
    /// Relative paths resolve against /workspace.
    pub path: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct WriteArgs {
    pub sandbox_id: String,
    /// Must be under /workspace; relative paths resolve against it.
    pub path: String,
    pub content: String,
}

fn workspace() -> String {
    "/workspace".into()
}

#[derive(Deserialize, JsonSchema)]
pub struct ListFilesArgs {
    pub sandbox_id: String,
    #[serde(default = "workspace")]
    pub path: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    pub sandbox_id: String,
    /// A label for the snapshot.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct RollbackArgs {
    pub sandbox_id: String,
    pub snapshot_id: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct ForkArgs {
    pub snapshot_id: String,
    /// Lifetime of the new sandbox in seconds; the server's default when omitted.
    #[serde(default)]
    pub timeout_seconds: Option<i64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct SandboxArgs {
    pub sandbox_id: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct ProcessStartArgs {
    pub sandbox_id: String,
    /// A shell command, run with /bin/sh -c, in the background.
    pub command: String,
    /// Keep stdin open for process_write_stdin.
    #[serde(default)]
    pub stdin: bool,
    /// Run on a terminal.
    #[serde(default)]
    pub tty: bool,
    /// Working directory (default /workspace).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Kill it after this many seconds; none means it runs until it exits or is killed.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ProcessOutputArgs {
    pub sandbox_id: String,
    pub process_id: String,
    /// Byte offset in stdout to read from (the stdout_offset of the previous call).
    #[serde(default)]
    pub stdout_from: u64,
    /// Byte offset in stderr to read from (the stderr_offset of the previous call).
    #[serde(default)]
    pub stderr_from: u64,
}

#[derive(Deserialize, JsonSchema)]
pub struct ProcessStdinArgs {
    pub sandbox_id: String,
    pub process_id: String,
    /// Text to write (add "\n" to end a line).
    pub data: String,
    /// Close stdin afterwards (end of input).
    #[serde(default)]
    pub close: bool,
}

#[derive(Deserialize, JsonSchema)]
pub struct ProcessSignalArgs {
    pub sandbox_id: String,
    pub process_id: String,
    /// TERM, INT, HUP, KILL, QUIT, USR1 or USR2.
    pub signal: String,
}

fn processes_path(sandbox: &str, rest: &str) -> String {
    format!(
        "{}/processes{rest}",
        Client::resource_path(crate::resource::Kind::Sandbox, Some(sandbox))
    )
}

/// Sums an NDJSON output read (base64) into text and the offsets to read on from.
fn collect_output(text: &str, stdout_from: u64, stderr_from: u64) -> Value {
    use base64::Engine as _;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_next, mut err_next) = (stdout_from, stderr_from);
    let mut end = json!({"state": "Running"});
    let mut truncated = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match e["type"].as_str() {
            Some(kind @ ("stdout" | "stderr")) => {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(e["data"].as_str().unwrap_or_default())
                    .unwrap_or_default();
                let offset = e["offset"].as_u64().unwrap_or(0);
                let (buf, next) = if kind == "stdout" {
                    (&mut out, &mut out_next)
                } else {
                    (&mut err, &mut err_next)
                };
                buf.extend_from_slice(&data);
                *next = offset + data.len() as u64;
            }
            Some("truncated") => {
                let from = e["retainedFrom"].as_u64().unwrap_or(0);
                if e["stream"] == "stderr" {
                    err_next = from;
                } else {
                    out_next = from;
                }
                truncated.push(e);
            }
            Some("exit") => {
                end = json!({"state": "Exited", "exit_code": e["exitCode"], "signal": e["signal"]});
            }
            _ => {}
        }
    }
    let mut v = json!({
        "stdout": String::from_utf8_lossy(&out),
        "stderr": String::from_utf8_lossy(&err),
        "stdout_offset": out_next,
        "stderr_offset": err_next,
    });
    if let (Some(v), Some(end)) = (v.as_object_mut(), end.as_object()) {
        v.extend(end.clone());
        if !truncated.is_empty() {
            v.insert("truncated".into(), Value::Array(truncated));
        }
    }
    v
}

/// The MCP server: a tool router over one HTTP client.
#[derive(Clone)]
pub struct SandboxTools {
    client: Client,
    tool_router: ToolRouter<SandboxTools>,
}

/// What the reference returns for a sandbox: the fields a model needs, not the limits.
fn summary(sandbox: &Value) -> Value {
    let mut out = Map::new();
    for key in [
        "id",
        "status",
        "image",
        "network",
        "expires_at",
        "source_snapshot_id",
    ] {
        out.insert(key.into(), sandbox.get(key).cloned().unwrap_or(Value::Null));
    }
    Value::Object(out)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

fn object_result(value: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(pretty(&value))]);
    result.structured_content = Some(value);
    result
}

fn list_result(items: Vec<Value>) -> CallToolResult {
    let content = items
        .iter()
        .map(|i| ContentBlock::text(pretty(i)))
        .collect();
    let mut result = CallToolResult::success(content);
    result.structured_content = Some(json!({ "result": items }));
    result
}

fn text_result(text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text.clone())]);
    result.structured_content = Some(json!({ "result": text }));
    result
}

fn failure(tool: &str, error: ClientError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "Error executing tool {tool}: {error}"
    ))])
}

/// Turns a call's outcome into the tool's answer; failures are tool errors, never protocol errors.
fn answer(
    tool: &str,
    outcome: Result<CallToolResult, ClientError>,
) -> Result<CallToolResult, McpError> {
    Ok(outcome.unwrap_or_else(|e| failure(tool, e)))
}

#[tool_router]
impl SandboxTools {
    pub fn new(client: Client) -> SandboxTools {
        SandboxTools {
            client,
            tool_router: Self::tool_router(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.client
            .json(self.client.request(Method::POST, path).json(body))
            .await
    }

    #[tool(
        description = "Create a new sandbox and return its ID. Network access is off unless network=true."
    )]
    async fn sandbox_create(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<CallToolResult, McpError> {
        let mut body = json!({ "network": args.network });
        if let Some(image) = args.image {
            body["image"] = json!(image);
        }
        if let Some(t) = args.timeout_seconds {
            body["timeout_seconds"] = json!(t);
        }
        if let Some(c) = args.cpus {
            body["cpus"] = json!(c);
        }
        if let Some(m) = args.memory_mb {
            body["memory_mb"] = json!(m);
        }
        let outcome = self.post("/v1/sandboxes", &body).await;
        answer(
            "sandbox_create",
            outcome.map(|s| object_result(summary(&s))),
        )
    }

    #[tool(description = "List live sandboxes.")]
    async fn sandbox_list(&self) -> Result<CallToolResult, McpError> {
        let outcome = self
            .client
            .json(self.client.request(Method::GET, "/v1/sandboxes"))
            .await
            .map(|list| {
                let items = list["sandboxes"].as_array().cloned().unwrap_or_default();
                list_result(items.iter().map(summary).collect())
            });
        answer("sandbox_list", outcome)
    }

    #[tool(
        description = "Run a shell command in the sandbox and return stdout, stderr, and the exit code."
    )]
    async fn sandbox_exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
    ) -> Result<CallToolResult, McpError> {
        let mut body = json!({ "command": args.command });
        if let Some(w) = args.workdir {
            body["workdir"] = json!(w);
        }
        if let Some(t) = args.timeout_seconds {
            body["timeout_seconds"] = json!(t);
        }
        let path = Client::sandbox_path(&args.sandbox_id, "/exec");
        answer(
            "sandbox_exec",
            self.post(&path, &body).await.map(object_result),
        )
    }

    #[tool(description = "Read a UTF-8 text file. Relative paths resolve against /workspace.")]
    async fn sandbox_read_file(
        &self,
        Parameters(args): Parameters<PathArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "/files");
        let outcome = self
            .client
            .bytes(
                self.client
                    .request(Method::GET, &path)
                    .query(&[("path", args.path.as_str())]),
            )
            .await
            .map(|bytes| text_result(String::from_utf8_lossy(&bytes).into_owned()));
        answer("sandbox_read_file", outcome)
    }

    #[tool(
        description = "Create or overwrite a text file under /workspace. Parent directories are created."
    )]
    async fn sandbox_write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "/files");
        let outcome = self
            .client
            .json(
                self.client
                    .request(Method::PUT, &path)
                    .query(&[("path", args.path.as_str()), ("mode", "644")])
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(args.content.into_bytes()),
            )
            .await
            .map(object_result);
        answer("sandbox_write_file", outcome)
    }

    #[tool(description = "List a directory in the sandbox.")]
    async fn sandbox_list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "/files/list");
        let outcome = self
            .client
            .json(
                self.client
                    .request(Method::GET, &path)
                    .query(&[("path", args.path.as_str())]),
            )
            .await
            .map(|list| list_result(list["entries"].as_array().cloned().unwrap_or_default()));
        answer("sandbox_list_files", outcome)
    }

    #[tool(
        description = "Save the current /workspace so you can roll back to it or fork from it later."
    )]
    async fn sandbox_snapshot(
        &self,
        Parameters(args): Parameters<SnapshotArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "/snapshots");
        let outcome = self.post(&path, &json!({ "name": args.name })).await;
        answer("sandbox_snapshot", outcome.map(object_result))
    }

    #[tool(description = "Restore a snapshot. Running processes stop and /tmp is cleared.")]
    async fn sandbox_rollback(
        &self,
        Parameters(args): Parameters<RollbackArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "/rollback");
        let outcome = self
            .post(&path, &json!({ "snapshot_id": args.snapshot_id }))
            .await;
        answer(
            "sandbox_rollback",
            outcome.map(|s| object_result(summary(&s))),
        )
    }

    #[tool(description = "Start a new, independent sandbox from a snapshot.")]
    async fn sandbox_fork(
        &self,
        Parameters(args): Parameters<ForkArgs>,
    ) -> Result<CallToolResult, McpError> {
        let mut body = json!({});
        if let Some(t) = args.timeout_seconds {
            body["timeout_seconds"] = json!(t);
        }
        let path = Client::snapshot_path(&args.snapshot_id, "/fork");
        let outcome = self.post(&path, &body).await;
        answer("sandbox_fork", outcome.map(|s| object_result(summary(&s))))
    }

    #[tool(
        description = "Start a long-lived background process (a dev server, a watcher, a REPL) and return its id at once. It keeps running across calls; read its output with process_output."
    )]
    async fn process_start(
        &self,
        Parameters(args): Parameters<ProcessStartArgs>,
    ) -> Result<CallToolResult, McpError> {
        let mut body = json!({"command": args.command, "stdin": args.stdin, "tty": args.tty});
        if let Some(w) = args.workdir {
            body["workdir"] = json!(w);
        }
        if let Some(t) = args.timeout_seconds {
            body["timeoutSeconds"] = json!(t);
        }
        let outcome = self
            .post(&processes_path(&args.sandbox_id, ""), &body)
            .await;
        answer("process_start", outcome.map(object_result))
    }

    #[tool(
        description = "Read a process's output from byte offsets without waiting. Returns stdout, stderr, the offsets to pass next time (stdout_offset, stderr_offset), and state (Running, or Exited with exit_code or signal)."
    )]
    async fn process_output(
        &self,
        Parameters(args): Parameters<ProcessOutputArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = processes_path(&args.sandbox_id, &format!("/{}/output", args.process_id));
        let from = (args.stdout_from.to_string(), args.stderr_from.to_string());
        let outcome = self
            .client
            .bytes(self.client.request(Method::GET, &path).query(&[
                ("stdoutFrom", from.0.as_str()),
                ("stderrFrom", from.1.as_str()),
                ("encoding", "base64"),
            ]))
            .await
            .map(|b| {
                object_result(collect_output(
                    &String::from_utf8_lossy(&b),
                    args.stdout_from,
                    args.stderr_from,
                ))
            });
        answer("process_output", outcome)
    }

    #[tool(
        description = "Write text to a process's stdin (it must have been started with stdin=true)."
    )]
    async fn process_write_stdin(
        &self,
        Parameters(args): Parameters<ProcessStdinArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = processes_path(&args.sandbox_id, &format!("/{}/stdin", args.process_id));
        let close = if args.close { "true" } else { "false" };
        let outcome = self
            .client
            .send(
                self.client
                    .request(Method::POST, &path)
                    .query(&[("close", close)])
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(args.data.into_bytes()),
            )
            .await
            .map(|_| text_result(format!("written to {}", args.process_id)));
        answer("process_write_stdin", outcome)
    }

    #[tool(
        description = "Send a signal (TERM, INT, HUP, KILL, QUIT, USR1, USR2) to a process's group."
    )]
    async fn process_signal(
        &self,
        Parameters(args): Parameters<ProcessSignalArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = processes_path(&args.sandbox_id, &format!("/{}/signal", args.process_id));
        let outcome = self
            .client
            .send(
                self.client
                    .request(Method::POST, &path)
                    .json(&json!({"signal": args.signal})),
            )
            .await
            .map(|_| text_result(format!("sent {} to {}", args.signal, args.process_id)));
        answer("process_signal", outcome)
    }

    #[tool(
        description = "List a sandbox's long-lived processes with their state and output sizes."
    )]
    async fn process_list(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, McpError> {
        let outcome = self
            .client
            .json(
                self.client
                    .request(Method::GET, &processes_path(&args.sandbox_id, "")),
            )
            .await
            .map(|list| list_result(list["items"].as_array().cloned().unwrap_or_default()));
        answer("process_list", outcome)
    }

    #[tool(description = "Destroy a sandbox. Its snapshots are kept.")]
    async fn sandbox_destroy(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, McpError> {
        let path = Client::sandbox_path(&args.sandbox_id, "");
        let outcome = self
            .client
            .json(self.client.request(Method::DELETE, &path))
            .await
            .map(|_| text_result(format!("destroyed {}", args.sandbox_id)));
        answer("sandbox_destroy", outcome)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "agent-sandbox",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::client::Connection;

    fn tools() -> SandboxTools {
        SandboxTools::new(
            Client::new(&Connection {
                server: "http://127.0.0.1:9".into(),
                api_key: None,
                namespace: None,
            })
            .unwrap(),
        )
    }

    #[test]
    fn the_ten_tools_of_the_reference_and_the_process_tools() {
        let mut names: Vec<String> = tools()
            .tool_router
            .list_all()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "process_list",
                "process_output",
                "process_signal",
                "process_start",
                "process_write_stdin",
                "sandbox_create",
                "sandbox_destroy",
                "sandbox_exec",
                "sandbox_fork",
                "sandbox_list",
                "sandbox_list_files",
                "sandbox_read_file",
                "sandbox_rollback",
                "sandbox_snapshot",
                "sandbox_write_file"
            ]
        );
    }

    #[test]
    fn arguments_use_the_wire_names_and_defaults() {
        let all = tools().tool_router.list_all();
        let schema = |name: &str| {
            let tool = all.iter().find(|t| t.name == name).unwrap();
            Value::Object(tool.input_schema.as_ref().clone())
        };
        let exec = schema("sandbox_exec");
        assert_eq!(exec["required"], json!(["sandbox_id", "command"]));
        assert!(exec["properties"]["timeout_seconds"].is_object());
        let create = schema("sandbox_create");
        assert_eq!(create["properties"]["network"]["default"], json!(false));
        assert!(create
            .get("required")
            .is_none_or(|r| r.as_array().is_some_and(|a| a.is_empty())));
        let list = schema("sandbox_list_files");
        assert_eq!(list["properties"]["path"]["default"], json!("/workspace"));
        assert_eq!(
            schema("sandbox_rollback")["required"],
            json!(["sandbox_id", "snapshot_id"])
        );
    }

    #[test]
    fn output_reads_sum_up_with_the_next_offsets() {
        let text = concat!(
            r#"{"type":"truncated","stream":"stdout","requested":0,"retainedFrom":4}"#,
            "\n",
            r#"{"type":"stdout","offset":4,"data":"aGk="}"#,
            "\n",
            r#"{"type":"exit","exitCode":3,"signal":null,"finishedAt":"t"}"#,
            "\n"
        );
        let v = collect_output(text, 0, 7);
        assert_eq!(v["stdout"], "hi");
        assert_eq!(
            (v["stdout_offset"].as_u64(), v["stderr_offset"].as_u64()),
            (Some(6), Some(7))
        );
        assert_eq!(
            (&v["state"], &v["exit_code"]),
            (&json!("Exited"), &json!(3))
        );
        assert_eq!(v["truncated"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn summaries_keep_the_reference_fields() {
        let s = json!({"id": "sb_1", "status": "running", "image": "i", "cpus": 1.0, "network": false,
                       "expires_at": "t", "source_snapshot_id": null, "memory_mb": 512});
        assert_eq!(
            summary(&s),
            json!({"id": "sb_1", "status": "running", "image": "i", "network": false,
                   "expires_at": "t", "source_snapshot_id": null})
        );
        let r = list_result(vec![json!({"a": 1}), json!({"b": 2})]);
        assert_eq!(r.content.len(), 2);
        assert_eq!(
            r.structured_content,
            Some(json!({"result": [{"a": 1}, {"b": 2}]}))
        );
    }
}
