//! Wiring for `agent-sandbox serve`: settings → Docker → store → controller → HTTP, and graceful
//! shutdown on SIGTERM or Ctrl-C.

use std::process::ExitCode;

use crate::config::Settings;

/// Runs the server until it is told to stop; returns the process exit code.
pub fn run_blocking(settings: Settings) -> ExitCode {
    if let Err(e) = settings.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    todo!("server wiring")
}
