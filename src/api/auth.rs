//! API keys: where they come from (settings, or a key generated once and kept in the data
//! directory, whose file the store keeps), how a request presents one (`Authorization: Bearer` first, then `X-API-Key`, as the
//! reference server does), and the middleware that refuses everything else with 401.
//!
//! Keys are secrets: this module never logs a key, and it compares them in constant time against
//! SHA-256 digests so that neither a matching prefix nor a length difference changes the timing.
//!
//! A key becomes a [`Principal`]: the admin keys of the settings and the generated key, or a
//! scoped key of the keys file ([`crate::authz::keyring`]). The middleware then asks
//! [`crate::authz`] whether that principal may make the request (404 for objects outside its
//! reach, 403 for what its role may not do), hands the principal to the handlers as a request
//! extension, and ends a streamed answer when its key is revoked.

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
use crate::authz::keyring::Keyring;
use crate::authz::{self, Decision, Principal};
use crate::config::Settings;
use crate::store::{read_or_create_private, PrivateFile, StoreError};

/// Name of the generated key's file inside the data directory.
pub const KEY_FILE: &str = "api-key";

/// The keys a request may present, or none at all when authentication is off.
pub struct ApiKeys {
    /// SHA-256 of every admin key; `None` means authentication is off.
    digests: Option<Vec<[u8; 32]>>,
    /// The name of the admin keys (for the audit trail).
    admin_name: &'static str,
    /// The scoped keys of the keys file, if there is one.
    keyring: Option<Arc<Keyring>>,
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
            admin_name: "admin",
            keyring: None,
        }
    }

    /// Accepts every request.
    pub fn disabled() -> ApiKeys {
        ApiKeys {
            digests: None,
            admin_name: "anonymous",
            keyring: None,
        }
    }

    /// Also accepts the scoped keys of `keyring`.
    pub fn with_keyring(mut self, keyring: Arc<Keyring>) -> ApiKeys {
        self.keyring = Some(keyring);
        self
    }

    /// The keys file in force, if any (its reloader is started by the server).
    pub fn keyring(&self) -> Option<&Arc<Keyring>> {
        self.keyring.as_ref()
    }

    /// Who `candidate` is: an admin key, a scoped key, or nobody. With authentication off,
    /// everyone is an admin.
    pub fn identify(&self, candidate: &[u8]) -> Option<Principal> {
        if self.verify(candidate) {
            return Some(Principal::admin(self.admin_name));
        }
        let keyring = self.keyring.as_ref()?;
        keyring.identify(&digest(candidate))
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

    /// Whether the request's headers carry an accepted key (admin or scoped).
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        self.principal_of(headers).is_some()
    }

    /// The principal of the key in the request's headers.
    pub fn principal_of(&self, headers: &HeaderMap) -> Option<Principal> {
        if !self.is_enabled() {
            return Some(Principal::admin(self.admin_name));
        }
        self.identify(presented_key(headers)?)
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
/// `super::session` makes (403 when those fail). Then the key's principal must be allowed the
/// request ([`authz::classify`], [`Principal::decide`]); it goes to the handler as an
/// `Extension<Principal>`, and a revocable key's answer body ends with an error when the key is
/// revoked.
pub async fn require_key(
    State(keys): State<Arc<ApiKeys>>,
    mut request: Request,
    next: Next,
) -> Response {
    let principal = match keys.admit(request.method(), request.uri().path(), request.headers()) {
        Ok(principal) => principal,
        Err(error) => return error.into_response(),
    };
    let asked_namespace = request
        .extensions()
        .get::<super::namespace::RequestNamespace>()
        .and_then(|n| n.0.clone());
    let asked = authz::classify(
        request.method().as_str(),
        request.uri().path(),
        asked_namespace.as_deref(),
        principal.home_namespace(),
    );
    let refusal = match principal.decide(&asked) {
        Decision::Allow => None,
        Decision::NotFound(message) => Some(ApiError::NotFound(message)),
        Decision::Forbidden(message) => Some(ApiError::Forbidden(message)),
        Decision::Unauthenticated => {
            Some(ApiError::Unauthorized("missing or invalid API key".into()))
        }
    };
    if let Some(error) = refusal {
        let mut response = error.into_response();
        response.extensions_mut().insert(principal);
        return response;
    }
    let revocation = principal.revocation();
    request.extensions_mut().insert(principal.clone());
    let response = next.run(request).await;
    let mut response = match revocation {
        Some(token) => cut_on_revocation(response, token),
        None => response,
    };
    // For the audit trail, recorded further out.
    response.extensions_mut().insert(principal);
    response
}

/// `response` with a body that fails as soon as `token` is cancelled (a revoked key's watch,
/// log or exec stream stops within the keys file's reload period).
fn cut_on_revocation(response: Response, token: tokio_util::sync::CancellationToken) -> Response {
    use futures::StreamExt;
    let (parts, body) = response.into_parts();
    let data = body.into_data_stream();
    let stream = futures::stream::unfold(Some((data, token)), |state| async move {
        let (mut data, token) = state?;
        tokio::select! {
            biased;
            _ = token.cancelled() => Some((
                Err(std::io::Error::other("the API key was revoked")),
                None,
            )),
            next = data.next() => match next {
                Some(Ok(bytes)) => Some((Ok(bytes), Some((data, token)))),
                Some(Err(e)) => Some((Err(std::io::Error::other(e)), None)),
                None => None,
            },
        }
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

impl ApiKeys {
    /// Who is making a request: a key in a header is judged alone; without one, the
    /// dashboard's session cookie with its CSRF and origin checks.
    pub fn admit(
        &self,
        method: &axum::http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Principal, ApiError> {
        let unauthorized = || ApiError::Unauthorized("missing or invalid API key".into());
        if !self.is_enabled() {
            return Ok(Principal::admin(self.admin_name));
        }
        if presented_key(headers).is_some() {
            return self.principal_of(headers).ok_or_else(unauthorized);
        }
        let Some(key) = session::cookie(headers, session::KEY_COOKIE) else {
            return Err(unauthorized());
        };
        let principal = self.identify(key.as_bytes());
        session::check(method, path, headers, principal.is_some()).map_err(
            |refusal| match refusal {
                session::Refusal::BadKey => unauthorized(),
                session::Refusal::Forged(why) => ApiError::Forbidden(why.into()),
            },
        )?;
        principal.ok_or_else(unauthorized)
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
    #[error("{0}")]
    KeysFile(String),
}

/// The keys the server accepts: [`admin_keys`], and the scoped keys of the keys file
/// (`AGENT_SANDBOX_KEYS_FILE`) unless authentication is off.
pub fn load_or_create_keys(settings: &Settings) -> Result<ApiKeys, AuthError> {
    let keys = admin_keys(settings)?;
    match &settings.keys_file {
        Some(path) if keys.is_enabled() => {
            let ring = Keyring::load(path).map_err(|e| AuthError::KeysFile(e.to_string()))?;
            tracing::info!(path = %path.display(), "scoped API keys come from the keys file, reloaded when it changes");
            Ok(keys.with_keyring(Arc::new(ring)))
        }
        Some(_) => {
            tracing::warn!("AGENT_SANDBOX_KEYS_FILE is ignored: authentication is off");
            Ok(keys)
        }
        None => Ok(keys),
    }
}

/// The admin keys: `AGENT_SANDBOX_API_KEYS` when set; none at all with
/// `AGENT_SANDBOX_INSECURE_NO_AUTH=true`; else the key in `<data>/api-key`, generated on first
/// start. Logs where a generated key is, never the key.
fn admin_keys(settings: &Settings) -> Result<ApiKeys, AuthError> {
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
