//! Authorization: who a key is (a [`Principal`]: its name, [`Role`] and the namespaces it
//! reaches), what a request asks for ([`classify`]: read or write, of one object, a collection or
//! something of the whole server), and whether it may ([`Principal::decide`]). Scoped keys come
//! from the keys file, loaded and reloaded by [`keyring`], which also revokes the principals of
//! keys that disappear or change so that open streams end.
//!
//! It never sees a key (only SHA-256 digests), knows nothing of HTTP beyond a method and a path,
//! and never touches the store: handlers filter what they list with [`Principal::reaches`].
//! An object's namespace is read from its key in the path (namespaced paths are rewritten to keys
//! before routing: `crate::api::namespace`).

pub mod keyring;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use crate::resource::keyfile::Role;

use crate::resource::split_key;
pub use crate::resource::DEFAULT_NAMESPACE;

/// The namespace of an object.
pub fn namespace_of(metadata: &crate::resource::ObjectMeta) -> &str {
    &metadata.namespace
}

/// The caller of a request, as its key makes it.
#[derive(Debug, Clone)]
pub struct Principal {
    name: Arc<str>,
    role: Role,
    /// `None`: every namespace.
    namespaces: Option<Arc<[String]>>,
    /// Cancelled when the key is revoked or changed; never for keys that cannot change.
    revoked: Option<CancellationToken>,
}

impl Principal {
    /// An admin of every namespace that stays valid while the server runs (the keys of the
    /// settings, the generated key, or everyone when authentication is off).
    pub fn admin(name: &str) -> Principal {
        Principal {
            name: Arc::from(name),
            role: Role::Admin,
            namespaces: None,
            revoked: None,
        }
    }

    /// A key of the keys file.
    pub fn scoped(
        name: &str,
        role: Role,
        namespaces: &[String],
        revoked: CancellationToken,
    ) -> Principal {
        let all = namespaces.iter().any(|n| n == "*");
        Principal {
            name: Arc::from(name),
            role,
            namespaces: (!all).then(|| Arc::from(namespaces.to_vec())),
            revoked: Some(revoked),
        }
    }

    /// The key's name (for the audit trail and messages; never the key).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether objects of `namespace` exist for this key.
    pub fn reaches(&self, namespace: &str) -> bool {
        match &self.namespaces {
            None => true,
            Some(list) => list.iter().any(|n| n == namespace),
        }
    }

    /// The namespace calls without one act in (`/v1`): the key's first.
    pub fn home_namespace(&self) -> &str {
        match &self.namespaces {
            Some(list) if !list.is_empty() => &list[0],
            _ => DEFAULT_NAMESPACE,
        }
    }

    /// Cancelled when the key stops being valid; `None` for keys that cannot be revoked.
    pub fn revocation(&self) -> Option<CancellationToken> {
        self.revoked.clone()
    }

    /// Runs `work` (a WebSocket session, say) until it ends or this key is revoked, whichever
    /// is first; `None` when the key was revoked (and `work` dropped).
    pub async fn while_valid<F: std::future::Future>(&self, work: F) -> Option<F::Output> {
        match &self.revoked {
            None => Some(work.await),
            Some(token) => tokio::select! {
                output = work => Some(output),
                _ = token.cancelled() => None,
            },
        }
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.as_ref().is_some_and(|t| t.is_cancelled())
    }

    /// Whether this key may make `request`.
    pub fn decide(&self, request: &Classified) -> Decision {
        if self.is_revoked() {
            return Decision::Unauthenticated;
        }
        let needed = match request.access {
            Access::Read => Role::View,
            Access::Write => Role::Edit,
        };
        match &request.target {
            Target::Server => {
                if self.role == Role::Admin {
                    Decision::Allow
                } else {
                    Decision::Forbidden(format!(
                        "key {:?} (role {}) may not use this: it is for admin keys only",
                        self.name(),
                        self.role.as_str()
                    ))
                }
            }
            Target::Collection { namespace } => {
                if self.role < needed {
                    Decision::Forbidden(self.too_weak(request.access))
                } else if request.access == Access::Write && !self.reaches(namespace) {
                    Decision::Forbidden(format!(
                        "key {:?} may not create objects in namespace {namespace:?}",
                        self.name()
                    ))
                } else {
                    // Reads of a collection are filtered by the handler.
                    Decision::Allow
                }
            }
            Target::Object { namespace, missing } => {
                if !self.reaches(namespace) {
                    Decision::NotFound(missing.clone())
                } else if self.role < needed {
                    Decision::Forbidden(self.too_weak(request.access))
                } else {
                    Decision::Allow
                }
            }
        }
    }

