//! `agent-sandbox mcp`: a Model Context Protocol server over stdio that gives a model the ten
//! sandbox tools of the reference MCP server (same names, arguments, defaults and results), backed
//! by a running agent-sandbox server over HTTP. Nothing but this binary is needed on the machine
//! the model's client runs on.
//!
//! Standard output carries the protocol and nothing else; diagnostics go to standard error.

mod tools;

use std::process::ExitCode;

use clap::Args;
use rmcp::ServiceExt;

use super::client::{Client, Connection};
use super::CliError;

pub use tools::{SandboxTools, INSTRUCTIONS};

#[derive(Args, Debug)]
#[command(
    after_help = "Speaks MCP on standard input and output; configure it in an MCP client as a
stdio server. The server to use comes from AGENT_SANDBOX_URL and AGENT_SANDBOX_API_KEY (or the
flags).

Example (an MCP client's configuration):
  {\"command\": \"agent-sandbox\", \"args\": [\"mcp\"],
   \"env\": {\"AGENT_SANDBOX_URL\": \"http://127.0.0.1:8080\", \"AGENT_SANDBOX_API_KEY\": \"…\"}}"
)]
pub struct McpArgs {
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn mcp(args: McpArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let service = SandboxTools::new(client)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| CliError::Failed(format!("MCP session did not start: {e}")))?;
    service
        .waiting()
        .await
        .map_err(|e| CliError::Failed(format!("MCP session ended with an error: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
