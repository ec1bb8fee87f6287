//! The messages of envd's `process` and `filesystem` services, written from E2B's public
//! service definitions (`spec/envd/process/process.proto`, `spec/envd/filesystem/
//! filesystem.proto`) in their proto3 JSON form: lowerCamelCase names (the proto names are
//! accepted too), `bytes` as base64, 64-bit integers as strings, enums by name, a `oneof` as the
//! one field that is set. Only data: what the calls do is `api/e2b`'s business.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// A proto3 JSON integer: a number or a decimal string.
fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Num(u32),
        Text(String),
    }
    match Option::<Int>::deserialize(d)? {
        None => Ok(None),
        Some(Int::Num(n)) => Ok(Some(n)),
        Some(Int::Text(t)) => t
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{t:?} is not a uint32"))),
    }
}

// ----- process.Process -----

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub struct PtySize {
    #[serde(default, deserialize_with = "de_u32")]
    pub cols: Option<u32>,
    #[serde(default, deserialize_with = "de_u32")]
    pub rows: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub struct Pty {
    #[serde(default)]
    pub size: Option<PtySize>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StartRequest {
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    #[serde(default)]
    pub pty: Option<Pty>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// Which process a call is about: by pid or by the tag given at start.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ProcessSelector {
    #[serde(default, deserialize_with = "de_u32")]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ConnectRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
}

/// Input for a process: base64 bytes for its stdin or its terminal.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ProcessInput {
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub pty: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SendInputRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub input: Option<ProcessInput>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SendSignalRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    /// `SIGNAL_SIGTERM`, `SIGNAL_SIGKILL` or their numbers (15, 9).
    #[serde(default)]
    pub signal: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SelectorRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct UpdateRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// An answer with no fields.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Empty {}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StartEvent {
    pub pid: u32,
}

/// Output, base64: exactly one of the three is set.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DataEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ProcessEvent {
    Start(StartEvent),
    Data(DataEvent),
    End(EndEvent),
    Keepalive(Empty),
}

/// `StartResponse` and `ConnectResponse` alike.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EventResponse {
    pub event: ProcessEvent,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

// ----- filesystem.Filesystem -----

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PathRequest {
    #[serde(default)]
    pub path: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ListDirRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default, deserialize_with = "de_u32")]
    pub depth: Option<u32>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct MoveRequest {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    /// `FILE_TYPE_FILE`, `FILE_TYPE_DIRECTORY`, `FILE_TYPE_SYMLINK` or `FILE_TYPE_UNSPECIFIED`.
    #[serde(rename = "type")]
    pub file_type: &'static str,
    pub path: String,
    /// int64: a string in proto3 JSON.
    pub size: String,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest` alike.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    /// envd 0.6.3's entry info in events (refused by the SDK for the envd version served here).
    #[serde(default, alias = "include_entry")]
    pub include_entry: bool,
    #[serde(default, alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest` alike.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct WatcherRequest {
    #[serde(default, rename = "watcherId", alias = "watcher_id")]
    pub watcher_id: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FilesystemEvent {
    /// The entry's path relative to the watched directory.
    pub name: String,
    /// `EVENT_TYPE_CREATE`, `_WRITE`, `_REMOVE`, `_RENAME` or `_CHMOD`.
    #[serde(rename = "type")]
    pub event_type: &'static str,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum WatchDirResponse {
    Start(Empty),
    Filesystem(FilesystemEvent),
    Keepalive(Empty),
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CreateWatcherResponse {
    #[serde(rename = "watcherId")]
    pub watcher_id: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GetWatcherEventsResponse {
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_proto3_json_shape() {
        let start = EventResponse {
            event: ProcessEvent::Start(StartEvent { pid: 7 }),
        };
        assert_eq!(
            serde_json::to_value(&start).unwrap(),
            serde_json::json!({"event": {"start": {"pid": 7}}})
        );
        let end = EventResponse {
            event: ProcessEvent::End(EndEvent {
                exit_code: 3,
                exited: true,
                status: "exit status 3".into(),
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            serde_json::json!({"event": {"end": {"exitCode": 3, "exited": true,
                "status": "exit status 3"}}})
        );
    }

    #[test]
    fn watch_messages_have_the_proto3_json_shape() {
        let event = WatchDirResponse::Filesystem(FilesystemEvent {
            name: "sub/a".into(),
            event_type: "EVENT_TYPE_WRITE",
        });
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            serde_json::json!({"filesystem": {"name": "sub/a", "type": "EVENT_TYPE_WRITE"}})
        );
        assert_eq!(
            serde_json::to_value(WatchDirResponse::Start(Empty {})).unwrap(),
            serde_json::json!({"start": {}})
        );
        let r: WatcherRequest = serde_json::from_str(r#"{"watcher_id": "w_1"}"#).unwrap();
        assert_eq!(r.watcher_id, "w_1");
        let r: WatchRequest = serde_json::from_str(r#"{"path": "/w", "recursive": true}"#).unwrap();
        assert!(r.recursive && !r.include_entry);
    }

    #[test]
    fn requests_take_numbers_as_numbers_or_strings() {
        let r: ConnectRequest = serde_json::from_str(r#"{"process": {"pid": "42"}}"#).unwrap();
        assert_eq!(r.process.unwrap().pid, Some(42));
        let r: StartRequest = serde_json::from_str(
            r#"{"process": {"cmd": "/bin/bash", "args": ["-c", "x"], "envs": {"A": "b"}},
                "pty": {"size": {"cols": 80, "rows": 24}}, "stdin": true}"#,
        )
        .unwrap();
        assert_eq!(r.process.unwrap().args, vec!["-c", "x"]);
        assert_eq!(r.pty.unwrap().size.unwrap().cols, Some(80));
        assert!(serde_json::from_str::<ConnectRequest>(r#"{"process": {"pid": "x"}}"#).is_err());
    }
}
