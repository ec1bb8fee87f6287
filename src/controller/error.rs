//! What can go wrong in a reconcile: one typed error for every kind, each variant saying what
//! failed (Docker, the store, a snapshot's content, this host's copy of a workspace…) and keeping
//! its cause. The reconcilers return these and never report them; the error policy
//! (`policy.rs`) decides which condition reports each one and when to try again. There is
//! no catch-all variant: a new way to fail is a new variant.

use crate::archive::ArchiveError;
use crate::config::SettingsError;
use crate::docker::EngineError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The image is being pulled (bytes so far of its layers); the reconcile looks again.
    #[error("pulling image {image}: {done} of {total} bytes")]
    ImagePulling {
        image: String,
        done: u64,
        total: u64,
    },
    /// The image is missing and the server's allowlist does not let it be pulled.
    #[error("image {0} is not in the server's allowed_images list, so it is not pulled")]
    ImageNotAllowed(String),
    /// The server requires egress policies (`AGENT_SANDBOX_EGRESS_REQUIRED`) and the sandbox
    /// asks for an open network.
    #[error("this server requires spec.egress for sandboxes with a network (AGENT_SANDBOX_EGRESS_REQUIRED); add spec.egress.allow")]
    EgressRequired,
    /// The egress gateway could not listen on the internal network's host address; retried.
    #[error("the egress gateway cannot listen on {address}: {source}")]
    EgressGateway {
        address: std::net::IpAddr,
        #[source]
        source: std::io::Error,
    },
    /// Docker reports no host address for the internal network, so there is nowhere for the
    /// gateway to listen.
    #[error(
        "docker reports no gateway address for network {0}; the egress gateway cannot listen there"
    )]
    EgressNoAddress(String),
    /// The firewall rule that sends a policed sandbox's TCP to the gateway's transparent
    /// listener could not be put in place (without it such traffic still goes nowhere).
    #[error("cannot redirect the TCP of network {network:?} to the egress gateway: {message}")]
    EgressRedirect { network: String, message: String },
    /// The firewall rules that keep open-network sandboxes from link-local destinations and the
    /// host's own addresses could not be put in place; the sandbox does not start without them.
    #[error(
        "cannot guard the open network {network:?} (link-local and host addresses refused): \
         {message}; set AGENT_SANDBOX_OPEN_NETWORK_GUARD=false to run open sandboxes without \
         it (see SECURITY.md)"
    )]
    OpenNetworkGuard { network: String, message: String },
    #[error("docker: {0}")]
    Engine(#[from] EngineError),
    /// The workspace's disk (`spec.diskMB`) cannot be made, mounted or grown.
    #[error("workspace disk (spec.diskMB): {0}")]
    Disk(#[from] crate::disk::DiskError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("settings: {0}")]
    Settings(#[from] SettingsError),
    #[error("snapshot {0:?} does not exist")]
    SnapshotNotFound(String),
    #[error("snapshot {0:?} is not ready yet")]
    SnapshotNotReady(String),
    /// `spec.template` names a template that does not exist (yet).
    #[error("template {0:?} does not exist; the sandbox starts once it does")]
    TemplateNotFound(String),
    #[error("snapshot {name:?} failed: {message}")]
    SnapshotFailed { name: String, message: String },
    #[error("the data of snapshot {name:?} is missing ({path})")]
    DataMissing { name: String, path: String },
    #[error("snapshot {name:?} was refused and nothing was restored: {error}")]
    Refused { name: String, error: ArchiveError },
    /// Reading a snapshot's data file failed.
    #[error("{path}: {error}")]
    DataUnreadable { path: String, error: std::io::Error },
    /// Writing the workspace on this host failed (the next attempt goes through Docker).
    #[error("writing the workspace on this host failed: {0}")]
    HostWrite(String),
    /// This host's copy of a workspace turned out not to be usable after all.
    #[error("{0}")]
    HostUnavailable(String),
    /// A container the reconcile just made or claimed is gone (`when` is empty or starts with a
    /// space).
    #[error("container {container} vanished{when}")]
    Vanished {
        container: String,
        when: &'static str,
    },
    /// A blocking task of the reconcile did not finish (it panicked, or the runtime stops).
    #[error("a blocking task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A status could not be turned into JSON.
    #[error("status: {0}")]
    Status(#[from] serde_json::Error),
    /// The container cannot take new limits live; it was removed and is made anew.
    #[error("replacing the container to apply new limits ({0})")]
    LimitsNeedNewContainer(EngineError),
    /// Some pool members could not be created.
    #[error("cannot create pool containers: {0}")]
    MembersNotCreated(Box<ReconcileError>),
    /// A sandbox's first workspace could not be built from its `spec.source`.
    #[error(transparent)]
    Source(Box<ReconcileError>),
    /// Docker could not export a workspace for a snapshot.
    #[error("{0}")]
    Export(EngineError),
    /// A rollback request failed; the sandbox runs on as it was.
    #[error("rollback {request:?} failed: {error}")]
    RollbackFailed {
        request: String,
        error: Box<ReconcileError>,
    },
    /// A `Full` snapshot's root filesystem is made on another image than the sandbox asks for.
    #[error(
        "snapshot {snapshot:?} is a Full snapshot taken on image {base}, and its root filesystem \
         cannot be put on spec.image {image}: leave spec.image unset or set it to {base}"
    )]
    RootfsImageMismatch {
        snapshot: String,
        base: String,
        image: String,
    },
    /// The image holding a `Full` snapshot's root filesystem is gone from the Docker host.
    #[error(
        "the root filesystem of snapshot {snapshot:?} (image {image}) is no longer on the docker \
         host (was it removed by hand?); take the snapshot again"
    )]
    RootfsImageMissing { snapshot: String, image: String },
    /// A file of a snapshot's data could not be removed.
    #[error("removing {path}: {error}")]
    DataNotRemoved { path: String, error: std::io::Error },
}

impl ReconcileError {
    /// The condition reason reporting this error where a snapshot's content was wanted (a
    /// sandbox's source or rollback).
    pub fn restore_reason(&self) -> &'static str {
        match self {
            ReconcileError::SnapshotNotFound(_) => "SnapshotNotFound",
            ReconcileError::SnapshotNotReady(_) => "WaitingForSnapshot",
            ReconcileError::SnapshotFailed { .. } => "SnapshotFailed",
            ReconcileError::DataMissing { .. } => "SnapshotDataMissing",
            ReconcileError::Refused { .. } => "SnapshotRefused",
            ReconcileError::RootfsImageMismatch { .. } => "RootfsImageMismatch",
            ReconcileError::RootfsImageMissing { .. } => "SnapshotDataMissing",
            ReconcileError::Engine(EngineError::ImageMissing(_)) => "ImageMissing",
            _ => "RestoreFailed",
        }
    }
}
