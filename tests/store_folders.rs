//! The store's folder watcher against a real file system: changes made to watched folders (and by
//! hand to the data directory) arrive as events, bad edits keep the last good version, removals
//! mark resources for deletion.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::resource::{AnyResource, Kind};
use agent_sandbox::store::{EventType, Store, WatchEvent};
use tokio::sync::broadcast;

const PATIENCE: Duration = Duration::from_secs(10);

fn doc(name: &str, image: &str) -> String {
    format!(
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n"
    )
}

struct Watched {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    folder: PathBuf,
    store: Arc<Store>,
    events: broadcast::Receiver<WatchEvent>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

async fn watched() -> Watched {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let folder = tmp.path().join("gitops");
    std::fs::create_dir_all(&folder).unwrap();
    let store = Store::open(&data, std::slice::from_ref(&folder)).unwrap();
    let events = store.subscribe();
    let watcher = store.spawn_watchers();
    // Let the watches be set up before the tests start changing files.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Watched {
        _tmp: tmp,
        data,
        folder,
        store,
        events,
        watcher,
    }
}

impl Watched {
    /// The next event for `name`, skipping others.
    async fn next_for(&mut self, name: &str) -> WatchEvent {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no event for {name} in time"))
                .expect("event stream ended");
            if event.resource.name() == name {
                return event;
            }
        }
    }

    /// Waits until `check` holds, polling the store.
    async fn until(&self, what: &str, check: impl Fn(&Store) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !check(&self.store) {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn image(&self, name: &str) -> Option<String> {
        let entry = self.store.get(Kind::Sandbox, name)?;
        entry.resource.as_sandbox()?.spec.image.clone()
    }

    /// Waits long enough for a rescan to happen, then checks that no event came.
    async fn assert_quiet(&mut self) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(self.events.try_recv().is_err(), "unexpected event");
    }
}

fn image_of(resource: &AnyResource) -> Option<&str> {
    resource.as_sandbox()?.spec.image.as_deref()
}

