//! Delivering events to `Webhook` receivers: each occurrence in the event log's outbox that a
//! webhook wants is POSTed to its URL as JSON, signed with its Secret (`sign.rs`), in the order
//! it was recorded (so in order per object), one at a time per webhook. A failed delivery is
//! retried with waits doubling from one second up to `AGENT_SANDBOX_WEBHOOK_MAX_BACKOFF_SECONDS`,
//! for `AGENT_SANDBOX_WEBHOOK_RETRY_SECONDS` (a day) after the event happened; then it is given up,
//! with a Warning event about the webhook saying so, and the next one is tried.
//!
//! Delivery is at least once: how far each webhook got is its `status.deliveredThrough`, written
//! after the receiver accepted, so a crash in between delivers that one again (with the same
//! `id`). The outbox keeps what any webhook still needs across restarts. A new webhook starts
//! with the events recorded after it. Nothing here logs or stores a Secret's value.

mod sign;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use crate::config::Settings;
use crate::resource::{Event, Kind, ObjectReference, Webhook, WebhookStatus};
use crate::store::Store;
pub use sign::{signature, Delivery, DELIVERY_HEADER, SIGNATURE_HEADER};

/// How many outbox entries one look at the outbox takes.
const BATCH: usize = 256;
/// How long an idle delivery waits before looking at the outbox again without being woken.
const IDLE: Duration = Duration::from_secs(2);
/// How long one POST may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the deliveries of every webhook, starting and stopping them as webhooks come and go,
/// and lets the outbox drop what every webhook is past. Stops when the task is aborted.
pub fn spawn(store: Arc<Store>, settings: Arc<Settings>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(supervise(store, settings))
}

