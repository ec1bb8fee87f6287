//! A `Secret`'s value, from wherever it comes: the store (given through the API) or, for a Secret
//! declared in a folder, the server's environment or a file (`spec.valueFrom`). Values are read
//! when needed and never kept, logged or put in an error: an error names the Secret and where its
//! value should have come from, nothing more.

use crate::resource::{Kind, ValueFrom};
use crate::store::Store;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("Secret {0:?} not found")]
    NotFound(String),
    #[error(
        "Secret {0:?} has no value: give one with `value` in a PUT, or declare spec.valueFrom"
    )]
    NoValue(String),
    #[error("Secret {name:?}: the server has no environment variable {variable}")]
    Env { name: String, variable: String },
    #[error("Secret {name:?}: cannot read {file}: {reason}")]
    File {
        name: String,
        file: String,
        reason: String,
    },
}

/// The value of Secret `name`.
pub fn value_of(store: &Store, name: &str) -> Result<Vec<u8>, SecretError> {
    let entry = store
        .get(Kind::Secret, name)
        .filter(|e| e.resource.metadata().deletion_timestamp.is_none())
        .ok_or_else(|| SecretError::NotFound(name.to_string()))?;
    let secret = entry
        .resource
        .as_secret()
        .ok_or_else(|| SecretError::NotFound(name.to_string()))?;
    match &secret.spec.value_from {
        Some(ValueFrom::Env(variable)) => std::env::var_os(variable)
            .map(|v| v.into_encoded_bytes())
            .ok_or_else(|| SecretError::Env {
                name: name.to_string(),
                variable: variable.clone(),
            }),
        Some(ValueFrom::File(path)) => match std::fs::read(path) {
            Ok(mut bytes) => {
                if bytes.ends_with(b"\n") {
                    bytes.pop();
                }
                Ok(bytes)
            }
            Err(e) => Err(SecretError::File {
                name: name.to_string(),
                file: path.display().to_string(),
                reason: e.kind().to_string(),
            }),
        },
        None => store
            .secret_value(name)
            .ok_or_else(|| SecretError::NoValue(name.to_string())),
    }
}
