//! Path rules of the `/v1` contract: relative paths are under `/workspace`, everything is
//! normalized lexically, NUL and empty paths are refused.

use super::DataPlaneError;

pub const WORKSPACE: &str = "/workspace";

/// Normalizes a request path: relative → under `/workspace`; `.` and `..` resolved lexically (never
/// above `/`); repeated slashes collapsed. Refuses empty paths and NUL bytes.
pub fn normalize(path: &str) -> Result<String, DataPlaneError> {
    if path.is_empty() {
        return Err(DataPlaneError::InvalidRequest(
            "path must not be empty".into(),
        ));
    }
    if path.contains('\0') {
        return Err(DataPlaneError::InvalidRequest(
            "path must not contain NUL".into(),
        ));
    }
    let absolute = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKSPACE}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in absolute.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Whether a normalized path is strictly inside `/workspace` (not `/workspace` itself).
pub fn is_strictly_in_workspace(normalized: &str) -> bool {
    normalized
        .strip_prefix(WORKSPACE)
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_the_contract() {
        assert_eq!(normalize("a/b").unwrap(), "/workspace/a/b");
        assert_eq!(normalize("./a//b/").unwrap(), "/workspace/a/b");
        assert_eq!(normalize("../etc/passwd").unwrap(), "/etc/passwd");
        assert_eq!(normalize("/../../x").unwrap(), "/x");
        assert_eq!(normalize("/workspace").unwrap(), "/workspace");
        assert!(normalize("").is_err());
        assert!(normalize("a\0b").is_err());
    }

    #[test]
    fn workspace_confinement_is_strict() {
        assert!(is_strictly_in_workspace("/workspace/a"));
        assert!(!is_strictly_in_workspace("/workspace"));
        assert!(!is_strictly_in_workspace("/workspacex/a"));
        assert!(!is_strictly_in_workspace("/etc/passwd"));
    }
}
