//! `template create NAME --from-sandbox SB`: a Full snapshot of a running sandbox plus a
//! `SandboxTemplate` that names it, in one step.
//!
//! What the template copies of the sandbox is chosen here: its shape (cpus, memoryMB, pidsLimit,
//! network, egress, readOnlyRootfs, idle), never its env or services, whose values and commands
//! may carry secrets. Both are named in the output so that people add them on purpose. This
//! module only calls the server; the snapshot and the template are ordinary resources there.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::client::{Client, Connection};
use super::{emit, CliError};
use crate::resource::{Kind, Sandbox, SandboxTemplateSpec, API_VERSION};

#[derive(Args, Debug)]
#[command(after_help = "Example:
  agent-sandbox template create py-tools --from-sandbox dev")]
pub struct TemplateArgs {
    #[command(subcommand)]
    pub action: TemplateAction,
}

#[derive(Subcommand, Debug)]
pub enum TemplateAction {
    /// Make a template from a running sandbox: a Full snapshot of it (its /workspace and its
    /// root filesystem changes; the sandbox needs readOnlyRootfs: false) and a template that
    /// starts sandboxes from that snapshot with the sandbox's limits and network. Env and
    /// services are not copied: their values may be secrets.
    #[command(after_help = "Example:
  agent-sandbox template create py-tools --from-sandbox dev")]
    Create(CreateArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Name of the new SandboxTemplate.
    pub name: String,
    /// The sandbox to make it from.
    #[arg(long = "from-sandbox", value_name = "SANDBOX")]
    pub from_sandbox: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn run(args: TemplateArgs) -> Result<ExitCode, CliError> {
    match args.action {
        TemplateAction::Create(args) => create(args).await,
    }
}

async fn create(args: CreateArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let sandbox = client
        .get_resource(Kind::Sandbox, &args.from_sandbox)
        .await?
        .ok_or_else(|| CliError::Reported(format!("sandbox {:?} not found", args.from_sandbox)))?;
    let sandbox: Sandbox = serde_json::from_value(sandbox)
        .map_err(|e| CliError::Reported(format!("sandbox {:?}: {e}", args.from_sandbox)))?;
    // The Full snapshot answers once it is Ready (or failed, as an error).
    let path = Client::sandbox_path(&client.key(&args.from_sandbox), "/snapshots");
    let body = json!({ "name": format!("template {}", args.name), "scope": "Full" });
    let snapshot = client
        .json(client.request(Method::POST, &path).json(&body))
        .await?;
    let snapshot = snapshot["id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| CliError::Reported("the server named no snapshot".into()))?
        .to_string();
    let spec = shape_of(&sandbox, snapshot.clone());
    let document = json!({
        "apiVersion": API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": { "name": args.name },
        "spec": spec,
    });
    client
        .create_resource(Kind::SandboxTemplate, &document, false)
        .await?;
    emit(&format!(
        "sandboxtemplate/{} created from snapshot/{snapshot} of sandbox/{}\n",
        args.name, args.from_sandbox
    ));
    let left_out = left_out(&sandbox);
    if !left_out.is_empty() {
        emit(&format!(
            "not copied (may hold secrets): {}\n",
            left_out.join(", ")
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// The template spec of `sandbox`'s shape on `snapshot`: the limits it runs with (as applied,
/// else as resolved), network, egress, root filesystem mode and idle policy.
pub fn shape_of(sandbox: &Sandbox, snapshot: String) -> SandboxTemplateSpec {
    let spec = sandbox.resolved_spec();
    let applied = sandbox.status.as_ref().and_then(|s| s.applied_limits);
    SandboxTemplateSpec {
        snapshot: Some(snapshot),
        cpus: applied.map(|l| l.cpus).or(spec.cpus),
        memory_mb: applied.map(|l| l.memory_mb).or(spec.memory_mb),
        pids_limit: applied.map(|l| l.pids_limit).or(spec.pids_limit),
        network: spec.network,
        egress: spec.egress.clone(),
        read_only_rootfs: spec.read_only_rootfs,
        idle: spec.idle.clone(),
        ..SandboxTemplateSpec::default()
    }
}

/// What of `sandbox` the template leaves out, for people to add on purpose.
fn left_out(sandbox: &Sandbox) -> Vec<String> {
    let spec = sandbox.resolved_spec();
    let mut out: Vec<String> = spec.env.keys().map(|k| format!("env {k}")).collect();
    out.extend(spec.services.iter().map(|s| format!("service {}", s.name)));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::resource::{AppliedLimits, SandboxSpec, SandboxStatus};

    #[test]
    fn the_shape_is_copied_and_env_values_are_not() {
        let mut sandbox = Sandbox::new(
            "dev",
            SandboxSpec {
                network: Some(true),
                read_only_rootfs: Some(false),
                env: BTreeMap::from([("TOKEN".into(), "secret-value".into())]),
                ..SandboxSpec::default()
            },
        );
        sandbox.status = Some(SandboxStatus {
            applied_limits: Some(AppliedLimits {
                cpus: 0.5,
                memory_mb: 300,
                pids_limit: 100,
            }),
            ..SandboxStatus::default()
        });
        let spec = shape_of(&sandbox, "snap".into());
        assert_eq!(spec.snapshot.as_deref(), Some("snap"));
        assert_eq!(
            (spec.cpus, spec.memory_mb, spec.pids_limit),
            (Some(0.5), Some(300), Some(100))
        );
        assert_eq!(
            (spec.network, spec.read_only_rootfs),
            (Some(true), Some(false))
        );
        assert!(spec.env.is_empty());
        assert!(spec.image.is_none(), "the snapshot carries the image");
        spec.check().unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        assert!(!text.contains("secret-value"), "{text}");
        assert_eq!(left_out(&sandbox), ["env TOKEN"]);
    }
}
