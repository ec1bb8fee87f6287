//! `top`: what sandboxes use, as a table refreshed in place (like `top`, with the columns of
//! `kubectl top`), from each running sandbox's `…/stats`. CPU is the share of one core used
//! between two samples, so the first table comes one interval after the start. With `--once`,
//! or when standard output is not a terminal, tables are printed one after another instead of
//! redrawn (`--once` prints one and exits).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;

use super::client::{Client, Connection};
use super::get::phase;
use super::util::{bytes, parse_duration, table};
use super::{emit, CliError};
use crate::resource::Kind;

/// Stats asked for at once.
const CONCURRENT: usize = 16;

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox top
  agent-sandbox top sandboxes -l team=research --interval 5s
  agent-sandbox top sandbox demo --once")]
pub struct TopArgs {
    /// What to show: sandboxes (the only kind that uses anything).
    #[arg(default_value = "sandboxes")]
    pub kind: String,
    /// Only this sandbox.
    pub name: Option<String>,
    /// Only sandboxes whose labels match (`team=a,tier!=x`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Time between two samples (`2s`, `500ms`, `1m`).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Print one table and exit.
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// One sample of one sandbox.
#[derive(Clone, Debug)]
struct Sample {
    phase: String,
    stats: Option<Value>,
    at: Instant,
}

pub async fn top(args: TopArgs) -> Result<ExitCode, CliError> {
    let (kind, name) = super::get::parse_target(&args.kind, args.name.as_deref())?;
    if kind != Kind::Sandbox {
        return Err(CliError::Usage(format!(
            "top shows sandboxes, not {}",
            kind.plural()
        )));
    }
    let client = Client::new(&args.connection)?;
    let live = !args.once && std::io::stdout().is_terminal();
    let mut before = sample(&client, name.as_deref(), args.selector.as_deref()).await?;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
        let now = sample(&client, name.as_deref(), args.selector.as_deref()).await?;
        let text = render(&before, &now);
        if live {
            // Home, the table, then clear whatever the last table left below it.
            emit(&format!("\x1b[H\x1b[2J{text}"));
        } else {
            emit(&text);
        }
        if args.once {
            return Ok(ExitCode::SUCCESS);
        }
        if !live {
            emit("\n");
        }
        before = now;
    }
}

/// Every sandbox asked for, with the stats of the running ones, by name (in the server's order).
async fn sample(
    client: &Client,
    name: Option<&str>,
    selector: Option<&str>,
) -> Result<Vec<(String, Sample)>, CliError> {
    let items: Vec<Value> = match name {
        Some(name) => vec![client
            .get_resource(Kind::Sandbox, name)
            .await?
            .ok_or_else(|| CliError::Failed(format!("sandbox/{name} not found")))?],
        None => client.list_resources(Kind::Sandbox, selector).await?["items"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    };
    let samples = futures::stream::iter(items.into_iter().map(|item| async move {
        let name = item["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = item["metadata"]["namespace"]
            .as_str()
            .unwrap_or(crate::resource::DEFAULT_NAMESPACE);
        let key = crate::resource::object_key(namespace, &name);
        let phase = phase(&item);
        let stats = if phase == "Running" || phase == "Paused" {
            let path = format!("{}/stats", Client::resource_path(Kind::Sandbox, Some(&key)));
            // A sandbox that stopped or went away in between is shown without numbers.
            client.json(client.request(Method::GET, &path)).await.ok()
        } else {
            None
        };
        (
            name,
            Sample {
                phase,
                stats,
                at: Instant::now(),
            },
        )
    }))
    .buffered(CONCURRENT)
    .collect()
    .await;
    Ok(samples)
}

/// The table of `now`, CPU from the difference to `before`.
fn render(before: &[(String, Sample)], now: &[(String, Sample)]) -> String {
    let earlier: HashMap<&str, &Sample> = before.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let headers = [
        "NAME",
        "PHASE",
        "CPU",
        "CPU-TIME",
        "MEMORY",
        "MEM%",
        "PIDS",
        "WORKSPACE",
        "NET-RX",
        "NET-TX",
    ];
    let none = || "-".to_string();
    let rows: Vec<Vec<String>> = now
        .iter()
        .map(|(name, sample)| {
            let Some(stats) = &sample.stats else {
                let mut row = vec![name.clone(), sample.phase.clone()];
                row.resize(headers.len(), none());
                return row;
            };
            let number = |field: &str| stats[field].as_u64();
            let cpu_seconds = stats["cpuSeconds"].as_f64().unwrap_or(0.0);
            let cpu = earlier
                .get(name.as_str())
                .and_then(|then| {
                    let then_seconds = then.stats.as_ref()?["cpuSeconds"].as_f64()?;
                    let wall = sample.at.duration_since(then.at).as_secs_f64();
                    (wall > 0.0).then(|| (cpu_seconds - then_seconds).max(0.0) / wall * 100.0)
                })
                .map_or_else(none, |percent| format!("{percent:.1}%"));
            let memory = number("memoryBytes").unwrap_or(0);
            let share = number("memoryLimitBytes")
                .filter(|limit| *limit > 0)
                .map_or_else(none, |limit| {
                    format!("{:.1}%", memory as f64 / limit as f64 * 100.0)
                });
            let or_none = |field: &str| number(field).map_or_else(none, bytes);
            vec![
                name.clone(),
                sample.phase.clone(),
                cpu,
                format!("{cpu_seconds:.1}s"),
                bytes(memory),
                share,
                number("pids").map_or_else(none, |p| p.to_string()),
                or_none("workspaceBytes"),
                or_none("netRxBytes"),
                or_none("netTxBytes"),
            ]
        })
        .collect();
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cpu_is_the_share_of_a_core_between_two_samples() {
        let at = Instant::now();
        let sample = |cpu: f64, later: u64| Sample {
            phase: "Running".into(),
            stats: Some(json!({
                "cpuSeconds": cpu, "memoryBytes": 1048576, "memoryLimitBytes": 4194304,
                "pids": 3, "workspaceBytes": 4096, "netRxBytes": 0, "netTxBytes": 10,
            })),
            at: at + Duration::from_secs(later),
        };
        let stopped = Sample {
            phase: "Stopped".into(),
            stats: None,
            at,
        };
        let before = vec![("a".to_string(), sample(1.0, 0))];
        let now = vec![
            ("a".to_string(), sample(2.0, 2)),
            ("b".to_string(), stopped),
        ];
        let text = render(&before, &now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        let a: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            a,
            ["a", "Running", "50.0%", "2.0s", "1.0MiB", "25.0%", "3", "4.0KiB", "0B", "10B"]
        );
        let b: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(b[..3], ["b", "Stopped", "-"]);
    }
}
