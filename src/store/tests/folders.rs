//! Folder merging: ownership, last good versions, pruning, symlinks.

use std::path::Path;

use super::*;

#[test]
fn folder_resources_are_read_only_but_take_status() {
    let f = fixture();
    f.write(
        "team/sbx.yaml",
        &format!("{}---\n{}", doc("a", "one"), doc("b", "two")),
    );
    let store = f.open();
    let entry = store.get(Kind::Sandbox, "b").unwrap();
    assert_eq!(entry.origin, Origin::Folder(f.folder.clone()));
    assert_eq!(
        entry.file.as_deref(),
        Some(f.folder.join("team/sbx.yaml").as_path())
    );
    match store.replace(sandbox("a", "x"), WriteOptions::default()) {
        Err(StoreError::ReadOnly { folder, .. }) => assert_eq!(folder, f.folder),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.delete(Kind::Sandbox, "a", WriteOptions::default()),
        Err(StoreError::ReadOnly { .. })
    ));
    assert!(matches!(
        store.create(sandbox("a", "x"), WriteOptions::default()),
        Err(StoreError::AlreadyExists { .. })
    ));
    let r = store
        .update_status(Kind::Sandbox, "a", serde_json::json!({"phase": "Expired"}))
        .unwrap();
    assert_eq!(r.metadata().resource_version.as_deref(), Some("3"));
    assert!(f.data.join("state/sandboxes/a.json").exists());
    assert!(!f.data.join("manifests/sandboxes/a.yaml").exists());
}

#[test]
fn a_name_declared_twice_is_an_error_for_the_later_declaration() {
    let f = fixture();
    f.write("a.yaml", &doc("dup", "first"));
    let store = f.open();
    let mut rx = store.subscribe();
    // Declared again in the data directory, by hand: the folder keeps it.
    let other = f.data.join("manifests/extra.yaml");
    std::fs::write(&other, doc("dup", "second")).unwrap();
    store.rescan(0);
    assert_eq!(image(&store, "dup").as_deref(), Some("first"));
    let errors = store.errors_for(Kind::Sandbox, "dup");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].file.as_deref(), Some(other.as_path()));
    assert!(
        errors[0].message.contains("already declared"),
        "{}",
        errors[0]
    );
    // And twice in the same folder.
    f.write("z.yaml", &doc("dup", "third"));
    store.rescan(FOLDER);
    assert_eq!(image(&store, "dup").as_deref(), Some("first"));
    assert_eq!(store.errors_for(Kind::Sandbox, "dup").len(), 2);
    assert!(drain(&mut rx).is_empty());
    // The owning file drops it: the other file of the same folder takes over.
    std::fs::remove_file(f.folder.join("a.yaml")).unwrap();
    store.rescan(FOLDER);
    assert_eq!(image(&store, "dup").as_deref(), Some("third"));
    assert_eq!(store.errors_for(Kind::Sandbox, "dup").len(), 1);
    // The folder drops it: it is pruned, and the waiting declaration applies once the deletion
    // is finalized.
    std::fs::remove_file(f.folder.join("z.yaml")).unwrap();
    store.rescan(FOLDER);
    let dup = store.get(Kind::Sandbox, "dup").unwrap();
    assert!(dup.resource.metadata().deletion_timestamp.is_some());
    store.finalize(Kind::Sandbox, "dup").unwrap();
    let entry = store.get(Kind::Sandbox, "dup").unwrap();
    assert!(entry.resource.metadata().deletion_timestamp.is_none());
    assert_eq!(entry.origin, Origin::DataDir);
    assert_eq!(image(&store, "dup").as_deref(), Some("second"));
    assert!(store.errors_for(Kind::Sandbox, "dup").is_empty());
}

#[test]
fn a_bad_document_keeps_its_last_good_version() {
    let f = fixture();
    let file = f.write(
        "sbx.yaml",
        &format!("{}---\n{}", doc("a", "one"), doc("b", "two")),
    );
    let store = f.open();
    let before = store.get(Kind::Sandbox, "a").unwrap().resource;
    // "a" becomes invalid; "b" changes normally.
    let bad = doc("a", "one").replace("spec:\n", "spec:\n  cpus: -3\n");
    std::fs::write(&file, format!("{bad}---\n{}", doc("b", "three"))).unwrap();
    store.rescan(FOLDER);
    assert_eq!(store.get(Kind::Sandbox, "a").unwrap().resource, before);
    assert_eq!(image(&store, "b").as_deref(), Some("three"));
    let errors = store.errors_for(Kind::Sandbox, "a");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].line, Some(6));
    assert_eq!(errors[0].field.as_deref(), Some("spec.cpus"));

    // A syntax error that hides which document it was keeps everything the file declared.
    std::fs::write(&file, "apiVersion: [\n").unwrap();
    store.rescan(FOLDER);
    assert_eq!(image(&store, "b").as_deref(), Some("three"));
    assert!(store
        .get(Kind::Sandbox, "a")
        .unwrap()
        .resource
        .metadata()
        .deletion_timestamp
        .is_none());
    assert!(!store.document_errors().is_empty());

    std::fs::write(&file, doc("a", "fixed")).unwrap();
    store.rescan(FOLDER);
    assert!(store.document_errors().is_empty());
    assert_eq!(image(&store, "a").as_deref(), Some("fixed"));
    assert!(store
        .get(Kind::Sandbox, "b")
        .unwrap()
        .resource
        .metadata()
        .deletion_timestamp
        .is_some());
}

