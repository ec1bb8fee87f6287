//! `agent-sandbox keys create|list|revoke`: edits the keys file (`AGENT_SANDBOX_KEYS_FILE` or
//! `--file`) on this machine, where the server reads it; a running server picks changes up
//! within a second. `create` prints the new key once; the file keeps only its SHA-256.
//!
//! Works on the file alone (through [`crate::authz::keyring`]); it never talks to a server.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::authz::keyring;
use crate::authz::Role;

#[derive(Args, Debug)]
pub struct KeysArgs {
    /// The keys file the server reads.
    #[arg(long, env = "AGENT_SANDBOX_KEYS_FILE", global = true)]
    file: Option<PathBuf>,
    #[command(subcommand)]
    action: KeysAction,
}

#[derive(Subcommand, Debug)]
enum KeysAction {
    /// Make a key, print it once, and keep only its digest.
    ///
    /// Example: agent-sandbox keys create --name ci --namespace default --role edit
    Create {
        #[arg(long)]
        name: String,
        /// A namespace the key reaches (repeatable; `*` for all).
        #[arg(long = "namespace", required = true)]
        namespaces: Vec<String>,
        /// view (get, list, watch), edit (everything in its namespaces) or admin.
        #[arg(long)]
        role: Role,
    },
    /// List the keys: name, role, namespaces (never a key).
    List,
    /// Remove a key; a running server stops accepting it within a second.
    Revoke { name: String },
}

pub fn command(args: KeysArgs) -> ExitCode {
    let Some(path) = args.file else {
        eprintln!("error: no keys file: set AGENT_SANDBOX_KEYS_FILE or pass --file");
        return ExitCode::from(2);
    };
    let result = match args.action {
        KeysAction::Create {
            name,
            namespaces,
            role,
        } => keyring::create(&path, &name, &namespaces, role).map(|key| {
            super::emit(&format!("{key}\n"));
            super::emit_err(&format!(
                "key {name:?} ({}) created; it is shown only this once",
                role.as_str()
            ));
        }),
        KeysAction::List => keyring::list(&path).map(|entries| {
            let mut out = String::from("NAME\tROLE\tNAMESPACES\n");
            for e in entries {
                out.push_str(&format!(
                    "{}\t{}\t{}\n",
                    e.name,
                    e.role.as_str(),
                    e.namespaces.join(",")
                ));
            }
            super::emit(&out);
        }),
        KeysAction::Revoke { name } => keyring::revoke(&path, &name).map(|()| {
            super::emit_err(&format!("key {name:?} revoked"));
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
