//! An [`Engine`] that times every call of the engine it wraps and tells a [`CallObserver`]: how
//! long Docker took per operation, and whether it answered with an error. This module knows
//! nothing of what the observer does with it (the server's metrics, see `crate::metrics`), and
//! changes nothing about the calls themselves.
//!
//! A call that returns a stream (exec output, an archive, events) is timed until the stream is
//! handed back, not while it is read; the event stream, which lasts as long as the server, is
//! not timed at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use super::{
    CommittedRootfs, ContainerDetails, ContainerPlan, Engine, EngineCapabilities, EngineEvent,
    EngineResult, ExecPlan, ExecSession, ExecState, LabeledImage, ManagedContainer, ManagedVolume,
    NetworkInfo, NetworkKind, PullProgress,
};

/// Told about every Docker call: the operation's name (the [`Engine`] method's), whether it
/// failed, and how long it took.
pub trait CallObserver: Send + Sync + 'static {
    fn docker_call(&self, operation: &'static str, failed: bool, elapsed: Duration);
}

/// `inner`, with every call reported to `observer`.
pub struct ObservedEngine {
    inner: Arc<dyn Engine>,
    observer: Arc<dyn CallObserver>,
}

impl ObservedEngine {
    pub fn new(inner: Arc<dyn Engine>, observer: Arc<dyn CallObserver>) -> ObservedEngine {
        ObservedEngine { inner, observer }
    }

    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl std::future::Future<Output = EngineResult<T>>,
    ) -> EngineResult<T> {
        let began = Instant::now();
        let result = call.await;
        self.observer
            .docker_call(operation, result.is_err(), began.elapsed());
        result
    }
}

#[async_trait]
impl Engine for ObservedEngine {
    async fn ping(&self) -> EngineResult<()> {
        self.timed("ping", self.inner.ping()).await
    }

    fn capabilities(&self) -> EngineCapabilities {
        self.inner.capabilities()
    }

    async fn list_containers(&self) -> EngineResult<Vec<ManagedContainer>> {
        self.timed("list_containers", self.inner.list_containers())
            .await
    }

    async fn list_volumes(&self) -> EngineResult<Vec<ManagedVolume>> {
        self.timed("list_volumes", self.inner.list_volumes()).await
    }

    async fn inspect_volume(&self, name: &str) -> EngineResult<Option<ManagedVolume>> {
        self.timed("inspect_volume", self.inner.inspect_volume(name))
            .await
    }

    async fn remove_volume(&self, name: &str) -> EngineResult<()> {
        self.timed("remove_volume", self.inner.remove_volume(name))
            .await
    }

    async fn create_marker_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<()> {
        self.timed(
            "create_marker_volume",
            self.inner.create_marker_volume(name, labels),
        )
        .await
    }

