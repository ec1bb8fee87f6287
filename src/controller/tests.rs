//! The controller against the fake engine: what the periodic resync queues, what garbage
//! collection takes, how a pool mends itself.

use std::sync::Arc;

use super::Controller;
use crate::config::Settings;
use crate::docker::fake::{FakeContainer, FakeEngine};
use crate::docker::{Engine, EngineError, LABEL_ID, LABEL_MANAGED, LABEL_SERVER, LABEL_UID};
use crate::resource::{AnyResource, Kind, Sandbox, SandboxPool, SandboxPoolSpec, SandboxSpec};
use crate::store::Store;

const IMAGE: &str = "img:1";

fn setup() -> (tempfile::TempDir, Arc<FakeEngine>, Arc<Controller>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &[]).unwrap();
    let engine = Arc::new(FakeEngine::new());
    engine.set_images(&[IMAGE]);
    let settings = Arc::new(Settings::for_tests(dir.path().to_path_buf()));
    let ctl = Controller::new(
        Arc::clone(&store),
        store.recorder(),
        engine.clone(),
        settings,
        "test-server".into(),
        None,
        Default::default(),
    );
    (dir, engine, ctl)
}

fn declare(ctl: &Controller, name: &str) {
    let sandbox: AnyResource = Sandbox::new(
        name,
        SandboxSpec {
            image: Some(IMAGE.into()),
            ..SandboxSpec::default()
        },
    )
    .into();
    ctl.store.create(sandbox, Default::default()).unwrap();
}

/// Declares pool `p` of two members and lets it fill them.
async fn fill_pool_of_two(ctl: &Controller) {
    let spec = SandboxPoolSpec {
        image: IMAGE.into(),
        size: 2,
        ..SandboxPoolSpec::default()
    };
    let pool: AnyResource = SandboxPool::new("p", spec).into();
    ctl.store.create(pool, Default::default()).unwrap();
    super::pool::reconcile(&ctl.pool_context(), "p")
        .await
        .unwrap();
}

fn pool_members(engine: &FakeEngine) -> Vec<FakeContainer> {
    engine
        .containers()
        .into_iter()
        .filter(|c| c.name().starts_with("agent-sandbox-pool.p."))
        .collect()
}

/// Takes every queued key.
async fn drain(ctl: &Controller) -> Vec<(Kind, String)> {
    let mut keys = Vec::new();
    while !ctl.queue.is_empty() {
        let key = ctl.queue.next().await.unwrap();
        ctl.queue.done(&key);
        keys.push(key);
    }
    keys
}

#[tokio::test]
async fn resync_queues_only_sandboxes_that_are_not_running_as_recorded() {
    let (_dir, engine, ctl) = setup();
    for name in ["a", "b"] {
        declare(&ctl, name);
        super::sandbox::reconcile(&ctl.sandbox_context(), name)
            .await
            .unwrap();
    }
    drain(&ctl).await;

    let inspects = engine.call_count("inspect_container");
    ctl.enqueue_drifted().await;
    assert_eq!(drain(&ctl).await, [], "both run as their status says");
    assert_eq!(
        engine.call_count("inspect_container"),
        inspects,
        "judged from one listing"
    );
    assert!(engine.call_count("list_containers") >= 1);

    // A container stopped behind our back (its event lost) is found by the next resync.
    let b = engine.container_of("b").unwrap();
    assert!(engine.set_state(&b.id, "exited"));
    ctl.enqueue_drifted().await;
    assert_eq!(drain(&ctl).await, [(Kind::Sandbox, "b".to_string())]);

    // So is a changed spec that no reconcile has observed yet.
    ctl.store
        .update(Kind::Sandbox, "a", |r| {
            if let AnyResource::Sandbox(s) = r {
                s.spec.cpus = Some(0.5);
            }
            Ok(())
        })
        .unwrap();
    drain(&ctl).await;
    ctl.enqueue_drifted().await;
    let mut queued = drain(&ctl).await;
    queued.sort();
    assert_eq!(
        queued,
        [
            (Kind::Sandbox, "a".to_string()),
            (Kind::Sandbox, "b".to_string())
        ]
    );

    // Without a listing, everything is queued.
    engine.fail_next("list_containers");
    ctl.enqueue_drifted().await;
    assert_eq!(drain(&ctl).await.len(), 2);
}

