//! Preview tokens and preview hosts. A token is `base64url(claims).base64url(HMAC-SHA256)` under
//! a server secret: its claims bind it to one sandbox (name and `uid`, so a sandbox recreated
//! under the same name accepts none of the old ones), one port and an expiry. Revoking a
//! sandbox's tokens records the moment; tokens issued before it are refused. The secret and the
//! revocations live in the data directory, written through `store` (private files); this module
//! only decides.
//!
//! A preview host is `{port}-{name}.{domain}` (`{port}-{name}.{namespace}.{domain}` outside the
//! `default` namespace) with an optional `:port` of the listener;
//! [`parse_host`] refuses everything else that claims the domain, and leaves hosts outside it
//! alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::store::{read_or_create_private, replace_private, StoreError};

/// The secret's file in the data directory.
pub const SECRET_FILE: &str = "preview-secret";
/// The revocations' file in the data directory: `{uid: revoked-at in ms}`.
pub const REVOCATIONS_FILE: &str = "preview-revocations.json";
/// The cookie a token is exchanged for (host-only, so per preview host).
pub const COOKIE: &str = "agent-sandbox-preview";
/// The longest a token may live (a week); revocations older than this are forgotten.
pub const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;
/// A token's lifetime when none is asked for.
pub const DEFAULT_TTL_SECONDS: u64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the preview token is malformed")]
    Malformed,
    #[error("the preview token's signature is wrong")]
    BadSignature,
    #[error("the preview token is for another sandbox or port")]
    WrongScope,
    #[error("the preview token has expired")]
    Expired,
    #[error("the preview token was revoked")]
    Revoked,
}

#[derive(Debug, thiserror::Error)]
pub enum PreviewStoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {problem}")]
    BadFile { path: PathBuf, problem: String },
}

/// What a token says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Claims {
    /// Sandbox name.
    n: String,
    /// Sandbox uid.
    u: String,
    /// Port.
    p: u16,
    /// Expiry, Unix seconds.
    e: i64,
    /// Issued at, Unix milliseconds.
    i: i64,
}

/// Signs and checks preview tokens.
pub struct Previews {
    secret: [u8; 32],
    data_dir: Option<PathBuf>,
    revoked: Mutex<BTreeMap<String, i64>>,
}

/// HMAC-SHA256 (RFC 2104) for keys of at most one block (64 bytes), zero-padded as is.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    debug_assert!(key.len() <= 64);
    let mut inner_pad = [0x36u8; 64];
    let mut outer_pad = [0x5cu8; 64];
    for (i, b) in key.iter().enumerate() {
        inner_pad[i] ^= b;
        outer_pad[i] ^= b;
    }
    let inner = Sha256::new()
        .chain_update(inner_pad)
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(outer_pad)
        .chain_update(inner)
        .finalize()
        .into()
}

impl Previews {
    /// Tokens under `secret`, remembered nowhere (for tests).
    pub fn in_memory(secret: [u8; 32]) -> Previews {
        Previews {
            secret,
            data_dir: None,
            revoked: Mutex::new(BTreeMap::new()),
        }
    }

    /// The secret and revocations of `data_dir`, the secret made on first use.
    pub fn load(data_dir: &Path) -> Result<Previews, PreviewStoreError> {
        let file = read_or_create_private(data_dir, SECRET_FILE, || {
            format!("{}\n", hex::encode(rand::random::<[u8; 32]>()))
        })?;
        let bad = |problem: &str| PreviewStoreError::BadFile {
            path: file.path.clone(),
            problem: problem.into(),
        };
        let text = std::str::from_utf8(&file.contents).map_err(|_| bad("not UTF-8"))?;
        let bytes = hex::decode(text.trim()).map_err(|_| bad("not a hex secret"))?;
        let secret: [u8; 32] = bytes.try_into().map_err(|_| bad("not a 32-byte secret"))?;
        let revocations = read_or_create_private(data_dir, REVOCATIONS_FILE, || "{}\n".into())?;
        let revoked: BTreeMap<String, i64> = serde_json::from_slice(&revocations.contents)
            .map_err(|e| PreviewStoreError::BadFile {
                path: revocations.path.clone(),
                problem: e.to_string(),
            })?;
        Ok(Previews {
            secret,
            data_dir: Some(data_dir.to_path_buf()),
            revoked: Mutex::new(revoked),
        })
    }

