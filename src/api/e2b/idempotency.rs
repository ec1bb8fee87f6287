//! `Idempotency-Key` on E2B's create: a create repeated with a key answers what the first one
//! did for [`control::IDEMPOTENCY_HOURS`], the sandbox it made whether it still lives or was
//! deleted since (a retry that arrives late never makes a second sandbox; calls on a deleted
//! one then find it gone). A living sandbox carries its key as an annotation
//! ([`control::IDEMPOTENCY_KEY`]); the store keeps the key past the sandbox
//! ([`crate::store::CreateKey`]), without anything secret: the answer's tokens are made again.

use chrono::{TimeDelta, Utc};

use crate::api::AppState;
use crate::authz::{namespace_of, Principal};
use crate::e2b::control;
use crate::resource::{split_key, Kind, Sandbox, SandboxSpec};
use crate::store::CreateKey;

/// Serializes creates that carry an `Idempotency-Key`, so that two at once with the same key
/// make one sandbox (creates without a key never wait on it).
pub(super) static CREATES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn horizon() -> chrono::DateTime<Utc> {
    Utc::now() - TimeDelta::hours(control::IDEMPOTENCY_HOURS)
}

/// The sandbox an earlier create with `key` in the caller's namespace (where E2B's creates make
/// sandboxes) made, if one did within the horizon: as it is while it lives, else as it was made
/// (its name, namespace, uid, creation and template: what its answer is made of).
pub(super) fn earlier(state: &AppState, principal: &Principal, key: &str) -> Option<Sandbox> {
    let now = Utc::now();
    let home = principal.home_namespace();
    let living = state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| namespace_of(&s.metadata) == home)
        .find(|s| control::created_with_key(s, key, now))
        .cloned();
    if living.is_some() {
        return living;
    }
    let record = state.store.create_key(home, key, horizon())?;
    let (namespace, name) = split_key(&record.object);
    // Gone: as it was made (its tokens are bound to its key, uid and creation).
    let mut gone = Sandbox::new(name, SandboxSpec::default());
    gone.metadata.namespace = namespace.to_string();
    gone.metadata.uid = Some(record.uid);
    gone.metadata.creation_timestamp = Some(record.created);
    gone.metadata
        .annotations
        .insert(control::TEMPLATE.to_string(), record.note);
    Some(gone)
}

/// Keeps `key` past `sandbox`, which a create with it just made. A failure to keep it is
/// logged: the sandbox's annotation still answers repeats while it lives.
pub(super) async fn remember(state: &AppState, key: String, sandbox: &Sandbox) {
    let record = CreateKey {
        object: sandbox.metadata.key(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        created: sandbox.metadata.creation_timestamp.unwrap_or_else(Utc::now),
        note: control::template_of(sandbox),
    };
    let store = std::sync::Arc::clone(&state.store);
    let namespace = sandbox.metadata.namespace.clone();
    let kept = tokio::task::spawn_blocking(move || {
        store.keep_create_key(&namespace, &key, record, horizon())
    })
    .await;
    match kept {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "cannot keep an idempotency key"),
        Err(error) => tracing::warn!(%error, "cannot keep an idempotency key"),
    }
}