#[tokio::test]
async fn garbage_collection_takes_a_replaced_workspace_only_once_nothing_is_in_progress() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    // Left by a rollback or a carried workspace whose removal a crash interrupted: a volume
    // labeled for the sandbox (here made, with its labels, by a container of it).
    let leftover = "agent-sandbox-a-workspace-0badcafe";
    let current = engine.container_of("a").unwrap();
    let mut plan = current.plan.clone();
    plan.name = Some("agent-sandbox-a.leftover".into());
    plan.workspace_volume = leftover.into();
    let id = engine.create_container(&plan).await.unwrap();
    engine.remove_container(&id).await.unwrap();

    // While the sandbox has a change in progress, a volume labeled for it may be its next one.
    ctl.store
        .update(Kind::Sandbox, "a", |resource| {
            if let AnyResource::Sandbox(sandbox) = resource {
                sandbox.spec.cpus = Some(0.5);
            }
            Ok(())
        })
        .unwrap();
    super::gc::collect_garbage(&ctl.gc_context()).await.unwrap();
    assert!(
        engine.volumes().contains_key(leftover),
        "kept while in progress"
    );

    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    super::gc::collect_garbage(&ctl.gc_context()).await.unwrap();
    let volumes = engine.volumes();
    assert!(
        !volumes.contains_key(leftover),
        "collected once settled: {volumes:?}"
    );
    assert!(
        volumes.contains_key("agent-sandbox-a-workspace"),
        "the current one stays"
    );
}

#[tokio::test]
async fn a_pool_replaces_a_member_left_half_made() {
    let (_dir, engine, ctl) = setup();
    fill_pool_of_two(&ctl).await;
    let members = || pool_members(&engine);
    assert_eq!(members().len(), 2);
    // A crash between a member's create and its start leaves it created, never running.
    let stuck = members()[0].id.clone();
    assert!(engine.set_state(&stuck, "created"));

    super::pool::reconcile(&ctl.pool_context(), "p")
        .await
        .unwrap();
    let now = members();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.iter().all(|c| c.state == "running" && c.id != stuck));
    let status = ctl.store.get(Kind::SandboxPool, "p").unwrap();
    let status = status.resource.as_pool().unwrap().status.clone().unwrap();
    assert_eq!(status.ready_replicas, 2);
}

#[tokio::test]
async fn a_claim_gets_past_a_member_that_vanished_since_the_pool_looked() {
    let (_dir, engine, ctl) = setup();
    fill_pool_of_two(&ctl).await;
    let members: Vec<String> = pool_members(&engine).into_iter().map(|c| c.id).collect();
    assert_eq!(members.len(), 2);
    // Removed by a hand after the pool published what it saw.
    assert!(engine.vanish_container(&members[0]));
    let listings = engine.call_count("list_containers");

    for name in ["a", "b"] {
        declare(&ctl, name);
        super::sandbox::reconcile(&ctl.sandbox_context(), name)
            .await
            .unwrap();
    }
    let a = ctl.store.get(Kind::Sandbox, "a").unwrap();
    let a = a.resource.as_sandbox().unwrap().status.clone().unwrap();
    assert_eq!(a.claimed_from.as_deref(), Some("p"), "{a:?}");
    assert_eq!(a.container_id.as_deref(), Some(members[1].as_str()));
    let b = ctl.store.get(Kind::Sandbox, "b").unwrap();
    let b = b.resource.as_sandbox().unwrap().status.clone().unwrap();
    assert_eq!(b.claimed_from, None, "no member was left for b: {b:?}");
    assert!(b.container_id.is_some_and(|id| id != members[1]));
    assert!(
        engine.call_count("list_containers") > listings,
        "the vanished member sent the claim to Docker's own list"
    );
}

