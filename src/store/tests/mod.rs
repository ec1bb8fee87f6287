//! Unit tests of the store against temporary directories: API writes and reopening here, folder
//! merging in [`folders`]. The watcher itself is exercised by the `store_folders` integration test.

use std::collections::{BTreeMap, HashSet};
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

/// An owner reference to a Fork `f`, as a Fork's children carry.
fn fork_owner() -> crate::resource::OwnerReference {
    crate::resource::OwnerReference {
        api_version: crate::resource::API_VERSION.into(),
        kind: "Fork".into(),
        name: "f".into(),
        uid: "u".into(),
    }
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
    let owner = fork_owner();
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

/// A batch create (a Fork's children) writes every resource that passes its own checks, in one
/// round; a name that exists, or repeats within the batch, fails alone; a failed write fails all
/// and leaves nothing behind.
#[test]
fn a_batch_create_writes_what_passes_and_fails_each_on_its_own() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("taken", "old"), WriteOptions::default())
        .unwrap();
    let owner = fork_owner();
    let mut rx = store.subscribe();
    let batch = ["a", "taken", "b", "a", "Bad!"].map(|n| sandbox(n, "new"));
    let results = store.create_all_owned(batch.to_vec(), vec![owner.clone()]);
    assert_eq!(results.len(), 5);
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(StoreError::AlreadyExists { .. })));
    assert!(matches!(results[3], Err(StoreError::AlreadyExists { .. })));
    assert!(matches!(results[4], Err(StoreError::Invalid(_))));
    assert_eq!(image(&store, "taken").as_deref(), Some("old"));
    let added: Vec<String> = drain(&mut rx)
        .into_iter()
        .map(|e| e.resource.name().to_string())
        .collect();
    assert_eq!(added, ["a", "b"]);

    // Both survive a reopen with their owner, metadata from the store.
    let reopened = f.open();
    for name in ["a", "b"] {
        let child = reopened.get(Kind::Sandbox, name).unwrap().resource;
        assert_eq!(
            child.metadata().owner_references,
            std::slice::from_ref(&owner)
        );
        assert_eq!(meta(&child).0, 1);
        assert_eq!(image(&reopened, name).as_deref(), Some("new"));
    }

    // The state directory made unwritable for one kind: the whole batch fails, nothing is known
    // of it, no temp files stay, and the names can be created once the disk is fine again.
    let states = f.data.join("state/sandboxes");
    let manifests = f.data.join("manifests/sandboxes");
    let files_before = std::fs::read_dir(&manifests).unwrap().count();
    std::fs::rename(&states, f.data.join("state/moved")).unwrap();
    std::fs::write(&states, b"").unwrap();
    let results = store.create_all_owned(vec![sandbox("c", "x"), sandbox("d", "x")], vec![]);
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(StoreError::Io { .. }))),
        "{results:?}"
    );
    assert!(store.get(Kind::Sandbox, "c").is_none() && store.get(Kind::Sandbox, "d").is_none());
    assert_eq!(std::fs::read_dir(&manifests).unwrap().count(), files_before);
    std::fs::remove_file(&states).unwrap();
    std::fs::rename(f.data.join("state/moved"), &states).unwrap();
    let results = store.create_all_owned(vec![sandbox("c", "x"), sandbox("d", "x")], vec![]);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// Status writes do their fsyncs outside the store's lock. Whatever interleaves with them (status
