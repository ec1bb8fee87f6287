//! Namespaced paths of the resource API. `/apis/agent-sandbox.io/v1/namespaces/{ns}/{plural}…`
//! is served by the same routes as the un-namespaced `/apis/agent-sandbox.io/v1/{plural}…`: before
//! routing, [`rewrite`] takes the namespace out of the path, puts the object's key
//! ([`crate::resource::object_key`]) where its name was, and tells the handlers through a
//! [`RequestNamespace`] extension. Un-namespaced paths mean `default` for one object and every
//! namespace the caller reaches for a collection, as in Kubernetes.
//!
//! It owns the path grammar only: it reads no store and decides nothing about access (the
//! authorization layer reads the namespace from the rewritten path and this extension).

use axum::extract::Request;
use axum::http::Uri;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::resource::{is_valid_namespace, object_key, Kind, DEFAULT_NAMESPACE};

/// The resource API's root.
const APIS: &str = "/apis/agent-sandbox.io/v1/";

/// The namespace a request's path named, if it named one (`None` on un-namespaced paths).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestNamespace(pub Option<String>);

impl RequestNamespace {
    /// The namespace a create without one in its document goes to.
    pub fn for_create(&self) -> &str {
        self.0.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }

    /// Whether a collection request shows objects of `namespace`.
    pub fn shows(&self, namespace: &str) -> bool {
        self.0.as_deref().is_none_or(|asked| asked == namespace)
    }
}

/// Plurals of the kinds that live in a namespace (Webhooks belong to the whole server), plus the
/// read-only events.
fn is_namespaced(plural: &str) -> bool {
    plural == "events" || Kind::from_plural(plural).is_some_and(|k| k != Kind::Webhook)
}

/// What a path becomes.
#[derive(Debug, PartialEq, Eq)]
enum Rewritten {
    /// Not a namespaced path and nothing to refuse: served as it is.
    Unchanged,
    /// A namespaced path, served as this un-namespaced one.
    Path { path: String, namespace: String },
    /// Refused before routing, with this message.
    NotFound(String),
}

fn rewrite_path(path: &str) -> Rewritten {
    let Some(rest) = path.strip_prefix(APIS) else {
        return Rewritten::Unchanged;
    };
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        ["namespaces", namespace, plural, tail @ ..] if !plural.is_empty() => {
            if !is_valid_namespace(namespace) {
                return Rewritten::NotFound(format!(
                    "{namespace:?} is not a namespace name (a-z, 0-9 and -, at most 63)"
                ));
            }
            if !is_namespaced(plural) {
                return Rewritten::NotFound(format!(
                    "{plural} are not namespaced: use {APIS}{plural}"
                ));
            }
            let mut out = vec![plural.to_string()];
            match tail {
                [] => {}
                // The import of a snapshot archive is an action on the collection.
                ["import"] if *plural == "snapshots" => out.push("import".into()),
                [name, more @ ..] => {
                    if name.contains('.') {
                        return Rewritten::NotFound(format!("{name:?} is not a valid name"));
                    }
                    out.push(object_key(namespace, name));
                    out.extend(more.iter().map(|s| s.to_string()));
                }
            }
            Rewritten::Path {
                path: format!("{APIS}{}", out.join("/")),
                namespace: namespace.to_string(),
            }
        }
        ["namespaces", ..] => Rewritten::NotFound("Not Found".into()),
        // A key names an object of another namespace only through its namespaced path.
        [plural, name, ..] if is_namespaced(plural) && name.contains('.') => {
            Rewritten::NotFound(format!("{name:?} is not a valid name"))
        }
        _ => Rewritten::Unchanged,
    }
}

/// Before routing: serves a namespaced path as its un-namespaced twin and records the namespace.
pub async fn rewrite(mut request: Request, next: Next) -> Response {
    match rewrite_path(request.uri().path()) {
        Rewritten::Unchanged => {
            request.extensions_mut().insert(RequestNamespace(None));
        }
        Rewritten::NotFound(message) => return ApiError::NotFound(message).into_response(),
        Rewritten::Path { path, namespace } => {
            let with_query = match request.uri().query() {
                Some(query) => format!("{path}?{query}"),
                None => path,
            };
            let Ok(uri) = with_query.parse::<Uri>() else {
                return ApiError::NotFound("Not Found".into()).into_response();
            };
            *request.uri_mut() = uri;
            request
                .extensions_mut()
                .insert(RequestNamespace(Some(namespace)));
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(path: &str, namespace: &str) -> Rewritten {
        Rewritten::Path {
            path: path.into(),
            namespace: namespace.into(),
        }
    }

    #[test]
    fn namespaced_paths_become_their_twins_with_keys() {
        let r = |p: &str| rewrite_path(&format!("{APIS}{p}"));
        assert_eq!(
            r("namespaces/team-a/sandboxes"),
            to(&format!("{APIS}sandboxes"), "team-a")
        );
        assert_eq!(
            r("namespaces/team-a/sandboxes/web/exec"),
            to(&format!("{APIS}sandboxes/team-a.web/exec"), "team-a")
        );
        assert_eq!(
            r("namespaces/default/sandboxes/web"),
            to(&format!("{APIS}sandboxes/web"), "default")
        );
        assert_eq!(
            r("namespaces/team-a/snapshots/import"),
            to(&format!("{APIS}snapshots/import"), "team-a")
        );
        assert_eq!(
            r("namespaces/team-a/sandboxes/web/files/a.txt"),
            to(&format!("{APIS}sandboxes/team-a.web/files/a.txt"), "team-a")
        );
        assert_eq!(r("sandboxes/web/files/a.txt"), Rewritten::Unchanged);
        assert_eq!(r("webhooks/w"), Rewritten::Unchanged);
        assert_eq!(rewrite_path("/v1/sandboxes/a.b"), Rewritten::Unchanged);
    }

    #[test]
    fn keys_and_bad_namespaces_are_refused() {
        let r = |p: &str| rewrite_path(&format!("{APIS}{p}"));
        assert!(matches!(r("sandboxes/team-a.web"), Rewritten::NotFound(_)));
        assert!(matches!(
            r("namespaces/team-a/sandboxes/x.web"),
            Rewritten::NotFound(_)
        ));
        assert!(matches!(
            r("namespaces/Team/sandboxes"),
            Rewritten::NotFound(_)
        ));
        assert!(matches!(
            r("namespaces/team-a/webhooks"),
            Rewritten::NotFound(_)
        ));
        assert!(matches!(r("namespaces/team-a"), Rewritten::NotFound(_)));
    }
}