    fn revoked(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, i64>> {
        self.revoked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A token for `port` of the sandbox `name` (`uid`), valid until `expires_at` (Unix seconds).
    pub fn issue(&self, name: &str, uid: &str, port: u16, expires_at: i64, now_ms: i64) -> String {
        // Never issued at or before a revocation of the same sandbox.
        let issued = match self.revoked().get(uid) {
            Some(at) if *at >= now_ms => at + 1,
            _ => now_ms,
        };
        let claims = Claims {
            n: name.to_string(),
            u: uid.to_string(),
            p: port,
            e: expires_at,
            i: issued,
        };
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let mac = URL_SAFE_NO_PAD.encode(hmac_sha256(&self.secret, body.as_bytes()));
        format!("{body}.{mac}")
    }

    /// The sandbox name a token of this server's names, once its signature is checked (`None`
    /// for a token this server did not sign); whether it opens anything is [`Previews::verify`]'s
    /// question.
    pub fn signed_name(&self, token: &str) -> Option<String> {
        self.signed_claims(token).ok().map(|claims| claims.n)
    }

    /// The claims of a token whose signature is this server's.
    fn signed_claims(&self, token: &str) -> Result<Claims, TokenError> {
        let (body, mac) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::Malformed)?;
        let expected = hmac_sha256(&self.secret, body.as_bytes());
        if !bool::from(expected.as_slice().ct_eq(&mac)) {
            return Err(TokenError::BadSignature);
        }
        URL_SAFE_NO_PAD
            .decode(body)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)
    }

    /// Whether `token` opens `port` of the sandbox `name` whose uid is `uid`, at `now_ms`.
    pub fn verify(
        &self,
        token: &str,
        name: &str,
        uid: &str,
        port: u16,
        now_ms: i64,
    ) -> Result<(), TokenError> {
        let claims = self.signed_claims(token)?;
        if claims.n != name || claims.u != uid || claims.p != port {
            return Err(TokenError::WrongScope);
        }
        if claims.e.saturating_mul(1000) <= now_ms {
            return Err(TokenError::Expired);
        }
        if self.revoked().get(uid).is_some_and(|at| claims.i <= *at) {
            return Err(TokenError::Revoked);
        }
        Ok(())
    }

    /// The expiry (Unix seconds) of a token this server signed; `None` for anything else.
    pub fn expiry(&self, token: &str) -> Option<i64> {
        self.signed_claims(token).ok().map(|claims| claims.e)
    }

    /// Revokes every token of the sandbox `uid` issued until `now_ms`, durably when this server
    /// keeps a data directory. Revocations older than the longest token life are dropped.
    pub fn revoke(&self, uid: &str, now_ms: i64) -> Result<(), PreviewStoreError> {
        let text = {
            let mut revoked = self.revoked();
            revoked.insert(uid.to_string(), now_ms);
            let horizon = now_ms - (MAX_TTL_SECONDS as i64) * 1000;
            revoked.retain(|_, at| *at >= horizon);
            serde_json::to_vec_pretty(&*revoked).unwrap_or_default()
        };
        if let Some(dir) = &self.data_dir {
            replace_private(dir, REVOCATIONS_FILE, &text)?;
        }
        Ok(())
    }
}

/// What a request's host says about previews.
#[derive(Debug, PartialEq)]
pub enum PreviewHost {
    /// Not under the preview domain: the API's business.
    Api,
    /// `{port}-{name}.{domain}`.
    Preview { port: u16, name: String },
    /// Claims the preview domain but is not a preview host (or is no host at all).
    Refused(String),
}

/// Judges `host` (a `Host` header or a request's authority) against `domain`.
pub fn parse_host(host: &str, domain: &str) -> PreviewHost {
    let host = host.to_ascii_lowercase();
    let (name, port) = match host.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (host.as_str(), None),
    };
    let domain_suffix = format!(".{domain}");
    let claims_domain = name == domain || name.ends_with(&domain_suffix);
    if !claims_domain {
        // A host that merely contains the domain (`8000-a.domain.evil`, `x@8000-a.domain`) is
        // not a preview host; it may still be the API's, which wants the key.
        return PreviewHost::Api;
    }
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return PreviewHost::Refused(format!("{host:?} is not a valid host"));
    }
    let Some(label) = name.strip_suffix(&domain_suffix) else {
        return PreviewHost::Refused(format!("{host:?} names no sandbox port"));
    };
    let refused = || PreviewHost::Refused(format!("{host:?} is not {{port}}-{{name}}.{domain}"));
    let Some((port, sandbox)) = label.split_once('-') else {
        return refused();
    };
    let Ok(port) = super::parse_port(port) else {
        return refused();
    };
    // `{name}` in `default`, `{name}.{namespace}` in any other.
    let (name, namespace) = sandbox
        .split_once('.')
        .unwrap_or((sandbox, crate::resource::DEFAULT_NAMESPACE));
    if !crate::resource::is_valid_name(name)
        || !crate::resource::is_valid_namespace(namespace)
        || (sandbox.contains('.') && namespace == crate::resource::DEFAULT_NAMESPACE)
    {
        return refused();
    }
    PreviewHost::Preview {
        port,
        name: crate::resource::object_key(namespace, name),
    }
}

