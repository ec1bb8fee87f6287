//! The `Secret` kind: a named value the server uses on a user's behalf (to sign webhook
//! deliveries, or to put in the request headers a sandbox sends to the hosts `spec.hosts` lists,
//! through the egress gateway). The value is write-only: given through the API (`value` beside
//! `spec` in a POST or PUT) and kept by the store outside `manifests/`, or, for a Secret declared
//! in a folder, read by the server from `spec.valueFrom`. It is never part of the document, so no
//! answer, status, event or log line can carry it. This module says what a spec means and which
//! specs are refused; using a value is `crate::secrets` and `crate::egress`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress::{parse_allow_list, Target};

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSpec {
    /// Where the server reads the value of a Secret declared in a folder. A Secret written
    /// through the API carries its value in the request instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ValueFrom>,
    /// The hosts a sandbox's requests may carry the value to: `host` or `*.suffix`, each with an
    /// optional `:port`, as in `egress.allow` (no addresses). The egress list must allow them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub hosts: Vec<String>,
    /// The request header the gateway writes the value into (`Authorization`, `x-api-key`).
    /// Needed with `hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub header: Option<String>,
    /// The header's value, with `{value}` where the value goes (`Bearer {value}`). Default:
    /// `{value}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub format: Option<String>,
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

/// A Secret spec the schema lets through but that cannot be used, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SecretSpecError {
    /// The field, as `spec.hosts[1]`.
    pub field: String,
    pub reason: String,
}

impl SecretSpecError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> SecretSpecError {
        SecretSpecError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// JSON pointer of the offending value.
    pub fn pointer(&self) -> String {
        let path = self
            .field
            .replace('[', ".")
            .replace(']', "")
            .replace('.', "/");
        format!("/{path}")
    }
}

/// What the value becomes when a request carries it: `header: format-with-value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injection {
    /// The hosts, parsed (names and suffixes, each with an optional port).
    pub hosts: Vec<super::AllowRule>,
    pub header: String,
    pub format: String,
}

impl SecretSpec {
    /// What a schema cannot say: hosts are names (or suffixes) with an optional port, `header`
    /// comes with `hosts` and is a header name, `format` holds `{value}` once and no line break.
    pub fn check(&self) -> Result<(), SecretSpecError> {
        self.injection().map(|_| ())
    }

    /// Where the value may be sent, when `hosts` says anywhere; `None` for a Secret only the
    /// server uses (webhook signatures).
    pub fn injection(&self) -> Result<Option<Injection>, SecretSpecError> {
        if self.hosts.is_empty() {
            return match (&self.header, &self.format) {
                (None, None) => Ok(None),
                (Some(_), _) => Err(SecretSpecError::new(
                    "spec.hosts",
                    "a Secret with a header names the hosts it may be sent to",
                )),
                (None, Some(_)) => Err(SecretSpecError::new(
                    "spec.hosts",
                    "a Secret with a format names the hosts and the header it is sent in",
                )),
            };
        }
        let mut hosts = Vec::with_capacity(self.hosts.len());
        for (index, entry) in self.hosts.iter().enumerate() {
            let field = format!("spec.hosts[{index}]");
            let rule = parse_allow_list(std::slice::from_ref(entry))
                .map_err(|e| SecretSpecError::new(&field, format!("{entry:?}: {}", e.reason)))?
                .remove(0);
            if matches!(rule.target, Target::Cidr(_)) {
                return Err(SecretSpecError::new(
                    field,
                    format!("{entry:?}: a Secret's host is a name or `*.suffix`, not an address"),
                ));
            }
            hosts.push(rule);
        }
        let header = self.header.clone().ok_or_else(|| {
            SecretSpecError::new(
                "spec.header",
                "a Secret with hosts needs the request header its value goes in (e.g. Authorization)",
            )
        })?;
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if header.is_empty() || !header.bytes().all(token) {
            return Err(SecretSpecError::new(
                "spec.header",
                format!("{header:?} is not an HTTP header name"),
            ));
        }
        let forbidden = ["host", "content-length", "transfer-encoding", "connection"];
        if forbidden.iter().any(|f| header.eq_ignore_ascii_case(f)) {
            return Err(SecretSpecError::new(
                "spec.header",
                format!("{header:?} frames the request; a Secret cannot go in it"),
            ));
        }
        let format = self.format.clone().unwrap_or_else(|| "{value}".into());
        if format.matches("{value}").count() != 1 {
            return Err(SecretSpecError::new(
                "spec.format",
                format!("{format:?} must hold `{{value}}` exactly once"),
            ));
        }
        if format.bytes().any(|b| b.is_ascii_control()) {
            return Err(SecretSpecError::new(
                "spec.format",
                "control characters (line breaks included) are not allowed",
            ));
        }
        Ok(Some(Injection {
            hosts,
            header,
            format,
        }))
    }
}

impl Injection {
    /// Whether a request to `host:port` may carry the value.
    pub fn applies_to(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|rule| rule.host_matches(host) && rule.port_matches(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hosts: &[&str], header: Option<&str>, format: Option<&str>) -> SecretSpec {
        SecretSpec {
            value_from: None,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            header: header.map(str::to_string),
            format: format.map(str::to_string),
        }
    }

    #[test]
    fn a_usable_secret_names_hosts_header_and_a_format_with_the_value() {
        assert_eq!(SecretSpec::default().injection(), Ok(None));
        let ok = spec(
            &["api.openai.com", "*.example.org:8443"],
            Some("Authorization"),
            Some("Bearer {value}"),
        )
        .injection()
        .unwrap()
        .unwrap();
        assert!(ok.applies_to("api.openai.com", 443));
        assert!(ok.applies_to("a.example.org", 8443));
        assert!(!ok.applies_to("a.example.org", 443));
        assert!(!ok.applies_to("example.org", 8443));
        assert!(!ok.applies_to("api.openai.com.evil.test", 443));
        let default = spec(&["a.example"], Some("x-api-key"), None);
        assert_eq!(default.injection().unwrap().unwrap().format, "{value}");

        for (bad, field) in [
            (spec(&["a.example"], None, None), "spec.header"),
            (spec(&[], Some("Authorization"), None), "spec.hosts"),
            (spec(&[], None, Some("{value}")), "spec.hosts"),
            (
                spec(&["a.example", "*.com"], Some("A"), None),
                "spec.hosts[1]",
            ),
            (spec(&["10.0.0.0/8"], Some("A"), None), "spec.hosts[0]"),
            (
                spec(&["a.example"], Some("Bad Header"), None),
                "spec.header",
            ),
            (spec(&["a.example"], Some("Host"), None), "spec.header"),
            (
                spec(&["a.example"], Some("A"), Some("Bearer")),
                "spec.format",
            ),
            (
                spec(&["a.example"], Some("A"), Some("{value}{value}")),
                "spec.format",
            ),
            (
                spec(&["a.example"], Some("A"), Some("{value}\r\nX: y")),
                "spec.format",
            ),
        ] {
            let error = bad.check().unwrap_err();
            assert_eq!(error.field, field, "{error}");
            assert!(error.to_string().starts_with(field), "{error}");
        }
        let error = spec(&["a.example", "*.com"], Some("A"), None)
            .check()
            .unwrap_err();
        assert_eq!(error.pointer(), "/spec/hosts/1");
    }
}
