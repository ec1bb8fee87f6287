//! The warm pool of a `SandboxTemplate` with `spec.pool`: an implicit pool whose members are made
//! in the template's shape, its snapshot's content included (a Full snapshot's root filesystem
//! image and its `/workspace`), with the template's limits, so that a sandbox made from the
//! template claims one as fast as from a `SandboxPool`, without filling anything at claim time.
//!
//! The implicit pool is named `T-<template>`: names of resources are lower case, so it never
//! meets a `SandboxPool`'s name, and its members (`pool.T-<template>.<random>`) go through the
//! pools' own listing, hand-out and rename (`claims.rs`). A member's `/workspace` is a
//! copy-on-write view of the snapshot where views work here (`views.rs`), else a copy of it, so
//! a claim never copies anything. Members are replaced when the
//! template's spec changes (their key hashes it). This module makes members and decides which
//! sandboxes may claim them; it does not build sandboxes' own containers.

use futures::future::join_all;

use super::claims::{ClaimName, Claimed};
use super::container::limits_for;
use super::content;
use super::context::{PoolContext, SandboxContext};
use super::error::ReconcileError;
use super::names::{self, container_name};
use super::policy::Outcome;
use super::status::generation;
use super::views;
use crate::docker::{ManagedContainer, LABEL_SPEC_HASH};
use crate::resource::{
    EffectiveSandbox, Kind, ObjectMeta, Sandbox, SandboxPool, SandboxPoolSpec, SandboxTemplate,
    TemplateRecord,
};

/// What an implicit pool's name starts with (upper case: no resource name has it).
const PREFIX: &str = "T-";

/// The implicit pool of template `template`.
pub(super) fn pool_name(template: &str) -> String {
    format!("{PREFIX}{template}")
}

/// The template whose implicit pool `pool` is, if it is one.
pub(super) fn template_of(pool: &str) -> Option<&str> {
    pool.strip_prefix(PREFIX)
}

/// The live template `name` with a pool, if there is one.
fn pooled_template(store: &crate::store::Store, name: &str) -> Option<SandboxTemplate> {
    store
        .get(Kind::SandboxTemplate, name)
        .and_then(|e| e.resource.as_template().cloned())
        .filter(|t| t.metadata.deletion_timestamp.is_none() && t.spec.pool.is_some())
}

/// Names of the implicit pools of live templates with a pool (for garbage collection).
pub(super) fn live_pools(store: &crate::store::Store) -> Vec<String> {
    store
        .list(Kind::SandboxTemplate)
        .iter()
        .filter_map(|e| e.resource.as_template())
        .filter(|t| t.metadata.deletion_timestamp.is_none() && t.spec.pool.is_some())
        .map(|t| pool_name(&t.metadata.key()))
        .collect()
}

/// The implicit pools of live templates with a pool whose snapshot is `snapshot` (a key): their
/// members hold it, and a change of it (deleted, made again under its name) may make them stale.
pub(super) fn pools_holding(store: &crate::store::Store, snapshot: &str) -> Vec<String> {
    store
        .list(Kind::SandboxTemplate)
        .iter()
        .filter_map(|e| e.resource.as_template())
        .filter(|t| t.metadata.deletion_timestamp.is_none() && t.spec.pool.is_some())
        .filter(|t| {
            t.spec
                .snapshot
                .as_ref()
                .is_some_and(|name| t.metadata.sibling(name) == snapshot)
        })
        .map(|t| pool_name(&t.metadata.key()))
        .collect()
}

/// Key of the members of `template`: its spec (without the pool size), the runtime, and the uid
/// of the snapshot the spec names as it is now, so that a snapshot deleted and made again under
/// the same name (other content) makes the members holding the old one stale.
fn key_of(store: &crate::store::Store, template: &SandboxTemplate, runtime: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut spec = template.spec.clone();
    spec.pool = None;
    let snapshot_uid = spec.snapshot.as_ref().and_then(|name| {
        store
            .get(Kind::Snapshot, &template.metadata.sibling(name))
            .and_then(|e| {
                e.resource
                    .as_snapshot()
                    .and_then(|s| s.metadata.uid.clone())
            })
    });
    let shape = serde_json::json!({"spec": spec, "runtime": runtime, "snapshot": snapshot_uid});
    let digest = Sha256::digest(shape.to_string().as_bytes());
    format!("tpool-{}", hex::encode(&digest[..8]))
}