#[test]
fn removing_a_document_prunes_but_an_empty_or_missing_folder_does_not() {
    let f = fixture();
    let file = f.write(
        "sbx.yaml",
        &format!("{}---\n{}", doc("a", "one"), doc("b", "two")),
    );
    let store = f.open();
    let deleting = |name: &str| {
        store
            .get(Kind::Sandbox, name)
            .unwrap()
            .resource
            .metadata()
            .deletion_timestamp
            .is_some()
    };

    // Every file suddenly parses to nothing: keep everything.
    std::fs::write(&file, "# being rewritten\n").unwrap();
    store.rescan(FOLDER);
    assert!(!deleting("a") && !deleting("b"));
    let errors = store.document_errors();
    assert!(errors[0].message.contains("empty"), "{errors:?}");

    // The folder vanishes: keep everything, report it.
    std::fs::rename(&f.folder, f.folder.with_extension("moved")).unwrap();
    assert!(!store.rescan(FOLDER));
    assert!(!deleting("a") && !deleting("b"));
    assert!(!store.document_errors().is_empty());
    std::fs::rename(f.folder.with_extension("moved"), &f.folder).unwrap();

    // One document removed: that one is pruned.
    std::fs::write(&file, doc("a", "one")).unwrap();
    store.rescan(FOLDER);
    assert!(!deleting("a") && deleting("b"));
    assert!(store.document_errors().is_empty());

    // No manifest files at all: legitimately empty.
    std::fs::remove_file(&file).unwrap();
    store.rescan(FOLDER);
    assert!(deleting("a"));
}

#[cfg(unix)]
#[test]
fn symlinks_out_of_a_folder_are_not_followed() {
    let f = fixture();
    let outside = f.folder.parent().unwrap().join("secret.yaml");
    std::fs::write(&outside, doc("evil", "one")).unwrap();
    std::os::unix::fs::symlink(&outside, f.folder.join("link.yaml")).unwrap();
    std::fs::create_dir(f.folder.join("real")).unwrap();
    std::fs::write(f.folder.join("real/inside.yaml"), doc("inside", "one")).unwrap();
    std::os::unix::fs::symlink(
        f.folder.join("real/inside.yaml"),
        f.folder.join("alias.yml"),
    )
    .unwrap();
    let outside_dir = f.folder.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&outside_dir).unwrap();
    std::fs::write(outside_dir.join("x.yaml"), doc("evil2", "one")).unwrap();
    std::os::unix::fs::symlink(&outside_dir, f.folder.join("linked")).unwrap();
    let store = f.open();
    assert!(store.get(Kind::Sandbox, "evil").is_none());
    assert!(store.get(Kind::Sandbox, "evil2").is_none());
    let errors = store.document_errors();
    let named = |p: &Path| errors.iter().any(|e| e.file.as_deref() == Some(p));
    assert!(named(&f.folder.join("link.yaml")), "{errors:?}");
    assert!(named(&f.folder.join("linked")), "{errors:?}");
    // A link within the folder is read, and its declaration clashes with its target's.
    assert!(store.get(Kind::Sandbox, "inside").is_some());
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("already declared")),
        "{errors:?}"
    );
}

#[test]
fn hand_edits_in_the_data_directory_are_picked_up() {
    let f = fixture();
    let store = f.open();
    store
        .create(sandbox("a", "one"), WriteOptions::default())
        .unwrap();
    let mut rx = store.subscribe();
    std::fs::write(f.data.join("manifests/sandboxes/a.yaml"), doc("a", "two")).unwrap();
    store.rescan(0);
    let events = drain(&mut rx);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, EventType::Modified);
    assert_eq!(meta(&events[0].resource), (2, "2".to_string()));
    // An API-created resource put in a shared file by hand can no longer be rewritten by the API.
    std::fs::remove_file(f.data.join("manifests/sandboxes/a.yaml")).unwrap();
    std::fs::write(
        f.data.join("manifests/both.yaml"),
        format!("{}---\n{}", doc("a", "two"), doc("b", "two")),
    )
    .unwrap();
    store.rescan(0);
    assert!(store
        .get(Kind::Sandbox, "a")
        .unwrap()
        .resource
        .metadata()
        .deletion_timestamp
        .is_none());
    assert!(matches!(
        store.replace(sandbox("a", "three"), WriteOptions::default()),
        Err(StoreError::Invalid(_))
    ));
}
