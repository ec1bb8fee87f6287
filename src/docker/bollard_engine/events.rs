//! Docker's event stream narrowed to what the controller reacts to.
//!
//! Container events carry the container's labels as attributes, so the daemon filters them by
//! [`LABEL_MANAGED`]. Volume events (Docker 20.10) carry only the driver, never labels, so
//! volumes are matched by name here: every volume whose name starts with `agent-sandbox-`, and
//! `agent-sandbox-<name>-workspace` is mapped back to sandbox `<name>`.

use std::collections::HashMap;

use bollard::models::{EventMessage, EventMessageTypeEnum};
use bollard::query_parameters::EventsOptions;
use futures::stream::{BoxStream, StreamExt};

use super::map_err;
use crate::docker::{EngineEvent, EngineResult, LABEL_ID, LABEL_MANAGED, LABEL_SERVER};

/// Container actions worth a reconcile. Exec and attach events are frequent and say nothing
/// about the container's life.
const CONTAINER_ACTIONS: &[&str] = &[
    "create", "start", "die", "stop", "kill", "oom", "pause", "unpause", "destroy", "rename",
];
const VOLUME_ACTIONS: &[&str] = &["create", "destroy"];
const VOLUME_PREFIX: &str = "agent-sandbox-";
const WORKSPACE_SUFFIX: &str = "-workspace";

fn filters(kind: &str, actions: &[&str], label: bool) -> HashMap<String, Vec<String>> {
    let mut filters = HashMap::from([
        ("type".to_string(), vec![kind.to_string()]),
        (
            "event".to_string(),
            actions.iter().map(|a| a.to_string()).collect(),
        ),
    ]);
    if label {
        filters.insert("label".into(), vec![format!("{LABEL_MANAGED}=true")]);
    }
    filters
}

pub fn stream(docker: &bollard::Docker) -> BoxStream<'static, EngineResult<EngineEvent>> {
    let subscribe = |filters| {
        docker
            .events(Some(EventsOptions {
                filters: Some(filters),
                ..Default::default()
            }))
            .boxed()
    };
    let containers = subscribe(filters("container", CONTAINER_ACTIONS, true));
    let volumes = subscribe(filters("volume", VOLUME_ACTIONS, false));
    futures::stream::select(containers, volumes)
        .filter_map(|item| async move {
            match item {
                Ok(message) => to_engine_event(&message).map(Ok),
                Err(e) => Some(Err(map_err("watch events", "event stream")(e))),
            }
        })
        .boxed()
}

/// The [`EngineEvent`] for one Docker event, or `None` when it is not about a managed object.
pub fn to_engine_event(message: &EventMessage) -> Option<EngineEvent> {
    let action = message.action.clone()?;
    let actor = message.actor.as_ref()?;
    let empty = HashMap::new();
    let attributes = actor.attributes.as_ref().unwrap_or(&empty);
    match message.typ? {
        EventMessageTypeEnum::CONTAINER => {
            if attributes.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
                return None;
            }
            let number = |key: &str| attributes.get(key).and_then(|v| v.parse::<i64>().ok());
            Some(EngineEvent {
                object: "container".into(),
                sandbox: attributes.get(LABEL_ID).cloned(),
                server: attributes.get(LABEL_SERVER).cloned(),
                container: actor.id.clone(),
                exit_code: number("exitCode").filter(|_| action == "die"),
                signal: signal(attributes.get("signal")).filter(|_| action == "kill"),
                at: at(message),
                action,
            })
        }
        EventMessageTypeEnum::VOLUME => {
            let name = actor.id.as_deref()?;
            let rest = name.strip_prefix(VOLUME_PREFIX)?;
            let sandbox = rest
                .strip_suffix(WORKSPACE_SUFFIX)
                .filter(|s| !s.is_empty())
                .map(str::to_string);
            Some(EngineEvent {
                object: "volume".into(),
                action,
                sandbox,
                at: at(message),
                ..Default::default()
            })
        }
        _ => None,
    }
}

/// A `kill` event's signal: a number, or a name such as `SIGTERM` or `KILL` (`docker kill -s`).
fn signal(value: Option<&String>) -> Option<i64> {
    let value = value?.trim();
    if let Ok(n) = value.parse::<i64>() {
        return Some(n);
    }
    let name = value.strip_prefix("SIG").unwrap_or(value);
    let n = match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        _ => return None,
    };
    Some(n)
}

fn at(message: &EventMessage) -> Option<chrono::DateTime<chrono::Utc>> {
    match message.time_nano {
        Some(nanos) => Some(chrono::DateTime::from_timestamp_nanos(nanos)),
        None => chrono::DateTime::from_timestamp(message.time?, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::EventActor;

    fn message(typ: EventMessageTypeEnum, id: &str, attrs: &[(&str, &str)]) -> EventMessage {
        EventMessage {
            typ: Some(typ),
            action: Some("destroy".into()),
            actor: Some(EventActor {
                id: Some(id.into()),
                attributes: Some(
                    attrs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn container_events_need_the_managed_label() {
        let m = message(
            EventMessageTypeEnum::CONTAINER,
            "abc",
            &[
                (LABEL_MANAGED, "true"),
                (LABEL_ID, "demo"),
                (LABEL_SERVER, "s1"),
            ],
        );
        assert_eq!(
            to_engine_event(&m),
            Some(EngineEvent {
                object: "container".into(),
                action: "destroy".into(),
                sandbox: Some("demo".into()),
                server: Some("s1".into()),
                container: Some("abc".into()),
                ..Default::default()
            })
        );
        let m = message(
            EventMessageTypeEnum::CONTAINER,
            "abc",
            &[(LABEL_ID, "demo")],
        );
        assert_eq!(to_engine_event(&m), None);
    }

    #[test]
    fn deaths_and_kills_carry_their_numbers() {
        let mut m = message(
            EventMessageTypeEnum::CONTAINER,
            "abc",
            &[
                (LABEL_MANAGED, "true"),
                ("exitCode", "137"),
                ("signal", "KILL"),
            ],
        );
        m.action = Some("die".into());
        m.time = Some(1_700_000_000);
        let die = to_engine_event(&m).unwrap();
        assert_eq!((die.exit_code, die.signal), (Some(137), None));
        assert_eq!(die.at.unwrap().timestamp(), 1_700_000_000);
        m.action = Some("kill".into());
        let kill = to_engine_event(&m).unwrap();
        assert_eq!((kill.exit_code, kill.signal), (None, Some(9)));
        assert_eq!(signal(Some(&"SIGTERM".to_string())), Some(15));
        assert_eq!(signal(Some(&"15".to_string())), Some(15));
        assert_eq!(signal(Some(&"bogus".to_string())), None);
    }

    #[test]
    fn volume_events_map_names_to_sandboxes() {
        let m = message(
            EventMessageTypeEnum::VOLUME,
            "agent-sandbox-demo-workspace",
            &[("driver", "local")],
        );
        assert_eq!(
            to_engine_event(&m).unwrap().sandbox.as_deref(),
            Some("demo")
        );
        let m = message(EventMessageTypeEnum::VOLUME, "agent-sandbox-helper", &[]);
        let event = to_engine_event(&m).unwrap();
        assert_eq!(event.object, "volume");
        assert_eq!(event.sandbox, None);
        let m = message(EventMessageTypeEnum::VOLUME, "postgres-data", &[]);
        assert_eq!(to_engine_event(&m), None);
    }
}
