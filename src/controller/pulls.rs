//! Image pulls: one pull per image however many sandboxes or pool members wait for it, its
//! progress for their status, and its failure, in the registry's words, for their conditions. A
//! reconcile asks [`Pulls::ensure`] and never waits for a pull: while one runs it is told to look
//! again ([`ReconcileError::ImagePulling`]). The image allowlist is checked before any pull.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::ReconcileError;
use crate::config::Settings;
use crate::docker::{Engine, EngineError};
use crate::resource::ImagePullPolicy;

/// How long a failed pull answers for its image before the next request starts a new one (each
/// sandbox's own retries back off on top).
const FAILURE_HOLDS: Duration = Duration::from_secs(5);

/// How long a finished pull counts as fresh for `Always`: sandboxes made together share it.
const FRESH: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Pull {
    done: AtomicU64,
    total: AtomicU64,
    /// `None` while it runs; then its result and when it came.
    finished: Mutex<Option<(Instant, Result<(), String>)>>,
}

impl Pull {
    fn finished(&self) -> Option<(Instant, Result<(), String>)> {
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The pulls of this server, by image.
pub(super) struct Pulls {
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    pulls: Mutex<HashMap<String, Arc<Pull>>>,
}

impl Pulls {
    pub(super) fn new(engine: Arc<dyn Engine>, settings: Arc<Settings>) -> Pulls {
        Pulls {
            engine,
            settings,
            pulls: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Pull>>> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers `Ok` once `image` is there to create a container from, as `policy` says; while a
    /// pull runs, [`ReconcileError::ImagePulling`] with its progress.
    pub(super) async fn ensure(
        &self,
        image: &str,
        policy: Option<ImagePullPolicy>,
    ) -> Result<(), ReconcileError> {
        let policy = policy.unwrap_or(self.settings.image_pull_policy);
        match policy {
            ImagePullPolicy::Never | ImagePullPolicy::IfNotPresent
                if self.engine.image_exists(image).await? =>
            {
                return Ok(())
            }
            ImagePullPolicy::Never => return Err(EngineError::ImageMissing(image.into()).into()),
            _ => {}
        }
        if !self.settings.image_allowed(image) {
            return Err(ReconcileError::ImageNotAllowed(image.to_string()));
        }
        // A pull that ended well between the look above and now made the image: asking again
        // saves a second, empty pull (which would also replace the first one's byte counts).
        if policy == ImagePullPolicy::IfNotPresent
            && self.finished_well(image)
            && self.engine.image_exists(image).await?
        {
            return Ok(());
        }
        let pull = {
            let mut pulls = self.lock();
            let current = pulls.get(image).cloned();
            let reusable = current.filter(|pull| match pull.finished() {
                None => true,
                Some((at, Err(_))) => at.elapsed() < FAILURE_HOLDS,
                Some((at, Ok(()))) => policy == ImagePullPolicy::Always && at.elapsed() < FRESH,
            });
            match reusable {
                Some(pull) => pull,
                None => {
                    let pull = Arc::new(Pull::default());
                    pulls.insert(image.to_string(), Arc::clone(&pull));
                    self.start(image, Arc::clone(&pull));
                    pull
                }
            }
        };
        match pull.finished() {
            Some((_, Ok(()))) => Ok(()),
            Some((_, Err(message))) => Err(EngineError::PullFailed {
                image: image.to_string(),
                message,
            }
            .into()),
            None => Err(ReconcileError::ImagePulling {
                image: image.to_string(),
                done: pull.done.load(Ordering::Relaxed),
                total: pull.total.load(Ordering::Relaxed),
            }),
        }
    }

    /// Whether the last pull of `image` has ended, and well.
    fn finished_well(&self, image: &str) -> bool {
        let pull = self.lock().get(image).cloned();
        pull.and_then(|p| p.finished())
            .is_some_and(|(_, result)| result.is_ok())
    }

    /// The bytes the last pull of `image` reported, `(done, total)`.
    pub(super) fn progress(&self, image: &str) -> Option<(u64, u64)> {
        let pull = self.lock().get(image).cloned()?;
        Some((
            pull.done.load(Ordering::Relaxed),
            pull.total.load(Ordering::Relaxed),
        ))
    }

    fn start(&self, image: &str, pull: Arc<Pull>) {
        let engine = Arc::clone(&self.engine);
        let auth_file = self.settings.registry_auth_file.clone();
        let image = image.to_string();
        tracing::info!(%image, "pulling image");
        tokio::spawn(async move {
            let counter = Arc::clone(&pull);
            let progress = Box::new(move |done: u64, total: u64| {
                counter.done.store(done, Ordering::Relaxed);
                counter.total.store(total, Ordering::Relaxed);
            });
            let result = engine
                .pull_image(&image, auth_file.as_deref(), progress)
                .await
                .map_err(|e| match e {
                    EngineError::PullFailed { message, .. } => message,
                    other => other.to_string(),
                });
            match &result {
                Ok(()) => tracing::info!(%image, "pulled image"),
                Err(message) => tracing::warn!(%image, %message, "pulling image failed"),
            }
            *pull.finished.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((Instant::now(), result));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::fake::FakeEngine;

    #[tokio::test]
    async fn many_waiters_share_one_pull_and_never_pulls_nothing() {
        let engine = Arc::new(FakeEngine::new());
        engine.set_images(&["present:1"]);
        let mut settings = Settings::for_tests("/tmp/unused".into());
        settings.allowed_images = vec!["present:*".into(), "missing:*".into()];
        let pulls = Pulls::new(engine.clone(), Arc::new(settings));
        assert!(pulls.ensure("present:1", None).await.is_ok());
        assert!(matches!(
            pulls
                .ensure("missing:1", Some(ImagePullPolicy::Never))
                .await,
            Err(ReconcileError::Engine(EngineError::ImageMissing(_)))
        ));
        assert!(matches!(
            pulls.ensure("other:1", None).await,
            Err(ReconcileError::ImageNotAllowed(_))
        ));
        for _ in 0..20 {
            let _ = pulls.ensure("missing:1", None).await;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while pulls.ensure("missing:1", None).await.is_err() {
            assert!(Instant::now() < deadline, "the pull finishes");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let calls = engine.calls();
        assert_eq!(
            calls.iter().filter(|c| c.starts_with("pull_image")).count(),
            1,
            "{calls:?}"
        );
        assert!(
            !calls.iter().any(|c| c == "pull_image other:1"),
            "not allowed: never pulled"
        );
    }
}
