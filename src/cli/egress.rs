//! `egress NAME [-f]`: a sandbox's egress decision log as a table (or its NDJSON lines with
//! `-o json`), read from `GET …/sandboxes/{name}/egress`. It only prints what the gateway
//! decided; it never changes a policy.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::Args;
use reqwest::Method;
use serde_json::Value;

use super::client::{Client, Connection, NdjsonReader};
use super::util::table;
use super::{emit, CliError};
use crate::resource::Kind;

const HEADERS: [&str; 7] = [
    "TIME", "PROTOCOL", "HOST", "ADDRESS", "DECISION", "RULE", "OUT/IN",
];

#[derive(Args, Debug)]
#[command(
    after_help = "Exits 0 once the log kept so far is printed; with -f it keeps printing
new decisions until interrupted.

Examples:
  agent-sandbox egress demo
  agent-sandbox egress demo -f
  agent-sandbox egress demo -o json"
)]
pub struct EgressArgs {
    /// The sandbox.
    pub name: String,
    /// Follow: keep printing decisions as the gateway makes them.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// `json` prints each decision as the server sent it, one a line.
    #[arg(short = 'o', long, value_parser = ["json"])]
    pub output: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn egress(args: EgressArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let path = format!(
        "{}/egress",
        Client::resource_path(Kind::Sandbox, Some(&client.key(&args.name)))
    );
    let follow = if args.follow { "true" } else { "false" };
    let response = client
        .send(
            client
                .request(Method::GET, &path)
                .query(&[("follow", follow)]),
        )
        .await?;
    let mut reader = NdjsonReader::new(&client, response);
    let json = args.output.is_some();
    if args.follow {
        // One line each as it comes: the widths of a table are not known in advance.
        if !json {
            emit(&format!("{}\n", HEADERS.join("   ")));
        }
        while let Some(decision) = reader.next().await? {
            emit(&format!("{}\n", line(&decision, json)));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut decisions = Vec::new();
    while let Some(decision) = reader.next().await? {
        decisions.push(decision);
    }
    if json {
        for decision in &decisions {
            emit(&format!("{}\n", line(decision, true)));
        }
    } else if decisions.is_empty() {
        super::emit_err(&format!("No egress decisions for sandbox/{}.", args.name));
    } else {
        emit(&table(
            &HEADERS,
            &decisions.iter().map(row).collect::<Vec<_>>(),
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn line(decision: &Value, json: bool) -> String {
    if json {
        decision.to_string()
    } else {
        row(decision).join("   ")
    }
}

/// One row of the table; the columns match [`HEADERS`].
fn row(decision: &Value) -> Vec<String> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let time = decision["time"]
        .as_str()
        .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        .map(|t| t.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_default();
    let address = match (decision["address"].as_str(), decision["port"].as_u64()) {
        (Some(a), Some(p)) if a.contains(':') => format!("[{a}]:{p}"),
        (Some(a), Some(p)) => format!("{a}:{p}"),
        (Some(a), None) => a.to_string(),
        (None, Some(p)) => format!(":{p}"),
        (None, None) => "-".into(),
    };
    let decided = if decision["allowed"].as_bool() == Some(true) {
        "allowed"
    } else {
        "refused"
    };
    vec![
        time,
        text(&decision["protocol"]),
        text(&decision["host"]),
        address,
        decided.into(),
        text(&decision["rule"]),
        format!(
            "{}/{}",
            decision["bytesOut"].as_u64().unwrap_or(0),
            decision["bytesIn"].as_u64().unwrap_or(0)
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_decision_shows_as_one_row() {
        let refused = json!({"time": "2026-12-04T10:11:12.345Z", "protocol": "dns",
            "host": "other.example.test", "address": null, "port": null, "allowed": false,
            "rule": "not in spec.egress.allow", "bytesOut": 0, "bytesIn": 0});
        assert_eq!(
            row(&refused),
            [
                "10:11:12.345",
                "dns",
                "other.example.test",
                "-",
                "refused",
                "not in spec.egress.allow",
                "0/0"
            ]
        );
        let allowed = json!({"time": "2026-12-04T10:11:13Z", "protocol": "tls",
            "host": "pypi.org", "address": "2001:db8::1", "port": 443, "allowed": true,
            "rule": "pypi.org", "bytesOut": 512, "bytesIn": 4096});
        assert_eq!(row(&allowed)[3], "[2001:db8::1]:443");
        assert_eq!(row(&allowed)[4..], ["allowed", "pypi.org", "512/4096"]);
    }
}
