//! `apply -f` and `delete`: make the server's desired state match manifests, or remove resources.
//!
//! Apply reads every document first and writes nothing when any of them is invalid, so a typo in
//! one file never leaves a folder half applied. It only creates and replaces what the files name:
//! resources the server has and the files do not are left alone (there is no pruning).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::Value;

use super::client::{Client, Connection};
use super::manifests::{self, reference, Document};
use super::progress::Progress;
use super::util::{kind_and_name, parse_duration};
use super::waiting::{wait_for_condition, wait_gone, WaitError};
use super::{emit, emit_err, CliError};
use crate::resource::{AnyResource, Kind};

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox apply -f sandbox.yaml
  agent-sandbox apply -f manifests/          # every *.yaml, *.yml, *.json below, in order
  cat sandbox.yaml | agent-sandbox apply -f -
  agent-sandbox apply -f manifests/ --dry-run
  agent-sandbox apply -f sandbox.yaml --wait --timeout=10m   # until Ready; an image pull shows a bar")]
pub struct ApplyArgs {
    /// A manifest file, a folder (read recursively) or `-` for standard input. Repeatable.
    #[arg(short = 'f', long = "filename", required = true, value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Let the server validate every change and say what it would do, without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Then wait until every resource the files name is Ready. A sandbox waiting for its image
    /// shows the pull: a progress bar on a terminal, a line per tenth otherwise (on stderr).
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,
    /// How long `--wait` waits for all of them together.
    #[arg(long, default_value = "5m", value_parser = parse_duration, requires = "wait")]
    pub timeout: Duration,
    #[command(flatten)]
    pub connection: Connection,
}

/// What apply did to one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl Outcome {
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// Reads manifests; every problem goes to stderr. `Err` when any document is invalid.
pub fn read_all(files: &[PathBuf]) -> Result<Vec<Document>, CliError> {
    let read = manifests::read(files);
    for error in &read.errors {
        emit_err(&format!("error: {error}"));
    }
    if !read.errors.is_empty() {
        return Err(CliError::Reported(format!(
            "{} invalid document(s) or unreadable path(s); nothing was changed",
            read.errors.len()
        )));
    }
    if read.documents.is_empty() {
        return Err(CliError::Usage(
            "no documents found in the given paths".into(),
        ));
    }
    for doc in &read.documents {
        if doc.resource.name().is_empty() {
            return Err(CliError::Usage(format!(
                "{}:{}: metadata.name: a name is required to apply or diff a {}",
                doc.file.display(),
                doc.line,
                doc.resource.kind()
            )));
        }
    }
    Ok(read.documents)
}

/// Whether the server's copy (its JSON) already declares what `wanted` declares.
pub fn same_as_server(server: &Value, wanted: &AnyResource) -> bool {
    let meta = &server["metadata"];
    let empty = Value::Object(Default::default());
    let or_empty = |v: &Value| {
        if v.is_null() {
            empty.clone()
        } else {
            v.clone()
        }
    };
    let wanted_json = wanted.declaration().to_json();
    server["spec"] == wanted.spec_json()
        && or_empty(&meta["labels"]) == or_empty(&wanted_json["metadata"]["labels"])
        && or_empty(&meta["annotations"]) == or_empty(&wanted_json["metadata"]["annotations"])
}

/// Creates or replaces one resource so that it declares what `resource` does.
pub async fn apply_one(
    client: &Client,
    resource: &AnyResource,
    dry_run: bool,
) -> Result<Outcome, CliError> {
    let kind = resource.kind();
    let key = resource.key();
    let name = key.as_str();
    let body = resource.declaration().to_json();
    match client.get_resource(kind, name).await? {
        None => {
            client.create_resource(kind, &body, dry_run).await?;
            Ok(Outcome::Created)
        }
        Some(current) if same_as_server(&current, resource) => Ok(Outcome::Unchanged),
        Some(_) => {
            client.replace_resource(kind, name, &body, dry_run).await?;
            Ok(Outcome::Configured)
        }
    }
}

