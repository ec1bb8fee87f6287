//! A running sandbox's declared services and listening ports in its status: the controller
//! tells [`crate::services::Services`] which services the current container should run, and
//! reports what they do, the `ServicesReady` condition, and whether they let the sandbox be
//! `Ready`.

use chrono::Utc;

use super::context::SandboxContext;
use crate::resource::{set_condition, Condition, ConditionStatus, Sandbox, SandboxStatus};
use crate::services::Running;

/// The condition naming the services not ready yet.
pub(super) const SERVICES_READY: &str = "ServicesReady";

/// Ensures `sandbox`'s services run in the container `status` names, and writes what they do
/// into `status`. Returns the services with a readiness check that are not ready (the sandbox
/// is not `Ready` while there are some).
pub(super) fn report(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    status: &mut SandboxStatus,
    generation: u64,
) -> Vec<String> {
    let name = &sandbox.metadata.key();
    let Some(container_id) = status.container_id.clone() else {
        return Vec::new();
    };
    let running = Running {
        name: name.to_string(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        container_id: container_id.clone(),
        started_at: status.started_at,
        // Services get what commands through the API get: the egress gateway's variables (the
        // proxy, the CA bundle, `spec.secrets` placeholders) under the spec's own.
        env: ctl.containers.egress_env(name, &sandbox.spec.env),
    };
    let specs = &sandbox.spec.services;
    ctl.services.ensure(&running, specs, &status.services);
    if let Some(observed) = ctl.services.observe(name, specs) {
        status.services = observed;
    }
    if let Some(ports) = ctl.services.listening_ports(name, &container_id) {
        status.listening_ports = ports;
    }
    let not_ready: Vec<String> = specs
        .iter()
        .filter(|s| s.readiness.is_some())
        .filter(|s| !status.services.iter().any(|o| o.name == s.name && o.ready))
        .map(|s| s.name.clone())
        .collect();
    if specs.is_empty() {
        super::status::clear_condition(&mut status.conditions, SERVICES_READY);
        return not_ready;
    }
    let (verdict, reason, message) = if not_ready.is_empty() {
        (ConditionStatus::True, "Ready", String::new())
    } else {
        (
            ConditionStatus::False,
            "NotReady",
            format!("not ready: {}", not_ready.join(", ")),
        )
    };
    let same = status
        .conditions
        .iter()
        .find(|c| c.type_ == SERVICES_READY)
        .filter(|c| c.status == verdict && c.message == message)
        .map(|c| c.last_transition_time);
    set_condition(
        &mut status.conditions,
        Condition {
            type_: SERVICES_READY.into(),
            status: verdict,
            reason: reason.into(),
            message,
            last_transition_time: same.unwrap_or_else(Utc::now),
            observed_generation: Some(generation),
        },
    );
    not_ready
}
