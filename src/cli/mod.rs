//! The command line. `serve` runs the server; `doctor` checks the machine first; `gc` (module
//! [`crate::gc`]) removes orphaned Docker objects; `schemas` and `openapi` regenerate committed
//! contracts; `validate` checks manifests offline; `export` translates them for Kubernetes; every
//! other command is a kubectl-style client of a running server over HTTP (`AGENT_SANDBOX_URL`,
//! `AGENT_SANDBOX_API_KEY`), and `mcp` is an MCP server over stdio backed by that same client.
//!
//! Client commands never touch the data directory or Docker, and never parse YAML themselves:
//! manifests go through `resource::yaml`. Long-lived processes (`run`, `ps`, `logs`, `attach`,
//! `kill`) are `processes.rs`; `port-forward` and `preview` are `ports.rs`; `top` (usage, refreshed) is `top.rs`; interactive sessions (`attach`, `exec -i/-t`) `interactive.rs`,
//! over WebSockets from the same client. Every failure is one line on stderr and a non-zero exit.

mod apply;
mod archive;
pub mod client;
mod describe;
mod diff;
mod egress;
mod events;
mod exec;
mod export;
mod get;
mod interactive;
mod keys;
mod manifests;
pub mod mcp;
mod ops;
mod ports;
mod power;
mod processes;
mod progress;
mod template;
mod terminal;
mod top;
mod util;
mod validate;
mod waiting;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Settings;

#[derive(Parser, Debug)]
#[command(
    name = "agent-sandbox",
    version,
    about = "Disposable, hardened Docker sandboxes for AI agents",
    after_help = "Client commands reach the server at AGENT_SANDBOX_URL (default http://127.0.0.1:8080)
with the key in AGENT_SANDBOX_API_KEY, or --server and --api-key.

