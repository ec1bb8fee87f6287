//! A plain workspace volume may carry a view the server mounted over its directory on this host
//! (a warm pool member that took a snapshot's view while running: see `crate::view_mount`).
//! Docker does not know of that mount: it would delete the volume's files through it (writing
//! into the view) and then fail on the busy directory. So before a volume is removed, a mount
//! found at its directory is taken away, but only when Docker says the volume is a plain local
//! one (its own overlay volumes it unmounts itself) and no container uses it (Docker refuses to
//! remove it then anyway, and the container's sandbox would lose its host path).

use std::collections::HashMap;
use std::path::Path;

use bollard::query_parameters::ListContainersOptions;

use super::{map_err, BollardEngine};
use crate::docker::EngineResult;

impl BollardEngine {
    /// Takes away a view the server mounted over plain volume `name`'s directory, if there is
    /// one and nothing uses the volume.
    pub(super) async fn unmount_twin(&self, name: &str) -> EngineResult<()> {
        let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return Ok(());
        };
        if !crate::docker::volume_directory_mounted(&table, name) {
            return Ok(());
        }
        let Some(volume) = self.volume(name).await? else {
            return Ok(());
        };
        let plain = volume.driver == "local" && !volume.options.contains_key("type");
        let mountpoint = Path::new(&volume.mountpoint);
        if !plain || !crate::view_mount::is_mounted_at(&table, mountpoint) {
            return Ok(());
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "volume".to_string(),
                vec![name.to_string()],
            )])),
            ..Default::default()
        };
        let users = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(map_err("list", &format!("containers of volume {name}")))?;
        if !users.is_empty() {
            return Ok(());
        }
        match crate::view_mount::unmount_all(mountpoint) {
            Ok(count) => tracing::debug!(volume = name, count, "a view's twin unmounted"),
            Err(error) => tracing::warn!(volume = name, %error, "a view's twin stays mounted"),
        }
        Ok(())
    }
}
