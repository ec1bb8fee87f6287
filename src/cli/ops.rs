//! The imperative verbs around the declarative core: `wait`, `snapshot`, `rollback`, `fork` and
//! `timeout`. Each is one call to the server (`/v1` where the wire API has the verb, the resource
//! API for a multi-replica Fork) followed, where asked, by polling until the result shows.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Args;
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::client::{Client, Connection};
use super::manifests::reference;
use super::progress::Progress;
use super::util::{bytes, kind_and_name, parse_duration, remaining};
use super::waiting::{wait_for_condition, wait_gone, WaitError};
use super::{emit, CliError};
use crate::resource::{Kind, API_VERSION};

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox wait sandbox/demo --for=condition=Ready --timeout=2m
  agent-sandbox wait fork/try --for=condition=Ready
  agent-sandbox wait sandbox/demo --for=delete")]
pub struct WaitArgs {
    /// KIND/NAME (or KIND NAME).
    pub target: String,
    pub name: Option<String>,
    /// `condition=TYPE` (met when its status is True for the current generation), optionally
    /// `condition=TYPE=False`; or `delete`.
    #[arg(long = "for", value_name = "condition=Ready|delete")]
    pub for_: String,
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub connection: Connection,
}

enum Goal {
    Condition { type_: String, status: String },
    Delete,
}

fn parse_goal(text: &str) -> Result<Goal, CliError> {
    if text == "delete" {
        return Ok(Goal::Delete);
    }
    let Some(rest) = text.strip_prefix("condition=") else {
        return Err(CliError::Usage(format!(
            "--for={text}: expected condition=TYPE[=STATUS] or delete"
        )));
    };
    let (type_, status) = match rest.split_once('=') {
        Some((t, s)) => (t, s),
        None => (rest, "True"),
    };
    if type_.is_empty() {
        return Err(CliError::Usage(
            "--for=condition= needs a type, e.g. Ready".into(),
        ));
    }
    Ok(Goal::Condition {
        type_: type_.to_string(),
        status: status.to_string(),
    })
}

