//! `exec` and `cp`: the imperative data plane from a terminal. Exec streams the command's stdout
//! and stderr to ours as they arrive and exits with the command's status; cp moves one file, byte
//! for byte, between this machine and a sandbox.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::client::{Client, Connection, NdjsonReader};
use super::interactive;
use super::util::parse_duration;
use super::CliError;

#[derive(Args, Debug)]
#[command(
    after_help = "Exits with the command's own exit status (137 when it timed out, 128 + N when
signal N ended it).

With -i or -t the command is a long-lived process of the sandbox, attached over a WebSocket like
kubectl exec: -i sends this terminal's input (or a pipe) to it, -t runs it on a terminal and puts
ours in raw mode (keys such as Ctrl-C go to the command; the window size follows ours). Leaving
early (SIGTERM, SIGHUP) leaves the process running: see `ps`, `attach`, `kill`.

Examples:
  agent-sandbox exec demo -- ls -la
  agent-sandbox exec demo -e DEBUG=1 -w /workspace/app -- python3 main.py
  agent-sandbox exec demo --timeout 10m -- sh -c 'make test 2>&1 | tail -n 20'
  agent-sandbox exec -it demo -- bash
  echo hi | agent-sandbox exec -i demo -- cat"
)]
pub struct ExecArgs {
    /// The sandbox.
    pub name: String,
    /// An environment variable for the command. Repeatable.
    #[arg(short = 'e', long = "env", value_name = "KEY=VAL")]
    pub env: Vec<String>,
    /// Working directory (default /workspace; relative paths are under /workspace).
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    pub workdir: Option<String>,
    /// Kill the command (and everything it started) after this long: 30s, 10m, 1h. Default: the
    /// server's (60s unless configured).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Pass stdin to the command (until its end, which closes the command's stdin).
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Run the command on a terminal (ours in raw mode while it runs).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments, after `--`. Run as given, not through a shell.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

fn env_map(pairs: &[String]) -> Result<Map<String, Value>, CliError> {
    let mut env = Map::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(CliError::Usage(format!("-e {pair:?}: expected KEY=VALUE")));
        };
        if key.is_empty() {
            return Err(CliError::Usage(format!("-e {pair:?}: the name is empty")));
        }
        env.insert(key.to_string(), Value::String(value.to_string()));
    }
    Ok(env)
}

pub async fn exec(args: ExecArgs) -> Result<ExitCode, CliError> {
    let env = env_map(&args.env)?;
    let client = Client::new(&args.connection)?;
    if args.stdin || args.tty {
        return exec_attached(&client, &args).await;
    }
    let mut body = json!({ "command": args.command, "env": env });
    if let Some(dir) = &args.workdir {
        body["workdir"] = json!(dir);
    }
    if let Some(timeout) = args.timeout {
        body["timeout_seconds"] = json!(timeout.as_secs_f64());
    }
    let path = Client::sandbox_path(&client.key(&args.name), "/exec/stream");
    let response = client
        .send(client.request(Method::POST, &path).json(&body))
        .await?;
    let mut reader = NdjsonReader::new(&client, response);
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = reader.next().await? {
        let data = event["data"].as_str().unwrap_or_default().as_bytes();
        // A closed terminal or pipe is the reader's choice; the command's status still counts.
        match event["type"].as_str() {
            Some("stdout") => {
                let _ = stdout.write_all(data).and_then(|_| stdout.flush());
            }
            Some("stderr") => {
                let _ = stderr.write_all(data).and_then(|_| stderr.flush());
            }
            Some("exit") => {
                let code = event["exit_code"].as_i64().unwrap_or(-1);
                if event["timed_out"].as_bool() == Some(true) {
                    super::emit_err(&format!(
                        "error: the command timed out and was killed (exit status {code})"
                    ));
                }
                return Ok(exit_code(code));
            }
            _ => {}
        }
    }
    Err(CliError::Failed(
        "the output stream ended before the command's exit status arrived".into(),
    ))
}

/// `exec -i`/`-t`: a long-lived process started and attached in one (the WebSocket exec route).
async fn exec_attached(client: &Client, args: &ExecArgs) -> Result<ExitCode, CliError> {
    let terminal = args.tty && interactive_terminal(args.stdin);
    let mut query: Vec<(&str, String)> = args.command.iter().map(|a| ("argv", a.clone())).collect();
    query.push(("stdin", args.stdin.to_string()));
    query.push(("tty", terminal.to_string()));
    query.extend(args.env.iter().map(|e| ("env", e.clone())));
    if let Some(dir) = &args.workdir {
        // The process routes take absolute paths; relative ones are under /workspace, as for /v1.
        let dir = if dir.starts_with('/') {
            dir.clone()
        } else {
            format!("{}/{dir}", crate::processes::DEFAULT_WORKDIR)
        };
        query.push(("workdir", dir));
    }
    if let Some(timeout) = args.timeout {
        query.push(("timeoutSeconds", timeout.as_secs_f64().to_string()));
    }
    if let (true, Some((cols, rows))) = (terminal, super::terminal::size()) {
        query.push(("cols", cols.to_string()));
        query.push(("rows", rows.to_string()));
    }
    let path = format!(
        "{}/exec",
        Client::resource_path(
            crate::resource::Kind::Sandbox,
            Some(&client.key(&args.name))
        )
    );
    let (socket, _) = client
        .websocket(
            client.request(Method::GET, &path).query(&query),
            interactive::PROTOCOL,
        )
        .await?;
    let _raw = raw_mode(terminal && args.stdin)?;
    interactive::run(
        socket,
        interactive::Options {
            stdin: args.stdin,
            terminal,
            detach_keys: false,
        },
    )
    .await
}