/// What a sandbox made from `template` alone runs as.
fn effective_of(
    defaults: &crate::resource::SandboxDefaults,
    t: &SandboxTemplate,
) -> EffectiveSandbox {
    t.spec.as_sandbox_spec().effective(defaults)
}

/// Keeps `size` members of template `template`'s shape; drains them when the template or its
/// pool is gone.
pub(super) async fn reconcile(
    ctl: &PoolContext<'_>,
    pool: &str,
    template: &str,
) -> Result<Outcome, ReconcileError> {
    let members = ctl.pools.members(pool).await?;
    let Some(template) = pooled_template(ctl.store, template) else {
        ctl.pools.handed_out.publish(pool, Vec::new());
        remove(ctl, &members).await?;
        return Ok(Outcome::done());
    };
    let runtime = ctl.containers.settings.docker_runtime.clone();
    let key = key_of(ctl.store, &template, &runtime);
    let (usable, stale): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|c| c.labels.get(LABEL_SPEC_HASH) == Some(&key) && c.is_running());
    remove(ctl, &stale).await?;
    let size = template.spec.pool.as_ref().map(|p| p.size).unwrap_or(0) as usize;
    if usable.len() > size {
        remove(ctl, &usable[size..]).await?;
    }
    if usable.len() >= size {
        ctl.pools
            .handed_out
            .publish(pool, usable.into_iter().take(size).collect());
        return Ok(Outcome::done());
    }
    if let Some(wait) = ctl.pools.handed_out.refill_wait(pool) {
        ctl.pools.handed_out.publish(pool, usable);
        return Ok(Outcome::after(wait));
    }
    let missing = size - usable.len();
    let results = join_all((0..missing).map(|_| async {
        let _turn = ctl.making_turn().await;
        create(ctl, pool, &template, &key, &runtime).await
    }))
    .await;
    let ready: Vec<ManagedContainer> = ctl
        .pools
        .members(pool)
        .await?
        .into_iter()
        .filter(|c| c.is_running() && c.labels.get(LABEL_SPEC_HASH) == Some(&key))
        .collect();
    ctl.pools.handed_out.publish(pool, ready);
    if let Some(Err(error)) = results.into_iter().find(|r| r.is_err()) {
        return Err(ReconcileError::MembersNotCreated(Box::new(error)));
    }
    Ok(Outcome::done())
}

