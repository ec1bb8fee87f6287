//! Reading and writing documents. The only place in the crate that parses or emits YAML.
//!
//! A manifest file may hold several `---`-separated documents. Each is parsed on its own so that one
//! bad document gets its own error (file, line, field) without hiding its neighbours. Parsing is
//! bounded: file size, nesting depth, node and alias budgets (tighter than serde-saphyr's defaults) all stop a
//! hostile file in bounded time and memory.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::schema::{self, FieldError};
use super::{AnyResource, Kind};

/// Largest manifest file or request body we parse, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Why a document was refused. `Display` gives `file:line: field: message`, omitting what is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentError {
    pub file: Option<PathBuf>,
    /// 1-based line in the file (or body).
    pub line: Option<usize>,
    /// The offending field, dotted (`spec.cpus`), when one is to blame.
    pub field: Option<String>,
    pub message: String,
    /// Kind and name of the document, when they could be read.
    pub identity: Option<(Kind, String)>,
}

impl DocumentError {
    fn new(message: impl Into<String>) -> Self {
        DocumentError {
            file: None,
            line: None,
            field: None,
            message: message.into(),
            identity: None,
        }
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            write!(f, ": ")?;
        } else if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for DocumentError {}

/// A document that parsed and validated, with the line it starts on.
#[derive(Clone, Debug)]
pub struct ParsedDocument {
    pub resource: AnyResource,
    pub line: usize,
}

/// Everything read from one file: the good documents and one error per bad one.
#[derive(Clone, Debug, Default)]
pub struct ParsedFile {
    pub documents: Vec<ParsedDocument>,
    pub errors: Vec<DocumentError>,
}

/// Parses every document of a manifest file. Errors carry `file` and absolute line numbers.
pub fn parse_file(bytes: &[u8], file: &Path) -> ParsedFile {
    let mut out = ParsedFile::default();
    let with_file = |mut e: DocumentError| {
        e.file = Some(file.to_path_buf());
        e
    };
    if bytes.len() > MAX_DOCUMENT_BYTES {
        out.errors.push(with_file(DocumentError::new(format!(
            "file is {} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            bytes.len()
        ))));
        return out;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let line = line_of_offset(bytes, e.valid_up_to());
            let mut err = DocumentError::new("invalid UTF-8");
            err.line = Some(line);
            out.errors.push(with_file(err));
            return out;
        }
    };
    for (first_line, body) in split_documents(text) {
        match parse_document_text(&body, None) {
            Ok(None) => {}
            Ok(Some(resource)) => out.documents.push(ParsedDocument {
                resource,
                line: first_line,
            }),
            Err(mut e) => {
                e.line = Some(first_line + e.line.unwrap_or(1) - 1);
                out.errors.push(with_file(e));
            }
        }
    }
    out
}

/// Parses a request body: JSON when it looks like JSON, YAML otherwise. Exactly one document.
pub fn parse_body(bytes: &[u8], expected: Kind) -> Result<AnyResource, DocumentError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::new(format!(
            "body is {} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let mut err = DocumentError::new("body is not valid UTF-8");
        err.line = Some(line_of_offset(bytes, e.valid_up_to()));
        err
    })?;
    let trimmed = text.trim_start();
    let resource = if trimmed.starts_with('{') {
        let value = parse_json(text)?;
        Some(value_to_resource(value, Some(expected), None)?)
    } else {
        let docs = split_documents(text);
        if docs.iter().filter(|(_, d)| !is_blank(d)).count() > 1 {
            return Err(DocumentError::new("the body holds more than one document"));
        }
        match docs.into_iter().find(|(_, d)| !is_blank(d)) {
            Some((first_line, body)) => {
                parse_document_text(&body, Some(expected)).map_err(|mut e| {
                    e.line = Some(first_line + e.line.unwrap_or(1) - 1);
                    e
                })?
            }
            None => None,
        }
    };
    resource.ok_or_else(|| DocumentError::new("the body is empty"))
}

/// The longest `value` a Secret may have.
pub const MAX_SECRET_VALUE_BYTES: usize = 64 * 1024;

