//! The `Secret` kind: a named value the server uses on a user's behalf (to sign webhook
//! deliveries). The value is write-only: given through the API (`value` beside `spec` in a POST or
//! PUT) and kept by the store outside `manifests/`, or, for a Secret declared in a folder, read by
//! the server from `spec.valueFrom`. It is never part of the document, so no answer, status,
//! event or log line can carry it. More fields (where a value may be sent) join `spec` later.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSpec {
    /// Where the server reads the value of a Secret declared in a folder. A Secret written
    /// through the API carries its value in the request instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ValueFrom>,
}

/// One source of a value: an environment variable of the server, or a file it can read.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ValueFrom {
    /// The name of an environment variable of the server.
    Env(String),
    /// An absolute path of a file the server reads (its content, trailing newline removed).
    File(PathBuf),
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretStatus {
    /// Whether the server has a value for it (never the value).
    #[serde(default)]
    pub has_value: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