async fn supervise(store: Arc<Store>, settings: Arc<Settings>) {
    let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut changes = store.subscribe();
    loop {
        let webhooks: Vec<Webhook> = store
            .list(Kind::Webhook)
            .into_iter()
            .filter_map(|e| e.resource.as_webhook().cloned())
            .filter(|w| w.metadata.deletion_timestamp.is_none())
            .collect();
        let uids: Vec<String> = webhooks
            .iter()
            .filter_map(|w| w.metadata.uid.clone())
            .collect();
        running.retain(|uid, task| {
            let keep = uids.contains(uid) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for webhook in &webhooks {
            let Some(uid) = webhook.metadata.uid.clone() else {
                continue;
            };
            running.entry(uid.clone()).or_insert_with(|| {
                let delivery = Deliveries::new(&store, &settings, webhook, uid);
                tokio::spawn(delivery.run())
            });
        }
        // The outbox may drop what every webhook is past (everything, without webhooks).
        let through = webhooks
            .iter()
            .map(|w| w.status.as_ref().map(|s| s.delivered_through))
            .try_fold(store.events().head(), |low, at| at.map(|at| low.min(at)));
        if let Some(through) = through {
            store.events().acknowledge(through);
        }
        // Look again when a webhook changes, or now and then.
        let _ = tokio::time::timeout(IDLE, async {
            loop {
                match changes.recv().await {
                    Ok(change) if change.resource.kind() == Kind::Webhook => return,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await
                    }
                }
            }
        })
        .await;
    }
}

/// The deliveries of one webhook.
struct Deliveries {
    store: Arc<Store>,
    settings: Arc<Settings>,
    name: String,
    uid: String,
    client: reqwest::Client,
}

impl Deliveries {
    fn new(store: &Arc<Store>, settings: &Arc<Settings>, webhook: &Webhook, uid: String) -> Self {
        let client = reqwest::Client::builder()
            .timeout(POST_TIMEOUT)
            // A signed delivery goes where the webhook says, nowhere a receiver redirects it.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Deliveries {
            store: Arc::clone(store),
            settings: Arc::clone(settings),
            name: webhook.metadata.name.clone(),
            uid,
            client,
        }
    }

    /// The webhook as it is now, while it is the same one and not being deleted.
    fn webhook(&self) -> Option<Webhook> {
        let entry = self.store.get(Kind::Webhook, &self.name)?;
        let webhook = entry.resource.as_webhook()?.clone();
        (webhook.metadata.uid.as_deref() == Some(self.uid.as_str())
            && webhook.metadata.deletion_timestamp.is_none())
        .then_some(webhook)
    }

    async fn write_status(&self, status: &WebhookStatus) {
        let Ok(value) = serde_json::to_value(status) else {
            return;
        };
        let name = self.name.clone();
        let written = self
            .store
            .write(move |store| store.update_status(Kind::Webhook, &name, value))
            .await;
        if let Err(e) = written {
            tracing::warn!(webhook = %self.name, "cannot write the webhook's status: {e}");
        }
    }

    async fn run(self) {
        let Some(webhook) = self.webhook() else {
            return;
        };
        let mut status = match webhook.status {
            Some(status) => status,
            None => {
                // A new webhook gets what happens from now on.
                let status = WebhookStatus {
                    delivered_through: self.store.events().head(),
                    ..WebhookStatus::default()
                };
                self.write_status(&status).await;
                status
            }
        };
        let mut wake = self.store.events().subscribe();
        loop {
            let Some(webhook) = self.webhook() else {
                return;
            };
            let batch = self
                .store
                .events()
                .outbox_after(status.delivered_through, BATCH);
            let wanted = |e: &Event| {
                webhook.spec.wants(&e.reason, &e.involved_object.kind)
                    && !(e.involved_object.kind == "Webhook"
                        && e.involved_object.name == webhook.metadata.name)
            };
            match batch.iter().find(|e| wanted(e)) {
                Some(event) => self.deliver(&webhook, event, &mut status).await,
                None => {
                    let Some(last) = batch.last() else {
                        let _ = tokio::time::timeout(IDLE, wake.recv()).await;
                        continue;
                    };
                    status.delivered_through = rv(last);
                    if batch.len() < BATCH {
                        self.write_status(&status).await;
                    }
                }
            }
        }
    }

    /// Delivers `event`, retrying until the receiver accepts it or the retry window has passed.
    async fn deliver(&self, webhook: &Webhook, event: &Event, status: &mut WebhookStatus) {
        match self.post(webhook, event).await {
            Ok(()) => {
                status.delivered_through = rv(event);
                status.delivered += 1;
                status.failures = 0;
                status.last_error.clear();
                status.last_delivery_time = Some(Utc::now());
                status.next_attempt_time = None;
                self.write_status(status).await;
            }
            Err(error) => {
                status.failures += 1;
                status.last_error = error;
                let window = chrono::TimeDelta::from_std(Duration::from_secs_f64(
                    self.settings.webhook_retry_seconds,
                ))
                .unwrap_or(chrono::TimeDelta::MAX);
                if Utc::now().signed_duration_since(event.last_timestamp) > window {
                    self.give_up(event, status).await;
                    return;
                }
                let backoff = backoff(status.failures, self.settings.webhook_max_backoff_seconds);
                status.next_attempt_time = chrono::TimeDelta::from_std(backoff)
                    .ok()
                    .map(|d| Utc::now() + d);
                self.write_status(status).await;
                tokio::time::sleep(backoff).await;
            }
        }
    }

    async fn give_up(&self, event: &Event, status: &mut WebhookStatus) {
        let attempts = status.failures;
        let object = &event.involved_object;
        let message = format!(
            "gave up delivering {} ({} of {}/{}) after {attempts} attempts: {}",
            Delivery::of(event).id,
            event.reason,
            object.kind.to_ascii_lowercase(),
            object.name,
            status.last_error
        );
        status.delivered_through = rv(event);
        status.given_up += 1;
        status.failures = 0;
        status.next_attempt_time = None;
        self.write_status(status).await;
        self.store.recorder().warning(
            ObjectReference {
                kind: Kind::Webhook.to_string(),
                name: self.name.clone(),
                namespace: crate::resource::DEFAULT_NAMESPACE.to_string(),
                uid: self.uid.clone(),
            },
            "DeliveryGivenUp",
            message,
        );
    }

    /// One POST of `event`; the error says why it failed, never with the secret.
    async fn post(&self, webhook: &Webhook, event: &Event) -> Result<(), String> {
        let secret = crate::secrets::value_of(&self.store, &webhook.spec.secret)
            .map_err(|e| e.to_string())?;
        let delivery = Delivery::of(event);
        let body = serde_json::to_vec(&delivery).map_err(|e| e.to_string())?;
        let response = self
            .client
            .post(&webhook.spec.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(DELIVERY_HEADER, &delivery.id)
            .header(SIGNATURE_HEADER, signature(&secret, &body))
            .body(body)
            .send()
            .await
            .map_err(|e| format!("cannot deliver: {}", e.without_url()))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {}", response.status()))
        }
    }
}

fn rv(event: &Event) -> u64 {
    event.metadata.resource_version.parse().unwrap_or(0)
}

/// One second after the first failure, doubling after each, up to `max_seconds`.
fn backoff(failures: u64, max_seconds: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(30) as i32;
    Duration::from_secs_f64(2f64.powi(exponent).min(max_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap() {
        let waits: Vec<u64> = (1..=6).map(|n| backoff(n, 10.0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(1000, 300.0), Duration::from_secs(300));
    }
}