/// Docker's own list, which a claim falls back to, may hold a member made before an edit of its
/// pool and not yet replaced: a claim never takes it.
#[tokio::test]
async fn a_claim_never_takes_a_member_of_an_earlier_pool_spec() {
    let (_dir, engine, ctl) = setup();
    fill_pool_of_two(&ctl).await;
    let members = pool_members(&engine);
    let mut stale = members[0].plan.clone();
    stale.name = Some("agent-sandbox-pool.p.stale".into());
    stale.sandbox = "pool.p.stale".into();
    stale.spec_hash = "an-earlier-spec".into();
    let stale = engine.create_container(&stale).await.unwrap();
    engine.start_container(&stale).await.unwrap();
    // The members the pool published are gone: the claim asks Docker.
    for member in &members {
        assert!(engine.vanish_container(&member.id));
    }

    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let a = ctl.store.get(Kind::Sandbox, "a").unwrap();
    let a = a.resource.as_sandbox().unwrap().status.clone().unwrap();
    assert_eq!(a.claimed_from, None, "{a:?}");
    assert_ne!(a.container_id.as_deref(), Some(stale.as_str()));
}

#[tokio::test]
async fn a_swap_retires_under_another_name_while_the_retired_name_is_held() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let current = engine.container_of("a").unwrap();
    let plan_named = |name: &str| {
        let mut plan = current.plan.clone();
        plan.name = Some(name.to_string());
        plan
    };
    // One retired before whose removal is still running (or a crash interrupted), and the new
    // one, built aside.
    let leftover = engine
        .create_container(&plan_named("agent-sandbox-a.retired"))
        .await
        .unwrap();
    let new = engine
        .create_container(&plan_named("agent-sandbox-a.restore"))
        .await
        .unwrap();

    let retired = ctl.containers.swap_in("a", &new).await.unwrap().unwrap();
    assert!(retired.starts_with("agent-sandbox-a.retired-"), "{retired}");
    let names: std::collections::BTreeMap<String, String> = engine
        .containers()
        .into_iter()
        .map(|c| (c.id.clone(), c.name()))
        .collect();
    assert_eq!(names.get(&new).map(String::as_str), Some("agent-sandbox-a"));
    assert_eq!(names.get(&current.id), Some(&retired));
    assert_eq!(
        names.get(&leftover).map(String::as_str),
        Some("agent-sandbox-a.retired"),
        "the swap does not wait for the earlier one's removal: {names:?}"
    );
}

#[tokio::test]
async fn a_second_reconcile_of_a_claimed_sandbox_writes_nothing() {
    let (_dir, _engine, ctl) = setup();
    fill_pool_of_two(&ctl).await;
    declare(&ctl, "a");
    let seen = || {
        let entry = ctl.store.get(Kind::Sandbox, "a").unwrap();
        let version = entry.resource.metadata().resource_version.clone();
        (version, entry.resource.as_sandbox().unwrap().status.clone())
    };
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let (first, status) = seen();
    assert!(
        status.as_ref().is_some_and(|s| s.claimed_from.is_some()),
        "{status:?}"
    );
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let (second, again) = seen();
    assert_eq!(first, second, "rewritten:\n{status:#?}\n{again:#?}");
}