Examples:
  agent-sandbox apply -f manifests/
  agent-sandbox get sandboxes
  agent-sandbox exec demo -- ls -la /workspace"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the server (API, controller, folder watchers).
    ///
    /// Example: AGENT_SANDBOX_DATA_DIR=./data agent-sandbox serve --watch ./manifests
    Serve(Box<Settings>),
    /// Check that this machine can run the server, one line each with a fix: Docker and its
    /// release, the runtime, the default image, the data directory, the key file, the port.
    ///
    /// Takes the same settings as `serve`; exits 1 when a check fails.
    ///
    /// Example: AGENT_SANDBOX_DOCKER_RUNTIME=runsc agent-sandbox doctor
    Doctor(Box<Settings>),
    /// Write the JSON Schemas of every kind into a folder.
    ///
    /// Example: agent-sandbox schemas schemas/
    Schemas {
        #[arg(default_value = "schemas")]
        dir: PathBuf,
    },
    /// Write the OpenAPI document of the HTTP API (to stdout without a path).
    ///
    /// Example: agent-sandbox openapi docs/openapi.json
    Openapi { path: Option<PathBuf> },
    /// Create or update the resources manifests declare.
    Apply(apply::ApplyArgs),
    /// Delete resources, by name or as manifests declare them.
    Delete(apply::DeleteArgs),
    /// List resources, or show one, as a table, YAML or JSON.
    Get(get::GetArgs),
    /// Show one resource in full: spec, status, conditions and history.
    Describe(describe::DescribeArgs),
    /// Show what `apply` would change, and what each change does to running sandboxes.
    Diff(diff::DiffArgs),
    /// Check manifests against the schemas, offline.
    Validate(validate::ValidateArgs),
    /// Print the Kubernetes objects that run the same sandboxes on a cluster.
    Export(export::ExportArgs),
    /// Run a command in a sandbox, streaming its output.
    Exec(exec::ExecArgs),
    /// Copy a file into or out of a sandbox.
    Cp(exec::CpArgs),
    /// Start a long-lived process in a sandbox and print its id.
    Run(processes::RunArgs),
    /// List a sandbox's long-lived processes.
    Ps(processes::PsArgs),
    /// Print a process's output, from a byte offset, optionally following it.
    Logs(processes::LogsArgs),
    /// Attach to a running process: its output, and with -i its stdin.
    Attach(processes::AttachArgs),
    /// Kill a process's whole tree and forget it, or send it a signal.
    Kill(processes::KillArgs),
    /// Forward local ports to ports inside a sandbox (127.0.0.1 here).
    PortForward(ports::PortForwardArgs),
    /// Print a preview link to a port of a sandbox (needs AGENT_SANDBOX_PREVIEW_DOMAIN).
    Preview(ports::PreviewArgs),
    /// Print a sandbox's egress decisions (what its allow-list let through or refused).
    Egress(egress::EgressArgs),
    /// Wait until a resource meets a condition or is deleted.
    Wait(ops::WaitArgs),
    /// Save a sandbox's /workspace as a snapshot; `snapshot export` and `snapshot import` move
    /// snapshots between servers as archive files.
    Snapshot(ops::SnapshotArgs),
    /// Restore a sandbox's /workspace from a snapshot.
    Rollback(ops::RollbackArgs),
    /// Start sandboxes from a snapshot.
    Fork(ops::ForkArgs),
    /// Make sandbox templates: `template create NAME --from-sandbox SB`.
    Template(template::TemplateArgs),
    /// Set how long a sandbox lives from now.
    Timeout(ops::TimeoutArgs),
    /// Pause a sandbox (freeze its processes), or stop it with --stop.
    Pause(power::PauseArgs),
    /// Resume a paused or stopped sandbox.
    Resume(power::ResumeArgs),
    /// Show what sandboxes use (CPU, memory, tasks, workspace, network), refreshed in place.
    Top(top::TopArgs),
    /// Serve the sandbox tools to an MCP client over stdio.
    Mcp(mcp::McpArgs),
    /// Remove labeled containers and volumes that no running server claims (talks to Docker).
    #[command(after_help = "Examples:
  agent-sandbox gc --dry-run
  agent-sandbox gc --all-servers --selector io.agent-sandbox.id=demo")]
    Gc(crate::gc::GcArgs),
    /// Create, list and revoke scoped API keys in the keys file (works on the file, not a server).
    #[command(after_help = "Examples:
  agent-sandbox keys create --name ci --namespace default --role edit
  agent-sandbox keys list
  agent-sandbox keys revoke ci")]
    Keys(keys::KeysArgs),
}

/// Why a client command failed. The message is printed as `error: <message>`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// The command line asks for something that cannot be done.
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
    /// The details are already on stderr; this is the summary.
    #[error("{0}")]
    Reported(String),
}

/// Writes to stdout. A closed pipe (`| head`) is not an error worth a message.
pub(crate) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

/// Writes one line to stderr.
pub(crate) fn emit_err(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(settings) => crate::server::run_blocking(*settings),
        Command::Doctor(settings) => doctor(*settings),
        Command::Openapi { path } => {
            let document = crate::api::default_openapi_document();
            match path {
                None => {
                    print!("{}", crate::api::openapi::to_text(&document));
                    ExitCode::SUCCESS
                }
                Some(path) => match crate::api::openapi::write(&document, &path) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: cannot write {}: {e}", path.display());
                        ExitCode::FAILURE
                    }
                },
            }
        }
        Command::Schemas { dir } => match crate::resource::schema::write_schemas(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write schemas to {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
        Command::Gc(args) => block_on(1, crate::gc::command(args)),
        Command::Keys(args) => keys::command(args),
        other => run_client(other),
    }
}

