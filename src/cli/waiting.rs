//! Waiting for the server's reconcile to show a result: until a resource meets a condition for
//! its current generation (showing the image pull it waits for, see `progress.rs`), or until it is
//! gone. `wait`, `apply --wait` and `delete` poll through here.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::Client;
use super::manifests::reference;
use super::progress::Progress;
use super::CliError;
use crate::resource::Kind;

/// Whether `item` has condition `type_` at `status` for its current generation; otherwise a
/// description of where it stands.
pub fn condition_state(item: &Value, type_: &str, status: &str) -> Result<(), String> {
    let generation = item["metadata"]["generation"].as_u64();
    let conditions = item["status"]["conditions"].as_array();
    let found = conditions.into_iter().flatten().find(|c| {
        c["type"]
            .as_str()
            .is_some_and(|t| t.eq_ignore_ascii_case(type_))
    });
    let Some(c) = found else {
        return Err(format!(
            "no {type_} condition yet (phase {})",
            item["status"]["phase"].as_str().unwrap_or("Pending")
        ));
    };
    let current = match (c["observedGeneration"].as_u64(), generation) {
        (Some(seen), Some(generation)) => seen >= generation,
        _ => true,
    };
    let actual = c["status"].as_str().unwrap_or("Unknown");
    if current && actual.eq_ignore_ascii_case(status) {
        return Ok(());
    }
    let mut why = format!("condition {type_} is {actual}",);
    if !current {
        why.push_str(" for an older generation");
    }
    for key in ["reason", "message"] {
        if let Some(text) = c[key].as_str().filter(|t| !t.is_empty()) {
            why.push_str(&format!("; {key}: {text}"));
        }
    }
    Err(why)
}

/// Why a wait for a condition ended without it.
pub enum WaitError {
    /// The deadline passed; where the resource stood then.
    TimedOut(String),
    Client(CliError),
}

/// Polls resource `kind/name` until it has condition `type_` at `status` for its current
/// generation, showing on `progress` the image pull it waits for, if any.
pub async fn wait_for_condition(
    client: &Client,
    kind: Kind,
    name: &str,
    type_: &str,
    status: &str,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<(), WaitError> {
    let what = reference(kind, name);
    loop {
        let item = client
            .get_resource(kind, name)
            .await
            .map_err(|e| WaitError::Client(e.into()))?;
        let state = match &item {
            Some(item) => {
                progress.show(&what, item);
                condition_state(item, type_, status)
            }
            None => Err("it does not exist".to_string()),
        };
        match state {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => {
                progress.finish();
                return Err(WaitError::TimedOut(why));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Polls until the resource is gone.
pub async fn wait_gone(
    client: &Client,
    kind: Kind,
    name: &str,
    deadline: Instant,
) -> Result<(), CliError> {
    loop {
        let current = client.get_resource(kind, name).await?;
        let Some(current) = current else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            let phase = current["status"]["phase"].as_str().unwrap_or("unknown");
            return Err(CliError::Failed(format!(
                "still there after the timeout (phase {phase}); deletion goes on in the server"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_count_only_for_the_current_generation() {
        let item = |status: &str, observed: u64| {
            json!({"metadata": {"generation": 2}, "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": status, "reason": "R", "message": "m", "observedGeneration": observed}
            ]}})
        };
        assert!(condition_state(&item("True", 2), "Ready", "True").is_ok());
        let old = condition_state(&item("True", 1), "Ready", "True").unwrap_err();
        assert!(old.contains("older generation"), "{old}");
        let no = condition_state(&item("False", 2), "Ready", "True").unwrap_err();
        assert!(no.contains("is False") && no.contains("message: m"), "{no}");
        assert!(condition_state(&json!({"status": {}}), "Ready", "True").is_err());
    }
}