/// A crash in the middle of a rollback leaves its staging container and new volume; when the
/// request can no longer succeed (its snapshot was deleted since), the failed retry removes
/// them, and the sandbox keeps running on its own workspace.
#[tokio::test]
async fn a_failing_rollback_removes_what_an_interrupted_attempt_left() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let current = engine.container_of("a").unwrap();
    let mut plan = current.plan.clone();
    plan.name = Some(super::names::staging_container_name("a"));
    plan.workspace_volume = "agent-sandbox-a-workspace-31c1e607".into();
    engine.create_container(&plan).await.unwrap();

    ctl.store
        .update(Kind::Sandbox, "a", |resource| {
            if let AnyResource::Sandbox(sandbox) = resource {
                sandbox.spec.rollback = Some(crate::resource::RollbackRequest {
                    snapshot: "deleted-since".into(),
                    request_id: "r1".into(),
                });
            }
            Ok(())
        })
        .unwrap();
    // Through the error policy, which reports the failure and then removes what it left.
    let failed = ctl.reconcile(&(Kind::Sandbox, "a".to_string())).await;
    assert!(failed.is_err(), "the rollback cannot succeed");

    let names: Vec<String> = engine.containers().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["agent-sandbox-a"], "staging container removed");
    let volumes: Vec<String> = engine.volumes().into_keys().collect();
    assert_eq!(
        volumes,
        ["agent-sandbox-a-workspace"],
        "only the current workspace"
    );
    assert_eq!(
        engine.container_of("a").unwrap().id,
        current.id,
        "still running as it was"
    );
}

/// Once the host path has held, a cold restore unpacks while its container starts and proves the
/// directory afterwards. A directory that turns out not to be the container's `/workspace` fails
/// the restore, leaves no container or volume, and the next restore goes through Docker.
#[tokio::test]
async fn a_restore_into_a_directory_that_fails_the_proof_fails_and_gives_up_the_host_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &[]).unwrap();
    let engine = Arc::new(FakeEngine::new());
    engine.set_images(&[IMAGE]);
    let mut settings = Settings::for_tests(dir.path().to_path_buf());
    // SAFETY: plain system calls without arguments.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    settings.sandbox_user = format!("{uid}:{gid}");
    settings.host_workspace_access = true;
    let ctl = Controller::new(
        Arc::clone(&store),
        store.recorder(),
        engine.clone(),
        Arc::new(settings),
        "t".into(),
        None,
        Default::default(),
    );
    // Docker names this directory; this test's process stands in for the container's, whose
    // root shows no such directory at /workspace.
    let named = tempfile::tempdir().unwrap();
    engine.set_host_workspace(named.path().to_path_buf(), i64::from(std::process::id()));
    ctl.workspaces.host_access.learn("", true);

    let tar_path = dir.path().join("s.tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
    let mut header = tar::Header::new_ustar();
    header.set_size(3);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, "hello.txt", &b"hi\n"[..])
        .unwrap();
    builder.into_inner().unwrap().sync_all().unwrap();
    let snapshot = super::content::Validated {
        name: "s".into(),
        path: tar_path,
        uid: None,
        rootfs: None,
        size_bytes: 0,
    };
    let sandbox = Sandbox::new(
        "a",
        SandboxSpec {
            image: Some(IMAGE.into()),
            ..SandboxSpec::default()
        },
    );
    let effective = sandbox.spec.effective(&ctl.containers.defaults());
    let plan = ctl
        .containers
        .plan_for(&sandbox, &effective, "agent-sandbox-a-workspace")
        .await
        .unwrap();

    let failed = super::restore::populate_volume(&ctl.sandbox_context(), &plan, &snapshot).await;
    assert!(failed.is_err(), "the proof cannot hold: {failed:?}");
    assert!(
        named.path().join("hello.txt").exists(),
        "the unpack ran while the container started"
    );
    assert_eq!(engine.call_count("start_container"), 1);
    assert_eq!(engine.call_count("archive_put"), 0);
    assert!(engine.containers().is_empty(), "the container is discarded");
    assert!(engine.volumes().is_empty(), "the volume is discarded");
    assert_eq!(
        ctl.workspaces.host_access.get(""),
        Some(false),
        "the host path is given up"
    );

    // The next restore goes through the archive API (which the fake cannot serve).
    let again = super::restore::populate_volume(&ctl.sandbox_context(), &plan, &snapshot).await;
    assert!(again.is_err());
    assert_eq!(engine.call_count("archive_put"), 1);
    assert_eq!(
        engine.call_count("start_container"),
        1,
        "not started unready"
    );
}