    fn too_weak(&self, access: Access) -> String {
        let what = match access {
            Access::Read => "read",
            Access::Write => "change or run anything",
        };
        format!(
            "key {:?} has role {} and may not {what} here",
            self.name(),
            self.role.as_str()
        )
    }
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Get, list, watch: nothing changes and nothing inside a sandbox is reached.
    Read,
    /// Anything else: changes, exec, files, processes' output, ports, exports.
    Write,
}

/// What a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One named object (or something inside it); `missing` is the message of its 404.
    Object { namespace: String, missing: String },
    /// A collection: a list or watch (filtered), or a create.
    Collection { namespace: String },
    /// Something of the whole server (webhooks, metrics, the audit, unknown routes).
    Server,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub access: Access,
    pub target: Target,
}

/// What to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 404 with this message (the object is outside the key's reach: it does not exist for it).
    NotFound(String),
    /// 403 with this message.
    Forbidden(String),
    /// 401: the key was revoked while the request was on its way.
    Unauthenticated,
}

/// Reaching into the sandbox of key `key` (its ports, through a preview host).
pub fn inside_sandbox(key: &str) -> Classified {
    let (namespace, name) = split_key(key);
    Classified {
        access: Access::Write,
        target: Target::Object {
            namespace: namespace.to_string(),
            missing: format!("sandbox {name:?} not found"),
        },
    }
}

/// The resource API's root.
const APIS: &str = "/apis/agent-sandbox.io/v1/";

/// Kind of a resource API plural, for the 404 message the handlers give.
fn kind_of(plural: &str) -> Option<&'static str> {
    Some(match plural {
        "sandboxes" => "Sandbox",
        "snapshots" => "Snapshot",
        "forks" => "Fork",
        "sandboxpools" => "SandboxPool",
        "sandboxtemplates" => "SandboxTemplate",
        "resourcequotas" => "ResourceQuota",
        "secrets" => "Secret",
        "events" => "Event",
        _ => return None,
    })
}

