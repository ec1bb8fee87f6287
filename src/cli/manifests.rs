//! Reading manifests for `apply`, `delete -f`, `diff` and `validate`: a file, a folder (walked
//! recursively for `*.yaml`, `*.yml` and `*.json`, hidden entries skipped) or `-` for standard
//! input, every document parsed and validated through `resource::yaml`.
//!
//! This module never parses YAML itself and never talks to a server.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::resource::yaml::{self, DocumentError};
use crate::resource::{AnyResource, Kind};

/// A document that parsed and validated, with where it came from.
#[derive(Clone, Debug)]
pub struct Document {
    pub resource: AnyResource,
    pub file: PathBuf,
    pub line: usize,
}

impl Document {
    /// `sandbox/demo`, as kubectl names objects.
    pub fn reference(&self) -> String {
        reference(self.resource.kind(), self.resource.name())
    }
}

/// Everything read from the given paths.
#[derive(Debug, Default)]
pub struct Manifests {
    pub documents: Vec<Document>,
    /// One line per problem: `file:line: field: message`.
    pub errors: Vec<String>,
    pub files: usize,
}

/// `sandbox/demo`.
pub fn reference(kind: Kind, name: &str) -> String {
    format!("{}/{name}", kind.as_str().to_ascii_lowercase())
}

/// Reads every document under `paths`. Problems are collected, not fatal, so that one run reports
/// all of them.
pub fn read(paths: &[PathBuf]) -> Manifests {
    let mut out = Manifests::default();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut bytes = Vec::new();
            match std::io::stdin()
                .take(yaml::MAX_DOCUMENT_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
            {
                Ok(_) => add_file(&mut out, &bytes, Path::new("<stdin>")),
                Err(e) => out.errors.push(format!("<stdin>: cannot read: {e}")),
            }
            continue;
        }
        let metadata = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => {
                out.errors
                    .push(format!("{}: {}", path.display(), io_reason(&e)));
                continue;
            }
        };
        if metadata.is_dir() {
            let mut files = Vec::new();
            if let Err(e) = walk(path, &mut files) {
                out.errors.push(e);
            }
            files.sort();
            if files.is_empty() {
                out.errors.push(format!(
                    "{}: no *.yaml, *.yml or *.json files in this folder",
                    path.display()
                ));
            }
            for file in files {
                read_one(&mut out, &file);
            }
        } else {
            read_one(&mut out, path);
        }
    }
    out
}

fn read_one(out: &mut Manifests, file: &Path) {
    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    if size > yaml::MAX_DOCUMENT_BYTES as u64 {
        out.errors.push(format!(
            "{}: file is {size} bytes; the limit is {}",
            file.display(),
            yaml::MAX_DOCUMENT_BYTES
        ));
        return;
    }
    match std::fs::read(file) {
        Ok(bytes) => add_file(out, &bytes, file),
        Err(e) => out
            .errors
            .push(format!("{}: {}", file.display(), io_reason(&e))),
    }
}

fn add_file(out: &mut Manifests, bytes: &[u8], file: &Path) {
    out.files += 1;
    let parsed = yaml::parse_file(bytes, file);
    out.errors
        .extend(parsed.errors.iter().map(DocumentError::to_string));
    for doc in parsed.documents {
        out.documents.push(Document {
            resource: doc.resource,
            file: file.to_path_buf(),
            line: doc.line,
        });
    }
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("{}: {}", dir.display(), io_reason(&e)))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {}", dir.display(), io_reason(&e)))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows links like kubectl does; a loop ends at the OS's path-length limit with an error.
        if path.is_dir() {
            walk(&path, files)?;
        } else if [".yaml", ".yml", ".json"].iter().any(|s| name.ends_with(s)) {
            files.push(path);
        }
    }
    Ok(())
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or folder".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str =
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: NAME\nspec: {}\n";

    #[test]
    fn folders_are_walked_recursively_in_order_and_hidden_entries_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub/.git")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), DOC.replace("NAME", "b")).unwrap();
        std::fs::write(dir.path().join("sub/a.yml"), DOC.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("sub/.git/x.yaml"), "junk: [").unwrap();
        std::fs::write(dir.path().join("README.md"), "not a manifest").unwrap();
        let read = read(&[dir.path().to_path_buf()]);
        assert!(read.errors.is_empty(), "{:?}", read.errors);
        let names: Vec<_> = read.documents.iter().map(|d| d.reference()).collect();
        assert_eq!(names, ["sandbox/b", "sandbox/a"]);
        assert_eq!(read.files, 2);
    }

    #[test]
    fn errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.yaml");
        std::fs::write(
            &file,
            DOC.replace("NAME", "x")
                .replace("spec: {}", "spec:\n  cpus: -1"),
        )
        .unwrap();
        let read = read(&[file.clone(), dir.path().join("missing.yaml")]);
        assert_eq!(read.errors.len(), 2, "{:?}", read.errors);
        assert!(
            read.errors[0].starts_with(&format!("{}:6: spec.cpus", file.display())),
            "{}",
            read.errors[0]
        );
        assert!(read.errors[1].contains("no such file"));
    }
}
