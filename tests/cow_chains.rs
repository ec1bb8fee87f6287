//! Snapshots of copy-on-write workspaces against the real Docker daemon (runc, or runsc with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): such a snapshot's tree, of a running or of a stopped
//! sandbox, holds only what the workspace changed over the trees it was a view of, and its
//! restores stack it on them; a chain is flattened into a whole tree past its bound; deleting
//! the snapshots below keeps what the deltas need; a kill -9 while a snapshot's tree is being
//! made converges with nothing left.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cow::*;
use common::*;
use serde_json::{json, Value};

/// The most trees one view stacks (the server's bound).
const MAX_LAYERS: usize = 4;

/// The trees `name`'s workspace stacks, top first (from its volume's overlay options).
fn lower_dirs(name: &str) -> Vec<String> {
    let (volume, options) = workspace_volume(name);
    let o = options["o"].as_str().unwrap_or_default();
    let lower = o
        .split(',')
        .find_map(|o| o.strip_prefix("lowerdir="))
        .unwrap_or_else(|| panic!("{volume} is not a view: {options}"));
    lower.split(':').map(str::to_string).collect()
}

fn restore(server: &Server, from: &str, prefix: &str) -> String {
    let spec = json!({"image": TEST_IMAGE, "source": {"snapshot": from}});
    running(server, prefix, spec)
}

fn uid(resource: &Value) -> String {
    resource["metadata"]["uid"].as_str().unwrap().to_string()
}

/// The bytes below `dir`, as `du` counts them.
fn disk_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-s", "-B1"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// The tree files of the data directory: trees and their layers files.
fn tree_files(server: &Server) -> Vec<String> {
    entries(&server.data_dir.join("trees"))
}

/// What a child changes: a rewrite through a hard link, a removal, a removed directory, a new
/// file.
const CHANGE: &str = "set -e; cd /workspace; echo more >> src/main.py; rm private/key; \
                      rmdir empty; echo new > new";

