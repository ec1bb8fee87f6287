//! Putting Secret values into the requests of a policed sandbox. The sandbox holds only a
//! placeholder (see [`placeholder`]); when one of its own placeholders stands in the request
//! header a Secret names, and the request goes to one of that Secret's hosts, the header is
//! rewritten to the Secret's `format` with the value in it. Anywhere else the placeholder stays a
//! useless string. The Secret's spec and value are read at each request (so an edit or a rotated
//! value applies to the next one) and kept nowhere; this module never logs a value. It decides
//! nothing about whether a request may leave: the proxy asks it only for allowed ones.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::gateway::{SecretBinding, Tenant};
use crate::resource::Kind;
use crate::store::Store;

/// The placeholder sandbox `sandbox` (whose uid is `uid`) holds for Secret `secret`: unique to
/// the pair, stable across restarts of the server and the sandbox, and telling nothing of the
/// value (it is made from names alone).
pub fn placeholder(sandbox: &str, uid: &str, secret: &str) -> String {
    let digest = Sha256::digest(format!("{sandbox}\0{uid}\0{secret}").as_bytes());
    format!("agent-sandbox-secret-{}", hex::encode(&digest[..16]))
}

/// `head` (a request head for `host:port`) with the tenant's placeholders replaced where a
/// Secret allows it, and the names of the Secrets put in. Reads the store off the async threads.
pub(super) async fn inject(
    store: &Arc<Store>,
    tenant: &Tenant,
    host: &str,
    port: u16,
    head: Vec<u8>,
) -> (Vec<u8>, Vec<String>) {
    let present: Vec<SecretBinding> = tenant
        .secrets
        .iter()
        .filter(|b| contains(&head, b.placeholder.as_bytes()))
        .cloned()
        .collect();
    if present.is_empty() {
        return (head, Vec::new());
    }
    let store = Arc::clone(store);
    let (host, sandbox) = (host.to_string(), tenant.sandbox.clone());
    let fallback = head.clone();
    tokio::task::spawn_blocking(move || {
        let mut head = head;
        let mut used = Vec::new();
        for binding in present {
            if let Some(rewritten) = rewrite(&store, &binding, &host, port, &head) {
                head = rewritten;
                used.push(binding.secret);
            }
        }
        if !used.is_empty() {
            tracing::debug!(%sandbox, %host, secrets = ?used, "egress: secrets put in a request");
        }
        (head, used)
    })
    .await
    .unwrap_or((fallback, Vec::new()))
}

/// `head` with `binding`'s header rewritten, when its Secret applies to `host:port` and has a
/// value that can stand in a header.
fn rewrite(
    store: &Store,
    binding: &SecretBinding,
    host: &str,
    port: u16,
    head: &[u8],
) -> Option<Vec<u8>> {
    let entry = store.get(Kind::Secret, &binding.secret)?;
    let secret = entry.resource.as_secret()?;
    let injection = secret.spec.injection().ok().flatten()?;
    if !injection.applies_to(host, port) {
        return None;
    }
    let value = match crate::secrets::value_of(store, &binding.secret) {
        Ok(value) => value,
        Err(error) => {
            tracing::warn!(secret = %binding.secret, %error, "egress: a Secret has no value to put in");
            return None;
        }
    };
    if value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        tracing::warn!(secret = %binding.secret, "egress: a Secret's value holds a line break or NUL; not put in a header");
        return None;
    }
    let (before, after) = injection.format.split_once("{value}")?;
    let mut line = Vec::with_capacity(injection.header.len() + value.len() + 32);
    line.extend_from_slice(injection.header.as_bytes());
    line.extend_from_slice(b": ");
    line.extend_from_slice(before.as_bytes());
    line.extend_from_slice(&value);
    line.extend_from_slice(after.as_bytes());
    replace_header(
        head,
        &injection.header,
        binding.placeholder.as_bytes(),
        &line,
    )
}

/// `head` with every `name` header line that holds `placeholder` replaced by `line`; `None` when
/// there is none (the placeholder stood elsewhere: it is left as it is).
fn replace_header(head: &[u8], name: &str, placeholder: &[u8], line: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(head.len() + line.len());
    let mut replaced = false;
    let mut lines = head.split(|b| *b == b'\n').peekable();
    let mut first = true;
    while let Some(raw) = lines.next() {
        let text = raw.strip_suffix(b"\r").unwrap_or(raw);
        let is_target = !first
            && text.iter().position(|b| *b == b':').is_some_and(|colon| {
                text[..colon]
                    .trim_ascii()
                    .eq_ignore_ascii_case(name.as_bytes())
            })
            && contains(text, placeholder);
        first = false;
        if is_target {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r");
            replaced = true;
        } else {
            out.extend_from_slice(raw);
        }
        if lines.peek().is_some() {
            out.push(b'\n');
        }
    }
    replaced.then_some(out)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_unique_to_sandbox_and_secret() {
        let a = placeholder("sb", "uid-1", "openai");
        assert!(a.starts_with("agent-sandbox-secret-"));
        assert_eq!(a, placeholder("sb", "uid-1", "openai"));
        assert_ne!(a, placeholder("sb", "uid-2", "openai"));
        assert_ne!(a, placeholder("sb2", "uid-1", "openai"));
        assert_ne!(a, placeholder("sb", "uid-1", "github"));
    }

    #[test]
    fn only_the_named_header_holding_the_placeholder_is_rewritten() {
        let head = b"GET / HTTP/1.1\r\nHost: a.example\r\nX-Other: PH\r\nauthorization: Bearer PH\r\nConnection: close\r\n\r\n";
        let out =
            replace_header(head, "Authorization", b"PH", b"Authorization: Bearer real").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nHost: a.example\r\nX-Other: PH\r\nAuthorization: Bearer real\r\nConnection: close\r\n\r\n"
        );
        // The placeholder in another header, or the request line, is not a place for the value.
        assert!(replace_header(head, "X-Api-Key", b"PH", b"X-Api-Key: real").is_none());
        let in_path = b"GET /PH HTTP/1.1\r\nAuthorization: none\r\n\r\n";
        assert!(replace_header(in_path, "Authorization", b"PH", b"x").is_none());
    }
}
