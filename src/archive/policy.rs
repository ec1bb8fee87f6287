//! What an archive is held to and what a pass answers: the [`Policy`] and its [`Limits`], the
//! [`Summary`] of a pass, every refusal ([`ArchiveError`]), and the [`Sink`] that receives what
//! passed. Plain types only: no reading, writing or filesystem here.

use std::io::{self, Read};

use tar::Header;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a valid tar archive: {0}")]
    Malformed(String),
    #[error("the archive is truncated: {0}")]
    Truncated(String),
    #[error("entry {0:?} has an absolute path")]
    AbsolutePath(String),
    #[error("entry {0:?} has a `..` path component")]
    ParentComponent(String),
    #[error("entry {0:?} has a NUL byte in its name or link target")]
    Nul(String),
    #[error("entry {0:?} is not under the exported directory")]
    OutsideRoot(String),
    #[error(
        "entry {path:?} is a {kind}; only regular files, directories and symlinks are allowed"
    )]
    UnsupportedType { path: String, kind: String },
    #[error("entry {0:?} has the setuid or setgid bit")]
    SetId(String),
    #[error("hard link {path:?} points to {target:?}, which is not an earlier regular file of the archive")]
    HardLinkOutside { path: String, target: String },
    #[error("symlink {0:?} has an empty or over-long target")]
    BadSymlink(String),
    #[error("the parent directory of entry {0:?} does not appear earlier in the archive")]
    MissingParent(String),
    #[error("entry {0:?} appears twice")]
    Duplicate(String),
    #[error("entry {0:?} has an over-long name")]
    NameTooLong(String),
    #[error("the archive has more than {0} entries")]
    TooManyEntries(u64),
    #[error("the archive is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("reading the archive failed: {0}")]
    Read(String),
    #[error("writing the archive failed: {0}")]
    Write(String),
}

impl ArchiveError {
    /// Wraps the error so that it survives a trip through an `io::Error` (from a reader or a
    /// writer the tar crate drives) and is recovered by [`lift`].
    pub fn into_io(self) -> io::Error {
        io::Error::other(self)
    }
}

/// Recovers an [`ArchiveError`] carried in an `io::Error`, or classifies a plain one.
pub(super) fn lift(error: io::Error, plain: fn(String) -> ArchiveError) -> ArchiveError {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<ArchiveError>())
    {
        if let Some(inner) = error.into_inner() {
            if let Ok(archive) = inner.downcast::<ArchiveError>() {
                return *archive;
            }
            // Unreachable: `is` said it was one.
            return ArchiveError::Read("unexpected error".into());
        }
        return ArchiveError::Read("unexpected error".into());
    }
    plain(error.to_string())
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_entries: u64,
    /// Sum of all file contents.
    pub max_content_bytes: u64,
    pub max_path_bytes: usize,
    pub max_component_bytes: usize,
    pub max_link_bytes: usize,
}

impl Limits {
    pub fn with_max_bytes(max_content_bytes: u64) -> Limits {
        Limits {
            max_entries: 1_000_000,
            max_content_bytes,
            max_path_bytes: 4096,
            max_component_bytes: 255,
            max_link_bytes: 4096,
        }
    }
}

/// How a pass ([`super::validate`], [`super::transform`], [`super::unpack`]) treats its input.
#[derive(Clone, Debug)]
pub struct Policy {
    /// A first path component every entry must carry and that is removed (Docker names the
    /// entries of `GET /archive?path=/workspace` `workspace/...`). The entry that is the root
    /// itself is dropped: an extraction never changes its target directory.
    pub strip_root: Option<Vec<u8>>,
    /// Owner written into every header.
    pub owner: (u32, u32),
    /// Drop unsupported entries and strip setuid/setgid bits (reported in the summary) instead of
    /// refusing the archive.
    pub lenient: bool,
    pub limits: Limits,
}

impl Policy {
    /// For a stored snapshot about to be restored: every rule refuses.
    pub fn restore(owner: (u32, u32), limits: Limits) -> Policy {
        Policy {
            strip_root: None,
            owner,
            lenient: false,
            limits,
        }
    }

    /// For Docker's export of the directory named `root` of a live sandbox.
    pub fn export(root: &str, owner: (u32, u32), limits: Limits) -> Policy {
        Policy {
            strip_root: Some(root.as_bytes().to_vec()),
            owner,
            lenient: true,
            limits,
        }
    }
}

/// What a pass saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Entries written (the root entry excluded).
    pub entries: u64,
    pub content_bytes: u64,
    /// Lenient mode only: what was dropped or changed, one line each (the first few).
    pub adjusted: Vec<String>,
    /// Total number of adjustments, including those not listed.
    pub adjusted_count: u64,
}

const ADJUSTED_LISTED: usize = 10;

impl Summary {
    pub(super) fn adjust(&mut self, note: String) {
        self.adjusted_count += 1;
        if self.adjusted.len() < ADJUSTED_LISTED {
            self.adjusted.push(note);
        }
    }
}

/// Where the pass (`super::run`) delivers each entry it lets through, rebuilt: `header` is fresh
/// (forced owner, kept mode bits, mtime, size), `name` the normalized in-tree name, `target` a
/// symlink's target or a hard link's (normalized) earlier file, and `data` exactly a regular
/// file's contents.
pub(super) trait Sink {
    fn append<D: Read>(
        &mut self,
        header: Header,
        name: &[u8],
        target: Option<&[u8]>,
        data: D,
    ) -> Result<(), ArchiveError>;
}
