//! `get`: what the server holds, as aligned tables (like kubectl), YAML, JSON or names, once or
//! as a watch that prints each change as it happens.

use std::process::ExitCode;

use chrono::Utc;
use clap::{Args, ValueEnum};
use reqwest::Method;
use serde_json::Value;

use super::client::{Client, Connection, NdjsonReader};
use super::util::{age, bytes, kind_and_name, remaining, table};
use super::{emit, CliError};
use crate::resource::yaml::to_yaml;
use crate::resource::Kind;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table with more columns.
    Wide,
    Yaml,
    Json,
    /// `kind/name` only.
    Name,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox get sandboxes
  agent-sandbox get sandbox demo -o yaml
  agent-sandbox get snapshots -o wide
  agent-sandbox get sandboxes -l team=research -w
  agent-sandbox get events --for demo -w")]
pub struct GetArgs {
    /// sandbox(es), snapshot(s), fork(s), sandboxpool(s), sandboxtemplate(s) or event(s); or
    /// KIND/NAME.
    pub kind: String,
    /// Only this resource.
    pub name: Option<String>,
    /// Output format: a table by default.
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<Output>,
    /// After listing, keep printing changes as they happen (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Only resources whose labels match (`team=a,tier!=x`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// With `get events`: only the events about the object of this name.
    #[arg(long = "for", value_name = "NAME")]
    pub involved: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) fn parse_target(
    kind: &str,
    name: Option<&str>,
) -> Result<(Kind, Option<String>), CliError> {
    if kind.contains('/') {
        let (k, n) = kind_and_name(kind, name).map_err(CliError::Usage)?;
        return Ok((k, Some(n)));
    }
    let k: Kind = kind.parse().map_err(CliError::Usage)?;
    Ok((k, name.map(String::from)))
}

pub async fn get(args: GetArgs) -> Result<ExitCode, CliError> {
    let (kind, name) = parse_target(&args.kind, args.name.as_deref())?;
    let client = Client::new(&args.connection)?;
    if args.watch {
        return watch(&client, kind, name.as_deref(), &args).await;
    }
    let items: Vec<Value> = match &name {
        Some(name) => {
            let one = client.get_resource(kind, name).await?.ok_or_else(|| {
                CliError::Failed(format!(
                    "{}/{name} not found",
                    kind.as_str().to_ascii_lowercase()
                ))
            })?;
            match args.output {
                Some(Output::Yaml) => return print_yaml(&one),
                Some(Output::Json) => return print_json(&one),
                _ => vec![one],
            }
        }
        None => {
            let list = client
                .list_resources(kind, args.selector.as_deref())
                .await?;
            match args.output {
                Some(Output::Yaml) => return print_yaml(&list),
                Some(Output::Json) => return print_json(&list),
                _ => list["items"].as_array().cloned().unwrap_or_default(),
            }
        }
    };
    if args.output == Some(Output::Name) {
        for item in &items {
            emit(&format!("{}\n", name_of(kind, item)));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if items.is_empty() {
        super::emit_err(&format!("No {} found.", kind.plural()));
        return Ok(ExitCode::SUCCESS);
    }
    let wide = args.output == Some(Output::Wide);
    let rows: Vec<Vec<String>> = items.iter().map(|i| row(kind, i, wide)).collect();
    emit(&table(&headers(kind, wide), &rows));
    Ok(ExitCode::SUCCESS)
}

fn print_yaml(value: &Value) -> Result<ExitCode, CliError> {
    let text = to_yaml(value).map_err(|e| CliError::Failed(e.to_string()))?;
    emit(&text);
    Ok(ExitCode::SUCCESS)
}

fn print_json(value: &Value) -> Result<ExitCode, CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Failed(e.to_string()))?;
    emit(&format!("{text}\n"));
    Ok(ExitCode::SUCCESS)
}

fn name_of(kind: Kind, item: &Value) -> String {
    format!(
        "{}/{}",
        kind.as_str().to_ascii_lowercase(),
        item["metadata"]["name"].as_str().unwrap_or_default()
    )
}