#[tokio::test]
async fn an_engine_that_cannot_rename_gets_no_pool_claims() {
    let (_dir, engine, ctl) = setup();
    fill_pool_of_two(&ctl).await;
    engine.set_capabilities(crate::docker::EngineCapabilities {
        rename: false,
        ..crate::docker::EngineCapabilities::ALL
    });
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let a = ctl.store.get(Kind::Sandbox, "a").unwrap();
    let a = a.resource.as_sandbox().unwrap().status.clone().unwrap();
    assert_eq!(a.claimed_from, None, "{a:?}");
    assert!(a.container_id.is_some(), "created cold instead: {a:?}");
    assert_eq!(pool_members(&engine).len(), 2, "the pool kept its members");
    assert_eq!(engine.call_count("rename_container"), 0);
}

#[tokio::test]
async fn a_deletion_kills_and_renames_at_once_and_a_new_sandbox_of_the_name_gets_a_fresh_workspace()
{
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    let ctx = ctl.sandbox_context();
    super::sandbox::reconcile(&ctx, "a").await.unwrap();
    let old = engine.container_of("a").unwrap();
    assert_eq!(old.plan.workspace_volume, "agent-sandbox-a-workspace");

    ctl.store
        .delete(Kind::Sandbox, "a", Default::default())
        .unwrap();
    super::sandbox::reconcile(&ctx, "a").await.unwrap();
    // The document is gone; the container is killed and under a name the sandbox's no longer
    // maps to; its removal has not run yet (this runtime has not yielded to it).
    assert!(ctl.store.get(Kind::Sandbox, "a").is_none());
    let killed: Vec<_> = engine
        .containers()
        .into_iter()
        .filter(|c| c.id == old.id)
        .collect();
    assert_eq!(killed.len(), 1);
    assert_ne!(killed[0].state, "running");
    assert!(killed[0].name().starts_with("agent-sandbox-a.deleted-"));
    assert!(engine.volumes().contains_key("agent-sandbox-a-workspace"));

    // The same name again, before the old workspace is gone: a workspace of its own.
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctx, "a").await.unwrap();
    let new = engine.container_of("a").unwrap();
    assert_ne!(new.id, old.id);
    assert_ne!(new.plan.workspace_volume, "agent-sandbox-a-workspace");
    assert!(new
        .plan
        .workspace_volume
        .starts_with("agent-sandbox-a-workspace-"));

    // The background removal takes the old container and workspace, never the new ones.
    for _ in 0..100 {
        if engine.containers().len() == 1 && engine.volumes().len() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(engine.containers(), vec![new.clone()]);
    assert_eq!(
        engine.volumes().into_keys().collect::<Vec<_>>(),
        vec![new.plan.workspace_volume.clone()]
    );
}

/// After a Docker daemon restart, gVisor's runtime may keep the task of a container the restart
/// found paused, and every start of it is refused: the container is replaced on the same
/// workspace instead of the sandbox failing for good.
#[tokio::test]
async fn a_container_whose_runtime_kept_its_task_is_replaced_on_the_same_workspace() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    let context = ctl.sandbox_context();
    super::sandbox::reconcile(&context, "a").await.unwrap();
    let before = engine.containers();
    assert_eq!(before.len(), 1);
    let old = before[0].id.clone();
    let volume = before[0].plan.workspace_volume.clone();
    engine
        .stop_container(&old, std::time::Duration::ZERO)
        .await
        .unwrap();

    engine.fail_next_with(
        "start_container",
        EngineError::StaleRuntimeTask {
            container: old.clone(),
        },
    );
    let failed = super::sandbox::reconcile(&context, "a").await;
    let error = failed.expect_err("the start is refused");
    let verdict = super::policy::error_policy(&error.error);
    assert_eq!(verdict.reason, "ContainerReplaced");
    assert_eq!(verdict.retry_after, Some(std::time::Duration::ZERO));
    assert!(
        engine.containers().is_empty(),
        "the stuck container is removed"
    );

    super::sandbox::reconcile(&context, "a").await.unwrap();
    let after = engine.containers();
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].id, old, "a new container");
    assert_eq!(after[0].state, "running");
    assert_eq!(after[0].plan.workspace_volume, volume, "the same workspace");
}

