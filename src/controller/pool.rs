//! Reconciling one `SandboxPool`: making, counting and draining its warm members. Claiming a
//! member for a sandbox is `claims.rs`.
//!
//! A pool member is an ordinary hardened container and workspace volume whose `io.agent-sandbox.id`
//! is `pool.<pool>.<random>` (a dot never occurs in a sandbox name, so members and sandboxes cannot
//! collide). It is created with the server's default limits and started, its workspace already
//! owned by the sandbox user. A sandbox whose immutable properties match claims a member: the
//! member takes the sandbox's container name (once the sandbox's status records it, for a new
//! sandbox; see `claims.rs`) and gets the sandbox's limits applied live. Claims run in
//! parallel; `HandedOut` (in `claims.rs`) makes sure no two take the same member. The pool refills in the
//! background, once claims have paused for a moment (at most a second), so that starting new
//! members does not slow down the operations that just claimed.

use std::time::Duration;

use chrono::Utc;
use futures::future::join_all;

use super::context::PoolContext;
use super::error::ReconcileError;
use super::names;
use super::policy::{Failure, Outcome};
use super::status::{self, generation, write_status};
use crate::docker::{ManagedContainer, LABEL_SPEC_HASH};
use crate::resource::{ConditionStatus, Kind, SandboxPool, SandboxPoolStatus};

/// Reconciles pool `name`. Members that could not be made are a failure, reported (by the error
/// policy) in the status that counts the others.
pub(super) async fn reconcile(
    ctl: &PoolContext<'_>,
    name: &str,
) -> Result<Outcome, Failure<SandboxPool>> {
    if let Some(template) = super::template_pool::template_of(name) {
        return Ok(super::template_pool::reconcile(ctl, name, template).await?);
    }
    let entry = ctl.store.get(Kind::SandboxPool, name);
    let pool = entry.as_ref().and_then(|e| e.resource.as_pool().cloned());
    let members = ctl.pools.members(name).await?;
    let Some(pool) = pool.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
        // Gone or going: drain every unclaimed member, then let the document go.
        ctl.pools.handed_out.publish(name, Vec::new());
        remove_members(ctl, &members).await?;
        if entry.is_some() {
            let name = name.to_string();
            ctl.store
                .write(move |store| store.finalize(Kind::SandboxPool, &name))
                .await?;
        }
        return Ok(Outcome::done());
    };
    let key = ctl.pools.key_of(&pool);
    // Members are made (created, started, prepared) within this reconcile, and one reconcile of
    // a pool runs at a time: a member not running now was left half made by a crash, or stopped
    // by a hand. It would hold a place in the pool and never be claimed.
    let (usable, stale): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|c| c.labels.get(LABEL_SPEC_HASH) == Some(&key) && c.is_running());
    remove_members(ctl, &stale).await?;
    let size = pool.spec.size as usize;
    let mut failure = None;
    let mut deferred = None;
    let mut created = false;
    if usable.len() > size {
        remove_members(ctl, &usable[size..]).await?;
    } else if usable.len() < size {
        if let Some(wait) = ctl.pools.handed_out.refill_wait(name) {
            deferred = Some(wait);
        } else {
            let missing = size - usable.len();
            let results = join_all((0..missing).map(|_| async {
                let _turn = ctl.making_turn().await;
                create_member(ctl, &pool, &key).await
            }))
            .await;
            if let Some(Err(error)) = results.into_iter().find(|r| r.is_err()) {
                failure = Some(ReconcileError::MembersNotCreated(Box::new(error)));
            }
            created = true;
        }
    }
    // A second listing only when this reconcile made members: otherwise the first one is current.
    let ready_members: Vec<ManagedContainer> = if created {
        ctl.pools
            .members(name)
            .await?
            .into_iter()
            .filter(|c| c.is_running() && c.labels.get(LABEL_SPEC_HASH) == Some(&key))
            .collect()
    } else {
        usable.into_iter().take(size).collect()
    };
    let ready = ready_members.len() as u32;
    ctl.pools.handed_out.publish(name, ready_members);
    let claimed = ctl
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox()?.status.as_ref())
        .filter(|s| s.claimed_from.as_deref() == Some(name) && s.container_id.is_some())
        .count() as u32;
    let generation = generation(&pool.metadata);
    let full = ready as usize >= size;
    let (verdict, reason) = if full {
        (ConditionStatus::True, "Full")
    } else {
        (ConditionStatus::False, "Filling")
    };
    let mut conditions = pool.status.clone().unwrap_or_default().conditions;
    status::set_ready(&mut conditions, verdict, reason, "", generation);
    let status = SandboxPoolStatus {
        observed_generation: Some(generation),
        conditions,
        ready_replicas: ready,
        claimed,
        message: String::new(),
    };
    if let Some(error) = failure {
        return Err(Failure::reported(error, &pool, status));
    }
    write_status(ctl.store, ctl.events, &pool, &status).await?;
    Ok(if full {
        Outcome::done()
    } else {
        Outcome::after(deferred.unwrap_or(Duration::from_millis(500)))
    })
}

async fn create_member(
    ctl: &PoolContext<'_>,
    pool: &SandboxPool,
    key: &str,
) -> Result<(), ReconcileError> {
    let member = names::new_member(&pool.metadata.key());
    let runtime = ctl.pools.runtime_of(pool);
    let plan = ctl
        .containers
        .plan_for_member(pool, &member, key, runtime)
        .await?;
    let created = async {
        let id = ctl.engine.create_container(&plan).await?;
        let runtime = plan.runtime.clone().unwrap_or_default();
        ctl.workspaces
            .start_with_workspace(&id, &runtime, None)
            .await?;
        Ok::<_, ReconcileError>(id)
    }
    .await;
    if let Ok(id) = &created {
        ctl.warm(id);
    }
    if let Err(error) = created {
        ctl.containers
            .discard(&names::container_name(&member), &plan.workspace_volume)
            .await;
        return Err(error);
    }
    tracing::debug!(pool = %pool.metadata.name, member, at = %Utc::now(), "pool container ready");
    Ok(())
}

async fn remove_members(
    ctl: &PoolContext<'_>,
    members: &[ManagedContainer],
) -> Result<(), ReconcileError> {
    for member in members {
        ctl.engine.remove_container(&member.id).await?;
        if let Some(id) = member.sandbox() {
            ctl.engine.remove_volume(&names::member_volume(id)).await?;
        }
    }
    Ok(())
}
