//! The bytes a `/v1` client sees: the response objects (in the reference server's key order), its
//! timestamp format, Python-style quoting in messages, and the NDJSON lines of a streamed exec.
//! Clients parse these strictly (the SDK builds objects with `**json`, so an extra key breaks it),
//! which is why this module writes them by hand instead of deriving them from the resources.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dataplane::{self, FileInfo as DataPlaneFileInfo, FileType};

/// A command: a string run as `/bin/sh -c`, or an argv list.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

/// What to run. Field names are the `/v1` wire names.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Command,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

/// The result of a buffered exec (`/v1` ExecResponse).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ExecResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

// The schema of what `ndjson_line` writes, for the OpenAPI document.
/// One line of a streamed exec (`/v1` NDJSON events).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ExecEvent {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Exit {
        exit_code: i64,
        timed_out: bool,
        duration_ms: u64,
    },
}

impl From<dataplane::ExecResponse> for ExecResponse {
    fn from(r: dataplane::ExecResponse) -> ExecResponse {
        ExecResponse {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
            timed_out: r.timed_out,
            truncated: r.truncated,
            duration_ms: r.duration_ms,
        }
    }
}

/// A sandbox as `/v1` shows it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[schemars(rename = "SandboxInfo")]
pub struct SandboxInfo {
    /// `sb_` + 16 lowercase hex digits for API-created sandboxes.
    pub id: String,
    /// `running` or `stopped`.
    pub status: String,
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_limit: u64,
    pub network: bool,
    pub read_only_rootfs: bool,
    /// UTC, `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`.
    pub created_at: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`; null only for a sandbox without any deadline.
    pub expires_at: Option<String>,
    /// The snapshot the current workspace came from (fork or last rollback).
    pub source_snapshot_id: Option<String>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct SandboxList {
    /// Sorted by `created_at`.
    pub sandboxes: Vec<SandboxInfo>,
}

/// A snapshot as `/v1` shows it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[schemars(rename = "SnapshotInfo")]
pub struct SnapshotInfo {
    /// `snap_` + 16 lowercase hex digits for API-created snapshots.
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    pub image: String,
    pub size_bytes: u64,
    pub created_at: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct SnapshotList {
    /// Sorted by `created_at`.
    pub snapshots: Vec<SnapshotInfo>,
}

/// A file or directory entry as `/v1` shows it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[schemars(rename = "FileInfo")]
pub struct FileInfo {
    pub name: String,
    /// Absolute and normalized.
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub file_type: String,
    pub size: u64,
    pub modified_at: String,
}

impl From<DataPlaneFileInfo> for FileInfo {
    fn from(info: DataPlaneFileInfo) -> FileInfo {
        FileInfo {
            name: info.name,
            path: info.path,
            file_type: match info.file_type {
                FileType::File => "file",
                FileType::Directory => "directory",
                FileType::Symlink => "symlink",
                FileType::Other => "other",
            }
            .to_string(),
            size: info.size,
            modified_at: timestamp(info.modified_at),
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct FileList {
    /// The listed directory, normalized.
    pub path: String,
    /// Sorted by name (code-point order).
    pub entries: Vec<FileInfo>,
}

/// The reference's timestamp: UTC, microseconds, `Z`, and no fraction at all when the
/// microseconds are zero (`2026-11-29T21:14:05Z`).
pub fn timestamp(t: DateTime<Utc>) -> String {
    let micros = t.timestamp_subsec_micros();
    if micros == 0 {
        t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        format!("{}.{micros:06}Z", t.format("%Y-%m-%dT%H:%M:%S"))
    }
}

/// Drops what the wire cannot show, so that a value stored now and one shown later agree.
pub fn truncate_to_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    let nanos = t.timestamp_subsec_nanos();
    t - chrono::TimeDelta::nanoseconds(i64::from(nanos % 1000))
}

/// Python's `repr()` of a string, as the reference puts names into messages (`'A=B'`).
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a float (`4.0`, `0.5`), for limits quoted in messages.
pub fn py_float(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A number the way the reference's settings print it: integers without a fraction.
pub fn py_number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.0}")
    } else {
        py_float(v)
    }
}

/// One line of `/exec/stream`, exactly as Python's `json.dumps` writes it with its defaults
/// (`", "` and `": "` separators, every non-ASCII character escaped), plus the newline.
pub fn ndjson_line(event: &dataplane::ExecEvent) -> String {
    let mut out = String::with_capacity(64);
    match event {
        dataplane::ExecEvent::Stdout { data } | dataplane::ExecEvent::Stderr { data } => {
            let kind = if matches!(event, dataplane::ExecEvent::Stdout { .. }) {
                "stdout"
            } else {
                "stderr"
            };
            out.push_str("{\"type\": \"");
            out.push_str(kind);
            out.push_str("\", \"data\": ");
            push_ascii_json_string(&mut out, data);
            out.push('}');
        }
        dataplane::ExecEvent::Exit {
            exit_code,
            timed_out,
            duration_ms,
        } => {
            out.push_str(&format!(
                "{{\"type\": \"exit\", \"exit_code\": {exit_code}, \"timed_out\": {timed_out}, \
                 \"duration_ms\": {duration_ms}}}"
            ));
        }
    }
    out.push('\n');
    out
}

/// A JSON string with `ensure_ascii`: short escapes where Python has them, `\u00XX` for other
/// controls, `\uXXXX` (lowercase, surrogate pairs beyond the BMP) for everything past `~`.
fn push_ascii_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::ExecEvent;

    #[test]
    fn timestamps_drop_a_zero_fraction() {
        let t = DateTime::parse_from_rfc3339("2026-11-29T21:13:35.542302Z")
            .unwrap()
            .to_utc();
        assert_eq!(timestamp(t), "2026-11-29T21:13:35.542302Z");
        let t = DateTime::parse_from_rfc3339("2026-11-29T21:14:05Z")
            .unwrap()
            .to_utc();
        assert_eq!(timestamp(t), "2026-11-29T21:14:05Z");
        let t = DateTime::parse_from_rfc3339("2026-11-29T21:14:05.000000999Z")
            .unwrap()
            .to_utc();
        assert_eq!(timestamp(t), "2026-11-29T21:14:05Z");
        let t = DateTime::parse_from_rfc3339("2026-11-29T21:14:05.1234567Z")
            .unwrap()
            .to_utc();
        assert_eq!(timestamp(t), "2026-11-29T21:14:05.123456Z");
        assert_eq!(timestamp(truncate_to_micros(t)), timestamp(t));
        assert_eq!(truncate_to_micros(t).timestamp_subsec_nanos(), 123_456_000);
    }

    #[test]
    fn python_reprs() {
        assert_eq!(py_repr("A=B"), "'A=B'");
        assert_eq!(py_repr(""), "''");
        assert_eq!(py_repr("a\0b"), "'a\\x00b'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("python:3.12-slim"), "'python:3.12-slim'");
        assert_eq!(py_float(4.0), "4.0");
        assert_eq!(py_float(0.25), "0.25");
        assert_eq!(py_number(3600.0), "3600");
        assert_eq!(py_number(2.5), "2.5");
    }

    // Lines copied from the reference server's responses.
    #[test]
    fn ndjson_lines_match_the_reference() {
        let line = |e: ExecEvent| ndjson_line(&e);
        assert_eq!(
            line(ExecEvent::Stdout {
                data: "one\n".into()
            }),
            "{\"type\": \"stdout\", \"data\": \"one\\n\"}\n"
        );
        assert_eq!(
            line(ExecEvent::Stderr {
                data: "two\n".into()
            }),
            "{\"type\": \"stderr\", \"data\": \"two\\n\"}\n"
        );
        assert_eq!(
            line(ExecEvent::Exit {
                exit_code: 4,
                timed_out: false,
                duration_ms: 672
            }),
            "{\"type\": \"exit\", \"exit_code\": 4, \"timed_out\": false, \"duration_ms\": 672}\n"
        );
        assert_eq!(
            line(ExecEvent::Exit {
                exit_code: 137,
                timed_out: true,
                duration_ms: 1077
            }),
            "{\"type\": \"exit\", \"exit_code\": 137, \"timed_out\": true, \"duration_ms\": 1077}\n"
        );
        assert_eq!(
            line(ExecEvent::Stdout {
                data: "caf\u{e9} \u{fffd} ".into()
            }),
            r#"{"type": "stdout", "data": "caf\u00e9 \ufffd "}"#.to_string() + "\n"
        );
        assert_eq!(
            line(ExecEvent::Stdout {
                data: "\u{20ac} euro\n".into()
            }),
            r#"{"type": "stdout", "data": "\u20ac euro\n"}"#.to_string() + "\n"
        );
        assert_eq!(
            line(ExecEvent::Stdout {
                data: "a\u{1}b\tc\u{7f}d\u{2028}e/f\u{1f600}g\"h\\i\r\n".into()
            }),
            r#"{"type": "stdout", "data": "a\u0001b\tc\u007fd\u2028e/f\ud83d\ude00g\"h\\i\r\n"}"#
                .to_string()
                + "\n"
        );
        assert_eq!(
            line(ExecEvent::Exit {
                exit_code: -1,
                timed_out: false,
                duration_ms: 0
            }),
            "{\"type\": \"exit\", \"exit_code\": -1, \"timed_out\": false, \"duration_ms\": 0}\n"
        );
    }

    #[test]
    fn sandbox_json_keeps_the_reference_key_order() {
        let info = SandboxInfo {
            id: "sb_1f584efa7b40a08f".into(),
            status: "running".into(),
            image: "agent-sandbox-ref-test:latest".into(),
            cpus: 1.0,
            memory_mb: 512,
            pids_limit: 256,
            network: false,
            read_only_rootfs: true,
            created_at: "2026-11-29T21:13:35.542302Z".into(),
            expires_at: Some("2026-11-29T21:28:35.542302Z".into()),
            source_snapshot_id: None,
        };
        assert_eq!(
            serde_json::to_string(&info).unwrap(),
            r#"{"id":"sb_1f584efa7b40a08f","status":"running","image":"agent-sandbox-ref-test:latest","cpus":1.0,"memory_mb":512,"pids_limit":256,"network":false,"read_only_rootfs":true,"created_at":"2026-11-29T21:13:35.542302Z","expires_at":"2026-11-29T21:28:35.542302Z","source_snapshot_id":null}"#
        );
    }
}