#[test]
fn a_snapshot_of_a_view_is_a_delta_and_its_chain_is_flattened_past_the_bound() {
    let server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let (base_name, first, _) = base(&server, "chain-base");
    let trees = server.data_dir.join("trees");
    let mut snapshots = vec![first.clone()];
    let mut sandboxes = vec![base_name];

    // A child of the base changes it; its snapshot is a delta over the base's tree.
    let child = restore(&server, &first, "chain-child");
    sandboxes.push(child.clone());
    assert_eq!(lower_dirs(&child).len(), 1, "the base's tree is whole");
    exec(&child, CHANGE);
    let changed = exec(&child, LISTING);
    let second = unique("s");
    let taken = snapshot(&server, &second, &child);
    snapshots.push(second.clone());
    let (key, depth) = made_tree(&server, &taken);
    assert_eq!(depth, 2, "a delta over the base's tree");
    let size = taken["status"]["sizeBytes"].as_u64().unwrap();
    assert!(size > 2_000_000, "the snapshot's tar is whole: {taken}");
    assert!(
        disk_bytes(&trees.join(&key)) < 200_000,
        "the delta holds the changes only, not the 2 MB blob"
    );

    // Restored, the delta stacks on the base and shows the whole snapshot.
    let grandchild = restore(&server, &second, "chain-grand");
    sandboxes.push(grandchild.clone());
    let stacked = lower_dirs(&grandchild);
    assert_eq!(stacked.len(), 2, "{stacked:?}");
    assert!(stacked[0].ends_with(&key), "{stacked:?}");
    assert_eq!(exec(&grandchild, LISTING), changed);

    // Each snapshot of a view stacks one more tree, up to the bound; the next is whole again.
    let mut last = (second, grandchild.clone(), changed);
    for round in 0..MAX_LAYERS {
        let (from, sandbox, _) = &last;
        exec(sandbox, &format!("echo {round} > /workspace/round-{round}"));
        let expected = exec(sandbox, LISTING);
        let next = unique("s");
        let taken = snapshot(&server, &next, sandbox);
        snapshots.push(next.clone());
        made_tree(&server, &taken);
        let restored = restore(&server, &next, "chain-r");
        sandboxes.push(restored.clone());
        let depth = lower_dirs(&restored).len();
        let was = lower_dirs(sandbox).len();
        let wanted = if was == MAX_LAYERS { 1 } else { was + 1 };
        assert_eq!(depth, wanted, "round {round}, over {from}");
        assert_eq!(exec(&restored, LISTING), expected, "round {round}");
        last = (next, restored, expected);
    }

    // The snapshots below a live delta, and the sandboxes they came from, go: the delta's
    // restores keep working, also when mounted anew (a stop and start).
    let (_, top, expected) = last.clone();
    for snapshot in &snapshots {
        delete(&server, "snapshots", snapshot);
    }
    for sandbox in sandboxes.iter().filter(|s| **s != grandchild && **s != top) {
        delete(&server, "sandboxes", sandbox);
    }
    for sandbox in sandboxes.iter().filter(|s| **s != grandchild && **s != top) {
        server.wait_gone("sandboxes", sandbox);
    }
    std::thread::sleep(Duration::from_secs(4));
    for sandbox in [&grandchild, &top] {
        let (status, body) = server.request(
            "POST",
            &format!("{API}/sandboxes/{sandbox}/pause"),
            Some(&json!({"mode": "Stopped"})),
        );
        assert_eq!(status, 200, "{body}");
        let (status, body) =
            server.request("POST", &format!("{API}/sandboxes/{sandbox}/resume"), None);
        assert_eq!(status, 200, "{body}");
        server.wait_running(sandbox);
    }
    assert_eq!(exec(&top, LISTING), expected);
    assert_eq!(exec(&grandchild, "cat /workspace/new"), "new\n");
    let kept = tree_files(&server);
    assert!(kept.len() >= 2, "{kept:?}");

    // With the last view gone, so are every tree and layers file.
    delete(&server, "sandboxes", &grandchild);
    delete(&server, "sandboxes", &top);
    server.wait_gone("sandboxes", &grandchild);
    server.wait_gone("sandboxes", &top);
    wait_until("no tree left", LONG, || tree_files(&server).is_empty());
}

#[test]
fn a_snapshot_of_a_stopped_view_is_a_delta_too() {
    let server = Server::start();
    let (_, first, _) = base(&server, "stopped-base");
    let child = restore(&server, &first, "stopped-child");
    exec(&child, CHANGE);
    let changed = exec(&child, LISTING);
    // Stopped, the workspace is mounted nowhere: what it stacks is read from its volume.
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes/{child}/pause"),
        Some(&json!({"mode": "Stopped"})),
    );
    assert_eq!(status, 200, "{body}");
    server
        .wait_for("sandboxes", &child, "Stopped", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Stopped")
        })
        .unwrap();
    let second = unique("s");
    let taken = snapshot(&server, &second, &child);
    let (key, depth) = made_tree(&server, &taken);
    assert_eq!(depth, 2, "a delta over the base's tree");
    assert!(
        disk_bytes(&server.data_dir.join("trees").join(&key)) < 200_000,
        "the delta holds the changes only, not the 2 MB blob"
    );
    let restored = restore(&server, &second, "stopped-r");
    assert_eq!(exec(&restored, LISTING), changed);
}

/// Waits until snapshot `taken`'s tree is made, and returns its name in the trees directory and
/// how many trees a view of it stacks.
fn made_tree(server: &Server, taken: &Value) -> (String, usize) {
    let trees = server.data_dir.join("trees");
    let uid = uid(taken);
    let mut key = String::new();
    wait_until("the snapshot's tree made", LONG, || {
        let files = tree_files(server);
        key = files
            .iter()
            .find(|t| t.starts_with(&uid) && !t.ends_with(".layers"))
            .cloned()
            .unwrap_or_default();
        !key.is_empty() && trees.join(&key).is_dir()
    });
    let below = std::fs::read_to_string(trees.join(format!("{key}.layers"))).unwrap_or_default();
    (key, 1 + below.lines().count())
}