/// `agent-sandbox doctor`: every check, one line each; exit 1 when one fails.
fn doctor(settings: Settings) -> ExitCode {
    if let Err(e) = settings.validate() {
        emit_err(&format!("FAIL  settings   {e}"));
        return ExitCode::FAILURE;
    }
    block_on(1, async {
        let findings = crate::doctor::run(&settings, crate::doctor::Occasion::Doctor).await;
        let failed = findings
            .iter()
            .filter(|f| f.verdict == crate::doctor::Verdict::Fail)
            .count();
        let mut text: String = findings.iter().map(|f| format!("{f}\n")).collect();
        text.push_str(&match failed {
            0 => "no check failed\n".to_string(),
            n => format!("{n} check(s) failed\n"),
        });
        emit(&text);
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

/// Runs `future` on a single-threaded runtime; `error_exit` if the runtime cannot start.
fn block_on(error_exit: u8, future: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(future),
        Err(e) => {
            emit_err(&format!("error: cannot start: {e}"));
            ExitCode::from(error_exit)
        }
    }
}

fn run_client(command: Command) -> ExitCode {
    // kubectl's convention: diff exits 1 for "differs", so its errors are 2.
    let error_exit = if matches!(command, Command::Diff(_)) {
        2
    } else {
        1
    };
    block_on(error_exit, async move {
        match dispatch(command).await {
            Ok(code) => code,
            Err(e) => {
                emit_err(&format!("error: {e}"));
                ExitCode::from(error_exit)
            }
        }
    })
}

async fn dispatch(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Apply(args) => apply::apply(args).await,
        Command::Delete(args) => apply::delete(args).await,
        // Events are read-only and shown as kubectl shows them: their own table.
        Command::Get(args) if events::is_events(&args.kind) => events::get(args).await,
        Command::Get(args) => get::get(args).await,
        Command::Describe(args) => describe::describe(args).await,
        Command::Diff(args) => diff::diff(args).await,
        Command::Validate(args) => validate::validate(args),
        Command::Export(args) => export::export(args).await,
        Command::Exec(args) => exec::exec(args).await,
        Command::Cp(args) => exec::cp(args).await,
        Command::Run(args) => processes::run(args).await,
        Command::Ps(args) => processes::ps(args).await,
        Command::Logs(args) => processes::logs(args).await,
        Command::Attach(args) => processes::attach(args).await,
        Command::Kill(args) => processes::kill(args).await,
        Command::PortForward(args) => ports::port_forward(args).await,
        Command::Preview(args) => ports::preview(args).await,
        Command::Egress(args) => egress::egress(args).await,
        Command::Wait(args) => ops::wait(args).await,
        Command::Snapshot(args) => ops::snapshot(args).await,
        Command::Rollback(args) => ops::rollback(args).await,
        Command::Fork(args) => ops::fork(args).await,
        Command::Template(args) => template::run(args).await,
        Command::Timeout(args) => ops::timeout(args).await,
        Command::Pause(args) => power::pause(args).await,
        Command::Resume(args) => power::resume(args).await,
        Command::Top(args) => top::top(args).await,
        Command::Mcp(args) => mcp::mcp(args).await,
        Command::Serve(_)
        | Command::Doctor(_)
        | Command::Gc(_)
        | Command::Keys(_)
        | Command::Schemas { .. }
        | Command::Openapi { .. } => Err(CliError::Usage("not a client command".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_client_command_has_an_example() {
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            let help = format!(
                "{}{}",
                sub.get_long_about()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                sub.get_after_help()
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            assert!(
                help.contains("Example"),
                "`{}` has no example in its help",
                sub.get_name()
            );
        }
    }

    #[test]
    fn exec_takes_the_command_after_dashes() {
        let cli = Cli::try_parse_from([
            "agent-sandbox",
            "exec",
            "demo",
            "-e",
            "A=1",
            "--",
            "sh",
            "-c",
            "echo hi",
        ])
        .unwrap();
        match cli.command {
            Command::Exec(args) => {
                assert_eq!(args.name, "demo");
                assert_eq!(args.command, ["sh", "-c", "echo hi"]);
                assert_eq!(args.env, ["A=1"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
