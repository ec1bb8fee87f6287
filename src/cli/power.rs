//! `pause` and `resume`: one call each to the resource API's convenience routes, which answer
//! once the controller reports the sandbox paused, stopped or running again.

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};

use super::client::{encode, Client, Connection};
use super::{emit, CliError};
use crate::api::resources::PREFIX;

#[derive(Args, Debug)]
#[command(
    after_help = "Paused freezes every process and keeps memory; --stop stops the container \
(memory released; /workspace, and a writable root filesystem, kept). The next exec or file call \
resumes the sandbox unless its spec.autoResume is false.

Examples:
  agent-sandbox pause demo
  agent-sandbox pause demo --stop"
)]
pub struct PauseArgs {
    pub sandbox: String,
    /// Stop the container instead of freezing it.
    #[arg(long)]
    pub stop: bool,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:
  agent-sandbox resume demo")]
pub struct ResumeArgs {
    pub sandbox: String,
    #[command(flatten)]
    pub connection: Connection,
}

fn phase(sandbox: &Value) -> &str {
    sandbox["status"]["phase"].as_str().unwrap_or("<unknown>")
}

pub async fn pause(args: PauseArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let path = format!("{PREFIX}/sandboxes/{}/pause", encode(&args.sandbox));
    let mode = if args.stop { "Stopped" } else { "Paused" };
    let sandbox = client
        .json(
            client
                .request(Method::POST, &path)
                .json(&json!({ "mode": mode })),
        )
        .await?;
    emit(&format!(
        "sandbox/{} {}\n",
        args.sandbox,
        phase(&sandbox).to_lowercase()
    ));
    Ok(ExitCode::SUCCESS)
}

pub async fn resume(args: ResumeArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let path = format!("{PREFIX}/sandboxes/{}/resume", encode(&args.sandbox));
    let sandbox = client.json(client.request(Method::POST, &path)).await?;
    emit(&format!(
        "sandbox/{} {}\n",
        args.sandbox,
        phase(&sandbox).to_lowercase()
    ));
    Ok(ExitCode::SUCCESS)
}