/// Parses the body of a `Secret` written through the API: the document, and the write-only
/// `value` given beside its `spec`, taken out before the document is validated so that it never
/// becomes part of the resource.
pub fn parse_secret_body(bytes: &[u8]) -> Result<(AnyResource, Option<String>), DocumentError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::new(format!(
            "body is {} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let mut err = DocumentError::new("body is not valid UTF-8");
        err.line = Some(line_of_offset(bytes, e.valid_up_to()));
        err
    })?;
    let mut value: Value = if text.trim_start().starts_with('{') {
        parse_json(text)?
    } else {
        serde_saphyr::from_str_with_options(text, parse_options()).map_err(|e| {
            let mut err = DocumentError::new(e.without_snippet().to_string());
            err.line = e.location().map(|l| l.line() as usize).filter(|l| *l > 0);
            err
        })?
    };
    let field_error = |message: &str| {
        let mut err = DocumentError::new(message);
        err.field = Some("value".into());
        err
    };
    let secret = match value.as_object_mut().and_then(|o| o.remove("value")) {
        None => None,
        Some(Value::String(s)) if s.is_empty() => {
            return Err(field_error("value must not be empty"))
        }
        Some(Value::String(s)) if s.len() > MAX_SECRET_VALUE_BYTES => {
            return Err(field_error(&format!(
                "value is {} bytes; the limit is {MAX_SECRET_VALUE_BYTES}",
                s.len()
            )))
        }
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(field_error("value must be a string")),
    };
    let resource = value_to_resource(value, Some(Kind::Secret), None)?;
    Ok((resource, secret))
}

/// Parses JSON with serde_json's own recursion limit, reporting the line of a syntax error.
pub fn parse_json(text: &str) -> Result<Value, DocumentError> {
    serde_json::from_str(text).map_err(|e| {
        let mut err = DocumentError::new(format!("invalid JSON: {e}"));
        err.line = Some(e.line());
        err
    })
}

/// Serializes any value as YAML.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, DocumentError> {
    serde_saphyr::to_string(value)
        .map_err(|e| DocumentError::new(format!("cannot write YAML: {e}")))
}

/// Serializes several resources as one multi-document YAML stream.
pub fn to_yaml_stream<T: Serialize>(values: &[T]) -> Result<String, DocumentError> {
    let mut out = String::new();
    for value in values {
        out.push_str("---\n");
        out.push_str(&to_yaml(value)?);
    }
    Ok(out)
}

/// Parses one document's text (YAML or JSON). `Ok(None)` for an empty document.
/// Largest number of YAML nodes (after alias expansion) and aliases in one document. A real
/// manifest has hundreds; the library's defaults (250,000 nodes) let an alias bomb cost seconds
/// of CPU on every rescan of a watched folder.
const MAX_NODES: usize = 20_000;
const MAX_ALIASES: usize = 1_000;

fn parse_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = MAX_NODES;
    budget.max_aliases = MAX_ALIASES;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // YAML 1.2: only true/false are booleans. YAML 1.1's yes/no/on/off/y/n would turn a label or
    // a name spelled `n` into `false` (the "Norway problem"), against what YAML 1.2 emitters mean.
    options.strict_booleans = true;
    options
}

fn parse_document_text(
    text: &str,
    expected: Option<Kind>,
) -> Result<Option<AnyResource>, DocumentError> {
    if is_blank(text) {
        return Ok(None);
    }
    let value: Value = serde_saphyr::from_str_with_options(text, parse_options()).map_err(|e| {
        let mut err = DocumentError::new(e.without_snippet().to_string());
        err.line = e.location().map(|l| l.line() as usize).filter(|l| *l > 0);
        err
    })?;
    if value.is_null() {
        return Ok(None);
    }
    value_to_resource(value, expected, Some(text)).map(Some)
}