pub async fn wait(args: WaitArgs) -> Result<ExitCode, CliError> {
    let (kind, name) =
        kind_and_name(&args.target, args.name.as_deref()).map_err(CliError::Usage)?;
    let goal = parse_goal(&args.for_)?;
    let client = Client::new(&args.connection)?;
    let deadline = Instant::now() + args.timeout;
    let what = reference(kind, &name);
    match goal {
        Goal::Delete => {
            wait_gone(&client, kind, &name, deadline)
                .await
                .map_err(|e| CliError::Failed(format!("timed out waiting for {what}: {e}")))?;
            emit(&format!("{what} deleted\n"));
        }
        Goal::Condition { type_, status } => {
            let mut progress = Progress::on_stderr();
            wait_for_condition(
                &client,
                kind,
                &name,
                &type_,
                &status,
                deadline,
                &mut progress,
            )
            .await
            .map_err(|e| match e {
                WaitError::TimedOut(why) => CliError::Failed(format!(
                    "timed out after {:?} waiting for {what}: {why}",
                    args.timeout
                )),
                WaitError::Client(e) => e,
            })?;
            emit(&format!("{what} condition met\n"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox snapshot demo --name before-upgrade
  SNAP=$(agent-sandbox snapshot demo -q)")]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SnapshotArgs {
    /// Export or import a snapshot archive instead of taking a snapshot.
    #[command(subcommand)]
    pub action: Option<super::archive::SnapshotAction>,
    /// The sandbox whose /workspace to save.
    #[arg(required = true)]
    pub sandbox: Option<String>,
    /// A label for people (at most 128 characters).
    #[arg(long)]
    pub name: Option<String>,
    /// Also keep the root filesystem's changes (a Full snapshot; the sandbox needs
    /// readOnlyRootfs: false).
    #[arg(long)]
    pub full: bool,
    /// Print only the new snapshot's ID.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn snapshot(args: SnapshotArgs) -> Result<ExitCode, CliError> {
    if let Some(action) = args.action {
        return super::archive::run(action, &args.connection).await;
    }
    let sandbox = args
        .sandbox
        .ok_or_else(|| CliError::Usage("snapshot: name the sandbox to save".into()))?;
    let client = Client::new(&args.connection)?;
    let path = Client::sandbox_path(&client.key(&sandbox), "/snapshots");
    let mut body = json!({ "name": args.name });
    if args.full {
        body["scope"] = json!("Full");
    }
    let snap = client
        .json(client.request(Method::POST, &path).json(&body))
        .await?;
    let id = snap["id"].as_str().unwrap_or_default();
    if args.quiet {
        emit(&format!("{id}\n"));
    } else {
        let size = snap["size_bytes"].as_u64().map(bytes).unwrap_or_default();
        emit(&format!(
            "snapshot/{id} created ({size} of sandbox/{sandbox}'s /workspace{})\n",
            if args.full {
                " and its root filesystem changes"
            } else {
                ""
            }
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn snapshot_id(text: &str) -> &str {
    text.strip_prefix("snapshot/")
        .or_else(|| text.strip_prefix("snapshots/"))
        .unwrap_or(text)
}

#[derive(Args, Debug)]
#[command(
    after_help = "The sandbox keeps its name, spec and expiry; its container and /workspace are
replaced by the snapshot's content: running processes stop and /tmp is cleared.

Example:
  agent-sandbox rollback demo snap_485f667dcf5910ac"
)]
pub struct RollbackArgs {
    pub sandbox: String,
    pub snapshot: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn rollback(args: RollbackArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let snapshot = snapshot_id(&args.snapshot);
    let path = Client::sandbox_path(&client.key(&args.sandbox), "/rollback");
    client
        .json(
            client
                .request(Method::POST, &path)
                .json(&json!({ "snapshot_id": snapshot })),
        )
        .await?;
    emit(&format!(
        "sandbox/{} rolled back to snapshot/{snapshot}\n",
        args.sandbox
    ));
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
#[command(
    after_help = "One replica starts one sandbox at once; more create a Fork resource that keeps
that many sandboxes (NAME-0, NAME-1, …) running from the snapshot.

Examples:
  agent-sandbox fork snap_485f667dcf5910ac
  agent-sandbox fork snap_485f667dcf5910ac --replicas 3 --name try --wait
  agent-sandbox fork snap_485f667dcf5910ac --ttl 30m --network"
)]
pub struct ForkArgs {
    pub snapshot: String,
    /// How many sandboxes to start.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub replicas: u32,
    /// Name of the Fork resource (replicas > 1; generated when absent).
    #[arg(long)]
    pub name: Option<String>,
    /// Lifetime of each new sandbox: 900, 30m, 2h.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Network access for the new sandboxes (`--network` or `--network=false`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub network: Option<bool>,
    #[arg(long)]
    pub cpus: Option<f64>,
    #[arg(long = "memory-mb")]
    pub memory_mb: Option<u64>,
    /// With replicas > 1: wait until every sandbox runs.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print only the new sandbox's (or Fork's) name.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub connection: Connection,
}

fn ttl_seconds(ttl: Duration) -> u64 {
    ttl.as_secs().max(1) + u64::from(ttl.subsec_nanos() > 0 && ttl.as_secs() > 0)
}

pub async fn fork(args: ForkArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let snapshot = snapshot_id(&args.snapshot).to_string();
    if args.replicas == 1 && args.name.is_none() {
        let mut body = Map::new();
        if let Some(ttl) = args.ttl {
            body.insert("timeout_seconds".into(), json!(ttl_seconds(ttl)));
        }
        if let Some(network) = args.network {
            body.insert("network".into(), json!(network));
        }
        if let Some(cpus) = args.cpus {
            body.insert("cpus".into(), json!(cpus));
        }
        if let Some(memory) = args.memory_mb {
            body.insert("memory_mb".into(), json!(memory));
        }
        let path = Client::snapshot_path(&client.key(&snapshot), "/fork");
        let sandbox = client
            .json(
                client
                    .request(Method::POST, &path)
                    .json(&Value::Object(body)),
            )
            .await?;
        let id = sandbox["id"].as_str().unwrap_or_default();
        if args.quiet {
            emit(&format!("{id}\n"));
        } else {
            emit(&format!("sandbox/{id} created from snapshot/{snapshot}\n"));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut overrides = Map::new();
    if let Some(ttl) = args.ttl {
        overrides.insert("ttlSeconds".into(), json!(ttl_seconds(ttl)));
    }
    if let Some(network) = args.network {
        overrides.insert("network".into(), json!(network));
    }
    if let Some(cpus) = args.cpus {
        overrides.insert("cpus".into(), json!(cpus));
    }
    if let Some(memory) = args.memory_mb {
        overrides.insert("memoryMB".into(), json!(memory));
    }
    let mut spec = json!({ "snapshot": snapshot, "replicas": args.replicas });
    if !overrides.is_empty() {
        spec["overrides"] = Value::Object(overrides);
    }
    let mut document =
        json!({ "apiVersion": API_VERSION, "kind": "Fork", "metadata": {}, "spec": spec });
    if let Some(name) = &args.name {
        document["metadata"]["name"] = json!(name);
    }
    let created = client.create_resource(Kind::Fork, &document, false).await?;
    let name = created["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if args.quiet {
        emit(&format!("{name}\n"));
    } else {
        emit(&format!(
            "fork/{name} created: {} sandboxes ({name}-0 … {name}-{}) from snapshot/{snapshot}\n",
            args.replicas,
            args.replicas - 1
        ));
    }
    if args.wait {
        let deadline = Instant::now() + args.timeout;
        loop {
            let item = client.get_resource(Kind::Fork, &name).await?;
            let ready = item
                .as_ref()
                .and_then(|f| f["status"]["readyReplicas"].as_u64())
                .unwrap_or(0);
            if ready >= u64::from(args.replicas) {
                if !args.quiet {
                    emit(&format!("fork/{name}: {ready}/{} ready\n", args.replicas));
                }
                break;
            }
            if Instant::now() >= deadline {
                let message = item
                    .as_ref()
                    .and_then(|f| f["status"]["message"].as_str())
                    .filter(|m| !m.is_empty())
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default();
                return Err(CliError::Failed(format!(
                    "timed out: fork/{name} has {ready}/{} sandboxes ready{message}",
                    args.replicas
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
#[command(
    after_help = "The sandbox now expires SECS from now (900, 30m, 2h also work).

Example:
  agent-sandbox timeout demo 3600"
)]
pub struct TimeoutArgs {
    pub sandbox: String,
    #[arg(value_parser = parse_duration, value_name = "SECS")]
    pub seconds: Duration,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn timeout(args: TimeoutArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let path = Client::sandbox_path(&client.key(&args.sandbox), "/timeout");
    let sandbox = client
        .json(
            client
                .request(Method::POST, &path)
                .json(&json!({ "timeout_seconds": ttl_seconds(args.seconds) })),
        )
        .await?;
    let expires = sandbox["expires_at"].as_str();
    emit(&format!(
        "sandbox/{} expires at {} (in {})\n",
        args.sandbox,
        expires.unwrap_or("<unknown>"),
        remaining(expires, Utc::now())
    ));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals() {
        assert!(matches!(parse_goal("delete"), Ok(Goal::Delete)));
        match parse_goal("condition=Ready").unwrap() {
            Goal::Condition { type_, status } => {
                assert_eq!((type_.as_str(), status.as_str()), ("Ready", "True"))
            }
            Goal::Delete => panic!(),
        }
        assert!(parse_goal("jsonpath={.x}").is_err());
        assert!(parse_goal("condition=").is_err());
    }

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_secs(90)), 90);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(10)), 1);
    }
}