#[tokio::test]
async fn a_rollbacks_background_cleanup_spares_a_workspace_made_after_it() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    let current = "agent-sandbox-a-workspace".to_string();
    let labels = |uid: &str| {
        std::collections::BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_SERVER.to_string(), ctl.containers.server_id.clone()),
            (LABEL_ID.to_string(), "a".to_string()),
            (LABEL_UID.to_string(), uid.to_string()),
        ])
    };
    // An attempt a crash interrupted: a stray of the rollback that completes now.
    let stray = "agent-sandbox-a-workspace-0000dead";
    engine
        .create_marker_volume(stray, &labels("u1"))
        .await
        .unwrap();
    let strays = ctl.containers.stray_volumes("a", &current).await;
    assert_eq!(strays, [stray]);
    // The next rollback's new workspace, made before the cleanup task runs.
    let next = "agent-sandbox-a-workspace-0000beef";
    engine
        .create_marker_volume(next, &labels("u1"))
        .await
        .unwrap();
    ctl.containers.remove_retired("a", Vec::new(), strays);
    for _ in 0..200 {
        if !engine.volumes().contains_key(stray) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        !engine.volumes().contains_key(stray),
        "the stray is removed"
    );
    assert!(
        engine.volumes().contains_key(next),
        "the next rollback's workspace is left alone"
    );
}

fn status_of(ctl: &Controller, name: &str) -> crate::resource::SandboxStatus {
    let entry = ctl.store.get(Kind::Sandbox, name).unwrap();
    entry.resource.as_sandbox().unwrap().status.clone().unwrap()
}

fn named(engine: &FakeEngine, sandbox: &str) -> Option<FakeContainer> {
    let name = crate::docker::container_name(sandbox);
    engine.containers().into_iter().find(|c| c.name() == name)
}

/// A server started afresh on the same data and daemon: what it knew only in memory is gone.
fn restarted(
    dir: &tempfile::TempDir,
    engine: &Arc<FakeEngine>,
    ctl: &Controller,
) -> Arc<Controller> {
    let settings = Arc::new(Settings::for_tests(dir.path().to_path_buf()));
    Controller::new(
        Arc::clone(&ctl.store),
        ctl.store.recorder(),
        engine.clone(),
        settings,
        "test-server".into(),
        None,
        Default::default(),
    )
}

/// Sandbox `a` claims a member of pool `p`, but the rename that follows its status write fails:
/// the status names a member still under its pool name. Returns that member's ID.
async fn claim_left_unnamed(engine: &FakeEngine, ctl: &Controller) -> String {
    fill_pool_of_two(ctl).await;
    declare(ctl, "a");
    engine.fail_next("rename_container");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    // The rename follows the status write, on a task of its own; here it fails.
    ctl.pools.naming.settled().await;
    assert_eq!(engine.call_count("rename_container"), 1);
    let a = status_of(ctl, "a");
    assert_eq!(a.phase, crate::resource::SandboxPhase::Running, "{a:?}");
    assert_eq!(a.claimed_from.as_deref(), Some("p"), "{a:?}");
    let claimed = a.container_id.expect("recorded");
    assert!(
        pool_members(engine).iter().any(|c| c.id == claimed),
        "still under its member name"
    );
    assert!(named(engine, "a").is_none());
    claimed
}

/// Nothing hands a recorded claim out again, or drains it, before it carries its sandbox's name.
async fn never_handed_out(engine: &FakeEngine, ctl: &Controller, claimed: &str) {
    super::pool::reconcile(&ctl.pool_context(), "p")
        .await
        .unwrap();
    assert!(
        engine.containers().iter().any(|c| c.id == claimed),
        "the pool kept it"
    );
    declare(ctl, "b");
    super::sandbox::reconcile(&ctl.sandbox_context(), "b")
        .await
        .unwrap();
    let b = status_of(ctl, "b");
    assert!(b.container_id.is_some());
    assert_ne!(b.container_id.as_deref(), Some(claimed), "{b:?}");
}