/// What `method` on `path` asks for. Anything not recognized is [`Target::Server`] (admin only).
/// Objects of the resource API are named by their keys (the namespace is in the key);
/// `collection` is the namespace a namespaced path named, `home` the namespace of calls that
/// name none (`/v1`, E2B, un-namespaced creates): the key's first.
pub fn classify(method: &str, path: &str, collection: Option<&str>, home: &str) -> Classified {
    let read_method = matches!(method, "GET" | "HEAD");
    let access = |read: bool| if read { Access::Read } else { Access::Write };
    let ns = collection.unwrap_or(home).to_string();
    let home = home.to_string();
    let server = Classified {
        access: access(read_method),
        target: Target::Server,
    };
    if let Some(rest) = path.strip_prefix(APIS) {
        let segments: Vec<&str> = rest.split('/').collect();
        if segments.first() == Some(&"resourcequotas") && !read_method {
            // A namespace's keys see its quotas; only an admin sets them.
            return server;
        }
        match segments.as_slice() {
            ["errors"] => Classified {
                access: access(read_method),
                target: Target::Collection { namespace: ns },
            },
            [plural] if kind_of(plural).is_some() => Classified {
                access: access(read_method),
                target: Target::Collection { namespace: ns },
            },
            ["snapshots", "import"] => Classified {
                access: Access::Write,
                target: Target::Collection { namespace: ns },
            },
            [plural, name, sub @ ..] if kind_of(plural).is_some() => {
                let kind = kind_of(plural).unwrap_or("object");
                let read = read_method
                    && matches!(
                        (*plural, sub),
                        (_, [])
                            | ("sandboxes", ["egress" | "stats" | "processes"])
                            | ("sandboxes", ["stats", "history"])
                            | ("sandboxes", ["processes", _])
                    );
                let (namespace, name) = split_key(name);
                let missing = if sub.is_empty() {
                    format!("{kind} {name:?} not found")
                } else {
                    format!("{} {name:?} not found", kind.to_lowercase())
                };
                Classified {
                    access: access(read),
                    target: Target::Object {
                        namespace: namespace.to_string(),
                        missing,
                    },
                }
            }
            _ => server,
        }
    } else if let Some(rest) = path.strip_prefix("/v1/") {
        let segments: Vec<&str> = rest.split('/').collect();
        match segments.as_slice() {
            ["sandboxes" | "snapshots"] => Classified {
                access: access(read_method),
                target: Target::Collection {
                    namespace: home.clone(),
                },
            },
            [plural @ ("sandboxes" | "snapshots"), id, sub @ ..] => {
                let singular = plural.trim_end_matches("es").trim_end_matches('s');
                // A `/v1` ID is the object's key: its namespace is in it.
                Classified {
                    access: access(read_method && sub.is_empty()),
                    target: Target::Object {
                        namespace: split_key(id).0.to_string(),
                        missing: format!("{singular} {id} not found"),
                    },
                }
            }
            _ => server,
        }
    } else if let Some(rest) = path.strip_prefix("/e2b/") {
        // E2B's control API acts in the key's first namespace, where its IDs are plain names.
        let rest = rest.strip_prefix("v2/").unwrap_or(rest);
        match rest.split('/').collect::<Vec<_>>().as_slice() {
            ["sandboxes" | "snapshots"] => Classified {
                access: access(read_method),
                target: Target::Collection {
                    namespace: home.clone(),
                },
            },
            [plural @ ("sandboxes" | "templates"), id, sub @ ..] => Classified {
                access: access(read_method && sub.is_empty()),
                target: Target::Object {
                    namespace: home.clone(),
                    missing: format!(
                        "{} {id} not found",
                        if *plural == "sandboxes" {
                            "sandbox"
                        } else {
                            "snapshot"
                        }
                    ),
                },
            },
            _ => server,
        }
    } else {
        server
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(role: Role, namespaces: &[&str]) -> Principal {
        let ns: Vec<String> = namespaces.iter().map(|s| s.to_string()).collect();
        Principal::scoped("k", role, &ns, CancellationToken::new())
    }

    fn decide(p: &Principal, method: &str, path: &str) -> Decision {
        p.decide(&classify(method, path, None, p.home_namespace()))
    }

    #[test]
    fn view_reads_but_never_runs_or_writes() {
        let view = scoped(Role::View, &["default"]);
        let allow = |m, p| assert_eq!(decide(&view, m, p), Decision::Allow, "{m} {p}");
        let deny = |m, p| {
            assert!(
                matches!(decide(&view, m, p), Decision::Forbidden(_)),
                "{m} {p}"
            )
        };
        allow("GET", "/apis/agent-sandbox.io/v1/sandboxes");
        allow("GET", "/apis/agent-sandbox.io/v1/sandboxes/a");
        allow("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/stats");
        allow("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/stats/history");
        allow("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/processes");
        allow("GET", "/apis/agent-sandbox.io/v1/events");
        allow("GET", "/v1/sandboxes/a");
        allow("GET", "/v1/snapshots");
        deny("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/exec");
        deny("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/portforward");
        deny("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/proxy/80/x");
        deny(
            "GET",
            "/apis/agent-sandbox.io/v1/sandboxes/a/processes/p/output",
        );
        deny(
            "GET",
            "/apis/agent-sandbox.io/v1/sandboxes/a/processes/p/attach",
        );
        deny("GET", "/apis/agent-sandbox.io/v1/snapshots/s/export");
        deny("POST", "/apis/agent-sandbox.io/v1/sandboxes");
        deny("DELETE", "/apis/agent-sandbox.io/v1/sandboxes/a");
        deny("POST", "/v1/sandboxes/a/exec");
        deny("GET", "/v1/sandboxes/a/files");
        deny("PUT", "/v1/sandboxes/a/files");
        deny("GET", "/metrics");
        deny("GET", "/apis/agent-sandbox.io/v1/webhooks");
    }

    #[test]
    fn edit_elsewhere_finds_nothing_and_creates_nothing() {
        let other = scoped(Role::Edit, &["team-b"]);
        assert_eq!(
            decide(&other, "GET", "/apis/agent-sandbox.io/v1/sandboxes/a"),
            Decision::NotFound("Sandbox \"a\" not found".into())
        );
        assert_eq!(
            decide(&other, "POST", "/v1/sandboxes/a/exec"),
            Decision::NotFound("sandbox a not found".into())
        );
        assert_eq!(
            decide(&other, "POST", "/v1/snapshots/s/fork"),
            Decision::NotFound("snapshot s not found".into())
        );
        // An un-namespaced create goes to the key's own namespace; a namespaced one elsewhere
        // is refused.
        assert_eq!(
            decide(&other, "POST", "/apis/agent-sandbox.io/v1/sandboxes"),
            Decision::Allow
        );
        assert!(matches!(
            other.decide(&classify(
                "POST",
                "/apis/agent-sandbox.io/v1/sandboxes",
                Some("default"),
                other.home_namespace()
            )),
            Decision::Forbidden(_)
        ));
        // Lists are allowed and filtered by the handler.
        assert_eq!(
            decide(&other, "GET", "/apis/agent-sandbox.io/v1/sandboxes"),
            Decision::Allow
        );
        assert!(!other.reaches(DEFAULT_NAMESPACE));
        assert_eq!(other.home_namespace(), "team-b");
        // E2B's calls act in the key's first namespace (the handlers look IDs up there).
        for (method, path) in [
            ("POST", "/e2b/sandboxes"),
            ("GET", "/e2b/v2/sandboxes"),
            ("GET", "/e2b/sandboxes/a"),
            ("POST", "/e2b/sandboxes/a/connect"),
            ("GET", "/e2b/snapshots"),
            ("DELETE", "/e2b/templates/snap_1"),
        ] {
            assert_eq!(
                decide(&other, method, path),
                Decision::Allow,
                "{method} {path}"
            );
        }
        let view = scoped(Role::View, &["team-b"]);
        assert!(matches!(
            decide(&view, "POST", "/e2b/sandboxes/a/connect"),
            Decision::Forbidden(_)
        ));
        assert_eq!(decide(&view, "GET", "/e2b/sandboxes/a"), Decision::Allow);
    }

    #[test]
    fn a_namespace_sees_its_quotas_and_only_an_admin_sets_them() {
        let edit = scoped(Role::Edit, &["default"]);
        let quotas = "/apis/agent-sandbox.io/v1/resourcequotas";
        assert_eq!(decide(&edit, "GET", quotas), Decision::Allow);
        assert_eq!(
            decide(&edit, "GET", &format!("{quotas}/team")),
            Decision::Allow
        );
        for (m, p) in [
            ("POST", quotas.to_string()),
            ("PUT", format!("{quotas}/team")),
            ("PATCH", format!("{quotas}/team")),
            ("DELETE", format!("{quotas}/team")),
        ] {
            assert!(
                matches!(decide(&edit, m, &p), Decision::Forbidden(_)),
                "{m} {p}"
            );
        }
        let admin = Principal::admin("root");
        assert_eq!(
            decide(&admin, "PUT", &format!("{quotas}/team")),
            Decision::Allow
        );
    }

    #[test]
    fn edit_at_home_does_all_but_server_things_and_admin_everything() {
        let edit = scoped(Role::Edit, &["default"]);
        for (m, p) in [
            ("POST", "/v1/sandboxes/a/exec"),
            ("GET", "/apis/agent-sandbox.io/v1/sandboxes/a/exec"),
            ("POST", "/apis/agent-sandbox.io/v1/snapshots/import"),
            ("DELETE", "/apis/agent-sandbox.io/v1/forks/f"),
        ] {
            assert_eq!(decide(&edit, m, p), Decision::Allow, "{m} {p}");
        }
        assert!(matches!(
            decide(&edit, "POST", "/apis/agent-sandbox.io/v1/webhooks"),
            Decision::Forbidden(_)
        ));
        assert!(matches!(
            decide(&edit, "GET", "/apis/agent-sandbox.io/v1/audit"),
            Decision::Forbidden(_)
        ));
        let admin = scoped(Role::Admin, &["*"]);
        assert_eq!(decide(&admin, "GET", "/metrics"), Decision::Allow);
        assert_eq!(
            decide(&Principal::admin("x"), "POST", "/anything"),
            Decision::Allow
        );
    }

    #[test]
    fn a_revoked_key_is_refused_everything() {
        let token = CancellationToken::new();
        let p = Principal::scoped("k", Role::Admin, &["*".into()], token.clone());
        token.cancel();
        assert_eq!(
            decide(&p, "GET", "/v1/sandboxes"),
            Decision::Unauthenticated
        );
    }
}
