//! The audit trail's records: which requests are audited (every one that changes something, and
//! every exec, process start, file write, preview and port forward, whatever its method), and
//! the line each becomes: `{time, key, namespace, verb, resource, name, code, source}`. `key` is
//! the key's name (never the key), `source` where the request came in (`api`, `v1`, `dashboard`)
//! and from which address.
//!
//! Where lines are kept is the store's (`store/audit_log.rs`); this module never touches a file
//! and knows nothing of HTTP beyond a method and a path.

use chrono::{DateTime, SecondsFormat, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One audited request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct AuditRecord {
    /// When the answer was given (RFC 3339, UTC).
    pub time: String,
    /// The name of the key that made it (`admin` for the settings' and the generated key).
    pub key: String,
    /// The namespace it acted in.
    pub namespace: String,
    /// What it did: `create`, `replace`, `patch`, `delete`, `exec`, `write-file`,
    /// `start-process`, `create-preview`, `snapshot`, `fork`, …
    pub verb: String,
    /// The kind of object, as its plural (`sandboxes`, `snapshots`, …).
    pub resource: String,
    /// The object's name (empty for a create that let the server choose it).
    pub name: String,
    /// The HTTP status it was answered with.
    pub code: u16,
    /// `api` (the resource API), `v1`, or `dashboard` (its session), and the client's address.
    pub source: String,
}

/// What a request is, for the trail: `(verb, resource, name)`, or `None` when it is not audited
/// (reads).
pub fn describe(method: &str, path: &str) -> Option<(String, String, String)> {
    let mutating = !matches!(method, "GET" | "HEAD" | "OPTIONS");
    let (rest, v1) = if let Some(rest) = path.strip_prefix("/apis/agent-sandbox.io/v1/") {
        (rest, false)
    } else if let Some(rest) = path.strip_prefix("/v1/") {
        (rest, true)
    } else {
        return mutating.then(|| (method.to_lowercase(), path.to_string(), String::new()));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let plain = |m: &str| match m {
        "POST" => "create",
        "PUT" => "replace",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    };
    let (verb, resource, name): (&str, &str, &str) = match segments.as_slice() {
        [resource] => (plain(method), resource, ""),
        ["snapshots", "import"] => ("import", "snapshots", ""),
        [resource, name] => (plain(method), resource, name),
        [resource, name, sub, ..] => {
            let verb = match (*sub, method, v1) {
                ("exec", _, _) => "exec",
                ("files", "PUT", true) => "write-file",
                ("files", _, true) => "read-file",
                ("processes", "POST", _) if segments.len() == 3 => "start-process",
                ("processes", "DELETE", _) => "kill-process",
                ("processes", _, _) if segments.get(4) == Some(&"attach") => "attach",
                ("processes", _, _) if segments.get(4) == Some(&"stdin") => "write-stdin",
                ("processes", _, _) if segments.get(4) == Some(&"signal") => "signal",
                ("processes", _, _) if segments.get(4) == Some(&"resize") => "resize",
                ("previews", "POST", _) => "create-preview",
                ("previews", "DELETE", _) => "revoke-previews",
                ("portforward", _, _) => "port-forward",
                ("proxy", _, _) => "proxy",
                ("snapshots", "POST", true) => "snapshot",
                ("fork", _, true) => "fork",
                ("rollback", _, true) => "rollback",
                ("timeout", _, true) => "set-timeout",
                ("pause", _, _) => "pause",
                ("resume", _, _) => "resume",
                ("export", _, _) => "export",
                (other, _, _) => other,
            };
            (verb, resource, name)
        }
        _ => (plain(method), rest, ""),
    };
    if !mutating && !matches!(verb, "exec" | "attach" | "port-forward" | "export") {
        return None;
    }
    Some((verb.to_string(), resource.to_string(), name.to_string()))
}

impl AuditRecord {
    /// The line for an audited request.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        at: DateTime<Utc>,
        key: &str,
        namespace: &str,
        (verb, resource, name): (String, String, String),
        code: u16,
        source: String,
    ) -> AuditRecord {
        AuditRecord {
            time: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            key: key.to_string(),
            namespace: namespace.to_string(),
            verb,
            resource,
            name,
            code,
            source,
        }
    }

    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(method: &str, path: &str) -> Option<(String, String, String)> {
        describe(method, path)
    }

    fn t(verb: &str, resource: &str, name: &str) -> Option<(String, String, String)> {
        Some((verb.into(), resource.into(), name.into()))
    }

    #[test]
    fn writes_and_runs_are_audited_reads_are_not() {
        let api = "/apis/agent-sandbox.io/v1";
        assert_eq!(d("GET", &format!("{api}/sandboxes")), None);
        assert_eq!(d("GET", &format!("{api}/sandboxes/a")), None);
        assert_eq!(d("GET", "/v1/sandboxes/a/files"), None);
        assert_eq!(
            d("GET", &format!("{api}/sandboxes/a/processes/p/output")),
            None
        );
        assert_eq!(
            d("POST", &format!("{api}/sandboxes")),
            t("create", "sandboxes", "")
        );
        assert_eq!(
            d("DELETE", &format!("{api}/forks/f")),
            t("delete", "forks", "f")
        );
        assert_eq!(
            d("GET", &format!("{api}/sandboxes/a/exec")),
            t("exec", "sandboxes", "a")
        );
        assert_eq!(
            d("POST", "/v1/sandboxes/a/exec"),
            t("exec", "sandboxes", "a")
        );
        assert_eq!(
            d("POST", "/v1/sandboxes/a/exec/stream"),
            t("exec", "sandboxes", "a")
        );
        assert_eq!(
            d("PUT", "/v1/sandboxes/a/files"),
            t("write-file", "sandboxes", "a")
        );
        assert_eq!(
            d("POST", &format!("{api}/sandboxes/a/processes")),
            t("start-process", "sandboxes", "a")
        );
        assert_eq!(
            d("POST", &format!("{api}/sandboxes/a/previews")),
            t("create-preview", "sandboxes", "a")
        );
        assert_eq!(
            d("GET", &format!("{api}/sandboxes/a/portforward")),
            t("port-forward", "sandboxes", "a")
        );
        assert_eq!(
            d("POST", "/v1/snapshots/s/fork"),
            t("fork", "snapshots", "s")
        );
        assert_eq!(d("POST", "/ui/login"), t("post", "/ui/login", ""));
    }

    #[test]
    fn a_line_names_the_key_and_never_holds_more() {
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .unwrap()
            .to_utc();
        let r = AuditRecord::new(
            at,
            "ci",
            "default",
            t("exec", "sandboxes", "a").unwrap(),
            200,
            "v1 127.0.0.1".into(),
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_line()).unwrap();
        assert_eq!(v["time"], "2026-01-02T03:04:05.678Z");
        assert_eq!(v["key"], "ci");
        assert_eq!(v.as_object().unwrap().len(), 8);
    }
}