/// The next reconcile of `a` gives the member it recorded, `claimed`, its name.
async fn named_on_the_next_pass(engine: &FakeEngine, ctl: &Controller, claimed: &str) {
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    assert_eq!(named(engine, "a").map(|c| c.id).as_deref(), Some(claimed));
    assert_eq!(status_of(ctl, "a").container_id.as_deref(), Some(claimed));
}

#[tokio::test]
async fn a_claim_is_named_after_its_status_and_a_failed_rename_on_the_next_pass() {
    let (_dir, engine, ctl) = setup();
    let claimed = claim_left_unnamed(&engine, &ctl).await;
    never_handed_out(&engine, &ctl, &claimed).await;
    named_on_the_next_pass(&engine, &ctl, &claimed).await;
}

#[tokio::test]
async fn a_claim_recorded_before_a_restart_is_named_by_the_next_server_and_kept_from_its_pool() {
    let (dir, engine, ctl) = setup();
    let claimed = claim_left_unnamed(&engine, &ctl).await;
    let ctl = restarted(&dir, &engine, &ctl);
    never_handed_out(&engine, &ctl, &claimed).await;
    named_on_the_next_pass(&engine, &ctl, &claimed).await;
}

#[tokio::test]
async fn deleting_a_sandbox_whose_claim_was_never_named_retires_the_member_with_it() {
    let (dir, engine, ctl) = setup();
    let claimed = claim_left_unnamed(&engine, &ctl).await;
    let ctl = restarted(&dir, &engine, &ctl);
    ctl.store
        .delete(Kind::Sandbox, "a", Default::default())
        .unwrap();
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    assert!(ctl.store.get(Kind::Sandbox, "a").is_none(), "finalized");
    assert!(
        !pool_members(&engine).iter().any(|c| c.id == claimed),
        "no longer a member of its pool: {:?}",
        engine.containers()
    );
    // And no later claim gets it.
    declare(&ctl, "c");
    super::sandbox::reconcile(&ctl.sandbox_context(), "c")
        .await
        .unwrap();
    assert_ne!(status_of(&ctl, "c").container_id, Some(claimed));
}

#[tokio::test]
async fn a_view_not_seen_mounted_gives_views_up_only_while_its_container_runs() {
    let (_dir, engine, ctl) = setup();
    declare(&ctl, "a");
    super::sandbox::reconcile(&ctl.sandbox_context(), "a")
        .await
        .unwrap();
    drain(&ctl).await;
    // Docker names a directory where nothing is mounted; under gVisor the host path's proof is
    // not asked for, so only the mount table speaks.
    let named = tempfile::tempdir().unwrap();
    engine.set_host_workspace(named.path().to_path_buf(), i64::from(std::process::id()));
    let id = engine.container_of("a").unwrap().id;
    let views = super::views::ViewContext {
        store: &ctl.store,
        engine: engine.as_ref(),
        containers: &ctl.containers,
        workspaces: &ctl.workspaces,
    };
    let upper = named.path().join("upper");
    let verify = |id: String| {
        let (views, upper) = (&views, &upper);
        async move { super::views::verify(views, &id, "runsc", upper).await }
    };

    let running = verify(id.clone()).await.unwrap_err();
    assert!(running.lasting, "{running:?}");
    assert!(
        running.reason.contains("not this host's overlay"),
        "{running:?}"
    );
    // The same container stopped meanwhile (Docker unmounts its volumes), or vanished: that
    // says nothing of this host.
    assert!(engine.set_state(&id, "exited"));
    let stopped = verify(id.clone()).await.unwrap_err();
    assert!(!stopped.lasting, "{stopped:?}");
    assert!(engine.vanish_container(&id));
    let vanished = verify(id).await.unwrap_err();
    assert!(!vanished.lasting, "{vanished:?}");
}
