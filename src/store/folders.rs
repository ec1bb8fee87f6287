//! Reading manifest folders: scanning `*.yaml`/`*.yml` files (recursively) into documents and
//! errors, and merging a fresh scan with the previous one so that a bad file or document keeps its
//! last good version. Pure file reading and bookkeeping: it assigns no metadata, writes nothing and
//! decides nothing about which source owns a name (that is the index's job).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::resource::yaml::{parse_file, DocumentError, ParsedFile, MAX_DOCUMENT_BYTES};
use crate::resource::{is_valid_name, AnyResource, Kind, DEFAULT_NAMESPACE};

/// Deeper trees than this are not walked; no real manifest repository gets close.
const MAX_DEPTH: usize = 32;

/// One good document: its declaration only (server metadata and status stripped).
#[derive(Clone, Debug)]
pub(super) struct Declared {
    pub resource: AnyResource,
    pub file: PathBuf,
    pub line: usize,
}

impl Declared {
    pub fn key(&self) -> (Kind, String) {
        (self.resource.kind(), self.resource.key())
    }
}

/// What one source currently declares, after the last-good rules were applied.
#[derive(Clone, Debug, Default)]
pub(super) struct SourceDocs {
    pub files: BTreeMap<PathBuf, Vec<Declared>>,
    pub errors: Vec<DocumentError>,
}

impl SourceDocs {
    pub fn count(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }
}

#[derive(Debug)]
pub(super) enum FileScan {
    Parsed(ParsedFile),
    Unreadable(DocumentError),
}

/// A raw read of a folder.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub files: BTreeMap<PathBuf, FileScan>,
    /// Problems that belong to no document: unreadable subfolders, refused symlinks.
    pub errors: Vec<DocumentError>,
    /// Subfolders that could not be listed: what they held before is kept.
    pub unreadable_dirs: Vec<PathBuf>,
}

pub(super) fn error_at(file: &Path, message: String) -> DocumentError {
    DocumentError {
        file: Some(file.to_path_buf()),
        line: None,
        field: None,
        message,
        identity: None,
    }
}

fn is_yaml_name(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Reads every manifest under `root`. Fails only when `root` itself cannot be read; everything
/// below it that goes wrong becomes an error in the scan.
pub(super) fn scan_folder(root: &Path) -> std::io::Result<Scan> {
    let canonical_root = std::fs::canonicalize(root)?;
    let mut scan = Scan::default();
    walk(root, &canonical_root, &mut scan, 0)?;
    Ok(scan)
}

fn walk(dir: &Path, root: &Path, scan: &mut Scan, depth: usize) -> std::io::Result<()> {
    let listing = std::fs::read_dir(dir).and_then(|rd| rd.collect::<Result<Vec<_>, _>>());
    let mut entries = match listing {
        Ok(entries) => entries,
        Err(e) if depth == 0 => return Err(e),
        Err(e) => {
            scan.errors
                .push(error_at(dir, format!("cannot read folder: {e}")));
            scan.unreadable_dirs.push(dir.to_path_buf());
            return Ok(());
        }
    };
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        // Hidden names: temp files of atomic writes, editors' swap files, `.git`.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                scan.errors.push(error_at(
                    &path,
                    format!("folder nesting deeper than {MAX_DEPTH}; not read"),
                ));
                scan.unreadable_dirs.push(path);
            } else {
                walk(&path, root, scan, depth + 1)?;
            }
            continue;
        }
        if !is_yaml_name(&path) {
            // Linked folders are never walked (their targets inside the tree are walked anyway);
            // one that leads outside is worth telling about.
            if file_type.is_symlink() {
                if let Ok(target) = std::fs::canonicalize(&path) {
                    if target.is_dir() && !target.starts_with(root) {
                        scan.errors.push(outside(&path, &target));
                    }
                }
            }
            continue;
        }
        // Resolve every file, symlink or not: a folder replaced by a symlink mid-scan must not
        // lead outside the watched tree either. Reading the resolved path closes the window
        // between the check and the read.
        let target = match std::fs::canonicalize(&path) {
            Ok(target) => target,
            Err(e) => {
                let message = if file_type.is_symlink() {
                    format!("broken symlink: {e}")
                } else {
                    format!("cannot read: {e}")
                };
                scan.files
                    .insert(path.clone(), FileScan::Unreadable(error_at(&path, message)));
                continue;
            }
        };
        if !target.starts_with(root) {
            scan.errors.push(outside(&path, &target));
            continue;
        }
        if !target.is_file() {
            continue;
        }
        let read = read_limited(&target)
            .map(|bytes| FileScan::Parsed(parse_file(&bytes, &path)))
            .unwrap_or_else(|e| FileScan::Unreadable(error_at(&path, format!("cannot read: {e}"))));
        scan.files.insert(path, read);
    }
    Ok(())
}