    async fn create_view_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        view: &super::ViewPaths,
    ) -> EngineResult<()> {
        self.timed(
            "create_view_volume",
            self.inner.create_view_volume(name, labels, view),
        )
        .await
    }

    async fn view_of_volume(&self, name: &str) -> EngineResult<Option<super::ViewPaths>> {
        self.timed("view_of_volume", self.inner.view_of_volume(name))
            .await
    }

    async fn volume_directory(&self, name: &str) -> EngineResult<Option<std::path::PathBuf>> {
        self.timed("volume_directory", self.inner.volume_directory(name))
            .await
    }

    async fn create_bind_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        source: &std::path::Path,
    ) -> EngineResult<()> {
        self.timed(
            "create_bind_volume",
            self.inner.create_bind_volume(name, labels, source),
        )
        .await
    }

    async fn list_volumes_with_label(&self, key: &str) -> EngineResult<Vec<ManagedVolume>> {
        self.timed(
            "list_volumes_with_label",
            self.inner.list_volumes_with_label(key),
        )
        .await
    }

    async fn create_container(&self, plan: &ContainerPlan) -> EngineResult<String> {
        self.timed("create_container", self.inner.create_container(plan))
            .await
    }

    async fn start_container(&self, id: &str) -> EngineResult<()> {
        self.timed("start_container", self.inner.start_container(id))
            .await
    }

    async fn remove_container(&self, id: &str) -> EngineResult<()> {
        self.timed("remove_container", self.inner.remove_container(id))
            .await
    }

    async fn inspect_container(&self, id: &str) -> EngineResult<Option<ContainerDetails>> {
        self.timed("inspect_container", self.inner.inspect_container(id))
            .await
    }

    async fn update_limits(
        &self,
        id: &str,
        cpus: f64,
        memory_mb: u64,
        pids_limit: u64,
    ) -> EngineResult<()> {
        self.timed(
            "update_limits",
            self.inner.update_limits(id, cpus, memory_mb, pids_limit),
        )
        .await
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        self.timed("pause", self.inner.pause(id)).await
    }

    async fn unpause(&self, id: &str) -> EngineResult<()> {
        self.timed("unpause", self.inner.unpause(id)).await
    }

    async fn ensure_network(&self, name: &str, kind: NetworkKind) -> EngineResult<NetworkInfo> {
        self.timed("ensure_network", self.inner.ensure_network(name, kind))
            .await
    }

    async fn network_members(&self, name: &str) -> EngineResult<Vec<(String, std::net::IpAddr)>> {
        self.timed("network_members", self.inner.network_members(name))
            .await
    }

    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        self.timed("image_exists", self.inner.image_exists(image))
            .await
    }

    async fn commit_rootfs(
        &self,
        container: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
        pause: bool,
    ) -> EngineResult<CommittedRootfs> {
        self.timed(
            "commit_rootfs",
            self.inner
                .commit_rootfs(container, reference, labels, pause),
        )
        .await
    }

    async fn list_images_with_label(&self, key: &str) -> EngineResult<Vec<LabeledImage>> {
        self.timed(
            "list_images_with_label",
            self.inner.list_images_with_label(key),
        )
        .await
    }

    async fn remove_image(&self, reference: &str) -> EngineResult<()> {
        self.timed("remove_image", self.inner.remove_image(reference))
            .await
    }

    async fn export_top_layer(
        &self,
        reference: &str,
        digest: &str,
        out: std::fs::File,
    ) -> EngineResult<(u64, std::fs::File)> {
        self.timed(
            "export_top_layer",
            self.inner.export_top_layer(reference, digest, out),
        )
        .await
    }

    async fn load_rootfs(
        &self,
        base: &str,
        layer: std::fs::File,
        size: u64,
        digest: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<String> {
        self.timed(
            "load_rootfs",
            self.inner
                .load_rootfs(base, layer, size, digest, reference, labels),
        )
        .await
    }

    fn events(&self) -> BoxStream<'static, EngineResult<EngineEvent>> {
        self.inner.events()
    }

    async fn exec(&self, container: &str, plan: &ExecPlan) -> EngineResult<ExecSession> {
        self.timed("exec", self.inner.exec(container, plan)).await
    }

    async fn inspect_exec(&self, exec_id: &str) -> EngineResult<ExecState> {
        self.timed("inspect_exec", self.inner.inspect_exec(exec_id))
            .await
    }

    async fn archive_get(
        &self,
        container: &str,
        path: &str,
    ) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>> {
        self.timed("archive_get", self.inner.archive_get(container, path))
            .await
    }

    async fn archive_put(
        &self,
        container: &str,
        path: &str,
        tar: BoxStream<'static, Bytes>,
    ) -> EngineResult<()> {
        self.timed("archive_put", self.inner.archive_put(container, path, tar))
            .await
    }

    async fn ensure_helper_volume(&self, volume: &str, binary: &[u8]) -> EngineResult<()> {
        self.timed(
            "ensure_helper_volume",
            self.inner.ensure_helper_volume(volume, binary),
        )
        .await
    }

    async fn prepare_workspace(&self, container: &str, uid: u32, gid: u32) -> EngineResult<()> {
        self.timed(
            "prepare_workspace",
            self.inner.prepare_workspace(container, uid, gid),
        )
        .await
    }

    async fn rename_container(&self, id: &str, new_name: &str) -> EngineResult<()> {
        self.timed(
            "rename_container",
            self.inner.rename_container(id, new_name),
        )
        .await
    }

    async fn kill_container(&self, id: &str) -> EngineResult<()> {
        self.timed("kill_container", self.inner.kill_container(id))
            .await
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> EngineResult<()> {
        self.timed("stop_container", self.inner.stop_container(id, grace))
            .await
    }

    async fn pull_image(
        &self,
        image: &str,
        auth_file: Option<&std::path::Path>,
        progress: PullProgress,
    ) -> EngineResult<()> {
        self.timed(
            "pull_image",
            self.inner.pull_image(image, auth_file, progress),
        )
        .await
    }
}
