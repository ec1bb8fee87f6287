//! Unit tests of the store against temporary directories: API writes and reopening here, folder
//! merging in [`folders`]. The watcher itself is exercised by the `store_folders` integration test.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::broadcast::error::TryRecvError;

use super::*;

mod folders;
use crate::resource::{Sandbox, SandboxSpec};

fn sandbox(name: &str, image: &str) -> AnyResource {
    Sandbox::new(
        name,
        SandboxSpec {
            image: Some(image.into()),
            ..SandboxSpec::default()
        },
    )
    .into()
}

fn doc(name: &str, image: &str) -> String {
    format!(
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n"
    )
}

fn image(store: &Store, name: &str) -> Option<String> {
    let entry = store.get(Kind::Sandbox, name)?;
    entry.resource.as_sandbox()?.spec.image.clone()
}

fn meta(resource: &AnyResource) -> (u64, String) {
    let m = resource.metadata();
    (m.generation.unwrap(), m.resource_version.clone().unwrap())
}

fn drain<T: Clone>(rx: &mut tokio::sync::broadcast::Receiver<T>) -> Vec<T> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(e) => out.push(e),
            Err(TryRecvError::Lagged(_)) => continue,
            Err(_) => return out,
        }
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    folder: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let folder = tmp.path().join("gitops");
    std::fs::create_dir_all(&folder).unwrap();
    Fixture {
        _tmp: tmp,
        data,
        folder,
    }
}

impl Fixture {
    fn open(&self) -> Arc<Store> {
        Store::open(&self.data, std::slice::from_ref(&self.folder)).unwrap()
    }
    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.folder.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }
}

const FOLDER: usize = 1;

#[test]
fn open_creates_the_layout() {
    let f = fixture();
    let store = f.open();
    for dir in ["manifests/sandboxes", "state/forks", "snapshots"] {
        assert!(f.data.join(dir).is_dir(), "{dir}");
    }
    assert!(store.is_fully_loaded());
}

#[test]
fn create_assigns_metadata_and_writes_declaration_and_state() {
    let f = fixture();
    let store = f.open();
    let mut rx = store.subscribe();
    let mut input = sandbox("demo", "busybox");
    input.metadata_mut().uid = Some("forged".into());
    input.metadata_mut().generation = Some(7);
    let created = store.create(input, WriteOptions::default()).unwrap();
    let m = created.metadata();
    assert_ne!(m.uid.as_deref(), Some("forged"));
    assert_eq!(m.uid.as_ref().unwrap().len(), 36);
    assert_eq!(meta(&created), (1, "1".to_string()));
    assert!(m.creation_timestamp.is_some());

    let manifest = std::fs::read_to_string(f.data.join("manifests/sandboxes/demo.yaml")).unwrap();
    assert!(manifest.contains("image: busybox"), "{manifest}");
    assert!(!manifest.contains("uid"), "{manifest}");
    let state = std::fs::read_to_string(f.data.join("state/sandboxes/demo.json")).unwrap();
    assert!(state.contains(m.uid.as_ref().unwrap()), "{state}");

    let events = drain(&mut rx);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, EventType::Added);
    assert_eq!(events[0].resource, created);

    let again = store.create(sandbox("demo", "other"), WriteOptions::default());
    assert!(matches!(again, Err(StoreError::AlreadyExists { .. })));
    let nameless = store.create(sandbox("", "busybox"), WriteOptions::default());
    assert!(matches!(nameless, Err(StoreError::Invalid(_))));
}

#[test]
fn generation_moves_only_with_the_spec_and_resource_version_with_every_write() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    let mut rx = store.subscribe();

    let mut labelled = sandbox("a", "one");
    labelled
        .metadata_mut()
        .labels
        .insert("team".into(), "x".into());
    let r = store
        .replace(labelled.clone(), WriteOptions::default())
        .unwrap();
    assert_eq!(meta(&r), (1, "2".to_string()));

    let r = store
        .replace(labelled.clone(), WriteOptions::default())
        .unwrap();
    assert_eq!(
        meta(&r),
        (1, "2".to_string()),
        "identical replace is a no-op"
    );

    let mut respecced = sandbox("a", "two");
    respecced
        .metadata_mut()
        .labels
        .insert("team".into(), "x".into());
    let r = store.replace(respecced, WriteOptions::default()).unwrap();
    assert_eq!(meta(&r), (2, "3".to_string()));

    let r = store
        .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Running"}))
        .unwrap();
    assert_eq!(meta(&r), (2, "4".to_string()));
    let same = store
        .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Running"}))
        .unwrap();
    assert_eq!(meta(&same), (2, "4".to_string()), "same status is a no-op");
    assert!(store
        .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Dancing"}))
        .is_err());

    let types: Vec<_> = drain(&mut rx).iter().map(|e| e.event_type).collect();
    assert_eq!(types, [EventType::Modified; 3]);

    // The API's own manifest, read back by a rescan, changes nothing.
    assert!(store.rescan(0));
    assert!(drain(&mut rx).is_empty());
    assert_eq!(image(&store, "a").as_deref(), Some("two"));
}