/// writes of the same resource and of others, replaces, folder rescans), memory, disk and the
/// event stream must agree afterwards.
#[test]
fn concurrent_status_writes_replaces_and_rescans_agree_in_memory_on_disk_and_in_events() {
    const ROUNDS: usize = 30;
    let f = fixture();
    let store = f.open();
    let mut names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for name in &names {
        store
            .create(sandbox(name, "one"), WriteOptions::default())
            .unwrap();
    }
    f.write("folder.yaml", &doc("from-folder", "v0"));
    store.rescan(FOLDER);
    names.push("from-folder".into());
    let mut rx = store.subscribe();
    let status = |writer: usize, round: usize| serde_json::json!({"phase": "Running", "message": format!("{writer}-{round}")});

    std::thread::scope(|scope| {
        for name in &names {
            for writer in 0..2 {
                let store = &store;
                scope.spawn(move || {
                    for round in 0..ROUNDS {
                        store
                            .update_status(Kind::Sandbox, name, status(writer, round))
                            .unwrap();
                    }
                });
            }
        }
        scope.spawn(|| {
            for round in 0..ROUNDS {
                let image = format!("img{round}");
                store
                    .replace(sandbox("s0", &image), WriteOptions::default())
                    .unwrap();
            }
        });
        scope.spawn(|| {
            for round in 1..=ROUNDS {
                f.write("folder.yaml", &doc("from-folder", &format!("v{round}")));
                store.rescan(FOLDER);
            }
        });
    });

    let events = drain(&mut rx);
    let mut last_seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut all_versions = HashSet::new();
    for event in &events {
        let rv: u64 = meta(&event.resource).1.parse().unwrap();
        assert!(
            all_versions.insert(rv),
            "resourceVersion {rv} handed out twice"
        );
        let previous = last_seen.insert(event.resource.name().to_string(), rv);
        assert!(
            previous.is_none_or(|p| p < rv),
            "{}: event {rv} after {previous:?}",
            event.resource.name()
        );
    }
    assert_eq!(events.len(), names.len() * 2 * ROUNDS + 2 * ROUNDS);

    let reopened = f.open();
    for name in &names {
        let live = store.get(Kind::Sandbox, name).unwrap().resource;
        let read_back = reopened.get(Kind::Sandbox, name).unwrap().resource;
        assert_eq!(meta(&live), meta(&read_back), "{name}");
        assert_eq!(live.status_json(), read_back.status_json(), "{name}");
        assert_eq!(image(&store, name), image(&reopened, name), "{name}");
        assert_eq!(
            last_seen[name].to_string(),
            meta(&live).1,
            "{name}: the last event is the current version"
        );
        let container = live.status_json().unwrap()["message"].clone();
        assert!(
            container == "0-29" || container == "1-29",
            "{name}: {container}"
        );
    }
    assert_eq!(image(&store, "s0").as_deref(), Some("img29"));
    assert_eq!(image(&store, "from-folder").as_deref(), Some("v30"));
    let leftovers = std::fs::read_dir(f.data.join("state/sandboxes"))
        .unwrap()
        .filter(|e| atomic::is_temp_name(&e.as_ref().unwrap().file_name().to_string_lossy()))
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn a_failed_status_write_changes_nothing_and_blocks_nothing() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    let before = store.get(Kind::Sandbox, "a").unwrap().resource;
    // A directory where the state file goes makes the rename fail.
    let state_file = f.data.join("state/sandboxes/a.json");
    std::fs::remove_file(&state_file).unwrap();
    std::fs::create_dir(&state_file).unwrap();
    let mut rx = store.subscribe();
    let failed = store.update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Running"}));
    assert!(matches!(failed, Err(StoreError::Io { .. })), "{failed:?}");
    assert_eq!(store.get(Kind::Sandbox, "a").unwrap().resource, before);
    assert!(drain(&mut rx).is_empty());

    std::fs::remove_dir(&state_file).unwrap();
    let replaced = store
        .replace(sandbox("a", "two"), WriteOptions::default())
        .unwrap();
    let written = store
        .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Running"}))
        .unwrap();
    assert!(meta(&written).1.parse::<u64>().unwrap() > meta(&replaced).1.parse().unwrap());
    assert_eq!(f.open().get(Kind::Sandbox, "a").unwrap().resource, written);
}

