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
            Some(EngineEvent {
                object: "container".into(),
                action,
                sandbox: attributes.get(LABEL_ID).cloned(),
                server: attributes.get(LABEL_SERVER).cloned(),
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
                server: None,
            })
        }
        _ => None,
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
