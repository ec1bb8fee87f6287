//! `spec.services` of a sandbox: long-running commands the controller keeps up while the sandbox's
//! container runs (the way a pod declares its containers), and what `status.services` reports of
//! them. The checks a schema cannot express (unique names, one of `command`/`argv`, one kind of
//! readiness check) are [`check_services`], which names the field of each violation.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::field_error::FieldError;

/// One service: a command started as a process of the sandbox (so `logs` and `attach` work on
/// it) and started again per its `restartPolicy`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    /// Unique among the sandbox's services: `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    )]
    pub name: String,
    /// A command line run by `/bin/sh -c`; give this or `argv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 65536))]
    pub command: Option<String>,
    /// The program and its arguments; give this or `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// Added to the sandbox's `spec.env` (these win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub workdir: Option<String>,
    /// When an ended service is started again (default `Always`), after a delay that doubles
    /// from 1 s up to 60 s (the first restart is immediate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// The ports it serves, for people and clients (informational).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServicePort>,
    /// How to tell the service is ready; without one it counts as ready once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
    /// Seconds after each start before the first readiness check (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub initial_delay_seconds: Option<u64>,
    /// Seconds between readiness checks (default 10; until the first success after a start,
    /// every second at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub period_seconds: Option<u64>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicePort {
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
}

/// Exactly one of `httpGet`, `tcpSocket` or `exec`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Readiness {
    /// Ready when a GET of `path` on `127.0.0.1:port` inside the sandbox answers 200-399.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetCheck>,
    /// Ready when `127.0.0.1:port` inside the sandbox accepts a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketCheck>,
    /// Ready when the command exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecCheck>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGetCheck {
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^/[\x21-\x7e]*$"))]
    pub path: Option<String>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpSocketCheck {
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecCheck {
    /// A command line run by `/bin/sh -c`, with the service's environment.
    #[schemars(length(min = 1, max = 65536))]
    pub command: String,
}

/// What `status.services` says of one service.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceStatus {
    pub name: String,
    pub state: ServiceState,
    pub ready: bool,
    /// How many times it was started again after it ended.
    pub restarts: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_at: Option<DateTime<Utc>>,
    /// The process it runs as now (or ran as last), for `logs` and `attach`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_id: Option<String>,
    /// Why it is not ready or not running, when something says.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceState {
    Starting,
    Running,
    Exited,
    BackOff,
}

impl ServiceSpec {
    pub fn restart_policy(&self) -> RestartPolicy {
        self.restart_policy.unwrap_or_default()
    }

    pub fn initial_delay(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.initial_delay_seconds.unwrap_or(0))
    }

    pub fn period(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.period_seconds.unwrap_or(10).max(1))
    }
}

/// What the schema cannot say about `spec.services`: each violation with its field, e.g.
/// `spec.services[1].argv`.
pub fn check_services(services: &[ServiceSpec]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    let mut error = |i: usize, field: &str, message: String| {
        let pointer = if field.is_empty() {
            format!("/spec/services/{i}")
        } else {
            format!("/spec/services/{i}/{field}")
        };
        errors.push(FieldError { pointer, message });
    };
    for (i, s) in services.iter().enumerate() {
        if !names.insert(s.name.as_str()) {
            error(
                i,
                "name",
                format!("service name {:?} is used twice", s.name),
            );
        }
        match (&s.command, s.argv.is_empty()) {
            (Some(_), false) => error(i, "argv", "give command or argv, not both".into()),
            (None, true) => error(i, "command", "give command or argv".into()),
            _ => {}
        }
        if s.argv.first().is_some_and(String::is_empty) {
            error(i, "argv", "the program name is empty".into());
        }
        if let Some(r) = &s.readiness {
            let given = [
                r.http_get.is_some(),
                r.tcp_socket.is_some(),
                r.exec.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                error(
                    i,
                    "readiness",
                    "give exactly one of httpGet, tcpSocket or exec".into(),
                );
            }
        }
        let mut ports = BTreeSet::new();
        for (j, p) in s.ports.iter().enumerate() {
            if !ports.insert(p.port) {
                error(
                    i,
                    &format!("ports/{j}/port"),
                    format!("port {} is listed twice", p.port),
                );
            }
        }
        for key in s.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                error(
                    i,
                    "env",
                    format!("{key:?} is not an environment variable name"),
                );
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            command: Some("sleep 1".into()),
            argv: Vec::new(),
            env: BTreeMap::new(),
            workdir: None,
            restart_policy: None,
            ports: Vec::new(),
            readiness: None,
            initial_delay_seconds: None,
            period_seconds: None,
        }
    }

    #[test]
    fn names_the_service_and_field_of_each_violation() {
        let mut both = service("b");
        both.argv = vec!["x".into()];
        let mut neither = service("c");
        neither.command = None;
        let mut two_checks = service("d");
        two_checks.readiness = Some(Readiness {
            tcp_socket: Some(TcpSocketCheck { port: 1 }),
            exec: Some(ExecCheck {
                command: "true".into(),
            }),
            http_get: None,
        });
        let mut same_port = service("e");
        same_port.ports = [8000, 8001, 8000]
            .map(|port| ServicePort { port, name: None })
            .to_vec();
        let errors = check_services(&[
            service("a"),
            both,
            neither,
            two_checks,
            service("a"),
            same_port,
        ]);
        let fields: Vec<String> = errors.iter().map(FieldError::field).collect();
        assert_eq!(
            fields,
            [
                "spec.services[1].argv",
                "spec.services[2].command",
                "spec.services[3].readiness",
                "spec.services[4].name",
                "spec.services[5].ports[2].port"
            ]
        );
        assert!(check_services(&[service("a"), service("b")]).is_empty());
    }

    #[test]
    fn defaults_are_always_and_ten_seconds() {
        let s = service("a");
        assert_eq!(s.restart_policy(), RestartPolicy::Always);
        assert_eq!(s.period(), std::time::Duration::from_secs(10));
        assert_eq!(s.initial_delay(), std::time::Duration::ZERO);
    }
}