/// Takes a snapshot of `sandbox`, SIGKILLs the server while the snapshot's tree is being
/// unpacked (its temp directory is there), and starts it again; returns the snapshot's name.
fn snapshot_killed_while_its_tree_is_made(server: &mut Server, sandbox: &str) -> String {
    let name = unique("s");
    create(
        server,
        "snapshots",
        "Snapshot",
        &name,
        json!({"sandbox": sandbox}),
    );
    let trees = server.data_dir.join("trees");
    let deadline = std::time::Instant::now() + LONG;
    let caught = loop {
        let temp = entries(&trees).into_iter().find(|t| t.starts_with(".tmp-"));
        if let Some(temp) = temp {
            break temp;
        }
        assert!(std::time::Instant::now() < deadline, "no tree was made");
        std::thread::sleep(Duration::from_millis(2));
    };
    server.kill9();
    assert!(
        trees.join(&caught).is_dir(),
        "killed while {caught} was unpacked"
    );
    server.restart();
    name
}

#[test]
fn a_kill_while_a_delta_or_a_flattening_is_made_converges_without_leaks() {
    let mut server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let (base_name, first, _) = base(&server, "chain-kill");
    let mut sandboxes = vec![base_name];
    let mut snapshots = vec![first.clone()];
    // Big enough that its tree takes a while to write.
    let big = "head -c 200000000 /dev/urandom > /workspace/big";

    // A delta interrupted: the view of a whole tree writes the big file.
    let view = restore(&server, &first, "chain-kv");
    sandboxes.push(view.clone());
    exec(&view, big);
    let expected_delta = exec(&view, LISTING);
    let interrupted_delta = snapshot_killed_while_its_tree_is_made(&mut server, &view);
    snapshots.push(interrupted_delta.clone());
    exec(&view, "rm /workspace/big");

    // A flattening interrupted: a view at the bound writes the big file.
    let mut top = view.clone();
    for _ in 1..MAX_LAYERS {
        exec(&top, &format!("echo x > /workspace/{}", unique("f")));
        let next = unique("s");
        let taken = snapshot(&server, &next, &top);
        snapshots.push(next.clone());
        made_tree(&server, &taken);
        top = restore(&server, &next, "chain-kt");
        sandboxes.push(top.clone());
    }
    assert_eq!(lower_dirs(&top).len(), MAX_LAYERS);
    exec(&top, big);
    let expected_flat = exec(&top, LISTING);
    let interrupted_flat = snapshot_killed_while_its_tree_is_made(&mut server, &top);
    snapshots.push(interrupted_flat.clone());

    // Both snapshots restore whole after the restart, and nothing of the kills stays.
    for (name, expected) in [
        (&interrupted_delta, &expected_delta),
        (&interrupted_flat, &expected_flat),
    ] {
        let (_, taken) = server.request("GET", &format!("{API}/snapshots/{name}"), None);
        assert_eq!(taken["status"]["phase"], "Ready", "{taken}");
        let restored = restore(&server, name, "chain-kr");
        assert_eq!(&exec(&restored, LISTING), expected);
        sandboxes.push(restored);
    }
    wait_until("the interrupted unpacks removed", LONG, || {
        !tree_files(&server).iter().any(|t| t.starts_with(".tmp-"))
    });
    for name in &snapshots {
        delete(&server, "snapshots", name);
    }
    for sandbox in &sandboxes {
        delete(&server, "sandboxes", sandbox);
    }
    for sandbox in &sandboxes {
        server.wait_gone("sandboxes", sandbox);
    }
    wait_until("no tree, layers file or view left", LONG, || {
        tree_files(&server).is_empty() && entries(&server.data_dir.join("views")).is_empty()
    });
}