fn deleting(resource: &AnyResource) -> bool {
    resource.metadata().deletion_timestamp.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_lifecycle_add_edit_break_fix_remove() {
    let mut w = watched().await;
    let file = w.folder.join("team/sandboxes.yaml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        &file,
        format!("{}---\n{}", doc("a", "one"), doc("b", "one")),
    )
    .unwrap();

    let a = w.next_for("a").await;
    assert_eq!(a.event_type, EventType::Added);
    assert_eq!(a.resource.metadata().generation, Some(1));
    let b = w.next_for("b").await;
    assert_eq!(b.event_type, EventType::Added);

    // Edit one document: MODIFIED with a generation bump, the other untouched.
    std::fs::write(
        &file,
        format!("{}---\n{}", doc("a", "two"), doc("b", "one")),
    )
    .unwrap();
    let a = w.next_for("a").await;
    assert_eq!(a.event_type, EventType::Modified);
    assert_eq!(a.resource.metadata().generation, Some(2));
    assert_eq!(image_of(&a.resource), Some("two"));
    w.assert_quiet().await;

    // Break it: an error naming the file, the last good version kept, nothing pruned.
    std::fs::write(&file, "apiVersion: agent-sandbox.io/v1\nkind: [Sandbox\n").unwrap();
    w.until("error reported", |s| !s.document_errors().is_empty())
        .await;
    let errors = w.store.document_errors();
    assert_eq!(
        errors[0].file.as_deref(),
        Some(file.as_path()),
        "{errors:?}"
    );
    assert!(errors[0].line.is_some(), "{errors:?}");
    assert_eq!(w.image("a").as_deref(), Some("two"));
    assert_eq!(w.image("b").as_deref(), Some("one"));
    w.assert_quiet().await;

    // Fix it with one document fewer: "b" is marked for deletion.
    std::fs::write(&file, doc("a", "two")).unwrap();
    let b = w.next_for("b").await;
    assert_eq!(b.event_type, EventType::Modified);
    assert!(deleting(&b.resource));
    assert!(w.store.document_errors().is_empty());

    // Remove the file: "a" is marked for deletion too; finalizing drops it.
    std::fs::remove_file(&file).unwrap();
    let a = w.next_for("a").await;
    assert!(deleting(&a.resource));
    w.store.finalize(Kind::Sandbox, "a").unwrap();
    let a = w.next_for("a").await;
    assert_eq!(a.event_type, EventType::Deleted);
    assert!(w.store.get(Kind::Sandbox, "a").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_swapped_in_by_rename_is_read() {
    let mut w = watched().await;
    let tmp = w.folder.join(".incoming.yaml");
    std::fs::write(&tmp, doc("swapped", "one")).unwrap();
    std::fs::rename(&tmp, w.folder.join("swapped.yaml")).unwrap();
    let e = w.next_for("swapped").await;
    assert_eq!(e.event_type, EventType::Added);

    // Replace it by rename again, the way editors and git do.
    std::fs::write(&tmp, doc("swapped", "two")).unwrap();
    std::fs::rename(&tmp, w.folder.join("swapped.yaml")).unwrap();
    let e = w.next_for("swapped").await;
    assert_eq!(e.event_type, EventType::Modified);
    assert_eq!(image_of(&e.resource), Some("two"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partially_written_file_is_refused_until_complete() {
    let mut w = watched().await;
    let full = format!("{}---\n{}", doc("p1", "one"), doc("p2", "one"));
    // Cut inside the second document's `spec` key, so that the torn document is invalid.
    let cut = full.rfind("spec:").unwrap() + 2;
    let path = w.folder.join("partial.yaml");
    std::fs::write(&path, &full[..cut]).unwrap();
    let p1 = w.next_for("p1").await;
    assert_eq!(p1.event_type, EventType::Added);
    w.until("error for the torn document", |s| {
        !s.document_errors().is_empty()
    })
    .await;
    assert!(w.store.get(Kind::Sandbox, "p2").is_none());

    std::fs::write(&path, &full).unwrap();
    let p2 = w.next_for("p2").await;
    assert_eq!(p2.event_type, EventType::Added);
    assert_eq!(image_of(&p2.resource), Some("one"));
    assert!(w.store.document_errors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_is_watched_and_api_writes_echo_nothing() {
    let mut w = watched().await;
    let created = w
        .store
        .create(
            agent_sandbox::resource::Sandbox::new(
                "api",
                agent_sandbox::resource::SandboxSpec {
                    image: Some("one".into()),
                    ..Default::default()
                },
            )
            .into(),
            Default::default(),
        )
        .unwrap();
    assert_eq!(w.next_for("api").await.event_type, EventType::Added);
    // The watcher sees our own manifest write; reading it back is a no-op.
    w.assert_quiet().await;
    assert_eq!(w.store.get(Kind::Sandbox, "api").unwrap().resource, created);

    // A person edits the manifest by hand.
    let manifest = w.data.join("manifests/sandboxes/api.yaml");
    std::fs::write(&manifest, doc("api", "two")).unwrap();
    let e = w.next_for("api").await;
    assert_eq!(e.event_type, EventType::Modified);
    assert_eq!(e.resource.metadata().generation, Some(2));

    // ...or drops a new one anywhere under manifests/.
    let loose = w.data.join("manifests/mine.yml");
    std::fs::write(&loose, doc("handmade", "one")).unwrap();
    assert_eq!(w.next_for("handmade").await.event_type, EventType::Added);
    assert!(Path::new(&loose).exists());
}

fn snapshot_doc(name: &str, sandbox: &str) -> String {
    format!(
        "apiVersion: agent-sandbox.io/v1\nkind: Snapshot\nmetadata:\n  name: {name}\nspec:\n  sandbox: {sandbox}\n"
    )
}

fn snapshot_of(store: &Store, name: &str) -> Option<String> {
    let entry = store.get(Kind::Snapshot, name)?;
    Some(entry.resource.as_snapshot()?.spec.sandbox.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_edit_of_an_immutable_field_is_a_document_error_and_changes_nothing() {
    let mut w = watched().await;
    let file = w.folder.join("snapshots.yaml");
    let sandbox = format!("{}  source:\n    snapshot: base\n", doc("forked", "one"));
    std::fs::write(
        &file,
        format!("{}---\n{sandbox}", snapshot_doc("snap", "a")),
    )
    .unwrap();
    w.until("both declared", |s| {
        s.get(Kind::Snapshot, "snap").is_some() && s.get(Kind::Sandbox, "forked").is_some()
    })
    .await;
    let version = w
        .store
        .get(Kind::Snapshot, "snap")
        .unwrap()
        .resource
        .metadata()
        .resource_version
        .clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    while w.events.try_recv().is_ok() {}

    // Change the snapshot's sandbox and the sandbox's source (and its image, which alone would
    // be fine): both documents are refused as a whole.
    let sandbox = format!("{}  source:\n    snapshot: other\n", doc("forked", "two"));
    std::fs::write(
        &file,
        format!("{}---\n{sandbox}", snapshot_doc("snap", "b")),
    )
    .unwrap();
    w.until("both errors reported", |s| s.document_errors().len() == 2)
        .await;
    let errors = w.store.errors_for(Kind::Snapshot, "snap");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].file.as_deref(), Some(file.as_path()));
    assert_eq!(errors[0].line, Some(1), "{errors:?}");
    assert_eq!(errors[0].field.as_deref(), Some("spec.sandbox"));
    assert!(
        errors[0]
            .to_string()
            .contains("spec.sandbox: field is immutable"),
        "{}",
        errors[0]
    );
    let errors = w.store.errors_for(Kind::Sandbox, "forked");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field.as_deref(), Some("spec.source"));
    assert_eq!(snapshot_of(&w.store, "snap").as_deref(), Some("a"));
    assert_eq!(w.image("forked").as_deref(), Some("one"));
    let now = w.store.get(Kind::Snapshot, "snap").unwrap();
    assert_eq!(now.resource.metadata().resource_version, version);
    w.assert_quiet().await;

    // Undo the snapshot's edit and keep the sandbox's mutable change only: applied, errors gone.
    let sandbox = format!("{}  source:\n    snapshot: base\n", doc("forked", "two"));
    std::fs::write(
        &file,
        format!("{}---\n{sandbox}", snapshot_doc("snap", "a")),
    )
    .unwrap();
    let forked = w.next_for("forked").await;
    assert_eq!(image_of(&forked.resource), Some("two"));
    assert!(w.store.document_errors().is_empty());
}
