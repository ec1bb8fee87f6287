//! `get events [-w] [--for NAME]` and the `Events:` section of `describe`: the server's events as
//! kubectl shows them (last seen, type, reason, object, message, with `xN` when one happened
//! several times).

use std::process::ExitCode;

use chrono::Utc;
use reqwest::Method;
use serde_json::Value;

use super::client::{Client, NdjsonReader};
use super::get::{text, GetArgs, Output};
use super::util::{age, table};
use super::{emit, CliError};
use crate::resource::yaml::to_yaml;

const PATH: &str = "/apis/agent-sandbox.io/v1/events";

const HEADERS: [&str; 5] = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"];

/// Whether `kind` (as typed after `get`) names the events.
pub(super) fn is_events(kind: &str) -> bool {
    matches!(
        kind.to_ascii_lowercase().as_str(),
        "event" | "events" | "ev"
    )
}

/// The events about the object named `involved` (all without it), oldest first.
pub(super) async fn list(client: &Client, involved: Option<&str>) -> Result<Vec<Value>, CliError> {
    let mut builder = client.request(Method::GET, PATH);
    if let Some(name) = involved {
        builder = builder.query(&[("involvedObject", name)]);
    }
    let list = client.json(builder).await?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

pub(super) async fn get(args: GetArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let involved = args.involved.as_deref();
    if let Some(name) = &args.name {
        let one = client
            .json(client.request(
                Method::GET,
                &format!("{PATH}/{}", super::client::encode(name)),
            ))
            .await?;
        return print(&[one], args.output);
    }
    if args.watch {
        return watch(&client, involved, args.output).await;
    }
    let items = list(&client, involved).await?;
    match args.output {
        Some(Output::Yaml) | Some(Output::Json) => {
            let list = serde_json::json!({"apiVersion": "agent-sandbox.io/v1", "kind": "EventList", "items": items});
            if args.output == Some(Output::Yaml) {
                emit(&to_yaml(&list).map_err(|e| CliError::Failed(e.to_string()))?);
            } else {
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        _ if items.is_empty() => {
            super::emit_err("No events found.");
            Ok(ExitCode::SUCCESS)
        }
        output => print(&items, output),
    }
}

fn print(items: &[Value], output: Option<Output>) -> Result<ExitCode, CliError> {
    match output {
        Some(Output::Yaml) => {
            for item in items {
                emit(&format!(
                    "---\n{}",
                    to_yaml(item).map_err(|e| CliError::Failed(e.to_string()))?
                ));
            }
        }
        Some(Output::Json) => {
            for item in items {
                emit(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(item).unwrap_or_default()
                ));
            }
        }
        Some(Output::Name) => {
            for item in items {
                emit(&format!("event/{}\n", text(&item["metadata"]["name"])));
            }
        }
        _ => emit(&table(&HEADERS, &items.iter().map(row).collect::<Vec<_>>())),
    }
    Ok(ExitCode::SUCCESS)
}

/// One row of the table; the columns match [`HEADERS`].
pub(super) fn row(event: &Value) -> Vec<String> {
    let seen = age(event["lastTimestamp"].as_str(), Utc::now());
    let count = event["count"].as_u64().unwrap_or(1);
    let seen = if count > 1 {
        format!("{seen} (x{count})")
    } else {
        seen
    };
    let object = &event["involvedObject"];
    vec![
        seen,
        text(&event["type"]),
        text(&event["reason"]),
        format!(
            "{}/{}",
            object["kind"]
                .as_str()
                .unwrap_or_default()
                .to_ascii_lowercase(),
            object["name"].as_str().unwrap_or_default()
        ),
        event["message"].as_str().unwrap_or_default().to_string(),
    ]
}

/// `describe`'s `Events:` section: the most recent events about `kind` `name`.
pub(super) async fn section(client: &Client, kind: &str, name: &str) -> Result<String, CliError> {
    const SHOWN: usize = 20;
    let mut items = list(client, Some(name)).await?;
    items.retain(|e| e["involvedObject"]["kind"].as_str() == Some(kind));
    let recent = &items[items.len().saturating_sub(SHOWN)..];
    if recent.is_empty() {
        return Ok("Events:\n  <none>\n".into());
    }
    let rows: Vec<Vec<String>> = recent.iter().map(row).collect();
    let indented: String = table(&HEADERS, &rows)
        .lines()
        .map(|line| format!("  {line}\n"))
        .collect();
    Ok(format!("Events:\n{indented}"))
}

async fn watch(
    client: &Client,
    involved: Option<&str>,
    output: Option<Output>,
) -> Result<ExitCode, CliError> {
    let mut builder = client
        .request(Method::GET, PATH)
        .query(&[("watch", "true")]);
    if let Some(name) = involved {
        builder = builder.query(&[("involvedObject", name)]);
    }
    let response = client.send(builder).await?;
    let mut reader = NdjsonReader::new(client, response);
    let table_output = matches!(output, None | Some(Output::Wide));
    if table_output {
        emit(&format!("{}\n", HEADERS.join("   ")));
    }
    while let Some(change) = reader.next().await? {
        let change_type = change["type"].as_str().unwrap_or_default();
        if change_type == "ERROR" {
            return Err(CliError::Failed(format!(
                "the watch ended: {}",
                text(&change["object"]["error"]["message"])
            )));
        }
        if change_type == "DELETED" {
            continue;
        }
        let event = &change["object"];
        if table_output {
            emit(&format!("{}\n", row(event).join("   ")));
        } else {
            print(std::slice::from_ref(event), output)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_repeated_event_shows_its_count() {
        let event = json!({
            "involvedObject": {"kind": "Sandbox", "name": "demo"},
            "reason": "Started", "message": "the sandbox is running", "type": "Normal",
            "count": 3, "lastTimestamp": Utc::now().to_rfc3339(),
        });
        let r = row(&event);
        assert!(r[0].ends_with("(x3)"), "{}", r[0]);
        assert_eq!(
            r[1..],
            [
                "Normal",
                "Started",
                "sandbox/demo",
                "the sandbox is running"
            ]
        );
    }
}
