//! The `agent-sandbox` binary: everything lives in the library; this only hands over to the CLI.

fn main() -> std::process::ExitCode {
    agent_sandbox::cli::main()
}
