//! Wiring for `agent-sandbox serve`: settings → Docker → store → controller → HTTP, and graceful
//! shutdown on SIGTERM or Ctrl-C. Nothing here decides behaviour; it only connects the parts.

use std::process::ExitCode;
use std::sync::Arc;

use crate::api::{self, AppState};
use crate::config::Settings;
use crate::controller::Controller;
use crate::dataplane::DataPlane;
use crate::docker::{BollardEngine, Engine};
use crate::store::Store;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Settings(#[from] crate::config::SettingsError),
    #[error("cannot reach docker: {0}")]
    Docker(#[from] crate::docker::EngineError),
    #[error("cannot open the data directory: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Auth(String),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the server until it is told to stop; returns the process exit code.
pub fn run_blocking(settings: Settings) -> ExitCode {
    init_tracing();
    if let Err(e) = settings.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server stopped");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Caps glibc's malloc at one arena per core. Its default, eight per core, gives each of the
/// short-lived blocking threads that wait for the store's fsyncs an arena of its own, whose freed
/// memory stays with the process: with 1,000 sandboxes that was several MiB of resident memory
/// for nothing, as the threads spend their time waiting on the disk, not allocating.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a malloc parameter; called before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Runs the server until `shutdown` completes.
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    settings.validate()?;
    let settings = Arc::new(settings);
    let engine: Arc<dyn Engine> = Arc::new(BollardEngine::connect().await?);
    engine.ping().await?;
    let store = Store::open(&settings.data_dir, &settings.watch_dirs)?;
    let keys =
        api::auth::load_or_create_keys(&settings).map_err(|e| StartError::Auth(e.to_string()))?;

    let server_id = load_or_create_server_id(&settings.data_dir)?;
    // Claim this identity's objects before making any (see `gc`).
    if let Err(e) = crate::gc::beat(engine.as_ref(), &server_id).await {
        tracing::warn!("cannot write the server's heartbeat: {e}");
    }
    let _heartbeat = AbortOnDrop(tokio::spawn(crate::gc::keep_beating(
        Arc::clone(&engine),
        server_id.clone(),
    )));
    let controller = Controller::new(
        Arc::clone(&store),
        Arc::clone(&engine),
        Arc::clone(&settings),
        server_id,
        crate::helper_binary::helper_binary(),
    );
    let _watchers = AbortOnDrop(store.spawn_watchers());
    let _controller_tasks = controller.spawn();

    let state = AppState {
        settings: Arc::clone(&settings),
        store: Arc::clone(&store),
        dataplane: Arc::new(DataPlane::new(Arc::clone(&engine), Arc::clone(&settings))),
        engine: Arc::clone(&engine),
        create_lock: Arc::new(tokio::sync::Mutex::new(())),
        keys: Arc::new(keys),
    };
    let address = std::net::SocketAddr::new(settings.host, settings.port);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Listen {
            address: address.to_string(),
            source,
        })?;
    tracing::info!(%address, data_dir = %settings.data_dir.display(), "agent-sandbox listening");
    api::http::serve(listener, api::router(state), shutdown).await;
    tracing::info!("shut down");
    Ok(())
}

/// The identity of this data directory's server, created once and kept in `<data>/server-id`.
fn load_or_create_server_id(data_dir: &std::path::Path) -> Result<String, StartError> {
    let path = data_dir.join("server-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Ok(id.to_string());
        }
    }
    let id = format!("{:016x}", rand::random::<u64>());
    crate::store::write_atomic(&path, format!("{id}\n").as_bytes()).map_err(|source| {
        StartError::Store(crate::store::StoreError::Io {
            path: path.clone(),
            source,
        })
    })?;
    Ok(id)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutdown requested");
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("AGENT_SANDBOX_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,hyper=warn,bollard=warn"));
    let json = std::env::var("AGENT_SANDBOX_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
