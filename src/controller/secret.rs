//! Reconciling a `Secret` (its status says whether the server has a value, never the value; its
//! deletion forgets the value) and a `Webhook` (only its deletion: deliveries and their status
//! belong to `webhooks`).

use super::context::ForkContext;
use super::error::ReconcileError;
use super::policy::Outcome;
use super::status::write_status;
use crate::resource::{Kind, SecretStatus};

pub(super) async fn reconcile_secret(
    ctl: &ForkContext<'_>,
    name: &str,
) -> Result<Outcome, ReconcileError> {
    let Some(entry) = ctl.store.get(Kind::Secret, name) else {
        return Ok(Outcome::done());
    };
    let Some(secret) = entry.resource.as_secret().cloned() else {
        return Ok(Outcome::done());
    };
    if secret.metadata.deletion_timestamp.is_some() {
        let name = name.to_string();
        ctl.store
            .write(move |store| {
                store.remove_secret_value(&name)?;
                store.finalize(Kind::Secret, &name)
            })
            .await?;
        return Ok(Outcome::done());
    }
    let status = match crate::secrets::value_of(ctl.store, name) {
        Ok(_) => SecretStatus {
            has_value: true,
            message: String::new(),
        },
        Err(error) => SecretStatus {
            has_value: false,
            message: error.to_string(),
        },
    };
    write_status(ctl.store, ctl.events, &secret, &status).await?;
    Ok(Outcome::done())
}

pub(super) async fn reconcile_webhook(
    ctl: &ForkContext<'_>,
    name: &str,
) -> Result<Outcome, ReconcileError> {
    let deleting = ctl
        .store
        .get(Kind::Webhook, name)
        .is_some_and(|e| e.resource.metadata().deletion_timestamp.is_some());
    if deleting {
        let name = name.to_string();
        ctl.store
            .write(move |store| store.finalize(Kind::Webhook, &name))
            .await?;
    }
    Ok(Outcome::done())
}