/// Creates write their manifest and state outside the store's lock too. Racing with each other,
/// with a rescan of the data directory and with a folder that declares one of the same names,
/// every name still ends up created exactly once, and the index, the files and a reopened store
/// agree.
#[test]
fn concurrent_creates_and_rescans_create_each_name_once() {
    let f = fixture();
    let store = f.open();
    let mut rx = store.subscribe();
    // The folder declares every third name the API creates.
    let contested = |name: &str| name.rsplit('-').next().unwrap().parse::<u32>().unwrap() % 3 == 0;
    let folder_docs: Vec<String> = (0..4)
        .flat_map(|t| {
            (0..25)
                .step_by(3)
                .map(move |i| doc(&format!("t{t}-{i}"), "folder"))
        })
        .collect();
    let creating = std::sync::atomic::AtomicUsize::new(4);
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (store, creating) = (&store, &creating);
            scope.spawn(move || {
                for i in 0..25 {
                    let name = format!("t{thread}-{i}");
                    let created = store.create(sandbox(&name, "api"), WriteOptions::default());
                    match created {
                        Ok(_) => {}
                        Err(StoreError::AlreadyExists { .. }) if contested(&name) => {}
                        Err(e) => panic!("{name}: {e}"),
                    }
                }
                creating.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        scope.spawn(|| {
            f.write("contested.yaml", &folder_docs.join("---\n"));
            while creating.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                store.rescan(FOLDER);
                store.rescan(0);
            }
        });
    });
    store.rescan(0);
    store.rescan(FOLDER);

    let added: Vec<String> = drain(&mut rx)
        .into_iter()
        .filter(|e| e.event_type == EventType::Added)
        .map(|e| e.resource.name().to_string())
        .collect();
    let unique: HashSet<&String> = added.iter().collect();
    assert_eq!(added.len(), 100, "one Added per name: {added:?}");
    assert_eq!(unique.len(), 100);

    let reopened = f.open();
    let quiet = reopened.subscribe();
    reopened.rescan(0);
    assert!(quiet.is_empty(), "the files say what the index said");
    for thread in 0..4 {
        for i in 0..25 {
            let name = format!("t{thread}-{i}");
            let live = store.get(Kind::Sandbox, &name).unwrap();
            let read_back = reopened.get(Kind::Sandbox, &name).unwrap();
            assert_eq!(live.resource, read_back.resource, "{name}");
            assert_eq!(live.origin, read_back.origin, "{name}");
            let expected = if live.origin == Origin::DataDir {
                "api"
            } else {
                "folder"
            };
            assert!(expected == "api" || contested(&name), "{name}");
            assert_eq!(image(&store, &name).as_deref(), Some(expected), "{name}");
        }
    }
}

/// A snapshot's data file: written under a temp name that collection leaves alone, published
/// under the snapshot's name, removed with it; a write given up leaves nothing; a file no
/// snapshot claims is collected.
#[tokio::test]
async fn snapshot_data_lives_and_goes_with_its_snapshot() {
    use std::io::Write;
    let f = fixture();
    let store = f.open();
    let snapshots = f.data.join("snapshots");
    let files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&snapshots)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    let write = store.begin_snapshot("s");
    let mut file = write.create().await.unwrap();
    file.write_all(b"tar").unwrap();
    assert_eq!(
        store.collect_snapshot_data().await,
        0,
        "a write in progress"
    );
    assert_eq!(files().len(), 1);
    write.sync(file).await.unwrap();
    write.publish().await.unwrap();
    assert_eq!(files(), ["s.tar"]);
    assert!(store.has_snapshot_data("s").await);
    assert_eq!(
        store.collect_snapshot_data().await,
        1,
        "no Snapshot claims s.tar"
    );
    assert!(!store.has_snapshot_data("s").await);

    let given_up = store.begin_snapshot("t");
    drop(given_up.create().await.unwrap());
    given_up.discard().await;
    assert!(files().is_empty(), "{:?}", files());

    std::fs::write(store.snapshot_path("u"), b"tar").unwrap();
    store.remove_snapshot_data("u").await.unwrap();
    store.remove_snapshot_data("u").await.unwrap();
    assert!(files().is_empty());
}

#[test]
fn the_server_id_is_made_once_and_kept() {
    let f = fixture();
    let store = f.open();
    let id = store.server_id().unwrap();
    assert_eq!(id.len(), 16);
    assert_eq!(store.server_id().unwrap(), id);
    assert_eq!(
        std::fs::read_to_string(f.data.join("server-id")).unwrap(),
        format!("{id}\n")
    );
}