pub async fn apply(args: ApplyArgs) -> Result<ExitCode, CliError> {
    let documents = read_all(&args.files)?;
    let client = Client::new(&args.connection)?;
    let suffix = if args.dry_run {
        " (server dry run)"
    } else {
        ""
    };
    let mut failed = 0;
    for doc in &documents {
        match apply_one(&client, &doc.resource, args.dry_run).await {
            Ok(outcome) => emit(&format!("{} {}{suffix}\n", doc.reference(), outcome.word())),
            Err(CliError::Client(e)) if e.status().is_none() => return Err(e.into()),
            Err(e) if documents.len() == 1 => {
                return Err(CliError::Failed(format!("{}: {e}", doc.reference())))
            }
            Err(e) => {
                failed += 1;
                emit_err(&format!("error: {}: {e}", doc.reference()));
            }
        }
    }
    if failed > 0 {
        return Err(CliError::Reported(format!(
            "{failed} of {} resource(s) could not be applied",
            documents.len()
        )));
    }
    if args.wait {
        wait_ready(&client, &documents, Instant::now() + args.timeout).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `apply --wait`: waits, one after the other, until every applied resource is Ready for its
/// current generation, and says so for each.
async fn wait_ready(
    client: &Client,
    documents: &[Document],
    deadline: Instant,
) -> Result<(), CliError> {
    let mut progress = Progress::on_stderr();
    for doc in documents {
        let (kind, name) = (doc.resource.kind(), doc.resource.key());
        let waited = wait_for_condition(
            client,
            kind,
            &name,
            "Ready",
            "True",
            deadline,
            &mut progress,
        )
        .await;
        match waited {
            Ok(()) => emit(&format!("{} ready\n", doc.reference())),
            Err(WaitError::TimedOut(why)) => {
                return Err(CliError::Failed(format!(
                    "timed out waiting for {} to be ready: {why}",
                    doc.reference()
                )))
            }
            Err(WaitError::Client(e)) => return Err(e),
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox delete sandbox demo
  agent-sandbox delete sandbox/demo snapshot/snap_485f667dcf5910ac
  agent-sandbox delete -f manifests/
  agent-sandbox delete fork/try --wait=false")]
pub struct DeleteArgs {
    /// KIND NAME…, or KIND/NAME… (kinds: sandbox, snapshot, fork).
    #[arg(value_name = "KIND[/NAME]")]
    pub targets: Vec<String>,
    /// Delete what these manifests declare (file, folder or `-`). Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Wait until the resources are gone (their containers and volumes removed).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Treat a resource that does not exist as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,
    #[command(flatten)]
    pub connection: Connection,
}

fn delete_targets(args: &DeleteArgs) -> Result<Vec<(Kind, String)>, CliError> {
    let mut targets = Vec::new();
    if !args.files.is_empty() {
        if !args.targets.is_empty() {
            return Err(CliError::Usage(
                "give either -f PATH or KIND NAME, not both".into(),
            ));
        }
        for doc in read_all(&args.files)? {
            targets.push((doc.resource.kind(), doc.resource.key()));
        }
        return Ok(targets);
    }
    let Some(first) = args.targets.first() else {
        return Err(CliError::Usage(
            "say what to delete: KIND NAME, KIND/NAME or -f PATH".into(),
        ));
    };
    if first.contains('/') {
        for t in &args.targets {
            targets.push(kind_and_name(t, None).map_err(CliError::Usage)?);
        }
    } else {
        let kind: Kind = first.parse().map_err(CliError::Usage)?;
        if args.targets.len() < 2 {
            return Err(CliError::Usage(format!(
                "say which {} to delete: agent-sandbox delete {first} NAME",
                kind.as_str().to_ascii_lowercase()
            )));
        }
        for name in &args.targets[1..] {
            targets.push((kind, name.clone()));
        }
    }
    Ok(targets)
}

pub async fn delete(args: DeleteArgs) -> Result<ExitCode, CliError> {
    let targets = delete_targets(&args)?;
    let client = Client::new(&args.connection)?;
    let mut failed = 0;
    let mut pending = Vec::new();
    for (kind, name) in &targets {
        let what = reference(*kind, name);
        match client.delete_resource(*kind, name).await {
            Ok(_) => pending.push((*kind, name.clone())),
            Err(e) if e.is_not_found() && args.ignore_not_found => {}
            Err(e) if e.status().is_none() => return Err(e.into()),
            Err(e) if targets.len() == 1 => return Err(CliError::Failed(format!("{what}: {e}"))),
            Err(e) => {
                failed += 1;
                emit_err(&format!("error: {what}: {e}"));
            }
        }
    }
    let deadline = Instant::now() + args.timeout;
    for (kind, name) in pending {
        let what = reference(kind, &name);
        if args.wait {
            if let Err(e) = wait_gone(&client, kind, &name, deadline).await {
                if targets.len() == 1 {
                    return Err(CliError::Failed(format!("{what}: {e}")));
                }
                failed += 1;
                emit_err(&format!("error: {what}: {e}"));
                continue;
            }
        }
        emit(&format!("{what} deleted\n"));
    }
    if failed > 0 {
        return Err(CliError::Reported(format!(
            "{failed} of {} resource(s) could not be deleted",
            targets.len()
        )));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Sandbox, SandboxSpec};

    #[test]
    fn server_copies_compare_by_declaration_only() {
        let mut mine = Sandbox::new(
            "x",
            SandboxSpec {
                cpus: Some(1.0),
                ..Default::default()
            },
        );
        mine.metadata.labels.insert("team".into(), "a".into());
        let mine = AnyResource::Sandbox(mine);
        let mut server = mine.to_json();
        server["metadata"]["uid"] = "u".into();
        server["metadata"]["resourceVersion"] = "7".into();
        server["status"] = serde_json::json!({"phase": "Running"});
        assert!(same_as_server(&server, &mine));
        server["spec"]["cpus"] = 2.0.into();
        assert!(!same_as_server(&server, &mine));
        server["spec"]["cpus"] = 1.0.into();
        server["metadata"]["labels"]["team"] = "b".into();
        assert!(!same_as_server(&server, &mine));
    }
}
