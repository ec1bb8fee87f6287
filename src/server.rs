//! Wiring for `agent-sandbox serve`: settings → Docker → store → controller → HTTP, and graceful
//! shutdown on SIGTERM or Ctrl-C. Nothing here decides behaviour; it only connects the parts.

use std::process::ExitCode;
use std::sync::Arc;

use crate::api::{self, AppState};
use crate::config::Settings;
use crate::controller::Controller;
use crate::docker::{BollardEngine, Engine, ObservedEngine};
use crate::metrics::{Exporter, Metrics};
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
    mut settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    settings.validate()?;
    // Bound first: with port 0 the kernel chooses the port, and what the server hands out
    // (preview links, the ready line) must name the one it listens on.
    let address = std::net::SocketAddr::new(settings.host, settings.port);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Listen {
            address: address.to_string(),
            source,
        })?;
    let bound = listener.local_addr().unwrap_or(address);
    settings.port = bound.port();
    let settings = Arc::new(settings);
    let metrics = Metrics::new();
    // Every Docker call is timed for the metrics.
    let engine: Arc<dyn Engine> = Arc::new(ObservedEngine::new(
        Arc::new(BollardEngine::connect().await?),
        Arc::new(metrics.clone()),
    ));
    engine.ping().await?;
    let store = Store::open_watching(&settings.data_dir, &settings.watch_dirs)?;
    let keys =
        api::auth::load_or_create_keys(&settings).map_err(|e| StartError::Auth(e.to_string()))?;

    let stop_keys = tokio_util::sync::CancellationToken::new();
    let _stop_keys = stop_keys.clone().drop_guard();
    if let Some(keyring) = keys.keyring() {
        tokio::spawn(Arc::clone(keyring).watch(stop_keys));
    }

    let server_id = store.server_id()?;
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
        store.recorder(),
        Arc::clone(&engine),
        Arc::clone(&settings),
        server_id,
        crate::helper_binary::helper_binary(),
        metrics.clone(),
    );
    let _watchers = AbortOnDrop(store.spawn_watchers());
    let _webhooks = AbortOnDrop(crate::webhooks::spawn(
        Arc::clone(&store),
        Arc::clone(&settings),
    ));
    let egress = Arc::new(crate::egress::Gateway::new(
        crate::egress::GatewaySettings {
            network: settings.egress_network_name(),
            hosts_file: settings.egress_hosts.clone(),
            private_allow: settings.egress_private_allow()?,
            authority: Some(Arc::new(
                crate::egress::Authority::load_or_create(
                    &store,
                    settings.egress_extra_ca.as_deref(),
                )
                .map_err(|e| StartError::Auth(e.to_string()))?,
            )),
        },
        Arc::clone(&engine),
        Arc::clone(&store),
    ));
    egress.observe_with(Arc::new(metrics.clone()));
    controller.attach_egress(Arc::clone(&egress));
    let _controller_tasks = controller.spawn();

    let envd_tokens = crate::ports::preview::Previews::load(&settings.data_dir)
        .map_err(|e| StartError::Auth(format!("envd access tokens: {e}")))?;
    let mut ports =
        crate::ports::Ports::new(Arc::clone(&engine), &settings).with_envd_tokens(envd_tokens);
    if settings.preview_domain.is_some() {
        let previews = crate::ports::preview::Previews::load(&settings.data_dir)
            .map_err(|e| StartError::Auth(format!("preview tokens: {e}")))?;
        ports = ports.with_previews(previews);
    }
    let exporter = Arc::new(Exporter::new(
        metrics.clone(),
        Arc::clone(&store),
        Arc::clone(&engine),
        Box::new({
            let queue = Arc::clone(controller.queue());
            move || queue.len()
        }),
    ));
    let state = AppState {
        settings: Arc::clone(&settings),
        store: Arc::clone(&store),
        dataplane: Arc::clone(controller.dataplane()),
        processes: Arc::clone(controller.processes()),
        services: Arc::clone(controller.services()),
        engine: Arc::clone(&engine),
        create_lock: Arc::new(tokio::sync::Mutex::new(())),
        keys: Arc::new(keys),
        activity: Arc::clone(controller.activity()),
        ports: Arc::new(ports),
        metrics: Arc::clone(&exporter),
        egress: Some(egress),
    };
    let _history = AbortOnDrop(tokio::spawn(Arc::clone(&exporter).keep_history()));
    tracing::info!(address = %bound, data_dir = %settings.data_dir.display(), "agent-sandbox listening");
    {
        use std::io::Write;
        // On stdout, apart from the log on stderr; a closed stdout must not stop the server.
        let _ = writeln!(std::io::stdout(), "{}", ready_line(&settings, bound));
    }
    let _checks = AbortOnDrop(tokio::spawn(log_start_checks(Arc::clone(&settings))));
    api::http::serve(listener, api::router(state), shutdown).await;
    if let Err(e) = store.events().flush() {
        tracing::warn!("cannot write the events: {e}");
    }
    tracing::info!("shut down");
    Ok(())
}

/// The one line a person acts on once the server listens: where it is, where the key is, and a
/// command that creates a first sandbox.
pub fn ready_line(settings: &Settings, bound: std::net::SocketAddr) -> String {
    let host = match bound.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let url = format!("http://{host}:{}", bound.port());
    let (key, header) = if settings.insecure_no_auth {
        (
            "no API key (authentication is off)".to_string(),
            String::new(),
        )
    } else if !settings.api_keys.is_empty() {
        (
            "API key: one of AGENT_SANDBOX_API_KEYS".to_string(),
            "-H \"Authorization: Bearer $AGENT_SANDBOX_API_KEY\" ".to_string(),
        )
    } else {
        let path = settings.data_dir.join(crate::api::auth::KEY_FILE);
        (
            format!("API key in {}", path.display()),
            format!("-H \"Authorization: Bearer $(cat {})\" ", path.display()),
        )
    };
    format!(
        "agent-sandbox {} ready at {url} ({key}); first sandbox: curl -s {header}-H \
         'Content-Type: application/json' -d '{{}}' {url}/v1/sandboxes",
        env!("CARGO_PKG_VERSION")
    )
}

/// Runs `agent-sandbox doctor`'s checks once the server listens and logs each warning and
/// failure as one line; the server serves meanwhile (a missing default image, say, only stops
/// the sandboxes that need it).
async fn log_start_checks(settings: Arc<Settings>) {
    for finding in crate::doctor::run(&settings, crate::doctor::Occasion::Serve).await {
        match finding.verdict {
            crate::doctor::Verdict::Ok => tracing::debug!(check = finding.check, "{finding}"),
            crate::doctor::Verdict::Warn => tracing::warn!(check = finding.check, "{finding}"),
            crate::doctor::Verdict::Fail => tracing::error!(check = finding.check, "{finding}"),
        }
    }
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