async fn create(
    ctl: &PoolContext<'_>,
    pool: &str,
    template: &SandboxTemplate,
    key: &str,
    runtime: &str,
) -> Result<(), ReconcileError> {
    let effective = effective_of(&ctl.containers.defaults(), template);
    // The content first: a snapshot that cannot be used makes no member.
    let snapshot = match &template.spec.snapshot {
        Some(name) => Some(
            content::validated(
                ctl.store,
                &ctl.containers.settings,
                ctl.validated_files,
                &template.metadata.sibling(name),
            )
            .await?,
        ),
        None => None,
    };
    let shape = SandboxPool {
        api_version: String::new(),
        kind: String::new(),
        metadata: ObjectMeta {
            name: pool.to_string(),
            uid: template.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        spec: SandboxPoolSpec {
            image: effective.image.clone(),
            size: 0,
            read_only_rootfs: Some(effective.read_only_rootfs),
            network: Some(effective.network),
            runtime: None,
        },
        status: None,
    };
    let member = names::new_member(pool);
    let mut plan = ctl
        .containers
        .plan_for_member(&shape, &member, key, runtime.to_string())
        .await?;
    if let Some(rootfs) = snapshot.as_ref().and_then(|s| s.rootfs.as_ref()) {
        if !ctl.engine.image_exists(&rootfs.image).await? {
            return Err(ReconcileError::RootfsImageMissing {
                snapshot: template.spec.snapshot.clone().unwrap_or_default(),
                image: rootfs.image.clone(),
            });
        }
        plan.image = rootfs.image.clone();
    }
    // The template's limits, so that its sandboxes claim without a live change (which gVisor
    // cannot make).
    plan.cpus = effective.cpus;
    plan.memory_mb = effective.memory_mb;
    plan.pids_limit = effective.pids_limit;
    let made = async {
        // A snapshot's content as a copy-on-write view where views work here: a member costs the
        // same whatever the snapshot holds, and takes disk only for what its sandbox writes.
        if let Some(snapshot) = snapshot.as_ref().filter(|_| plan.workspace_disk_mb == 0) {
            if let Some(id) = views::populate_view(&ctl.views(), &plan, snapshot).await? {
                return Ok(id);
            }
        }
        let id = ctl.engine.create_container(&plan).await?;
        let runtime = plan.runtime.clone().unwrap_or_default();
        ctl.workspaces
            .start_with_workspace(&id, &runtime, snapshot.as_ref())
            .await?;
        Ok::<_, ReconcileError>(id)
    }
    .await;
    if let Ok(id) = &made {
        ctl.warm(id);
    }
    if let Err(error) = made {
        ctl.containers
            .discard(&container_name(&member), &plan.workspace_volume)
            .await;
        return Err(error);
    }
    Ok(())
}

async fn remove(ctl: &PoolContext<'_>, members: &[ManagedContainer]) -> Result<(), ReconcileError> {
    for member in members {
        ctl.engine.remove_container(&member.id).await?;
        if let Some(id) = member.sandbox() {
            ctl.engine.remove_volume(&names::member_volume(id)).await?;
        }
    }
    Ok(())
}

/// Claims, for sandbox `name` restored from snapshot `snapshot` (its key) without a template of
/// its own (a fork's child, a `source`, a rollback), a member of a pooled template on that very
/// snapshot whose members run exactly as the sandbox would, under the container name `as_name`:
/// the member holds the snapshot already, so the restore is a rename. `None` when there is none.
pub(super) async fn claim_holding(
    ctl: &SandboxContext<'_>,
    snapshot: &str,
    name: &str,
    effective: &EffectiveSandbox,
    as_name: ClaimName<'_>,
) -> Result<Option<Claimed>, ReconcileError> {
    for pool in pools_holding(ctl.store, snapshot) {
        let Some(template) = template_of(&pool).and_then(|t| pooled_template(ctl.store, t)) else {
            continue;
        };
        let claimed = claim_member(ctl, &template, name, effective, as_name).await?;
        if claimed.is_some() {
            return Ok(claimed);
        }
    }
    Ok(None)
}

/// Claims a member of the pool of the template `sandbox` was made from (`record`), when the sandbox runs
/// exactly as that template at its current generation would make it (same container shape and
/// source; limits may differ where they can change live). `None` when there is no such pool or
/// member: the sandbox is then built the ordinary way.
pub(super) async fn claim(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    record: Option<&TemplateRecord>,
    effective: &EffectiveSandbox,
) -> Result<Option<Claimed>, ReconcileError> {
    let Some(record) = record else {
        return Ok(None);
    };
    let Some(template) = pooled_template(ctl.store, &record.name) else {
        return Ok(None);
    };
    if generation(&template.metadata) != record.generation {
        return Ok(None);
    }
    let same_source =
        sandbox.spec.source.as_ref().map(|s| &s.snapshot) == template.spec.snapshot.as_ref();
    if !same_source {
        return Ok(None);
    }
    let name = &sandbox.metadata.key();
    claim_member(ctl, &template, name, effective, ClaimName::Own).await
}

/// Claims a member of `template`'s pool for sandbox `name` under the container name `as_name`,
/// when the sandbox runs in the members' container shape (limits may differ where they can
/// change live). Only members of the template as it is now: its pool may not have replaced older
/// ones yet.
async fn claim_member(
    ctl: &SandboxContext<'_>,
    template: &SandboxTemplate,
    name: &str,
    effective: &EffectiveSandbox,
    as_name: ClaimName<'_>,
) -> Result<Option<Claimed>, ReconcileError> {
    let members_are = effective_of(&ctl.containers.defaults(), template);
    if members_are.container_hash() != effective.container_hash() {
        return Ok(None);
    }
    let key = key_of(ctl.store, template, &ctl.settings.docker_runtime);
    ctl.pools
        .claim_from(
            &pool_name(&template.metadata.key()),
            limits_for(&members_are),
            Some(&key),
            name,
            effective,
            as_name,
        )
        .await
}