/// Validates a parsed value against its kind's schema and converts it. `text` (the document's own
/// source) lets errors name the line of the offending field.
pub fn value_to_resource(
    value: Value,
    expected: Option<Kind>,
    text: Option<&str>,
) -> Result<AnyResource, DocumentError> {
    let identity = identity_of(&value);
    let fail = |message: String, field: Option<String>, pointer: &str| {
        let mut err = DocumentError::new(message);
        err.field = field;
        err.identity = identity.clone();
        err.line = text.and_then(|t| line_of_pointer(t, pointer));
        err
    };
    let Some(object) = value.as_object() else {
        return Err(fail("a document must be a mapping".into(), None, ""));
    };
    let kind_text = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = match kind_text.parse::<Kind>() {
        Ok(kind) if kind.as_str() == kind_text => kind,
        _ => {
            let message = match expected {
                Some(k) => format!("kind must be {k:?}, found {kind_text:?}"),
                None => format!("kind must be Sandbox, Snapshot, Fork, SandboxPool, Secret, Webhook, SandboxTemplate or ResourceQuota, found {kind_text:?}"),
            };
            return Err(fail(message, Some("kind".into()), "/kind"));
        }
    };
    if let Some(expected) = expected {
        if expected != kind {
            return Err(fail(
                format!("kind must be {expected}, found {kind}"),
                Some("kind".into()),
                "/kind",
            ));
        }
    }
    if let Err(errors) = schema::validate(kind, &value) {
        let first: &FieldError = &errors[0];
        let mut message = first.message.clone();
        if errors.len() > 1 {
            message.push_str(&format!(" (and {} more)", errors.len() - 1));
        }
        return Err(fail(message, Some(first.field()), &first.pointer));
    }
    // JSON Schema counts `64.0` as an integer, and so does the schema check above; the typed
    // fields must agree.
    let value = integral_floats_as_integers(value);
    let converted = match kind {
        Kind::Sandbox => serde_json::from_value(value).map(AnyResource::Sandbox),
        Kind::Snapshot => serde_json::from_value(value).map(AnyResource::Snapshot),
        Kind::Fork => serde_json::from_value(value).map(AnyResource::Fork),
        Kind::SandboxPool => serde_json::from_value(value).map(AnyResource::SandboxPool),
        Kind::Secret => serde_json::from_value(value).map(AnyResource::Secret),
        Kind::Webhook => serde_json::from_value(value).map(AnyResource::Webhook),
        Kind::SandboxTemplate => serde_json::from_value(value).map(AnyResource::SandboxTemplate),
        Kind::ResourceQuota => serde_json::from_value(value).map(AnyResource::ResourceQuota),
    };
    let resource = converted.map_err(|e| fail(e.to_string(), None, ""))?;
    let checked = match &resource {
        AnyResource::Sandbox(sandbox) => sandbox
            .spec
            .check()
            .map_err(|e| (e.to_string(), e.pointer())),
        AnyResource::SandboxTemplate(template) => template
            .spec
            .check()
            .map_err(|e| (e.to_string(), e.pointer())),
        AnyResource::Secret(secret) => secret
            .spec
            .check()
            .map_err(|e| (e.to_string(), e.pointer())),
        _ => Ok(()),
    };
    if let Err((message, pointer)) = checked {
        let field = pointer.trim_start_matches('/').replace('/', ".");
        return Err(fail(message, Some(field), &pointer));
    }
    Ok(resource)
}

/// Every number with no fractional part written as an integer (`64.0` becomes `64`), so that
/// integer fields take what the schema allows; floating-point fields read both alike.
fn integral_floats_as_integers(value: Value) -> Value {
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => match n.as_f64() {
            // Only values the schema check let through get here, so the casts do not clip.
            Some(f) if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) => {
                Value::from(f as u64)
            }
            Some(f) if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..0.0).contains(&f) => {
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => {
            Value::Array(items.into_iter().map(integral_floats_as_integers).collect())
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, integral_floats_as_integers(v)))
                .collect(),
        ),
        other => other,
    }
}

fn identity_of(value: &Value) -> Option<(Kind, String)> {
    let kind = value.get("kind")?.as_str()?.parse().ok()?;
    let name = value.get("metadata")?.get("name")?.as_str()?.to_string();
    Some((kind, name))
}

fn is_blank(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// Splits a YAML stream at `---` / `...` markers, returning each document with its first line
/// (1-based). Marker lines are blanked, not removed, so line numbers inside stay exact.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let is_marker = |m: &str| {
            line.strip_prefix(m)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
        };
        if is_marker("---") || is_marker("...") {
            if !current.is_empty() {
                docs.push((start, std::mem::take(&mut current)));
            }
            start = index + 1;
            // Keep what follows `--- ` on the marker line as the document's first line.
            let rest = if is_marker("---") { &line[3..] } else { "\n" };
            current.push_str("   ");
            current.push_str(rest);
            if !rest.ends_with('\n') {
                current.push('\n');
            }
        } else {
            current.push_str(line);
        }
    }
    if !current.is_empty() {
        docs.push((start, current));
    }
    docs
}

