//! The HTTP server: the resource API (`/apis/agent-sandbox.io/v1/...`), the `/v1` wire contract,
//! `/healthz` and `/openapi.json`. Handlers are thin: parse, call the store or the data plane, and
//! map errors in one place ([`error::ApiError`]). Lifecycle changes only ever go through the store;
//! the controller does the Docker work and the handlers wait for its observed status.

pub mod error;
pub mod openapi;
pub mod v1;

use std::sync::Arc;

use crate::config::Settings;
use crate::dataplane::DataPlane;
use crate::docker::Engine;
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<Store>,
    pub dataplane: Arc<DataPlane>,
    pub engine: Arc<dyn Engine>,
    /// Serializes `/v1` creates so that `max_sandboxes` is never overshot by concurrent requests.
    pub create_lock: Arc<tokio::sync::Mutex<()>>,
}
