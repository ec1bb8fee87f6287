//! Which helper channel a command runs on, and the reuse of channels: each container's one
//! long-lived shared channel (for server-paced work: buffered exec, file operations) and a few
//! idle private channels per container (for client-paced streams, which must not apply their
//! backpressure to anyone else), kept warm so that a stream neither waits for a `docker exec` to
//! start nor starts one.
//!
//! This module owns every cached channel and nothing else: it does not start commands, read
//! their output or know the `/v1` contract (that is `exec.rs`, `files.rs` and `api/`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::channel::{Channel, ChannelError};
use crate::docker::Engine;

/// After the helper could not be started in a container, try again only after this long.
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(30);

/// Idle private channels kept per container: a finished stream's channel plus the one opened in
/// the background when the last was taken, so back-to-back streams never wait for a `docker exec`
/// and never start one either. Each is one idle helper process in the sandbox.
const SPARES_PER_CONTAINER: usize = 2;

/// Gives a private channel back once its stream ended cleanly, for the next stream to reuse
/// (see [`Channels::recycler`]).
pub type Recycle = Box<dyn FnOnce(Arc<Channel>) + Send>;

type Spares = Arc<Mutex<HashMap<String, Vec<Arc<Channel>>>>>;

/// Every helper channel the data plane keeps, per container.
pub struct Channels {
    engine: Arc<dyn Engine>,
    /// The user the helper runs as.
    user: String,
    shared: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    /// Opened, idle private channels per container (at most [`SPARES_PER_CONTAINER`]).
    spares: Spares,
    /// When each container was started, as its callers last said.
    starts: Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>,
}

enum Slot {
    Empty,
    Live(Arc<Channel>),
    Unavailable { since: Instant, why: String },
}

/// Keeps `channel` as a spare of `container` if it is idle and there is room; else it is closed.
fn keep_spare(spares: &Spares, container: &str, channel: Arc<Channel>) {
    let mut spares = spares.lock().unwrap_or_else(|p| p.into_inner());
    let list = spares.entry(container.to_string()).or_default();
    list.retain(|c| c.is_idle());
    if list.len() < SPARES_PER_CONTAINER && channel.is_idle() {
        list.push(channel);
    }
}

impl Channels {
    pub fn new(engine: Arc<dyn Engine>, user: String) -> Channels {
        Channels {
            engine,
            user,
            shared: Mutex::default(),
            spares: Arc::default(),
            starts: Mutex::default(),
        }
    }

    /// Drops every channel of `container` when it was started again since they were opened (its
    /// ID is the same, its processes are not; gVisor keeps the old streams open, so they would
    /// not be seen to die).
    pub fn renew_if_restarted(
        &self,
        container: &str,
        started_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let Some(started_at) = started_at else {
            return;
        };
        let restarted = {
            let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
            match starts.insert(container.to_string(), started_at) {
                Some(before) => before != started_at,
                None => false,
            }
        };
        if restarted {
            tracing::debug!(%container, "container started again; dropping its helper channels");
            self.shared
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(container);
            self.spares
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(container);
        }
    }

    fn slot(&self, container: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if !slots.contains_key(container) {
            // Forget containers whose channel died (they are usually gone); cheap and bounded
            // by the number of sandboxes.
            slots.retain(|_, slot| match slot.try_lock() {
                Ok(s) => matches!(&*s, Slot::Live(c) if !c.is_dead()),
                Err(_) => true,
            });
        }
        Arc::clone(
            slots
                .entry(container.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Slot::Empty))),
        )
    }

    /// The container's shared channel, opened on first use. A new container (a new ID) gets a
    /// new channel; a dead one is replaced on the next use; a container found without a working
    /// helper is not asked again for [`UNAVAILABLE_RETRY`].
    pub async fn shared(&self, container: &str) -> Result<Arc<Channel>, ChannelError> {
        let slot = self.slot(container);
        let mut slot = slot.lock().await;
        match &*slot {
            Slot::Live(c) if !c.is_dead() => return Ok(Arc::clone(c)),
            Slot::Unavailable { since, why } if since.elapsed() < UNAVAILABLE_RETRY => {
                return Err(ChannelError::NoHelper(why.clone()))
            }
            _ => {}
        }
        match Channel::open(self.engine.as_ref(), container, &self.user).await {
            Ok(c) => {
                *slot = Slot::Live(Arc::clone(&c));
                Ok(c)
            }
            Err(ChannelError::NoHelper(why)) => {
                tracing::info!(%container, %why, "no in-sandbox helper; using plain docker exec");
                *slot = Slot::Unavailable {
                    since: Instant::now(),
                    why: why.clone(),
                };
                Err(ChannelError::NoHelper(why))
            }
            Err(e) => {
                *slot = Slot::Empty;
                Err(e)
            }
        }
    }

    /// Opens the container's shared channel ahead of its first use, unless one is open or a call
    /// is using the slot. Best effort: a failure leaves the slot as it was, so that a helper slow
    /// to greet on a busy host is not taken for a missing one (the first call decides that).
    pub async fn warm(&self, container: &str) -> Result<(), ChannelError> {
        let slot = self.slot(container);
        let Ok(mut slot) = slot.try_lock() else {
            return Ok(());
        };
        if matches!(&*slot, Slot::Live(c) if !c.is_dead()) {
            return Ok(());
        }
        let channel = Channel::open(self.engine.as_ref(), container, &self.user).await?;
        *slot = Slot::Live(channel);
        Ok(())
    }

    /// A channel of the stream's own: one of the container's spares if one is ready, else a new
    /// one. When that leaves no spare, another is opened in the background. Spares die with the
    /// container; those of containers that are gone are forgotten on the next take.
    pub async fn private(&self, container: &str) -> Result<Arc<Channel>, ChannelError> {
        let (spare, refill) = {
            let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
            for list in spares.values_mut() {
                list.retain(|c| c.is_idle());
            }
            spares.retain(|_, list| !list.is_empty());
            let spare = spares.get_mut(container).and_then(Vec::pop);
            let left = spares.get(container).map_or(0, Vec::len);
            (spare, left == 0)
        };
        if refill {
            let (engine, spares) = (Arc::clone(&self.engine), Arc::clone(&self.spares));
            let (container_owned, user) = (container.to_string(), self.user.clone());
            tokio::spawn(async move {
                if let Ok(next) = Channel::open(engine.as_ref(), &container_owned, &user).await {
                    keep_spare(&spares, &container_owned, next);
                }
            });
        }
        match spare {
            Some(channel) => Ok(channel),
            None => self.fresh(container).await,
        }
    }

    /// A newly opened private channel, never a spare (the retry after a spare turned out dead).
    pub async fn fresh(&self, container: &str) -> Result<Arc<Channel>, ChannelError> {
        Channel::open(self.engine.as_ref(), container, &self.user).await
    }

    /// How a finished stream's private channel goes back to the container's spares.
    pub fn recycler(&self, container: &str) -> Recycle {
        let spares = Arc::clone(&self.spares);
        let container = container.to_string();
        Box::new(move |channel| keep_spare(&spares, &container, channel))
    }
}
