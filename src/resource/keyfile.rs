//! The keys file (`AGENT_SANDBOX_KEYS_FILE`): a YAML list of scoped API keys, each
//! `{name, sha256, namespaces, role}`, parsed and checked here and written back here (YAML is
//! only ever touched in this module tree). It holds digests, never keys.
//!
//! This module neither reads nor writes files and knows nothing of requests: reading the file,
//! reloading it and deciding what a key may do is [`crate::authz`]'s.

use serde::{Deserialize, Serialize};

/// What a key may do in the namespaces it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Get, list and watch.
    View,
    /// Everything in its namespaces: exec, files, snapshots, forks, processes, previews.
    Edit,
    /// Everything, including what is not in any namespace (webhooks, metrics, the audit).
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::View => "view",
            Role::Edit => "edit",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "view" => Ok(Role::View),
            "edit" => Ok(Role::Edit),
            "admin" => Ok(Role::Admin),
            other => Err(format!("role {other:?} is not one of view, edit, admin")),
        }
    }
}

/// One scoped key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// How the key is named in the audit trail, in `keys list` and in `keys revoke`.
    pub name: String,
    /// Lowercase hex of the SHA-256 of the key.
    pub sha256: String,
    /// The namespaces the key reaches; `["*"]` for all.
    pub namespaces: Vec<String>,
    pub role: Role,
}

/// Why a keys file is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyFileError {
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("{message}")]
    Shape { message: String },
    #[error("entry {index} ({name:?}): {field}: {message}")]
    Field {
        index: usize,
        name: String,
        field: &'static str,
        message: String,
    },
}

/// Whether `name` may name a key or a namespace: 1 to 63 of `a-z`, `0-9`, `-`, starting and
/// ending with a letter or digit (a DNS label, as namespace names are).
pub fn valid_name(name: &str) -> bool {
    super::is_valid_namespace(name)
}

/// Parses and checks a keys file's text. An empty file is no keys.
pub fn parse(text: &str) -> Result<Vec<KeyEntry>, KeyFileError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| KeyFileError::Syntax {
            line: e.location().map(|l| l.line() as usize).unwrap_or(0),
            message: e.without_snippet().to_string(),
        })?;
    if value.is_null() {
        return Ok(Vec::new());
    }
    let serde_json::Value::Array(items) = value else {
        return Err(KeyFileError::Shape {
            message: "the keys file must be a YAML list of {name, sha256, namespaces, role}".into(),
        });
    };
    let mut entries: Vec<KeyEntry> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let index = i + 1;
        let name = item
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        let field = |field: &'static str, message: String| KeyFileError::Field {
            index,
            name: name.clone(),
            field,
            message,
        };
        let entry: KeyEntry =
            serde_json::from_value(item.clone()).map_err(|e| field("entry", e.to_string()))?;
        if !valid_name(&entry.name) {
            return Err(field(
                "name",
                "must be 1-63 lowercase letters, digits or '-'".into(),
            ));
        }
        if entry.sha256.len() != 64
            || !entry
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(field(
                "sha256",
                "must be the 64 lowercase hex digits of the key's SHA-256".into(),
            ));
        }
        if entry.namespaces.is_empty() {
            return Err(field(
                "namespaces",
                "must name at least one namespace, or \"*\"".into(),
            ));
        }
        if let Some(bad) = entry
            .namespaces
            .iter()
            .find(|ns| ns.as_str() != "*" && !valid_name(ns))
        {
            return Err(field(
                "namespaces",
                format!("{bad:?} is not a namespace name (or \"*\")"),
            ));
        }
        if entries.iter().any(|e| e.name == entry.name) {
            return Err(field("name", "another entry has the same name".into()));
        }
        if entries.iter().any(|e| e.sha256 == entry.sha256) {
            return Err(field("sha256", "another entry has the same key".into()));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The text of a keys file holding `entries`.
pub fn render(entries: &[KeyEntry]) -> String {
    let mut out = String::from(
        "# Scoped API keys of agent-sandbox: SHA-256 digests only, never keys.\n\
         # Managed with `agent-sandbox keys create|list|revoke`; edits are picked up live.\n",
    );
    if entries.is_empty() {
        out.push_str("[]\n");
        return out;
    }
    out.push_str(&serde_saphyr::to_string(&entries).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn parses_and_renders_round_trip() {
        let text = format!(
            "- name: ci\n  sha256: {DIGEST}\n  namespaces: [team-a]\n  role: edit\n\
             - name: ops\n  sha256: {}\n  namespaces: ['*']\n  role: admin\n",
            "a".repeat(64)
        );
        let entries = parse(&text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].role, Role::Edit);
        assert_eq!(entries[1].namespaces, vec!["*".to_string()]);
        assert_eq!(parse(&render(&entries)).unwrap(), entries);
        assert_eq!(parse(&render(&[])).unwrap(), vec![]);
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn bad_entries_are_named() {
        let bad = |text: &str| parse(text).unwrap_err().to_string();
        assert!(bad("name: x\n").contains("YAML list"));
        let e = bad(&format!(
            "- name: ci\n  sha256: {DIGEST}\n  namespaces: [a]\n  role: root\n"
        ));
        assert!(e.contains("entry 1 (\"ci\")"), "{e}");
        let e = bad("- name: ci\n  sha256: abc\n  namespaces: [a]\n  role: view\n");
        assert!(e.contains("sha256"), "{e}");
        let e = bad(&format!(
            "- name: ci\n  sha256: {DIGEST}\n  namespaces: []\n  role: view\n"
        ));
        assert!(e.contains("namespaces"), "{e}");
        let e = bad(&format!(
            "- name: ci\n  sha256: {DIGEST}\n  namespaces: [a]\n  role: view\n\
             - name: ci\n  sha256: {}\n  namespaces: [a]\n  role: view\n",
            "b".repeat(64)
        ));
        assert!(e.contains("entry 2") && e.contains("same name"), "{e}");
        let e = bad("- [\n");
        assert!(e.starts_with("line "), "{e}");
    }
}
