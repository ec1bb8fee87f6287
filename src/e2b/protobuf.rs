//! The binary protobuf encoding of envd's messages, for clients that send `application/proto`
//! or `application/connect+proto` instead of JSON. Each message is described once by a table of
//! its fields (number, proto3 JSON name, type), written from envd's service definitions; a
//! message is translated between its wire bytes and its proto3 JSON value, so that the calls
//! themselves only ever see the JSON form ([`super::messages`]). Unknown fields are skipped, as
//! protobuf requires; malformed input is refused, never half-read.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value};

/// A field's type.
#[derive(Clone, Copy)]
pub enum Ty {
    Str,
    Bytes,
    U32,
    /// `sint32` (zigzag).
    S32,
    /// `int64`, a decimal string in JSON.
    I64,
    Bool,
    Enum(&'static [(i64, &'static str)]),
    Msg(&'static Schema),
    /// `map<string, string>`.
    StrMap,
    Timestamp,
}

/// One field: number, proto3 JSON name, type, repeated.
pub type Field = (u32, &'static str, Ty, bool);
pub type Schema = [Field];

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("the protobuf message is malformed: {0}")]
pub struct ProtoError(&'static str);

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtoError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf
            .get(*pos)
            .ok_or(ProtoError("a varint runs past the end"))?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtoError("a varint is longer than 10 bytes"))
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], ProtoError> {
    let end = pos
        .checked_add(len)
        .filter(|e| *e <= buf.len())
        .ok_or(ProtoError("a field runs past the end"))?;
    let out = &buf[*pos..end];
    *pos = end;
    Ok(out)
}

/// The JSON value of a message's bytes.
pub fn decode(schema: &Schema, buf: &[u8]) -> Result<Value, ProtoError> {
    decode_at(schema, buf, 0)
}

fn decode_at(schema: &Schema, buf: &[u8], depth: usize) -> Result<Value, ProtoError> {
    if depth > 16 {
        return Err(ProtoError("messages nest too deep"));
    }
    let mut out = Map::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (number, wire) = ((key >> 3) as u32, key & 7);
        let raw: Raw = match wire {
            0 => Raw::Varint(varint(buf, &mut pos)?),
            1 => {
                take(buf, &mut pos, 8)?;
                Raw::Fixed
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?)
                    .map_err(|_| ProtoError("a length does not fit"))?;
                Raw::Len(take(buf, &mut pos, len)?)
            }
            5 => {
                take(buf, &mut pos, 4)?;
                Raw::Fixed
            }
            _ => return Err(ProtoError("an unknown wire type")),
        };
        let Some((_, name, ty, repeated)) = schema.iter().find(|f| f.0 == number) else {
            continue;
        };
        match ty {
            Ty::StrMap => {
                let Raw::Len(entry) = raw else {
                    return Err(ProtoError("a map entry is not length-delimited"));
                };
                let pair = decode_at(
                    &[(1, "k", Ty::Str, false), (2, "v", Ty::Str, false)],
                    entry,
                    depth + 1,
                )?;
                let map = out
                    .entry(name.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let (Some(m), Some(k)) = (map.as_object_mut(), pair["k"].as_str()) {
                    m.insert(
                        k.to_string(),
                        pair.get("v").cloned().unwrap_or(Value::from("")),
                    );
                }
            }
            _ if *repeated => {
                let values = scalar_or_packed(*ty, raw, depth)?;
                let list = out
                    .entry(name.to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(a) = list.as_array_mut() {
                    a.extend(values);
                }
            }
            _ => {
                out.insert(name.to_string(), value(*ty, raw, depth)?);
            }
        }
    }
    Ok(Value::Object(out))
}

enum Raw<'a> {
    Varint(u64),
    /// A 32- or 64-bit field: no field of envd's has one, so only skipped.
    Fixed,
    Len(&'a [u8]),
}

fn scalar_or_packed(ty: Ty, raw: Raw, depth: usize) -> Result<Vec<Value>, ProtoError> {
    match (ty, &raw) {
        (Ty::U32 | Ty::S32 | Ty::I64 | Ty::Bool | Ty::Enum(_), Raw::Len(bytes)) => {
            let mut pos = 0;
            let mut out = Vec::new();
            while pos < bytes.len() {
                out.push(value(ty, Raw::Varint(varint(bytes, &mut pos)?), depth)?);
            }
            Ok(out)
        }
        _ => Ok(vec![value(ty, raw, depth)?]),
    }
}

