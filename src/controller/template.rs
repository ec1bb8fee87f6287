//! Sandbox templates in the controller: resolving a sandbox's `spec.template` once into its
//! `status.template` (the values it keeps from then on), and reconciling a `SandboxTemplate`
//! itself (its status, its deletion).
//!
//! The record is written with the sandbox's status, so a sandbox keeps the values it was made
//! with across container replacements and restarts, whatever the template becomes later. This
//! module does not build containers; `sandbox.rs` does, from the resolved sandbox.

use super::context::ForkContext;
use super::error::ReconcileError;
use super::policy::Outcome;
use super::status::{generation, set_ready, write_status};
use crate::resource::{ConditionStatus, Kind, Sandbox, SandboxStatus, TemplateRecord};
use crate::store::Store;

/// `sandbox` as it runs: its template recorded in `status` on first sight (the template as it is
/// now), and the fields it leaves unset filled from that record. A template that does not exist
/// is an error naming it; the sandbox waits for it.
pub(super) fn resolve(
    store: &Store,
    sandbox: &Sandbox,
    status: &mut SandboxStatus,
) -> Result<Sandbox, ReconcileError> {
    let Some(name) = &sandbox.spec.template else {
        return Ok(sandbox.clone());
    };
    // `spec.template` is immutable, so a record under another name is one from before a
    // refused edit: the record wins.
    if status.template.is_none() {
        let template = store
            .get(Kind::SandboxTemplate, &sandbox.metadata.sibling(name))
            .and_then(|e| e.resource.as_template().cloned())
            .filter(|t| t.metadata.deletion_timestamp.is_none())
            .ok_or_else(|| ReconcileError::TemplateNotFound(name.clone()))?;
        let mut spec = template.spec.clone();
        // The pool shapes no sandbox.
        spec.pool = None;
        status.template = Some(TemplateRecord {
            name: name.clone(),
            generation: generation(&template.metadata),
            spec,
        });
    }
    // The status stays as stored: the status write compares against it.
    let mut resolved = sandbox.clone();
    if let Some(record) = &status.template {
        resolved.spec = record.spec.apply_to(&sandbox.spec);
    }
    Ok(resolved)
}

/// Sandboxes that name template `name` and have not taken their values from it yet: what a new
/// template wakes.
pub(super) fn waiting_for(store: &Store, name: &str) -> Vec<String> {
    store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| {
            let wanted = s.spec.template.as_ref().map(|t| s.metadata.sibling(t));
            wanted.as_deref() == Some(name)
        })
        .filter(|s| s.status.as_ref().is_none_or(|st| st.template.is_none()))
        .map(|s| s.metadata.key())
        .collect()
}

/// Reconciles template `name`: Ready at its generation, or let go when deleted (sandboxes made
/// from it keep their recorded values).
pub(super) async fn reconcile(
    ctl: &ForkContext<'_>,
    name: &str,
) -> Result<Outcome, ReconcileError> {
    let Some(template) = ctl
        .store
        .get(Kind::SandboxTemplate, name)
        .and_then(|e| e.resource.as_template().cloned())
    else {
        return Ok(Outcome::done());
    };
    if template.metadata.deletion_timestamp.is_some() {
        let name = name.to_string();
        ctl.store
            .write(move |store| store.finalize(Kind::SandboxTemplate, &name))
            .await?;
        return Ok(Outcome::done());
    }
    let generation = generation(&template.metadata);
    let mut status = template.status.clone().unwrap_or_default();
    status.observed_generation = Some(generation);
    set_ready(
        &mut status.conditions,
        ConditionStatus::True,
        "Accepted",
        "",
        generation,
    );
    write_status(ctl.store, ctl.events, &template, &status).await?;
    Ok(Outcome::done())
}