/// The label before the preview domain of port `port` of the sandbox of key `key`:
/// `{port}-{name}` in `default`, `{port}-{name}.{namespace}` in any other.
pub fn host_label(port: u16, key: &str) -> String {
    match crate::resource::split_key(key) {
        (crate::resource::DEFAULT_NAMESPACE, name) => format!("{port}-{name}"),
        (namespace, name) => format!("{port}-{name}.{namespace}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 1 of RFC 4231.
        assert_eq!(
            hex::encode(hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2: key "Jefe".
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_token_opens_its_sandbox_and_port_only() {
        let p = Previews::in_memory([7; 32]);
        let t = p.issue("web", "uid-1", 8000, NOW / 1000 + 60, NOW);
        assert!(p.verify(&t, "web", "uid-1", 8000, NOW).is_ok());
        assert!(matches!(
            p.verify(&t, "web", "uid-1", 8001, NOW),
            Err(TokenError::WrongScope)
        ));
        assert!(matches!(
            p.verify(&t, "other", "uid-1", 8000, NOW),
            Err(TokenError::WrongScope)
        ));
        assert!(matches!(
            p.verify(&t, "web", "uid-2", 8000, NOW),
            Err(TokenError::WrongScope)
        ));
        assert!(matches!(
            p.verify(&t, "web", "uid-1", 8000, NOW + 61_000),
            Err(TokenError::Expired)
        ));
        let other = Previews::in_memory([8; 32]);
        assert!(matches!(
            other.verify(&t, "web", "uid-1", 8000, NOW),
            Err(TokenError::BadSignature)
        ));
        let (body, mac) = t.split_once('.').unwrap();
        let forged = format!("{}x.{mac}", body);
        assert!(p.verify(&forged, "web", "uid-1", 8000, NOW).is_err());
        assert!(p.verify("nonsense", "web", "uid-1", 8000, NOW).is_err());
        // The name is read back only from a token this server signed.
        assert_eq!(p.signed_name(&t).as_deref(), Some("web"));
        assert_eq!(other.signed_name(&t), None);
        assert_eq!(p.signed_name(&forged), None);
        assert_eq!(p.signed_name("nonsense"), None);
    }

    #[test]
    fn revocation_refuses_earlier_tokens_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let p = Previews::load(dir.path()).unwrap();
        let t = p.issue("web", "uid-1", 8000, NOW / 1000 + 60, NOW);
        p.revoke("uid-1", NOW + 5).unwrap();
        assert!(matches!(
            p.verify(&t, "web", "uid-1", 8000, NOW + 10),
            Err(TokenError::Revoked)
        ));
        let fresh = p.issue("web", "uid-1", 8000, NOW / 1000 + 60, NOW + 5);
        assert!(p.verify(&fresh, "web", "uid-1", 8000, NOW + 10).is_ok());
        let again = Previews::load(dir.path()).unwrap();
        assert!(matches!(
            again.verify(&t, "web", "uid-1", 8000, NOW + 10),
            Err(TokenError::Revoked)
        ));
        assert!(again.verify(&fresh, "web", "uid-1", 8000, NOW + 10).is_ok());
    }

    #[test]
    fn hosts_are_judged_strictly() {
        let d = "preview.localhost";
        assert_eq!(
            parse_host("8000-web.team-a.preview.localhost", d),
            PreviewHost::Preview {
                port: 8000,
                name: "team-a.web".into()
            }
        );
        assert_eq!(host_label(8000, "team-a.web"), "8000-web.team-a");
        assert_eq!(host_label(8000, "web"), "8000-web");
        assert!(matches!(
            parse_host("8000-web.default.preview.localhost", d),
            PreviewHost::Refused(_)
        ));
        assert!(matches!(
            parse_host("8000-web.a.b.preview.localhost", d),
            PreviewHost::Refused(_)
        ));
        assert_eq!(
            parse_host("8000-web.preview.localhost:8080", d),
            PreviewHost::Preview {
                port: 8000,
                name: "web".into()
            }
        );
        assert_eq!(
            parse_host("8000-Web.Preview.Localhost", d),
            PreviewHost::Preview {
                port: 8000,
                name: "web".into()
            }
        );
        assert_eq!(parse_host("127.0.0.1:8080", d), PreviewHost::Api);
        assert_eq!(
            parse_host("8000-web.preview.localhost.evil", d),
            PreviewHost::Api
        );
        for refused in [
            "8000-web.preview.localhost:1@other",
            "8000-web.preview.localhost:",
            "preview.localhost",
            "web.preview.localhost",
            "0-web.preview.localhost",
            "70000-web.preview.localhost",
            "8000-.preview.localhost",
            "8000-a.b.c.preview.localhost",
            "8000-a.b_c.preview.localhost",
        ] {
            assert!(
                matches!(parse_host(refused, d), PreviewHost::Refused(_)),
                "{refused}"
            );
        }
    }
}
