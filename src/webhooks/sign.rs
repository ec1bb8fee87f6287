//! What a delivery looks like on the wire: its JSON body and its signature header. Documented in
//! docs/events.md; receivers are written against it.

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use crate::resource::{Event, EventSeverity, ObjectReference};

/// The header carrying `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "X-Agent-Sandbox-Signature";
/// The header carrying the delivery's id (the same as the body's `id`).
pub const DELIVERY_HEADER: &str = "X-Agent-Sandbox-Delivery";

/// The body of one delivery.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery<'a> {
    /// `<event name>.<resourceVersion>`: unique per occurrence, the same on every retry of it,
    /// so a receiver can drop a delivery it already has (delivery is at least once).
    pub id: String,
    pub reason: &'a str,
    #[serde(rename = "type")]
    pub type_: EventSeverity,
    pub object: &'a ObjectReference,
    pub event: &'a Event,
}

impl<'a> Delivery<'a> {
    pub fn of(event: &'a Event) -> Delivery<'a> {
        Delivery {
            id: format!(
                "{}.{}",
                event.metadata.name, event.metadata.resource_version
            ),
            reason: &event.reason,
            type_: event.type_,
            object: &event.involved_object,
            event,
        }
    }
}

/// `sha256=<hex>` of `body` keyed with `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_as_rfc_4231_computes_it() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
