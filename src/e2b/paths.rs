//! How E2B's notions of user and home map onto a sandbox. E2B's SDK runs everything as `user`
//! by default, whose home `/home/user` is where relative paths land; here `user` is the sandbox
//! user and its home is the persistent workspace, so `/home/user/…`, `~/…` and relative paths
//! all mean `/workspace/…` (and are in snapshots). `root` is never granted: asking for it is
//! refused with a message saying so, never silently downgraded.

use base64::Engine as _;

use crate::processes::DEFAULT_WORKDIR;

/// E2B's home directory of `user`.
pub const E2B_HOME: &str = "/home/user";
/// The user E2B's SDK names by default.
pub const E2B_USER: &str = "user";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UserError {
    #[error(
        "root is never granted in these sandboxes: commands and files run as the sandbox user \
         (E2B's `user`); drop user=\"root\""
    )]
    Root,
    #[error("unknown user {0:?}: this server runs everything as the sandbox user, E2B's `user`")]
    Unknown(String),
    #[error("the Authorization header is not `Basic base64(user:)`")]
    Malformed,
}

/// Checks a user name asked for (none: the default, `user`).
pub fn check_user(user: Option<&str>) -> Result<(), UserError> {
    match user {
        None | Some("") | Some(E2B_USER) => Ok(()),
        Some("root") => Err(UserError::Root),
        Some(other) => Err(UserError::Unknown(other.to_string())),
    }
}

/// The user envd's `Authorization: Basic base64("name:")` names, if the header is there.
pub fn user_from_basic(header: Option<&str>) -> Result<Option<String>, UserError> {
    let Some(value) = header else {
        return Ok(None);
    };
    let (scheme, encoded) = value.trim().split_once(' ').ok_or(UserError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(UserError::Malformed);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| UserError::Malformed)?;
    let text = String::from_utf8(bytes).map_err(|_| UserError::Malformed)?;
    let name = text.split_once(':').map_or(text.as_str(), |(n, _)| n);
    Ok(Some(name.to_string()))
}

/// An E2B path as a path in the sandbox.
pub fn resolve(path: &str) -> String {
    let path = path.trim();
    let home_relative = if path.is_empty() || path == "~" || path == E2B_HOME {
        Some("")
    } else if let Some(rest) = path.strip_prefix("~/") {
        Some(rest)
    } else if let Some(rest) = path
        .strip_prefix(E2B_HOME)
        .and_then(|r| r.strip_prefix('/'))
    {
        Some(rest)
    } else if !path.starts_with('/') {
        Some(path)
    } else {
        None
    };
    match home_relative {
        Some("") => DEFAULT_WORKDIR.to_string(),
        Some(rest) => format!("{DEFAULT_WORKDIR}/{}", rest.trim_end_matches('/')),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_and_relative_paths_are_the_workspace() {
        assert_eq!(resolve(""), "/workspace");
        assert_eq!(resolve("/home/user"), "/workspace");
        assert_eq!(resolve("/home/user/a/b.txt"), "/workspace/a/b.txt");
        assert_eq!(resolve("~/x"), "/workspace/x");
        assert_eq!(resolve("rel/y"), "/workspace/rel/y");
        assert_eq!(resolve("/home/username"), "/home/username");
        assert_eq!(resolve("/tmp/z"), "/tmp/z");
    }

    #[test]
    fn root_is_refused_and_user_taken() {
        assert_eq!(check_user(Some("root")), Err(UserError::Root));
        assert_eq!(check_user(Some("user")), Ok(()));
        assert_eq!(check_user(None), Ok(()));
        assert!(matches!(
            check_user(Some("bob")),
            Err(UserError::Unknown(_))
        ));
        // base64("root:")
        assert_eq!(
            user_from_basic(Some("Basic cm9vdDo=")).unwrap().as_deref(),
            Some("root")
        );
        assert_eq!(user_from_basic(None).unwrap(), None);
        assert!(user_from_basic(Some("Bearer x")).is_err());
    }
}
