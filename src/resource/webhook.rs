//! The `Webhook` kind: a receiver that gets every event (or those of the reasons and kinds it
//! names) POSTed as signed JSON. The server delivers (`webhooks`); this module owns the document.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    /// Where events are POSTed: an `http://` or `https://` URL.
    #[schemars(length(min = 8, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,
    /// Event reasons (`Failed`, `Started`, ...) or involved kinds (`Sandbox`, ...) to deliver;
    /// empty or absent: every event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub events: Vec<String>,
    /// The `Secret` whose value signs each delivery (HMAC-SHA256).
    #[schemars(length(min = 1, max = 63))]
    pub secret: String,
}

impl WebhookSpec {
    /// Whether an event of `reason` about an object of `kind` is wanted.
    pub fn wants(&self, reason: &str, kind: &str) -> bool {
        self.events.is_empty() || self.events.iter().any(|e| e == reason || e == kind)
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookStatus {
    /// The event log position delivered through: every wanted event recorded up to it was
    /// delivered (or given up on).
    #[serde(default)]
    pub delivered_through: u64,
    /// Deliveries the receiver accepted.
    #[serde(default)]
    pub delivered: u64,
    /// Deliveries given up on after retrying for the whole retry window.
    #[serde(default)]
    pub given_up: u64,
    /// Failed attempts in a row at the delivery now being retried.
    #[serde(default)]
    pub failures: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivery_time: Option<DateTime<Utc>>,
    /// Why the last attempt failed (empty once one succeeds).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// When the delivery now being retried is tried next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<DateTime<Utc>>,
}
