//! The controller against the fake engine: what the periodic resync queues.

use std::sync::Arc;

use super::Controller;
use crate::config::Settings;
use crate::docker::fake::FakeEngine;
use crate::resource::{AnyResource, Kind, Sandbox, SandboxSpec};
use crate::store::Store;

const IMAGE: &str = "img:1";

fn setup() -> (tempfile::TempDir, Arc<FakeEngine>, Arc<Controller>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &[]).unwrap();
    let engine = Arc::new(FakeEngine::new());
    engine.set_images(&[IMAGE]);
    let settings = Arc::new(Settings::for_tests(dir.path().to_path_buf()));
    let ctl = Controller::new(store, engine.clone(), settings, "test-server".into(), None);
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
        super::sandbox::reconcile(&ctl, name).await.unwrap();
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