/// Whether `-t` can have a terminal: our stdin must be one when it is passed on (kubectl's rule;
/// otherwise a warning, and no terminal).
pub(super) fn interactive_terminal(passing_stdin: bool) -> bool {
    use std::io::IsTerminal;
    let ours = if passing_stdin {
        std::io::stdin().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    if !ours {
        super::emit_err("Unable to use a TTY - input is not a terminal or the right kind of file");
    }
    ours
}

/// Our terminal in raw mode for the session, when it takes keys.
pub(super) fn raw_mode(wanted: bool) -> Result<Option<super::terminal::RawMode>, CliError> {
    if !wanted {
        return Ok(None);
    }
    super::terminal::RawMode::enter()
        .map(Some)
        .map_err(|e| CliError::Failed(format!("cannot put the terminal in raw mode: {e}")))
}

/// The command's status as ours; statuses outside 0..=255 (unknown is -1) become 255.
fn exit_code(code: i64) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(255))
}

#[derive(Args, Debug)]
#[command(
    after_help = "One side is NAME:/path in a sandbox (relative paths are under /workspace),
the other a local path or - for standard input/output. Writes land under /workspace.

Examples:
  agent-sandbox cp ./data.bin demo:/workspace/data.bin
  agent-sandbox cp demo:/workspace/out.tar.gz ./out.tar.gz
  agent-sandbox cp demo:report.txt -"
)]
pub struct CpArgs {
    pub src: String,
    pub dst: String,
    #[command(flatten)]
    pub connection: Connection,
}

/// `NAME:/path` → (`NAME`, `/path`). A local path that holds `:` must contain a `/` before it
/// (`./a:b`), as with kubectl.
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (name, path) = spec.split_once(':')?;
    (!name.is_empty() && !name.contains('/') && !path.is_empty()).then_some((name, path))
}

fn base_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

pub async fn cp(args: CpArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    match (remote(&args.src), remote(&args.dst)) {
        (Some(_), Some(_)) => Err(CliError::Usage(
            "copying from one sandbox to another is not supported: copy through a local file"
                .into(),
        )),
        (None, None) => Err(CliError::Usage(
            "one side must be NAME:/path in a sandbox".into(),
        )),
        (Some((name, path)), None) => download(&client, name, path, &args.dst).await,
        (None, Some((name, path))) => upload(&client, &args.src, name, path).await,
    }
}

async fn download(
    client: &Client,
    name: &str,
    path: &str,
    dst: &str,
) -> Result<ExitCode, CliError> {
    let url = Client::sandbox_path(&client.key(name), "/files");
    let bytes = client
        .bytes(client.request(Method::GET, &url).query(&[("path", path)]))
        .await?;
    if dst == "-" {
        let mut out = std::io::stdout();
        out.write_all(&bytes)
            .and_then(|_| out.flush())
            .map_err(|e| CliError::Failed(format!("cannot write to standard output: {e}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut target = PathBuf::from(dst);
    if target.is_dir() {
        target.push(base_name(path));
    }
    std::fs::write(&target, &bytes)
        .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", target.display())))?;
    Ok(ExitCode::SUCCESS)
}

async fn upload(client: &Client, src: &str, name: &str, path: &str) -> Result<ExitCode, CliError> {
    let (bytes, mode, local_name) = if src == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| CliError::Failed(format!("cannot read standard input: {e}")))?;
        (bytes, 0o644, None)
    } else {
        let local = Path::new(src);
        let meta = std::fs::metadata(local)
            .map_err(|e| CliError::Failed(format!("cannot read {src}: {e}")))?;
        if meta.is_dir() {
            return Err(CliError::Usage(format!(
                "{src} is a folder; cp copies one file (pack a folder with tar first)"
            )));
        }
        let bytes = std::fs::read(local)
            .map_err(|e| CliError::Failed(format!("cannot read {src}: {e}")))?;
        (bytes, local_mode(&meta), Some(base_name(src).to_string()))
    };
    let mut target = path.to_string();
    if target.ends_with('/') {
        match &local_name {
            Some(n) => target.push_str(n),
            None => {
                return Err(CliError::Usage(
                    "name the file to write: NAME:/path/file (not a folder) when reading stdin"
                        .into(),
                ))
            }
        }
    }
    let url = Client::sandbox_path(&client.key(name), "/files");
    client
        .json(
            client
                .request(Method::PUT, &url)
                .query(&[("path", target.as_str()), ("mode", &format!("{mode:03o}"))])
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(bytes),
        )
        .await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(unix)]
fn local_mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o777
}

#[cfg(not(unix))]
fn local_mode(_: &std::fs::Metadata) -> u32 {
    0o644
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_specs() {
        assert_eq!(remote("demo:/workspace/a"), Some(("demo", "/workspace/a")));
        assert_eq!(remote("demo:a.txt"), Some(("demo", "a.txt")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/tmp/x"), None);
        assert_eq!(remote(":x"), None);
        assert_eq!(remote("demo:"), None);
    }

    #[test]
    fn env_pairs() {
        let env = env_map(&["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
        assert_eq!(env["B"], "x=y");
        assert_eq!(env["C"], "");
        assert!(env_map(&["nope".into()]).is_err());
        assert!(env_map(&["=v".into()]).is_err());
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(3), ExitCode::from(3));
        assert_eq!(exit_code(-1), ExitCode::from(255));
        assert_eq!(exit_code(300), ExitCode::from(255));
    }
}