fn outside(link: &Path, target: &Path) -> DocumentError {
    error_at(
        link,
        format!(
            "symlink points outside the watched folder (to {}); not followed",
            target.display()
        ),
    )
}

/// Reads at most one byte more than the parser accepts, so that a huge file costs nothing.
fn read_limited(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_DOCUMENT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The outcome of [`merge_scan`].
pub(super) struct Merged {
    pub docs: SourceDocs,
    /// The scan found files but no documents at all where there were some: the previous
    /// documents were kept instead.
    pub kept_because_empty: bool,
}

/// Combines a fresh scan with what the source declared before:
///
/// - a good document replaces its previous version;
/// - a bad document keeps the previous version of the same kind and name from the same file; a
///   bad document whose identity cannot be read keeps everything its file declared before that
///   the new read does not declare (we cannot tell which one it was);
/// - an unreadable file or subfolder keeps everything it declared before;
/// - a name declared twice in one file is an error for the second declaration;
/// - a source whose files suddenly hold no documents at all keeps the previous documents.
pub(super) fn merge_scan(prev: &SourceDocs, scan: Scan, namespace: Option<&str>) -> Merged {
    let mut docs = SourceDocs {
        files: BTreeMap::new(),
        errors: scan.errors,
    };
    let found_files = !scan.files.is_empty();
    for (path, file) in scan.files {
        let previous = prev.files.get(&path).map(Vec::as_slice).unwrap_or(&[]);
        let (mut good, errors, keep_all) = match file {
            FileScan::Unreadable(err) => (Vec::new(), vec![err], true),
            FileScan::Parsed(parsed) => read_documents(&path, parsed, namespace),
        };
        let declared: BTreeSet<_> = good.iter().map(Declared::key).collect();
        let failed: BTreeSet<_> = errors.iter().filter_map(|e| e.identity.clone()).collect();
        for old in previous {
            let key = old.key();
            if !declared.contains(&key) && (keep_all || failed.contains(&key)) {
                good.push(old.clone());
            }
        }
        docs.errors.extend(errors);
        if !good.is_empty() {
            docs.files.insert(path, good);
        }
    }
    for (path, old) in &prev.files {
        if scan.unreadable_dirs.iter().any(|d| path.starts_with(d)) {
            docs.files
                .entry(path.clone())
                .or_insert_with(|| old.clone());
        }
    }
    let kept_because_empty = found_files && docs.count() == 0 && prev.count() > 0;
    if kept_because_empty {
        docs.files = prev.files.clone();
    }
    Merged {
        docs,
        kept_because_empty,
    }
}

/// Splits one parsed file into good declarations and errors. The flag says whether an error could
/// not be tied to a document. In a folder bound to `namespace`, documents that name no namespace
/// (or `default`) are in it, and a document naming another is an error.
fn read_documents(
    path: &Path,
    parsed: ParsedFile,
    namespace: Option<&str>,
) -> (Vec<Declared>, Vec<DocumentError>, bool) {
    let mut errors = parsed.errors;
    let keep_all = errors.iter().any(|e| e.identity.is_none());
    let mut good: Vec<Declared> = Vec::new();
    for doc in parsed.documents {
        let mut resource = doc.resource.declaration();
        if let Some(bound) = namespace {
            let declared = resource.namespace().to_string();
            if declared != DEFAULT_NAMESPACE && declared != bound {
                errors.push(DocumentError {
                    file: Some(path.to_path_buf()),
                    line: Some(doc.line),
                    field: Some("metadata.namespace".into()),
                    message: format!(
                        "{declared:?}: this folder is bound to namespace {bound:?}; \
                         leave metadata.namespace out or name {bound:?}"
                    ),
                    identity: Some((resource.kind(), resource.key())),
                });
                continue;
            }
            resource.metadata_mut().namespace = bound.to_string();
        }
        let (kind, name) = (resource.kind(), resource.key());
        let fail = |message: String| DocumentError {
            file: Some(path.to_path_buf()),
            line: Some(doc.line),
            field: Some("metadata.name".into()),
            message,
            identity: Some((kind, name.clone())),
        };
        if !is_valid_name(resource.name()) {
            errors.push(fail(if name.is_empty() {
                "a name is required in a manifest file".into()
            } else {
                format!("{name:?} is not a valid name")
            }));
            continue;
        }
        if let Some(first) = good.iter().find(|d| d.key() == (kind, name.clone())) {
            errors.push(fail(format!(
                "{kind} {name:?} is declared twice in this file (first at line {})",
                first.line
            )));
            continue;
        }
        good.push(Declared {
            resource,
            file: path.to_path_buf(),
            line: doc.line,
        });
    }
    (good, errors, keep_all)
}
