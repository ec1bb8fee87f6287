//! A sandbox's `spec.secrets`, as the controller sees them: the placeholders the egress gateway
//! is told (one per entry, see `crate::egress::placeholder`) and the `SecretsReady` condition
//! that says whether each named Secret exists, says where it may be sent and has a value. A
//! missing Secret does not stop the sandbox: its variable holds the placeholder all the same, no
//! request gets a value for it, and the condition names the Secret and what is wrong. Never
//! reads a value into anything it keeps or writes.

use chrono::Utc;

use crate::egress::SecretBinding;
use crate::resource::{set_condition, Condition, ConditionStatus, Kind, Sandbox, SandboxStatus};
use crate::store::Store;

pub(super) const SECRETS_READY: &str = "SecretsReady";

/// The gateway's view of `sandbox`'s `spec.secrets`.
pub(super) fn bindings(sandbox: &Sandbox) -> Vec<SecretBinding> {
    let uid = sandbox.metadata.uid.as_deref().unwrap_or_default();
    sandbox
        .spec
        .secrets
        .iter()
        .map(|entry| SecretBinding {
            env: entry.env.clone(),
            secret: sandbox.metadata.sibling(&entry.secret),
            placeholder: crate::egress::placeholder(&sandbox.metadata.key(), uid, &entry.secret),
        })
        .collect()
}

/// The sandboxes whose `spec.secrets` name Secret `name` (to look at again when it changes).
pub(super) fn users_of(store: &Store, name: &str) -> Vec<String> {
    store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| {
            s.spec
                .secrets
                .iter()
                .any(|e| s.metadata.sibling(&e.secret) == name)
        })
        .map(|s| s.metadata.key())
        .collect()
}

/// Sets (or clears) `SecretsReady` in `status`; `policed` says whether the gateway carries the
/// sandbox's traffic (without it no value is ever put in).
pub(super) fn report(
    store: &Store,
    sandbox: &Sandbox,
    status: &mut SandboxStatus,
    policed: bool,
    generation: u64,
) {
    if sandbox.spec.secrets.is_empty() {
        super::status::clear_condition(&mut status.conditions, SECRETS_READY);
        return;
    }
    let mut problems = Vec::new();
    for entry in &sandbox.spec.secrets {
        if let Some(problem) = problem_of(store, &sandbox.metadata.sibling(&entry.secret)) {
            problems.push(format!("{} ({}): {problem}", entry.env, entry.secret));
        }
    }
    let (verdict, reason, message) = if !policed {
        (
            ConditionStatus::False,
            "NoEgressGateway",
            "the server runs no egress gateway, so no request gets a Secret's value".to_string(),
        )
    } else if problems.is_empty() {
        (ConditionStatus::True, "Ready", String::new())
    } else {
        (
            ConditionStatus::False,
            "SecretUnavailable",
            format!(
                "these variables hold placeholders no request gets a value for: {}",
                problems.join("; ")
            ),
        )
    };
    let same = status
        .conditions
        .iter()
        .find(|c| c.type_ == SECRETS_READY)
        .filter(|c| c.status == verdict && c.message == message)
        .map(|c| c.last_transition_time);
    set_condition(
        &mut status.conditions,
        Condition {
            type_: SECRETS_READY.into(),
            status: verdict,
            reason: reason.into(),
            message,
            last_transition_time: same.unwrap_or_else(Utc::now),
            observed_generation: Some(generation),
        },
    );
}

/// What keeps Secret `name` from being put in requests, if anything. The value is read to know
/// it is there and dropped at once.
fn problem_of(store: &Store, name: &str) -> Option<String> {
    let Some(secret) = store
        .get(Kind::Secret, name)
        .filter(|e| e.resource.metadata().deletion_timestamp.is_none())
        .and_then(|e| e.resource.as_secret().cloned())
    else {
        return Some(format!("Secret {name:?} not found"));
    };
    match secret.spec.injection() {
        Ok(Some(_)) => {}
        Ok(None) => return Some("the Secret names no hosts (spec.hosts, spec.header)".into()),
        Err(error) => return Some(error.to_string()),
    }
    crate::secrets::value_of(store, name)
        .err()
        .map(|error| error.to_string())
}
