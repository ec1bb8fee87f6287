//! `agent-sandbox-helper`: the in-sandbox exec helper of agent-sandbox, a small static binary
//! that runs as the sandbox user and needs no capability.
//!
//! Start here; each mode lives in its own file:
//!
//! - `serve` (`serve.rs`): reads requests from stdin and writes events to stdout in the framed
//!   protocol of the `helper_protocol` crate (`crates/helper-protocol/`, shared with the server),
//!   in one `poll(2)` loop that owns every timer. Each command (`command.rs`) gets a shepherd
//!   process, a child subreaper (`shepherd.rs`), and four pipes (stdout, stderr, shepherd status,
//!   shepherd control).
//! - `write-file`, `read-file`, `list-dir` (`files.rs`): one-shot file modes confined to
//!   `/workspace`, answering with `helper_protocol::file_exit` codes.
//! - `idle`: a container's main process, which keeps it alive and is its process supervisor
//!   (`supervisor.rs`): it owns the sandbox's long-lived processes (`process.rs`, output kept in
//!   `ring.rs`) and serves them on a Unix socket; it also owns the sandbox's directory watches
//!   (`watch.rs`, inotify).
//! - `bridge` (`bridge.rs`): relays stdin/stdout to that socket, for the server's `docker exec`.
//! - `relay PORT` (`relay.rs`): relays stdin/stdout to `127.0.0.1:PORT`, for the server's port
//!   proxy and port-forward.
//!
//! `sys.rs` wraps the few system calls the others share. This file only dispatches on the mode.

mod bridge;
mod command;
mod files;
mod process;
mod relay;
mod ring;
mod serve;
mod shepherd;
mod splice;
mod supervisor;
mod sys;
mod watch;

use helper_protocol::PROTOCOL_VERSION;

const USAGE: &str =
    "usage: agent-sandbox-helper serve|idle|bridge|relay|write-file|read-file|list-dir\n\
\n\
Speaks the agent-sandbox helper protocol on stdin (requests) and stdout (events).\n";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve"] => std::process::exit(serve::serve()),
        ["write-file", ..] => std::process::exit(files::write_file_main(&args[1..])),
        ["read-file", ..] => std::process::exit(files::read_file_main(&args[1..])),
        ["list-dir", ..] => std::process::exit(files::list_dir_main(&args[1..])),
        // The container's main process: keeps the container alive and supervises its processes.
        // It is not PID 1 (Docker's init is), so SIGTERM's default action ends it on `docker
        // stop`.
        ["idle"] => supervisor::main(),
        ["bridge"] => std::process::exit(bridge::bridge()),
        ["relay", ..] => std::process::exit(relay::relay_main(&args[1..])),
        ["--version"] | ["version"] => {
            println!(
                "agent-sandbox-helper {} (protocol {PROTOCOL_VERSION})",
                env!("CARGO_PKG_VERSION")
            );
        }
        ["--help"] | ["-h"] | ["help"] => print!("{USAGE}"),
        _ => {
            eprint!("{USAGE}");
            std::process::exit(2);
        }
    }
}