fn line_of_offset(bytes: &[u8], offset: usize) -> usize {
    bytes[..offset.min(bytes.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Best-effort line of the value a JSON pointer names, found by walking keys with increasing
/// indentation. Good enough for error messages; never used for anything else.
fn line_of_pointer(text: &str, pointer: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut min_indent = 0usize;
    let mut found = None;
    for segment in pointer.split('/').skip(1) {
        let key = segment.replace("~1", "/").replace("~0", "~");
        if key.parse::<usize>().is_ok() {
            continue;
        }
        let hit = lines.iter().enumerate().skip(from).find(|(_, line)| {
            let stripped = line.trim_start_matches([' ', '-']);
            let indent = line.len() - stripped.len();
            indent >= min_indent
                && [
                    format!("{key}:"),
                    format!("\"{key}\":"),
                    format!("'{key}':"),
                ]
                .iter()
                .any(|k| stripped.starts_with(k.as_str()))
        });
        let (index, line) = hit?;
        min_indent = line.len() - line.trim_start_matches([' ', '-']).len() + 1;
        from = index + 1;
        found = Some(index + 1);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "\
# two sandboxes
apiVersion: agent-sandbox.io/v1
kind: Sandbox
metadata:
  name: one
spec:
  image: busybox
---
apiVersion: agent-sandbox.io/v1
kind: Sandbox
metadata:
  name: two
spec:
  image: busybox
  cpus: 2
";

    #[test]
    fn only_yaml_1_2_booleans() {
        let text = "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: n\n  \
            labels:\n    country: NO\nspec:\n  network: true\n";
        let parsed = parse_body(text.as_bytes(), Kind::Sandbox).unwrap();
        assert_eq!(parsed.name(), "n");
        assert_eq!(parsed.metadata().labels["country"], "NO");
        let text = "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: a\nspec:\n  network: yes\n";
        let err = parse_body(text.as_bytes(), Kind::Sandbox).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("spec.network"), "{err:?}");
    }

    #[test]
    fn integral_floats_fill_integer_fields_and_huge_ones_are_refused() {
        let body = br#"{"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": {"name": "f"}, "spec": {"memoryMB": 256.0, "cpus": 2.0, "ttlSeconds": 1e3}}"#;
        let parsed = parse_body(body, Kind::Sandbox).unwrap();
        let sandbox = parsed.as_sandbox().unwrap();
        assert_eq!(sandbox.spec.memory_mb, Some(256));
        assert_eq!(sandbox.spec.ttl_seconds, Some(1000));
        assert_eq!(sandbox.spec.cpus, Some(2.0));
        for bad in ["256.5", "6.2e27", "-1"] {
            let body = format!(
                r#"{{"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                "metadata": {{"name": "f"}}, "spec": {{"memoryMB": {bad}}}}}"#
            );
            let err = parse_body(body.as_bytes(), Kind::Sandbox).unwrap_err();
            assert_eq!(
                err.field.as_deref(),
                Some("spec.memoryMB"),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn reads_several_documents_with_their_lines() {
        let parsed = parse_file(TWO.as_bytes(), Path::new("a.yaml"));
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let names: Vec<_> = parsed
            .documents
            .iter()
            .map(|d| d.resource.name().to_string())
            .collect();
        assert_eq!(names, ["one", "two"]);
        assert_eq!(parsed.documents[1].line, 8);
    }

    #[test]
    fn a_bad_document_names_file_line_and_field_and_spares_its_neighbours() {
        let text = TWO.replace("cpus: 2", "cpus: -3");
        let parsed = parse_file(text.as_bytes(), Path::new("dir/a.yaml"));
        assert_eq!(parsed.documents.len(), 1);
        let err = &parsed.errors[0];
        assert_eq!(err.line, Some(15), "{err}");
        assert_eq!(err.field.as_deref(), Some("spec.cpus"));
        assert_eq!(err.identity, Some((Kind::Sandbox, "two".to_string())));
        assert!(
            err.to_string().starts_with("dir/a.yaml:15: spec.cpus: "),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_line() {
        let text = TWO.replace("  cpus: 2", "  cpus: 2\n  privileged: true");
        let parsed = parse_file(text.as_bytes(), Path::new("a.yaml"));
        let err = &parsed.errors[0];
        assert!(err.message.contains("privileged"), "{err}");
        assert_eq!(err.line, Some(16), "{err}");
    }

    #[test]
    fn syntax_errors_carry_the_absolute_line() {
        let text = TWO.replace("  cpus: 2", "  cpus: [2");
        let parsed = parse_file(text.as_bytes(), Path::new("a.yaml"));
        assert_eq!(parsed.documents.len(), 1);
        let line = parsed.errors[0].line.unwrap();
        assert!(line >= 15, "line {line}: {}", parsed.errors[0]);
    }

    #[test]
    fn duplicate_keys_are_an_error() {
        let text = TWO.replace("  cpus: 2", "  cpus: 2\n  cpus: 3");
        let parsed = parse_file(text.as_bytes(), Path::new("a.yaml"));
        assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.documents);
    }

    #[test]
    fn invalid_utf8_is_reported_with_its_line() {
        let mut bytes = TWO.as_bytes().to_vec();
        bytes.extend_from_slice(b"\n  # \xff\xfe\n");
        let parsed = parse_file(&bytes, Path::new("a.yaml"));
        assert!(parsed.documents.is_empty());
        assert!(parsed.errors[0].message.contains("UTF-8"));
        assert_eq!(parsed.errors[0].line, Some(17));
    }

    #[test]
    fn alias_bombs_and_deep_nesting_stop_quickly() {
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..12 {
            let prev = if i == 0 {
                "a".to_string()
            } else {
                format!("l{}", i - 1)
            };
            bomb.push_str(&format!("l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        let started = std::time::Instant::now();
        let parsed = parse_file(bomb.as_bytes(), Path::new("bomb.yaml"));
        assert!(parsed.documents.is_empty());
        assert_eq!(parsed.errors.len(), 1);

        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let parsed = parse_file(deep.as_bytes(), Path::new("deep.yaml"));
        assert!(parsed.documents.is_empty());
        assert_eq!(parsed.errors.len(), 1);
        // A guard against a hang, not a speed claim (debug builds on a loaded machine are slow).
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn oversized_files_are_refused_before_parsing() {
        let big = vec![b'#'; MAX_DOCUMENT_BYTES + 1];
        let parsed = parse_file(&big, Path::new("big.yaml"));
        assert!(parsed.errors[0].message.contains("limit"));
    }

    #[test]
    fn bodies_may_be_json_or_yaml_but_hold_one_document() {
        let json = r#"{"apiVersion":"agent-sandbox.io/v1","kind":"Sandbox","metadata":{"name":"x"},"spec":{}}"#;
        assert_eq!(
            parse_body(json.as_bytes(), Kind::Sandbox).unwrap().name(),
            "x"
        );
        assert!(parse_body(TWO.as_bytes(), Kind::Sandbox).is_err());
        assert!(parse_body(json.as_bytes(), Kind::Fork).is_err());
        let deep = "{\"a\":".repeat(100_000);
        assert!(parse_body(deep.as_bytes(), Kind::Sandbox).is_err());
    }

    #[test]
    fn yaml_round_trip() {
        let parsed = parse_file(TWO.as_bytes(), Path::new("a.yaml"));
        let text = to_yaml(&parsed.documents[1].resource).unwrap();
        let again = parse_file(text.as_bytes(), Path::new("b.yaml"));
        assert_eq!(again.documents[0].resource, parsed.documents[1].resource);
    }

    #[test]
    fn a_secret_body_gives_its_value_apart_from_the_document() {
        let json = br#"{"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
            "metadata": {"name": "k"}, "spec": {}, "value": "hunter2"}"#;
        let (resource, value) = parse_secret_body(json).unwrap();
        assert_eq!(value.as_deref(), Some("hunter2"));
        assert!(!resource.to_json().to_string().contains("hunter2"));
        let yaml = b"apiVersion: agent-sandbox.io/v1\nkind: Secret\nmetadata: {name: k}\nspec: {}\nvalue: hunter2\n";
        assert_eq!(
            parse_secret_body(yaml).unwrap().1.as_deref(),
            Some("hunter2")
        );
        let number = br#"{"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
            "metadata": {"name": "k"}, "spec": {}, "value": 7}"#;
        let error = parse_secret_body(number).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("value"));
        assert!(!error.to_string().contains('7'), "{error}");
        let without = br#"{"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
            "metadata": {"name": "k"}, "spec": {}}"#;
        assert_eq!(parse_secret_body(without).unwrap().1, None);
    }
}
