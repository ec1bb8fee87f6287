//! API keys: where they come from (settings, or a key generated once and kept in the data
//! directory, whose file the store keeps), how a request presents one (`Authorization: Bearer` first, then `X-API-Key`, as the
//! reference server does), and the middleware that refuses everything else with 401.
//!
//! Keys are secrets: this module never logs a key, and it compares them in constant time against
//! SHA-256 digests so that neither a matching prefix nor a length difference changes the timing.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::error::ApiError;
use super::session;
use crate::config::Settings;
use crate::store::{read_or_create_private, PrivateFile, StoreError};

/// Name of the generated key's file inside the data directory.
pub const KEY_FILE: &str = "api-key";

/// The keys a request may present, or none at all when authentication is off.
pub struct ApiKeys {
    /// SHA-256 of every accepted key; `None` means authentication is off.
    digests: Option<Vec<[u8; 32]>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.digests {
            None => f.write_str("ApiKeys(disabled)"),
            Some(d) => write!(f, "ApiKeys({} keys)", d.len()),
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl ApiKeys {
    /// Accepts exactly these keys (surrounding whitespace is not part of a key; empty ones are
    /// dropped).
    pub fn new<I, K>(keys: I) -> ApiKeys
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let digests = keys
            .into_iter()
            .map(|k| k.as_ref().trim().to_string())
            .filter(|k| !k.is_empty())
            .map(|k| digest(k.as_bytes()))
            .collect();
        ApiKeys {
            digests: Some(digests),
        }
    }

    /// Accepts every request.
    pub fn disabled() -> ApiKeys {
        ApiKeys { digests: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.digests.is_some()
    }

    /// Whether `candidate` is one of the keys. Looks at every key, always.
    pub fn verify(&self, candidate: &[u8]) -> bool {
        let Some(digests) = &self.digests else {
            return true;
        };
        let candidate = digest(candidate);
        let mut matched = Choice::from(0u8);
        for key in digests {
            matched |= key.ct_eq(&candidate);
        }
        bool::from(matched)
    }

    /// Whether the request's headers carry an accepted key.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        if !self.is_enabled() {
            return true;
        }
        match presented_key(headers) {
            Some(key) => self.verify(key),
            None => false,
        }
    }
}

/// The key a request presents, following the reference server: a usable
/// `Authorization: Bearer <key>` (scheme case-insensitive, key trimmed) wins; only without one is
/// `X-API-Key` looked at. Another scheme, a missing space or an empty token count as no
/// `Authorization` header at all.
pub fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bytes = value.as_bytes();
        if let Some(space) = bytes.iter().position(|b| *b == b' ') {
            let (scheme, rest) = bytes.split_at(space);
            let token = rest.trim_ascii();
            if scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty() {
                return Some(token);
            }
        }
    }
    headers
        .get("x-api-key")
        .map(|v| v.as_bytes())
        .filter(|v| !v.is_empty())
}

