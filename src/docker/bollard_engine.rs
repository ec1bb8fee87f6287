//! [`Engine`] against the Docker daemon through bollard, negotiating the API version.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use std::collections::BTreeMap;

use super::*;

pub struct BollardEngine {
    docker: bollard::Docker,
}

impl BollardEngine {
    /// Connects to the local daemon (DOCKER_HOST or the default socket) and negotiates the API
    /// version, so that a 20.10 daemon (API 1.41) works.
    pub async fn connect() -> EngineResult<BollardEngine> {
        let docker = bollard::Docker::connect_with_local_defaults()
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        Ok(BollardEngine { docker })
    }
}

#[async_trait]
impl Engine for BollardEngine {
    async fn ping(&self) -> EngineResult<()> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| EngineError::Unreachable(e.to_string()))
    }
    async fn list_containers(&self) -> EngineResult<Vec<ManagedContainer>> {
        todo!()
    }
    async fn list_volumes(&self) -> EngineResult<Vec<ManagedVolume>> {
        todo!()
    }
    async fn ensure_volume(
        &self,
        _name: &str,
        _labels: &BTreeMap<String, String>,
    ) -> EngineResult<()> {
        todo!()
    }
    async fn remove_volume(&self, _name: &str) -> EngineResult<()> {
        todo!()
    }
    async fn create_container(&self, _plan: &ContainerPlan) -> EngineResult<String> {
        todo!()
    }
    async fn start_container(&self, _id: &str) -> EngineResult<()> {
        todo!()
    }
    async fn remove_container(&self, _id: &str) -> EngineResult<()> {
        todo!()
    }
    async fn inspect_container(&self, _id: &str) -> EngineResult<Option<ContainerDetails>> {
        todo!()
    }
    async fn update_limits(
        &self,
        _id: &str,
        _cpus: f64,
        _memory_mb: u64,
        _pids_limit: u64,
    ) -> EngineResult<()> {
        todo!()
    }
    async fn pause(&self, _id: &str) -> EngineResult<()> {
        todo!()
    }
    async fn unpause(&self, _id: &str) -> EngineResult<()> {
        todo!()
    }
    async fn ensure_network(&self, _name: &str) -> EngineResult<()> {
        todo!()
    }
    async fn image_exists(&self, _image: &str) -> EngineResult<bool> {
        todo!()
    }
    fn events(&self) -> BoxStream<'static, EngineResult<EngineEvent>> {
        todo!()
    }
    async fn exec(&self, _container: &str, _plan: &ExecPlan) -> EngineResult<ExecSession> {
        todo!()
    }
    async fn inspect_exec(&self, _exec_id: &str) -> EngineResult<ExecState> {
        todo!()
    }
    async fn archive_get(
        &self,
        _container: &str,
        _path: &str,
    ) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>> {
        todo!()
    }
    async fn archive_put(
        &self,
        _container: &str,
        _path: &str,
        _tar: BoxStream<'static, Bytes>,
    ) -> EngineResult<()> {
        todo!()
    }
}
