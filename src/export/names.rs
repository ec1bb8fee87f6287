//! Kubernetes' rules for names, label keys and values, and environment variable names, and the
//! mapping of our names onto them. Pure checks; nothing here builds an object.

/// A Kubernetes object name for one of ours: the same name when it is a DNS-1123 label, else the
/// name with `_` (which our names allow and Kubernetes' do not) turned into `-`.
pub fn object_name(ours: &str) -> String {
    ours.replace('_', "-")
}

/// Whether `name` is a DNS-1123 label: what Kubernetes requires of pod and Sandbox names.
pub fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter().all(|&c| edge(c) || c == b'-')
}

/// Whether `name` is a DNS-1123 subdomain (label prefixes).
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// The name part of a label key, and every non-empty label value: at most 63 characters,
/// alphanumerics at both ends, `-`, `_` and `.` between.
fn is_qualified_part(text: &str) -> bool {
    let b = text.as_bytes();
    let edge = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter()
            .all(|&c| edge(c) || c == b'-' || c == b'_' || c == b'.')
}

/// Whether `key` is a valid label or annotation key: `[prefix/]name`.
pub fn is_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_part(name),
        None => is_qualified_part(key),
    }
}

/// Whether `value` is a valid label value (empty is).
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_qualified_part(value)
}

/// How Kubernetes takes an environment variable name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvName {
    /// Valid on every supported Kubernetes version (`[-._a-zA-Z][-._a-zA-Z0-9]*`).
    Portable,
    /// Printable ASCII other than `=`: valid only with relaxed validation (Kubernetes 1.32+).
    Relaxed,
    /// Empty, or holding `=` or a character that is not printable ASCII: never valid.
    Invalid,
}

pub fn env_name(name: &str) -> EnvName {
    let b = name.as_bytes();
    if b.is_empty() || b.iter().any(|&c| c == b'=' || !(b' '..=b'~').contains(&c)) {
        return EnvName::Invalid;
    }
    let first = |c: u8| c.is_ascii_alphabetic() || c == b'-' || c == b'.' || c == b'_';
    if first(b[0]) && b.iter().all(|&c| first(c) || c.is_ascii_digit()) {
        EnvName::Portable
    } else {
        EnvName::Relaxed
    }
}

/// `text` with every control character and line separator escaped, for one line of a YAML
/// comment: user-given keys must not end the comment and start a document line.
pub fn comment_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert!(is_dns_label("demo-1"));
        assert!(!is_dns_label("sb_2f10"));
        assert_eq!(object_name("sb_2f10"), "sb-2f10");
        assert!(is_dns_label(&object_name("sb_2f10")));
        assert!(is_label_key("team"));
        assert!(is_label_key("agent-sandbox.io/sandbox"));
        assert!(!is_label_key("a/b/c"));
        assert!(!is_label_key("-x"));
        assert!(!is_label_key(&"k".repeat(64)));
        assert!(is_label_value(""));
        assert!(is_label_value("research"));
        assert!(!is_label_value("two words"));
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("GREETING"), EnvName::Portable);
        assert_eq!(env_name("_a.b-c9"), EnvName::Portable);
        assert_eq!(env_name("9LIVES"), EnvName::Relaxed);
        assert_eq!(env_name("A B"), EnvName::Relaxed);
        assert_eq!(env_name(""), EnvName::Invalid);
        assert_eq!(env_name("A=B"), EnvName::Invalid);
        assert_eq!(env_name("A\nB"), EnvName::Invalid);
    }

    #[test]
    fn comments_cannot_be_broken_out_of() {
        assert_eq!(comment_safe("a\nkind: Pod"), "a\\nkind: Pod");
        assert!(!comment_safe("x\r\u{85}y").contains(['\r', '\n', '\u{85}']));
    }
}