/// Middleware: 401 `unauthorized` (with `WWW-Authenticate: Bearer`) unless the request carries
/// an accepted key: in a header, or, for the dashboard, in its session cookie with the checks
/// `super::session` makes (403 when those fail).
pub async fn require_key(
    State(keys): State<Arc<ApiKeys>>,
    request: Request,
    next: Next,
) -> Response {
    match keys.admit(request.method(), request.uri().path(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

impl ApiKeys {
    /// Whether a request may go on: a key in a header is judged alone; without one, the
    /// dashboard's session cookie with its CSRF and origin checks.
    pub fn admit(
        &self,
        method: &axum::http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<(), ApiError> {
        if !self.is_enabled() {
            return Ok(());
        }
        if presented_key(headers).is_some() {
            return if self.allows(headers) {
                Ok(())
            } else {
                Err(ApiError::Unauthorized("missing or invalid API key".into()))
            };
        }
        let Some(key) = session::cookie(headers, session::KEY_COOKIE) else {
            return Err(ApiError::Unauthorized("missing or invalid API key".into()));
        };
        let key_ok = self.verify(key.as_bytes());
        session::check(method, path, headers, key_ok).map_err(|refusal| match refusal {
            session::Refusal::BadKey => ApiError::Unauthorized("missing or invalid API key".into()),
            session::Refusal::Forged(why) => ApiError::Forbidden(why.into()),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot use the API key file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the API key file {} is {problem}; remove it to have a new key generated", path.display())]
    BadKeyFile { path: PathBuf, problem: String },
}

/// The keys the server accepts: `AGENT_SANDBOX_API_KEYS` when set; none at all with
/// `AGENT_SANDBOX_INSECURE_NO_AUTH=true`; else the key in `<data>/api-key`, generated on first
/// start. Logs where a generated key is, never the key.
pub fn load_or_create_keys(settings: &Settings) -> Result<ApiKeys, AuthError> {
    if settings.insecure_no_auth {
        tracing::warn!(
            "AUTHENTICATION IS OFF (AGENT_SANDBOX_INSECURE_NO_AUTH=true): anyone who can reach \
             this server can run code in its sandboxes"
        );
        return Ok(ApiKeys::disabled());
    }
    let configured = ApiKeys::new(&settings.api_keys);
    if configured.digests.as_ref().is_some_and(|d| !d.is_empty()) {
        return Ok(configured);
    }
    let file = read_or_create_private(&settings.data_dir, KEY_FILE, || {
        format!("{}\n", hex::encode(rand::random::<[u8; 32]>()))
    })
    .map_err(|error| match error {
        StoreError::Io { path, source } => AuthError::Io { path, source },
        other => AuthError::Io {
            path: settings.data_dir.join(KEY_FILE),
            source: std::io::Error::other(other.to_string()),
        },
    })?;
    let key = check_key_file(&file)?;
    let (path, created) = (file.path, file.created);
    if created {
        tracing::info!(
            path = %path.display(),
            "no API key configured: generated one and stored it in the data directory \
             (readable by this user only); send it as `Authorization: Bearer <key>`"
        );
    } else {
        tracing::info!(path = %path.display(), "using the API key stored in the data directory");
    }
    Ok(ApiKeys::new([key]))
}

/// The key a key file holds, if it is one; warns when others may read it.
fn check_key_file(file: &PrivateFile) -> Result<String, AuthError> {
    let bad = |problem: &str| AuthError::BadKeyFile {
        path: file.path.clone(),
        problem: problem.into(),
    };
    let text = std::str::from_utf8(&file.contents).map_err(|_| bad("not UTF-8 text"))?;
    let key = text.trim();
    if key.len() < 16 {
        return Err(bad("shorter than 16 characters"));
    }
    if key.contains(char::is_whitespace) {
        return Err(bad("not a single key"));
    }
    if file.shared {
        tracing::warn!(
            path = %file.path.display(),
            "the API key file is readable by other users; `chmod 600` it"
        );
    }
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    const KEY: &str = "0123456789abcdef-key";

    #[test]
    fn presented_key_follows_the_reference_precedence() {
        let k = |pairs: &[(&str, &str)]| {
            presented_key(&headers(pairs)).map(|b| String::from_utf8_lossy(b).into_owned())
        };
        assert_eq!(
            k(&[("authorization", "Bearer abc")]).as_deref(),
            Some("abc")
        );
        assert_eq!(
            k(&[("authorization", "bEaReR    abc  ")]).as_deref(),
            Some("abc")
        );
        assert_eq!(k(&[("authorization", "Basic abc")]), None);
        assert_eq!(k(&[("authorization", "Bearer")]), None);
        assert_eq!(k(&[("authorization", "Bearer   ")]), None);
        assert_eq!(k(&[("authorization", "abc")]), None);
        assert_eq!(k(&[("x-api-key", "xyz")]).as_deref(), Some("xyz"));
        assert_eq!(k(&[("X-Api-Key", "")]), None);
        // A usable Bearer wins even when X-API-Key is present.
        assert_eq!(
            k(&[("authorization", "Bearer abc"), ("x-api-key", "xyz")]).as_deref(),
            Some("abc")
        );
        // An unusable Authorization header falls through to X-API-Key.
        assert_eq!(
            k(&[("authorization", "Basic abc"), ("x-api-key", "xyz")]).as_deref(),
            Some("xyz")
        );
    }

    #[test]
    fn verify_accepts_any_configured_key_exactly() {
        let keys = ApiKeys::new([KEY, "another-key-0123456789"]);
        assert!(keys.verify(KEY.as_bytes()));
        assert!(keys.verify(b"another-key-0123456789"));
        assert!(!keys.verify(b"0123456789ABCDEF-key"));
        assert!(!keys.verify(&KEY.as_bytes()[..10]));
        assert!(!keys.verify(b""));
        assert!(!ApiKeys::new(Vec::<String>::new()).verify(b""));
        assert!(ApiKeys::disabled().verify(b"anything"));
    }

    #[test]
    fn wrong_bearer_is_not_rescued_by_a_right_x_api_key() {
        let keys = ApiKeys::new([KEY]);
        assert!(!keys.allows(&headers(&[
            ("authorization", "Bearer wrong-wrong-wrong"),
            ("x-api-key", KEY)
        ])));
        assert!(keys.allows(&headers(&[
            ("authorization", "Basic abc"),
            ("x-api-key", KEY)
        ])));
        assert!(!keys.allows(&headers(&[])));
        assert!(ApiKeys::disabled().allows(&headers(&[])));
    }

    #[test]
    fn generates_a_private_key_file_once_and_reuses_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::for_tests(dir.path().join("data"));
        let first = load_or_create_keys(&settings).unwrap();
        let path = dir.path().join("data").join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let key = std::fs::read_to_string(&path).unwrap().trim().to_string();
        assert_eq!(key.len(), 64);
        assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(first.verify(key.as_bytes()));
        let second = load_or_create_keys(&settings).unwrap();
        assert!(second.verify(key.as_bytes()));
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), key);
        // No temporary files are left behind.
        assert_eq!(
            std::fs::read_dir(dir.path().join("data")).unwrap().count(),
            1
        );
    }

    #[test]
    fn configured_keys_and_insecure_mode_write_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::for_tests(dir.path().to_path_buf());
        settings.api_keys = vec![format!(" {KEY} ")];
        let keys = load_or_create_keys(&settings).unwrap();
        assert!(keys.verify(KEY.as_bytes()));
        settings.api_keys.clear();
        settings.insecure_no_auth = true;
        assert!(!load_or_create_keys(&settings).unwrap().is_enabled());
        assert!(!dir.path().join(KEY_FILE).exists());
    }

    #[test]
    fn a_broken_key_file_is_an_error_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KEY_FILE), "short\n").unwrap();
        let settings = Settings::for_tests(dir.path().to_path_buf());
        assert!(matches!(
            load_or_create_keys(&settings),
            Err(AuthError::BadKeyFile { .. })
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap(),
            "short\n"
        );
    }
}