#[test]
fn stale_resource_version_is_a_conflict_and_update_retries() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    let mut stale = sandbox("a", "two");
    stale.metadata_mut().resource_version = Some("0".into());
    assert!(matches!(
        store.replace(stale, WriteOptions::default()),
        Err(StoreError::Conflict { .. })
    ));
    let mut current = sandbox("a", "two");
    current.metadata_mut().resource_version = Some("1".into());
    store.replace(current, WriteOptions::default()).unwrap();

    let updated = store
        .update(Kind::Sandbox, "a", |r| {
            r.metadata_mut().labels.insert("k".into(), "v".into());
            Ok(())
        })
        .unwrap();
    assert_eq!(updated.metadata().labels["k"], "v");
    assert!(matches!(
        store.replace(sandbox("missing", "x"), WriteOptions::default()),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn dry_run_writes_and_broadcasts_nothing() {
    let f = fixture();
    let store = f.open();
    let mut rx = store.subscribe();
    let dry = WriteOptions { dry_run: true };
    let r = store.create(sandbox("a", "one"), dry).unwrap();
    assert_eq!(r.metadata().generation, Some(1));
    assert!(store.get(Kind::Sandbox, "a").is_none());
    assert!(!f.data.join("manifests/sandboxes/a.yaml").exists());

    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    drain(&mut rx);
    let r = store.replace(sandbox("a", "two"), dry).unwrap();
    assert_eq!(r.metadata().generation, Some(2));
    let r = store.delete(Kind::Sandbox, "a", dry).unwrap();
    assert!(r.metadata().deletion_timestamp.is_some());
    assert_eq!(image(&store, "a").as_deref(), Some("one"));
    assert!(store
        .get(Kind::Sandbox, "a")
        .unwrap()
        .resource
        .metadata()
        .deletion_timestamp
        .is_none());
    assert!(drain(&mut rx).is_empty());
    // The next real write gets the next version: dry runs consume none.
    let r = store
        .replace(sandbox("a", "two"), WriteOptions::default())
        .unwrap();
    assert_eq!(meta(&r), (2, "2".to_string()));
}

#[test]
fn delete_marks_then_finalize_removes_files() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    assert!(matches!(
        store.finalize(Kind::Sandbox, "a"),
        Err(StoreError::Invalid(_))
    ));
    let mut rx = store.subscribe();
    let d1 = store
        .delete(Kind::Sandbox, "a", WriteOptions::default())
        .unwrap();
    let d2 = store
        .delete(Kind::Sandbox, "a", WriteOptions::default())
        .unwrap();
    assert_eq!(d1, d2, "delete is idempotent");
    assert!(matches!(
        store.replace(sandbox("a", "two"), WriteOptions::default()),
        Err(StoreError::Terminating { .. })
    ));
    assert!(f.data.join("manifests/sandboxes/a.yaml").exists());
    store.finalize(Kind::Sandbox, "a").unwrap();
    assert!(!f.data.join("manifests/sandboxes/a.yaml").exists());
    assert!(!f.data.join("state/sandboxes/a.json").exists());
    assert!(store.get(Kind::Sandbox, "a").is_none());
    store.finalize(Kind::Sandbox, "a").unwrap();
    let types: Vec<_> = drain(&mut rx).iter().map(|e| e.event_type).collect();
    assert_eq!(types, [EventType::Modified, EventType::Deleted]);
    // Gone for good: a rescan does not bring it back.
    store.rescan(0);
    assert!(store.get(Kind::Sandbox, "a").is_none());
}

#[test]
fn state_survives_reopening_and_versions_continue() {
    let f = fixture();
    let (uid, status) = {
        let store = f.open();
        store
            .create(sandbox("a", "one"), WriteOptions::default())
            .unwrap();
        store
            .replace(sandbox("a", "two"), WriteOptions::default())
            .unwrap();
        let r = store
            .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Running"}))
            .unwrap();
        (r.metadata().uid.clone(), r.status_json())
    };
    let store = f.open();
    let r = store.get(Kind::Sandbox, "a").unwrap().resource;
    assert_eq!(r.metadata().uid, uid);
    assert_eq!(meta(&r), (2, "3".to_string()));
    assert_eq!(r.status_json(), status);
    let b = store
        .create(sandbox("b", "x"), WriteOptions::default())
        .unwrap();
    assert_eq!(b.metadata().resource_version.as_deref(), Some("4"));
}

#[test]
fn reopening_reconciles_manifests_with_state() {
    let f = fixture();
    {
        let store = f.open();
        store
            .create(sandbox("gone", "one"), WriteOptions::default())
            .unwrap();
        store
            .create(sandbox("edited", "one"), WriteOptions::default())
            .unwrap();
    }
    // While the server is down: one manifest vanishes, one is edited, one appears, and a state
    // file is corrupted.
    std::fs::remove_file(f.data.join("manifests/sandboxes/gone.yaml")).unwrap();
    std::fs::write(
        f.data.join("manifests/sandboxes/edited.yaml"),
        doc("edited", "two"),
    )
    .unwrap();
    std::fs::write(
        f.data.join("manifests/sandboxes/new.yaml"),
        doc("new", "one"),
    )
    .unwrap();
    std::fs::write(
        f.data.join("manifests/sandboxes/broken.yaml"),
        doc("broken", "one"),
    )
    .unwrap();
    std::fs::write(f.data.join("state/sandboxes/broken.json"), "{not json").unwrap();
    std::fs::write(f.data.join("state/sandboxes/.x.json.tmp-1-1"), "torn").unwrap();

    let store = f.open();
    let gone = store.get(Kind::Sandbox, "gone").unwrap().resource;
    assert!(gone.metadata().deletion_timestamp.is_some());
    let edited = store.get(Kind::Sandbox, "edited").unwrap().resource;
    assert_eq!(edited.metadata().generation, Some(2));
    assert_eq!(
        store
            .get(Kind::Sandbox, "new")
            .unwrap()
            .resource
            .metadata()
            .generation,
        Some(1)
    );
    assert!(store.get(Kind::Sandbox, "broken").is_some());
    assert!(!f.data.join("state/sandboxes/.x.json.tmp-1-1").exists());
    let versions: std::collections::BTreeSet<_> = store
        .list(Kind::Sandbox)
        .iter()
        .map(|e| e.resource.metadata().resource_version.clone().unwrap())
        .collect();
    assert_eq!(versions.len(), 4, "{versions:?}");
}

#[test]
fn a_missing_watched_folder_is_not_fully_loaded_and_prunes_nothing() {
    let f = fixture();
    f.write("a.yaml", &doc("a", "one"));
    drop(f.open());
    std::fs::remove_dir_all(&f.folder).unwrap();
    let store = f.open();
    assert!(!store.is_fully_loaded());
    let a = store.get(Kind::Sandbox, "a").unwrap();
    assert!(a.resource.metadata().deletion_timestamp.is_none());
    assert_eq!(a.origin, Origin::Folder(f.folder.clone()));
    f.write("a.yaml", &doc("a", "one"));
    store.rescan(FOLDER);
    assert!(store.is_fully_loaded());
}

#[test]
fn owned_resources_keep_their_owner_references() {
    let f = fixture();
    let store = f.open();
    let owner = crate::resource::OwnerReference {
        api_version: crate::resource::API_VERSION.into(),
        kind: "Fork".into(),
        name: "f".into(),
        uid: "u".into(),
    };
    store
        .create_owned(
            sandbox("child", "one"),
            vec![owner.clone()],
            WriteOptions::default(),
        )
        .unwrap();
    let store = f.open();
    let child = store.get(Kind::Sandbox, "child").unwrap().resource;
    assert_eq!(child.metadata().owner_references, [owner]);
}