fn value(ty: Ty, raw: Raw, depth: usize) -> Result<Value, ProtoError> {
    let wrong = ProtoError("a field has the wrong wire type");
    Ok(match (ty, raw) {
        (Ty::Str, Raw::Len(b)) => {
            Value::from(std::str::from_utf8(b).map_err(|_| ProtoError("a string is not UTF-8"))?)
        }
        (Ty::Bytes, Raw::Len(b)) => Value::from(STANDARD.encode(b)),
        (Ty::U32, Raw::Varint(v)) => Value::from(v as u32),
        (Ty::S32, Raw::Varint(v)) => Value::from(((v >> 1) as i64) ^ -((v & 1) as i64)),
        (Ty::I64, Raw::Varint(v)) => Value::from((v as i64).to_string()),
        (Ty::Bool, Raw::Varint(v)) => Value::from(v != 0),
        (Ty::Enum(names), Raw::Varint(v)) => names
            .iter()
            .find(|(n, _)| *n == v as i64)
            .map_or(Value::from(v as i64), |(_, name)| Value::from(*name)),
        (Ty::Msg(schema), Raw::Len(b)) => decode_at(schema, b, depth + 1)?,
        (Ty::Timestamp, Raw::Len(b)) => {
            let t = decode_at(
                &[(1, "s", Ty::I64, false), (2, "n", Ty::U32, false)],
                b,
                depth + 1,
            )?;
            let secs = t["s"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
            let nanos = t["n"].as_u64().unwrap_or(0) as u32;
            let at = DateTime::<Utc>::from_timestamp(secs, nanos).unwrap_or_default();
            Value::from(at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        }
        _ => return Err(wrong),
    })
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The bytes of a message from its JSON value (fields the schema does not know are dropped).
pub fn encode(schema: &Schema, value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(object) = value.as_object() else {
        return out;
    };
    for (number, name, ty, repeated) in schema {
        let Some(v) = object.get(*name) else { continue };
        match (ty, v) {
            (Ty::StrMap, Value::Object(m)) => {
                for (k, v) in m {
                    let mut entry = Vec::new();
                    put_len(&mut entry, 1, k.as_bytes());
                    put_len(&mut entry, 2, v.as_str().unwrap_or("").as_bytes());
                    put_len(&mut out, *number, &entry);
                }
            }
            (_, Value::Array(items)) if *repeated => {
                for item in items {
                    put_value(&mut out, *number, *ty, item);
                }
            }
            _ => put_value(&mut out, *number, *ty, v),
        }
    }
    out
}

fn put_value(out: &mut Vec<u8>, number: u32, ty: Ty, v: &Value) {
    let varint_field = |out: &mut Vec<u8>, n: u64| {
        put_varint(out, u64::from(number) << 3);
        put_varint(out, n);
    };
    match ty {
        Ty::Str => put_len(out, number, v.as_str().unwrap_or("").as_bytes()),
        Ty::Bytes => {
            let bytes = STANDARD
                .decode(v.as_str().unwrap_or(""))
                .unwrap_or_default();
            put_len(out, number, &bytes);
        }
        Ty::U32 => varint_field(out, v.as_u64().unwrap_or(0)),
        Ty::S32 => {
            let n = v.as_i64().unwrap_or(0);
            varint_field(out, ((n << 1) ^ (n >> 63)) as u64);
        }
        Ty::I64 => {
            let n = v
                .as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or(0);
            varint_field(out, n as u64);
        }
        Ty::Bool => varint_field(out, u64::from(v.as_bool().unwrap_or(false))),
        Ty::Enum(names) => {
            let n = match v {
                Value::String(s) => names
                    .iter()
                    .find(|(_, name)| name == s)
                    .map_or(0, |(n, _)| *n),
                other => other.as_i64().unwrap_or(0),
            };
            varint_field(out, n as u64);
        }
        Ty::Msg(schema) => put_len(out, number, &encode(schema, v)),
        Ty::StrMap => {}
        Ty::Timestamp => {
            let at = v
                .as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default();
            let mut t = Vec::new();
            put_varint(&mut t, 1 << 3);
            put_varint(&mut t, at.timestamp() as u64);
            if at.timestamp_subsec_nanos() > 0 {
                put_varint(&mut t, 2 << 3);
                put_varint(&mut t, u64::from(at.timestamp_subsec_nanos()));
            }
            put_len(out, number, &t);
        }
    }
}

// ----- envd's messages -----

pub const EMPTY: &Schema = &[];
pub const SIZE: &Schema = &[(1, "cols", Ty::U32, false), (2, "rows", Ty::U32, false)];
pub const PTY: &Schema = &[(1, "size", Ty::Msg(SIZE), false)];
pub const PROCESS_CONFIG: &Schema = &[
    (1, "cmd", Ty::Str, false),
    (2, "args", Ty::Str, true),
    (3, "envs", Ty::StrMap, false),
    (4, "cwd", Ty::Str, false),
];
pub const SELECTOR: &Schema = &[(1, "pid", Ty::U32, false), (2, "tag", Ty::Str, false)];
pub const START_REQUEST: &Schema = &[
    (1, "process", Ty::Msg(PROCESS_CONFIG), false),
    (2, "pty", Ty::Msg(PTY), false),
    (3, "tag", Ty::Str, false),
    (4, "stdin", Ty::Bool, false),
];
pub const SELECTOR_REQUEST: &Schema = &[(1, "process", Ty::Msg(SELECTOR), false)];
const INPUT: &Schema = &[(1, "stdin", Ty::Bytes, false), (2, "pty", Ty::Bytes, false)];
pub const SEND_INPUT_REQUEST: &Schema = &[
    (1, "process", Ty::Msg(SELECTOR), false),
    (2, "input", Ty::Msg(INPUT), false),
];
const SIGNALS: &[(i64, &str)] = &[
    (0, "SIGNAL_UNSPECIFIED"),
    (9, "SIGNAL_SIGKILL"),
    (15, "SIGNAL_SIGTERM"),
];
pub const SEND_SIGNAL_REQUEST: &Schema = &[
    (1, "process", Ty::Msg(SELECTOR), false),
    (2, "signal", Ty::Enum(SIGNALS), false),
];
pub const UPDATE_REQUEST: &Schema = &[
    (1, "process", Ty::Msg(SELECTOR), false),
    (2, "pty", Ty::Msg(PTY), false),
];
const START_EVENT: &Schema = &[(1, "pid", Ty::U32, false)];
const DATA_EVENT: &Schema = &[
    (1, "stdout", Ty::Bytes, false),
    (2, "stderr", Ty::Bytes, false),
    (3, "pty", Ty::Bytes, false),
];
const END_EVENT: &Schema = &[
    (1, "exitCode", Ty::S32, false),
    (2, "exited", Ty::Bool, false),
    (3, "status", Ty::Str, false),
    (4, "error", Ty::Str, false),
];
const PROCESS_EVENT: &Schema = &[
    (1, "start", Ty::Msg(START_EVENT), false),
    (2, "data", Ty::Msg(DATA_EVENT), false),
    (3, "end", Ty::Msg(END_EVENT), false),
    (4, "keepalive", Ty::Msg(EMPTY), false),
];
pub const EVENT_RESPONSE: &Schema = &[(1, "event", Ty::Msg(PROCESS_EVENT), false)];
const PROCESS_INFO: &Schema = &[
    (1, "config", Ty::Msg(PROCESS_CONFIG), false),
    (2, "pid", Ty::U32, false),
    (3, "tag", Ty::Str, false),
];
pub const LIST_RESPONSE: &Schema = &[(1, "processes", Ty::Msg(PROCESS_INFO), true)];

pub const PATH_REQUEST: &Schema = &[(1, "path", Ty::Str, false)];
pub const LIST_DIR_REQUEST: &Schema = &[(1, "path", Ty::Str, false), (2, "depth", Ty::U32, false)];
pub const MOVE_REQUEST: &Schema = &[
    (1, "source", Ty::Str, false),
    (2, "destination", Ty::Str, false),
];
const FILE_TYPES: &[(i64, &str)] = &[
    (0, "FILE_TYPE_UNSPECIFIED"),
    (1, "FILE_TYPE_FILE"),
    (2, "FILE_TYPE_DIRECTORY"),
    (3, "FILE_TYPE_SYMLINK"),
];
const ENTRY_INFO: &Schema = &[
    (1, "name", Ty::Str, false),
    (2, "type", Ty::Enum(FILE_TYPES), false),
    (3, "path", Ty::Str, false),
    (4, "size", Ty::I64, false),
    (5, "mode", Ty::U32, false),
    (6, "permissions", Ty::Str, false),
    (7, "owner", Ty::Str, false),
    (8, "group", Ty::Str, false),
    (9, "modifiedTime", Ty::Timestamp, false),
    (10, "symlinkTarget", Ty::Str, false),
];
pub const ENTRY_RESPONSE: &Schema = &[(1, "entry", Ty::Msg(ENTRY_INFO), false)];
pub const LIST_DIR_RESPONSE: &Schema = &[(1, "entries", Ty::Msg(ENTRY_INFO), true)];
/// `WatchDirRequest` and `CreateWatcherRequest` alike.
pub const WATCH_REQUEST: &Schema = &[
    (1, "path", Ty::Str, false),
    (2, "recursive", Ty::Bool, false),
    (3, "includeEntry", Ty::Bool, false),
    (4, "allowNetworkMounts", Ty::Bool, false),
];
const EVENT_TYPES: &[(i64, &str)] = &[
    (0, "EVENT_TYPE_UNSPECIFIED"),
    (1, "EVENT_TYPE_CREATE"),
    (2, "EVENT_TYPE_WRITE"),
    (3, "EVENT_TYPE_REMOVE"),
    (4, "EVENT_TYPE_RENAME"),
    (5, "EVENT_TYPE_CHMOD"),
];
const FILESYSTEM_EVENT: &Schema = &[
    (1, "name", Ty::Str, false),
    (2, "type", Ty::Enum(EVENT_TYPES), false),
];
/// A `oneof event` of three messages, the two markers empty.
pub const WATCH_DIR_RESPONSE: &Schema = &[
    (1, "start", Ty::Msg(EMPTY), false),
    (2, "filesystem", Ty::Msg(FILESYSTEM_EVENT), false),
    (3, "keepalive", Ty::Msg(EMPTY), false),
];
/// `CreateWatcherResponse`, `GetWatcherEventsRequest` and `RemoveWatcherRequest` alike.
pub const WATCHER_ID: &Schema = &[(1, "watcherId", Ty::Str, false)];
pub const WATCHER_EVENTS_RESPONSE: &Schema = &[(1, "events", Ty::Msg(FILESYSTEM_EVENT), true)];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_round_trip_through_the_wire_form() {
        let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
            "envs": {"A": "1", "B": "2"}, "cwd": "/w"}, "pty": {"size": {"cols": 80, "rows": 24}},
            "stdin": true});
        let bytes = encode(START_REQUEST, &start);
        assert_eq!(decode(START_REQUEST, &bytes).unwrap(), start);
        let end = json!({"event": {"end": {"exitCode": -1, "exited": false, "status": "signal: killed"}}});
        assert_eq!(
            decode(EVENT_RESPONSE, &encode(EVENT_RESPONSE, &end)).unwrap(),
            end
        );
        let entry = json!({"entry": {"name": "a", "type": "FILE_TYPE_DIRECTORY", "path": "/w/a",
            "size": "4096", "mode": 493, "permissions": "drwxr-xr-x", "owner": "u", "group": "g",
            "modifiedTime": "2023-11-14T22:13:20Z"}});
        assert_eq!(
            decode(ENTRY_RESPONSE, &encode(ENTRY_RESPONSE, &entry)).unwrap(),
            entry
        );
    }

    #[test]
    fn watch_messages_have_envd_wire_bytes() {
        // WatchDirResponse{start: {}}: field 1, length 0.
        assert_eq!(
            encode(WATCH_DIR_RESPONSE, &json!({"start": {}})),
            [0x0a, 0x00]
        );
        // {filesystem: {name: "a", type: EVENT_TYPE_REMOVE}}
        assert_eq!(
            encode(
                WATCH_DIR_RESPONSE,
                &json!({"filesystem": {"name": "a", "type": "EVENT_TYPE_REMOVE"}})
            ),
            [0x12, 0x05, 0x0a, 0x01, b'a', 0x10, 0x03]
        );
        assert_eq!(
            encode(WATCH_DIR_RESPONSE, &json!({"keepalive": {}})),
            [0x1a, 0x00]
        );
        let events = json!({"events": [{"name": "x", "type": "EVENT_TYPE_CREATE"},
            {"name": "y/z", "type": "EVENT_TYPE_CHMOD"}]});
        assert_eq!(
            decode(
                WATCHER_EVENTS_RESPONSE,
                &encode(WATCHER_EVENTS_RESPONSE, &events)
            )
            .unwrap(),
            events
        );
        // CreateWatcherRequest{path: "/w", recursive: true}
        assert_eq!(
            decode(WATCH_REQUEST, &[0x0a, 0x02, b'/', b'w', 0x10, 0x01]).unwrap(),
            json!({"path": "/w", "recursive": true})
        );
        assert_eq!(
            decode(
                WATCHER_ID,
                &encode(WATCHER_ID, &json!({"watcherId": "w_1"}))
            )
            .unwrap(),
            json!({"watcherId": "w_1"})
        );
    }

    #[test]
    fn known_bytes_decode_and_bad_ones_are_refused() {
        // ConnectRequest{process: {pid: 300}}, with an unknown field 7 (varint 1) skipped.
        let bytes = [0x0a, 0x03, 0x08, 0xac, 0x02, 0x38, 0x01];
        assert_eq!(
            decode(SELECTOR_REQUEST, &bytes).unwrap(),
            json!({"process": {"pid": 300}})
        );
        assert!(decode(SELECTOR_REQUEST, &[0x0a, 0x05, 0x08]).is_err());
        assert!(decode(PATH_REQUEST, &[0x0a, 0x01, 0xff]).is_err());
        assert!(decode(PATH_REQUEST, &[0x0b]).is_err());
    }
}