// Columns are chosen by the kind's name, not an exhaustive match: a kind the server has and this
// table does not know yet still lists, with the columns every kind has.
pub fn headers(kind: Kind, wide: bool) -> Vec<&'static str> {
    let mut h = match kind.as_str() {
        "Sandbox" => vec!["NAME", "PHASE", "IMAGE", "AGE", "EXPIRES"],
        "Snapshot" => vec!["NAME", "SANDBOX", "PHASE", "SIZE", "AGE"],
        "Fork" => vec!["NAME", "SNAPSHOT", "READY", "PHASE", "AGE"],
        "SandboxPool" => vec!["NAME", "IMAGE", "READY", "CLAIMED", "AGE"],
        "SandboxTemplate" => vec!["NAME", "FROM", "POOL", "GENERATION", "AGE"],
        _ => vec!["NAME", "PHASE", "AGE"],
    };
    if wide {
        h.extend(match kind.as_str() {
            "Sandbox" => vec!["CPUS", "MEMORY", "NETWORK", "SOURCE", "MESSAGE"],
            "Snapshot" => vec!["DISPLAY-NAME", "IMAGE", "DIGEST"],
            "Fork" => vec!["CHILDREN"],
            _ => vec!["MESSAGE"],
        });
    }
    h
}

pub(super) fn text(v: &Value) -> String {
    match v {
        Value::Null => "<none>".into(),
        Value::String(s) if s.is_empty() => "<none>".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn phase(item: &Value) -> String {
    if !item["metadata"]["deletionTimestamp"].is_null() {
        return "Terminating".into();
    }
    item["status"]["phase"]
        .as_str()
        .unwrap_or("Pending")
        .to_string()
}

/// One table row; the columns match [`headers`].
pub fn row(kind: Kind, item: &Value, wide: bool) -> Vec<String> {
    let now = Utc::now();
    let meta = &item["metadata"];
    let spec = &item["spec"];
    let status = &item["status"];
    let name = meta["name"].as_str().unwrap_or_default().to_string();
    let created = age(meta["creationTimestamp"].as_str(), now);
    let mut row = match kind.as_str() {
        "Sandbox" => vec![
            name,
            phase(item),
            spec["image"].as_str().unwrap_or("<default>").to_string(),
            created,
            remaining(status["expiresAt"].as_str(), now),
        ],
        "Snapshot" => vec![
            name,
            text(&spec["sandbox"]),
            phase(item),
            status["sizeBytes"]
                .as_u64()
                .map(bytes)
                .unwrap_or_else(|| "<none>".into()),
            created,
        ],
        "Fork" => vec![
            name,
            text(&spec["snapshot"]),
            format!(
                "{}/{}",
                status["readyReplicas"].as_u64().unwrap_or(0),
                spec["replicas"].as_u64().unwrap_or(1)
            ),
            phase(item),
            created,
        ],
        "SandboxPool" => vec![
            name,
            text(&spec["image"]),
            format!(
                "{}/{}",
                status["readyReplicas"].as_u64().unwrap_or(0),
                spec["size"].as_u64().unwrap_or(0)
            ),
            status["claimed"].as_u64().unwrap_or(0).to_string(),
            created,
        ],
        "SandboxTemplate" => vec![
            name,
            match spec["snapshot"].as_str() {
                Some(snapshot) => format!("snapshot/{snapshot}"),
                None => spec["image"].as_str().unwrap_or("<default>").to_string(),
            },
            spec["pool"]["size"]
                .as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "<none>".into()),
            text(&meta["generation"]),
            created,
        ],
        _ => vec![name, phase(item), created],
    };
    if wide {
        match kind.as_str() {
            "Sandbox" => {
                let limits = &status["appliedLimits"];
                let pick = |field: &str| {
                    if limits[field].is_null() {
                        text(&spec[field])
                    } else {
                        text(&limits[field])
                    }
                };
                row.push(pick("cpus"));
                let memory = pick("memoryMB");
                row.push(if memory == "<none>" {
                    memory
                } else {
                    format!("{memory}Mi")
                });
                row.push(spec["network"].as_bool().unwrap_or(false).to_string());
                row.push(text(&status["sourceSnapshot"]));
                row.push(text(&status["message"]));
            }
            "Snapshot" => {
                row.push(text(&spec["displayName"]));
                row.push(text(&status["image"]));
                row.push(text(&status["digest"]));
            }
            "Fork" => {
                let children: Vec<String> = status["children"]
                    .as_array()
                    .map(|c| c.iter().map(text).collect())
                    .unwrap_or_default();
                row.push(if children.is_empty() {
                    "<none>".into()
                } else {
                    children.join(",")
                });
            }
            _ => row.push(text(&status["message"])),
        }
    }
    row
}

async fn watch(
    client: &Client,
    kind: Kind,
    name: Option<&str>,
    args: &GetArgs,
) -> Result<ExitCode, CliError> {
    let mut builder = client
        .request(Method::GET, &client.collection_path(kind))
        .query(&[("watch", "true")]);
    if let Some(selector) = &args.selector {
        builder = builder.query(&[("labelSelector", selector.as_str())]);
    }
    let response = client.send(builder).await?;
    let mut reader = NdjsonReader::new(client, response);
    let wide = args.output == Some(Output::Wide);
    let table_output = matches!(args.output, None | Some(Output::Wide));
    let headers = headers(kind, wide);
    // Columns are sized once from the headers plus a margin: rows arrive one by one.
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len().max(12)).collect();
    if let Some(w) = widths.first_mut() {
        *w = (*w).max(24);
    }
    if table_output {
        emit(&format_row(
            &headers.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            &widths,
        ));
    }
    while let Some(event) = reader.next().await? {
        let event_type = event["type"].as_str().unwrap_or_default();
        if event_type == "ERROR" {
            return Err(CliError::Failed(format!(
                "the watch ended: {}",
                text(&event["object"]["error"]["message"])
            )));
        }
        let object = &event["object"];
        if name.is_some_and(|n| object["metadata"]["name"].as_str() != Some(n)) {
            continue;
        }
        match args.output {
            Some(Output::Json) => emit(&format!(
                "{}\n",
                serde_json::to_string_pretty(object).unwrap_or_default()
            )),
            Some(Output::Yaml) => {
                let text = to_yaml(object).map_err(|e| CliError::Failed(e.to_string()))?;
                emit(&format!("---\n{text}"));
            }
            Some(Output::Name) => emit(&format!("{}\n", name_of(kind, object))),
            _ => {
                let mut cells = row(kind, object, wide);
                if event_type == "DELETED" {
                    if let Some(i) = headers.iter().position(|h| *h == "PHASE") {
                        cells[i] = "Deleted".into();
                    }
                }
                emit(&format_row(&cells, &widths));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn format_row(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (i, cell) in cells.iter().enumerate() {
        out.push_str(cell);
        if i + 1 < cells.len() {
            let w = widths.get(i).copied().unwrap_or(0);
            out.push_str(&" ".repeat(w.saturating_sub(cell.chars().count()) + 3));
        }
    }
    format!("{}\n", out.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandbox_rows_show_phase_image_and_expiry() {
        let item = json!({
            "metadata": {"name": "demo", "creationTimestamp": Utc::now().to_rfc3339()},
            "spec": {"image": "busybox", "cpus": 2.0},
            "status": {"phase": "Running", "expiresAt": (Utc::now() + chrono::TimeDelta::minutes(15)).to_rfc3339()}
        });
        let r = row(Kind::Sandbox, &item, true);
        assert_eq!(r[0..3], ["demo", "Running", "busybox"]);
        assert!(r[4] == "14m" || r[4] == "15m", "{}", r[4]);
        assert_eq!(r[5], "2.0");
        assert_eq!(r.len(), headers(Kind::Sandbox, true).len());
    }

    #[test]
    fn deleting_resources_show_terminating() {
        let item = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                          "spec": {"snapshot": "s", "replicas": 3}, "status": {"phase": "Ready", "readyReplicas": 2}});
        let r = row(Kind::Fork, &item, false);
        assert_eq!(r[1..4], ["s", "2/3", "Terminating"]);
    }
}
