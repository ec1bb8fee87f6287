//! `validate`: checks manifests against the kinds' schemas with no server, for CI. Every problem
//! is one line naming file, line and field; any problem makes the exit status non-zero.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::manifests;
use super::{emit, emit_err, CliError};

#[derive(Args, Debug)]
#[command(after_help = "Works offline: no server is contacted.

Examples:
  agent-sandbox validate manifests/
  agent-sandbox validate sandbox.yaml fork.yaml
  git show HEAD:sandbox.yaml | agent-sandbox validate -")]
pub struct ValidateArgs {
    /// Files, folders (read recursively) or `-` for standard input.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

pub fn validate(args: ValidateArgs) -> Result<ExitCode, CliError> {
    let read = manifests::read(&args.paths);
    let mut errors = read.errors.clone();
    // The server keys resources by kind and name: two documents claiming one would fight.
    let mut seen: HashMap<(String, String), String> = HashMap::new();
    for doc in &read.documents {
        let here = format!("{}:{}", doc.file.display(), doc.line);
        if doc.resource.name().is_empty() {
            continue;
        }
        let key = (
            doc.resource.kind().to_string(),
            doc.resource.name().to_string(),
        );
        if let Some(first) = seen.get(&key) {
            errors.push(format!(
                "{here}: metadata.name: {} is declared twice (first at {first})",
                doc.reference()
            ));
        } else {
            seen.insert(key, here);
        }
    }
    for error in &errors {
        emit_err(&format!("error: {error}"));
    }
    if !errors.is_empty() {
        return Err(CliError::Reported(format!(
            "{} problem(s) in {} file(s)",
            errors.len(),
            read.files.max(1)
        )));
    }
    emit(&format!(
        "{} document(s) in {} file(s) are valid\n",
        read.documents.len(),
        read.files
    ));
    Ok(ExitCode::SUCCESS)
}
