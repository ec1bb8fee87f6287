//! `describe`: one resource in full (metadata, spec, status, conditions) and what happened around
//! it: a sandbox's source, rollbacks and snapshots, a snapshot's users, a fork's children, and
//! the recent events about it.

use std::process::ExitCode;

use chrono::Utc;
use clap::Args;
use serde_json::Value;

use super::client::{Client, Connection};
use super::get::{parse_target, phase, text};
use super::util::{age, remaining, table};
use super::{emit, CliError};
use crate::resource::yaml::to_yaml;
use crate::resource::Kind;

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox describe sandbox demo
  agent-sandbox describe fork/try")]
pub struct DescribeArgs {
    /// sandbox, snapshot or fork; or KIND/NAME.
    pub kind: String,
    pub name: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn describe(args: DescribeArgs) -> Result<ExitCode, CliError> {
    let (kind, name) = parse_target(&args.kind, args.name.as_deref())?;
    let Some(name) = name else {
        return Err(CliError::Usage(format!(
            "say which one: agent-sandbox describe {} NAME",
            kind.as_str().to_ascii_lowercase()
        )));
    };
    let client = Client::new(&args.connection)?;
    let item = client.get_resource(kind, &name).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "{}/{name} not found",
            kind.as_str().to_ascii_lowercase()
        ))
    })?;
    let mut out = describe_text(kind, &item);
    out.push_str(&history(&client, kind, &name, &item).await?);
    out.push_str(&super::events::section(&client, kind.as_str(), &name).await?);
    emit(&out);
    Ok(ExitCode::SUCCESS)
}

fn map_line(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".into(),
    }
}

fn indented_yaml(value: &Value) -> String {
    match to_yaml(value) {
        Ok(text) if text.trim() != "{}" => text.lines().map(|l| format!("  {l}\n")).collect(),
        _ => "  <none>\n".into(),
    }
}

fn with_age(timestamp: &Value) -> String {
    match timestamp.as_str() {
        Some(t) => format!("{t} ({} ago)", age(Some(t), Utc::now())),
        None => "<none>".into(),
    }
}

/// Everything but the history, which needs more requests.
pub fn describe_text(kind: Kind, item: &Value) -> String {
    let meta = &item["metadata"];
    let mut out = String::new();
    let mut field = |label: &str, value: String| {
        out.push_str(&format!("{:<14}{value}\n", format!("{label}:")));
    };
    field("Name", text(&meta["name"]));
    field("Kind", kind.as_str().to_string());
    field("Labels", map_line(&meta["labels"]));
    field("Annotations", map_line(&meta["annotations"]));
    field("Created", with_age(&meta["creationTimestamp"]));
    if !meta["deletionTimestamp"].is_null() {
        field("Deleting", with_age(&meta["deletionTimestamp"]));
    }
    if let Some(owner) = meta["ownerReferences"].as_array().and_then(|o| o.first()) {
        field(
            "Owned by",
            format!(
                "{}/{}",
                text(&owner["kind"]).to_ascii_lowercase(),
                text(&owner["name"])
            ),
        );
    }
    field(
        "Generation",
        format!(
            "{} (observed {})",
            text(&meta["generation"]),
            text(&item["status"]["observedGeneration"])
        ),
    );
    field("Phase", phase(item));
    if let Some(expires) = item["status"]["expiresAt"].as_str() {
        field(
            "Expires",
            format!("{expires} ({})", remaining(Some(expires), Utc::now())),
        );
    }
    out.push_str("Spec:\n");
    out.push_str(&indented_yaml(&item["spec"]));
    let mut status = item["status"].clone();
    let conditions = status
        .as_object_mut()
        .and_then(|s| s.remove("conditions"))
        .and_then(|c| c.as_array().cloned())
        .unwrap_or_default();
    out.push_str("Status:\n");
    out.push_str(&indented_yaml(&status));
    out.push_str("Conditions:\n");
    if conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = conditions
            .iter()
            .map(|c| {
                vec![
                    text(&c["type"]),
                    text(&c["status"]),
                    text(&c["reason"]),
                    age(c["lastTransitionTime"].as_str(), Utc::now()),
                    text(&c["message"]),
                ]
            })
            .collect();
        for line in table(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// What happened around the resource: a sandbox's rollbacks and snapshots, a snapshot's
/// sandboxes, a fork's children.
async fn history(
    client: &Client,
    kind: Kind,
    name: &str,
    item: &Value,
) -> Result<String, CliError> {
    let mut out = String::from("History:\n");
    let mut lines = Vec::new();
    let status = &item["status"];
    match kind.as_str() {
        "Sandbox" => {
            if let Some(source) = status["sourceSnapshot"].as_str() {
                lines.push(format!("  workspace built from snapshot/{source}"));
            }
            let last = &status["lastRollback"];
            if !last.is_null() {
                lines.push(format!(
                    "  {}  rolled back to snapshot/{} (request {})",
                    text(&last["completedAt"]),
                    text(&last["snapshot"]),
                    text(&last["requestId"])
                ));
            }
            let snapshots = client.list_resources(Kind::Snapshot, None).await?;
            for s in snapshots["items"].as_array().into_iter().flatten() {
                if s["spec"]["sandbox"].as_str() == Some(name) {
                    lines.push(format!(
                        "  {}  snapshot/{} {} ({})",
                        text(&s["metadata"]["creationTimestamp"]),
                        text(&s["metadata"]["name"]),
                        phase(s),
                        text(&s["spec"]["displayName"])
                    ));
                }
            }
        }
        "Snapshot" => {
            let sandboxes = client.list_resources(Kind::Sandbox, None).await?;
            for s in sandboxes["items"].as_array().into_iter().flatten() {
                if s["status"]["sourceSnapshot"].as_str() == Some(name) {
                    lines.push(format!(
                        "  sandbox/{} uses this snapshot's workspace ({})",
                        text(&s["metadata"]["name"]),
                        phase(s)
                    ));
                }
            }
        }
        "Fork" => {
            for child in status["children"].as_array().into_iter().flatten() {
                let child = text(child);
                let phase = match client.get_resource(Kind::Sandbox, &child).await? {
                    Some(c) => phase(&c),
                    None => "Missing".into(),
                };
                lines.push(format!("  sandbox/{child} {phase}"));
            }
        }
        _ => {}
    }
    if lines.is_empty() {
        lines.push("  <none>".into());
    }
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn describe_lists_spec_status_and_conditions() {
        let item = json!({
            "metadata": {"name": "demo", "labels": {"team": "a"}, "generation": 2},
            "spec": {"image": "busybox"},
            "status": {"phase": "Running", "observedGeneration": 2, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}
        });
        let text = describe_text(Kind::Sandbox, &item);
        assert!(text.contains("Labels:       team=a"), "{text}");
        assert!(text.contains("Generation:   2 (observed 2)"), "{text}");
        assert!(text.contains("  image: busybox"), "{text}");
        assert!(text.contains("Ready"), "{text}");
        assert!(!text.contains("conditions:"), "{text}");
    }
}
