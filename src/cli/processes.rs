//! Long-lived processes from a terminal, with kubectl's habits: `run NAME --detach -- CMD…`
//! (prints the process id), `ps NAME`, `logs NAME ID [-f] [--from N]`, `attach NAME ID [-i]
//! [-t]`, `kill NAME ID [--signal S]`. All of it is the processes subresource of the resource
//! API; output is replayed byte for byte (base64 on the wire). Interactive sessions (`attach`,
//! `exec -i/-t`) are `interactive.rs`.

use std::io::Write;
use std::process::ExitCode;

use base64::Engine as _;
use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};

use super::client::{Client, Connection, NdjsonReader};
use super::CliError;
use crate::resource::Kind;

fn path(sandbox: &str, rest: &str) -> String {
    format!(
        "{}/processes{rest}",
        Client::resource_path(Kind::Sandbox, Some(sandbox))
    )
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox run demo --detach -- python3 -m http.server 8000
  agent-sandbox run demo -d --stdin -- sh")]
pub struct RunArgs {
    /// The sandbox.
    pub name: String,
    /// Start it in the background and print its id (the only mode so far).
    #[arg(short = 'd', long)]
    pub detach: bool,
    /// Keep its stdin open (write with the API's `…/stdin`).
    #[arg(long)]
    pub stdin: bool,
    /// Run it on a terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Working directory (default /workspace).
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    pub workdir: Option<String>,
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

pub async fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    if !args.detach {
        return Err(CliError::Usage(
            "run needs --detach (use exec to run a command and wait for it)".into(),
        ));
    }
    let client = Client::new(&args.connection)?;
    let mut body = json!({"argv": args.command, "stdin": args.stdin, "tty": args.tty});
    if let Some(w) = &args.workdir {
        body["workdir"] = json!(w);
    }
    let p = client
        .json(
            client
                .request(Method::POST, &path(&client.key(&args.name), ""))
                .json(&body),
        )
        .await?;
    super::emit(&format!("{}\n", p["id"].as_str().unwrap_or_default()));
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
#[command(after_help = "Example:
  agent-sandbox ps demo")]
pub struct PsArgs {
    /// The sandbox.
    pub name: String,
    #[command(flatten)]
    pub connection: Connection,
}

fn describe_end(p: &Value) -> String {
    match (p["state"].as_str(), &p["exitCode"], &p["signal"]) {
        (Some("Exited"), Value::Number(n), _) => format!("Exited({n})"),
        (Some("Exited"), _, Value::String(s)) => format!("Exited(SIG{s})"),
        (Some(state), _, _) => state.to_string(),
        _ => "?".into(),
    }
}

pub async fn ps(args: PsArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let list = client
        .json(client.request(Method::GET, &path(&client.key(&args.name), "")))
        .await?;
    let mut out = format!(
        "{:<20} {:>7} {:<14} {:>10} {:>10}  COMMAND\n",
        "ID", "PID", "STATE", "STDOUT", "STDERR"
    );
    for p in list["items"].as_array().into_iter().flatten() {
        let command = p["command"].as_str().map(String::from).unwrap_or_else(|| {
            p["argv"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        });
        out.push_str(&format!(
            "{:<20} {:>7} {:<14} {:>10} {:>10}  {command}\n",
            p["id"].as_str().unwrap_or_default(),
            p["pid"],
            describe_end(p),
            p["stdoutBytes"],
            p["stderrBytes"],
        ));
    }
    super::emit(&out);
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exits 0 at the end of what was printed so far; with -f, once the process
ends, with its exit status.

Examples:
  agent-sandbox logs demo p_1f0c2d3e4f5a6b7c
  agent-sandbox logs demo p_1f0c2d3e4f5a6b7c -f --from 4096"
)]
pub struct LogsArgs {
    /// The sandbox.
    pub name: String,
    /// The process id.
    pub id: String,
    /// Follow: keep printing until the process ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Byte offset to start from, in stdout and stderr.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn logs(args: LogsArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let from = args.from.to_string();
    let follow = if args.follow { "true" } else { "false" };
    let response = client
        .send(
            client
                .request(
                    Method::GET,
                    &path(&client.key(&args.name), &format!("/{}/output", args.id)),
                )
                .query(&[
                    ("stdoutFrom", from.as_str()),
                    ("stderrFrom", from.as_str()),
                    ("follow", follow),
                    ("encoding", "base64"),
                ]),
        )
        .await?;
    let mut reader = NdjsonReader::new(&client, response);
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = reader.next().await? {
        let data = || {
            base64::engine::general_purpose::STANDARD
                .decode(event["data"].as_str().unwrap_or_default())
                .unwrap_or_default()
        };
        match event["type"].as_str() {
            Some("stdout") => {
                let _ = stdout.write_all(&data()).and_then(|_| stdout.flush());
            }
            Some("stderr") => {
                let _ = stderr.write_all(&data()).and_then(|_| stderr.flush());
            }
            Some("truncated") => super::emit_err(&format!(
                "warning: {} before byte {} is no longer retained",
                event["stream"].as_str().unwrap_or_default(),
                event["retainedFrom"]
            )),
            Some("exit") => {
                let code = match (&event["exitCode"], &event["signal"]) {
                    (Value::Number(n), _) => n.as_u64().unwrap_or(255).min(255) as u8,
                    _ => 137,
                };
                return Ok(if args.follow {
                    ExitCode::from(code)
                } else {
                    ExitCode::SUCCESS
                });
            }
            Some("running") => return Ok(ExitCode::SUCCESS),
            _ => {}
        }
    }
    Err(CliError::Failed(
        "the output stream ended early (the sandbox's container went away?)".into(),
    ))
}

#[derive(Args, Debug)]
#[command(
    after_help = "Streams what the process prints from now on (earlier output: logs) and exits
with its exit status when it ends. With -t on a terminal, Ctrl-P Ctrl-Q detaches and leaves it
running; so does ending attach any other way.

Examples:
  agent-sandbox attach demo p_1f0c2d3e4f5a6b7c
  agent-sandbox attach -it demo p_1f0c2d3e4f5a6b7c
  echo 'print(6 * 7)' | agent-sandbox attach -i demo p_1f0c2d3e4f5a6b7c"
)]
pub struct AttachArgs {
    /// The sandbox.
    pub name: String,
    /// The process id.
    pub id: String,
    /// Pass stdin to the process (until its end, which closes the process's stdin).
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Our terminal in raw mode, for a process that runs on a terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn attach(args: AttachArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let p = client
        .json(client.request(
            Method::GET,
            &path(&client.key(&args.name), &format!("/{}", args.id)),
        ))
        .await?;
    if p["state"] != "Running" {
        return Err(CliError::Failed(format!(
            "process {} is {} (read its output with logs)",
            args.id,
            describe_end(&p)
        )));
    }
    let mut terminal = args.tty && super::exec::interactive_terminal(args.stdin);
    if terminal && p["tty"] != true {
        super::emit_err("Unable to use a TTY - the process does not run on a terminal");
        terminal = false;
    }
    let (socket, _) = client
        .websocket(
            client.request(
                Method::GET,
                &path(&client.key(&args.name), &format!("/{}/attach", args.id)),
            ),
            super::interactive::PROTOCOL,
        )
        .await?;
    let raw = super::exec::raw_mode(terminal && args.stdin)?;
    let code = super::interactive::run(
        socket,
        super::interactive::Options {
            stdin: args.stdin,
            terminal,
            detach_keys: raw.is_some(),
        },
    )
    .await;
    drop(raw);
    code
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox kill demo p_1f0c2d3e4f5a6b7c
  agent-sandbox kill demo p_1f0c2d3e4f5a6b7c --signal INT")]
pub struct KillArgs {
    /// The sandbox.
    pub name: String,
    /// The process id.
    pub id: String,
    /// Send this signal (TERM, INT, HUP, KILL, QUIT, USR1, USR2) instead of killing and
    /// forgetting the process (its whole tree) as the default does.
    #[arg(short = 's', long)]
    pub signal: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn kill(args: KillArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    match &args.signal {
        Some(signal) => {
            client
                .send(
                    client
                        .request(
                            Method::POST,
                            &path(&client.key(&args.name), &format!("/{}/signal", args.id)),
                        )
                        .json(&json!({"signal": signal.to_ascii_uppercase()})),
                )
                .await?;
        }
        None => {
            client
                .send(client.request(
                    Method::DELETE,
                    &path(&client.key(&args.name), &format!("/{}", args.id)),
                ))
                .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
