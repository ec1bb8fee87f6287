//! The command line: `serve` runs the server; `schemas` and `openapi` regenerate committed
//! contracts. (kubectl-style client commands and `mcp` live here too.)

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Settings;

#[derive(Parser, Debug)]
#[command(
    name = "agent-sandbox",
    version,
    about = "Disposable, hardened Docker sandboxes for AI agents"
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
    Serve(Settings),
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
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(settings) => crate::server::run_blocking(settings),
        Command::Openapi { path } => {
            let document = crate::api::openapi_document();
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
    }
}
