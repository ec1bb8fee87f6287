//! Copy-on-write workspaces against the real Docker daemon (runc, or runsc with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): restores are overlay views of a snapshot's tree in the
//! data directory, under both runtimes; forks see only their own writes, a rollback discards them and keeps the base,
//! deleting the base snapshot keeps live views working (across a stop and start, which mounts
//! the view anew), a kill -9 in the middle of forks and rollbacks converges with nothing left
//! over, and hostile snapshot content is refused before any view exists.

mod common;

use std::time::Duration;

use common::cow::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn ten_forks_of_one_snapshot_see_only_their_own_changes() {
    let server = Server::start();
    let (base_name, snap, listing) = base(&server, "cow-base");
    let fork = unique("cow-fork");
    create(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 10}),
    );
    let children: Vec<String> = (0..10).map(|i| format!("{fork}-{i}")).collect();
    for child in &children {
        server.wait_for("sandboxes", child, "Running", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Running")
        });
    }
    let mut volumes = Vec::new();
    for (i, child) in children.iter().enumerate() {
        volumes.push(assert_view(&server, child));
        assert_eq!(exec(child, LISTING), listing, "{child} starts as the base");
        exec(
            child,
            &format!(
                "echo {i} > /workspace/own-{i} && echo changed-{i} >> /workspace/src/main.py \
                 && rm /workspace/src/blob.bin && rmdir /workspace/empty"
            ),
        );
    }
    for (i, child) in children.iter().enumerate() {
        let seen = exec(
            child,
            "ls /workspace; cat /workspace/src/main.py /workspace/hard",
        );
        assert_eq!(
            seen,
            format!("hard\nown-{i}\nprivate\nsrc\nbase\nchanged-{i}\nbase\nchanged-{i}\n"),
            "{child} sees its own changes only (and its hard link stays one)"
        );
    }
    // The views are all of one tree, which none of them changed.
    let trees = entries(&server.data_dir.join("trees"));
    assert_eq!(trees.len(), usize::from(views()), "{trees:?}");
    let mut made = entries(&server.data_dir.join("views"));
    volumes.sort();
    made.retain(|v| volumes.contains(v));
    if views() {
        assert_eq!(made, volumes);
    }
    let fresh = unique("cow-fresh");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &fresh,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap}}),
    );
    server.wait_running(&fresh);
    assert_eq!(exec(&fresh, LISTING), listing, "the base is untouched");
    assert_eq!(exec(&base_name, LISTING), listing);
    delete(&server, "forks", &fork);
    for child in &children {
        server.wait_gone("sandboxes", child);
    }
}

#[test]
fn a_rollback_discards_changes_and_keeps_the_base() {
    let server = Server::start();
    let (_, snap, listing) = base(&server, "cow-rb");
    let name = unique("cow-rb-child");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap}}),
    );
    server.wait_running(&name);
    let first = assert_view(&server, &name);
    for round in 1..=2 {
        exec(
            &name,
            "echo junk > /workspace/junk && echo more >> /workspace/src/main.py && \
             chmod 777 /workspace/src && rm /workspace/src/link && echo t > /tmp/t && \
             (sleep 1000 > /dev/null 2>&1 &)",
        );
        let generation = server.get("sandboxes", &name).unwrap()["metadata"]["generation"]
            .as_u64()
            .unwrap();
        replace(
            &server,
            &name,
            json!({"image": TEST_IMAGE, "source": {"snapshot": snap},
                   "rollback": {"snapshot": snap, "requestId": format!("r-{round}")}}),
        );
        let rolled = server.wait_for("sandboxes", &name, "rolled back", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["lastRollback"]["requestId"] == format!("r-{round}")
                    && r["status"]["phase"] == "Running"
            })
        });
        assert!(rolled.unwrap()["metadata"]["generation"].as_u64() > Some(generation));
        assert_eq!(
            exec(&name, LISTING),
            listing,
            "round {round}: the base again"
        );
        assert_ne!(
            docker_exec(&name, "test -e /tmp/t").0,
            0,
            "/tmp starts empty"
        );
        assert_ne!(
            docker_exec(&name, "ps -o args | grep -v grep | grep -q 'sleep 1000'").0,
            0,
            "processes do not survive a rollback"
        );
        let now = assert_view(&server, &name);
        assert_ne!(now, first, "a rollback mounts a new view");
    }
    // A snapshot of a view holds the merged workspace: base, changes and deletions.
    exec(
        &name,
        "echo view > /workspace/new && rm /workspace/src/link && echo more >> /workspace/hard",
    );
    let changed = exec(&name, LISTING);
    let of_view = unique("s-view");
    snapshot(&server, &of_view, &name);
    let copy = unique("cow-rb-again");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &copy,
        json!({"image": TEST_IMAGE, "source": {"snapshot": of_view}}),
    );
    server.wait_running(&copy);
    assert_view(&server, &copy);
    assert_eq!(exec(&copy, LISTING), changed);
}

#[test]
fn deleting_the_base_snapshot_keeps_live_views_working() {
    let server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let (base_name, snap, listing) = base(&server, "cow-del");
    let name = unique("cow-del-child");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap}}),
    );
    server.wait_running(&name);
    let volume = assert_view(&server, &name);
    exec(&name, "echo mine > /workspace/mine");
    delete(&server, "snapshots", &snap);
    server.wait_gone("snapshots", &snap);
    // Collection runs every second: give it a few passes.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        entries(&server.data_dir.join("trees")).len(),
        usize::from(views()),
        "the tree stays"
    );
    assert_eq!(exec(&name, "cat /workspace/mine"), "mine\n");
    // Stopped and started again, Docker mounts the view anew: its tree must still be there.
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes/{name}/pause"),
        Some(&json!({"mode": "Stopped"})),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request("POST", &format!("{API}/sandboxes/{name}/resume"), None);
    assert_eq!(status, 200, "{body}");
    server.wait_running(&name);
    let now: String = exec(&name, LISTING)
        .lines()
        .filter(|l| !l.starts_with("./mine "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        now, listing,
        "the base is whole after the view was mounted anew"
    );
    assert_eq!(exec(&name, "cat /workspace/mine"), "mine\n");
    // Gone with its last view: the tree, and the view's directories.
    delete(&server, "sandboxes", &name);
    delete(&server, "sandboxes", &base_name);
    server.wait_gone("sandboxes", &name);
    wait_until("the tree and view removed", LONG, || {
        entries(&server.data_dir.join("trees")).is_empty()
            && !entries(&server.data_dir.join("views")).contains(&volume)
    });
}

#[test]
fn a_kill_during_forks_and_rollbacks_converges_without_leaks() {
    let mut server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let (base_name, snap, listing) = base(&server, "cow-kill");
    let fork = unique("cow-kf");
    create(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 4}),
    );
    std::thread::sleep(Duration::from_millis(300));
    server.kill9();
    server.restart();
    let children: Vec<String> = (0..4).map(|i| format!("{fork}-{i}")).collect();
    // A child whose restore the kill interrupted may have been finished by copying (its view
    // could not be proven across the crash): what must hold is its content, no leak, and that
    // views still serve the restores after the restart (the sandbox below).
    for child in &children {
        server.wait_for("sandboxes", child, "Running", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Running")
        });
        assert_eq!(exec(child, LISTING), listing);
    }
    // A rollback interrupted at once, then done on restart.
    let child = &unique("cow-krb");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        child,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap}}),
    );
    server.wait_running(child);
    assert_view(&server, child);
    exec(child, "echo junk > /workspace/junk");
    replace(
        &server,
        child,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap},
               "rollback": {"snapshot": snap, "requestId": "k-1"}}),
    );
    std::thread::sleep(Duration::from_millis(150));
    server.kill9();
    server.restart();
    server.wait_for("sandboxes", child, "rolled back", LONG, |r| {
        r.is_some_and(|r| {
            r["status"]["lastRollback"]["requestId"] == "k-1" && r["status"]["phase"] == "Running"
        })
    });
    assert_eq!(exec(child, LISTING), listing);
    // Everything goes, and nothing is left on disk or in Docker.
    delete(&server, "forks", &fork);
    delete(&server, "sandboxes", &base_name);
    delete(&server, "sandboxes", child);
    delete(&server, "snapshots", &snap);
    server.wait_gone("sandboxes", child);
    for child in &children {
        server.wait_gone("sandboxes", child);
    }
    server.wait_gone("sandboxes", &base_name);
    server.wait_gone("snapshots", &snap);
    wait_until("no tree, view or volume left", LONG, || {
        let views = entries(&server.data_dir.join("views"));
        let trees = entries(&server.data_dir.join("trees"));
        let volumes: Vec<String> = children
            .iter()
            .chain([child])
            .flat_map(|c| volumes_of(c))
            .collect();
        views.is_empty() && trees.is_empty() && volumes.is_empty()
    });
}

#[test]
fn a_kill_while_pool_members_take_views_converges_without_leaks() {
    let mut server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let (big, snap, sum, _) = large_snapshot(
        &server,
        "cow-kbig",
        "head -c 70000000 /dev/urandom > /workspace/big.bin && mkdir d && echo x > d/f",
    );
    delete(&server, "sandboxes", &big);
    server.wait_gone("sandboxes", &big);
    let pool = unique("cow-kpool");
    create(
        &server,
        "sandboxpools",
        "SandboxPool",
        &pool,
        json!({"image": TEST_IMAGE, "size": 3}),
    );
    // Ready by the pool's own count: a member's container runs before the controller counts it
    // ready, and a Fork that comes first goes to new containers.
    server.wait_for("sandboxpools", &pool, "three ready members", LONG, |p| {
        p.is_some_and(|p| p["status"]["readyReplicas"] == 3)
    });
    let fork = unique("cow-kpf");
    create(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 3}),
    );
    let children: Vec<String> = (0..3).map(|i| format!("{fork}-{i}")).collect();
    let member_view_prefix = format!("views/agent-sandbox-pool.{pool}.");
    if gvisor() {
        // No member takes a view there (the children mount views on new containers).
        std::thread::sleep(Duration::from_millis(250));
    } else {
        until_a_member_takes_a_view(&server, &children, &pool);
    }
    server.kill9();
    server.restart();
    for child in &children {
        server.wait_for("sandboxes", child, "Running", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Running")
        });
        assert_eq!(exec(child, "md5sum < /workspace/big.bin"), sum);
        assert_eq!(exec(child, "cat /workspace/d/f"), "x\n");
    }
    if !gvisor() {
        // Under runc the members took views (under gVisor new containers mount them).
        let claimed = children
            .iter()
            .filter(|c| {
                server.get("sandboxes", c).unwrap()["status"]["claimedFrom"] == pool.as_str()
            })
            .count();
        let log = server.log();
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("member") || l.contains("view"))
            .collect();
        assert!(
            claimed > 0,
            "no child took a member; the server said:\n{}",
            said[said.len().saturating_sub(40)..].join("\n")
        );
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            table.contains(&member_view_prefix),
            "no member view is mounted"
        );
    }
    delete(&server, "forks", &fork);
    delete(&server, "sandboxpools", &pool);
    delete(&server, "snapshots", &snap);
    for child in &children {
        server.wait_gone("sandboxes", child);
    }
    server.wait_gone("sandboxpools", &pool);
    wait_until("no tree, view, mount or volume left", LONG, || {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounted = table.contains(&member_view_prefix);
        let members = docker(&["volume", "ls", "-q"])
            .lines()
            .any(|v| v.contains(&pool));
        entries(&server.data_dir.join("views")).is_empty()
            && entries(&server.data_dir.join("trees")).is_empty()
            && !mounted
            && !members
            && children.iter().all(|c| volumes_of(c).is_empty())
    });
}

/// Returns as soon as a member has taken a view for one of `children` and its claim is recorded
/// in the child's status. A kill then comes while the other children's members take theirs (a
/// fixed delay came before any claim in CI runs), and the recorded claim is what a restart must
/// keep: returning at the first view mounted over a member's volume, before the claim was
/// recorded, left nothing a restart had to keep (the member is discarded, the child gets a new
/// container), and the check after the restart failed under load ("no child took a member").
fn until_a_member_takes_a_view(server: &Server, children: &[String], pool: &str) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let claimed = children.iter().any(|c| {
            server
                .get("sandboxes", c)
                .is_some_and(|r| r["status"]["claimedFrom"] == pool)
        });
        if claimed {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no member took a view"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn hostile_snapshot_content_is_refused_before_any_view_is_mounted() {
    let server = Server::start();
    let (_, snap, _) = base(&server, "cow-evil");
    let data = server
        .data_dir
        .join("snapshots")
        .join(format!("{snap}.tar"));
    std::fs::write(&data, benign_then_setuid_tar()).unwrap();
    // A new snapshot of its own, whose tree was never made: only the hostile data.
    let views_before = entries(&server.data_dir.join("views"));
    let name = unique("cow-evil-child");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "source": {"snapshot": snap}}),
    );
    let refused = server
        .wait_for("sandboxes", &name, "refused", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter().any(|c| {
                        c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("suid-tool"))
                    })
                })
            })
        })
        .unwrap();
    assert_ne!(refused["status"]["phase"], "Running", "{refused}");
    assert!(volumes_of(&name).is_empty(), "no volume was made");
    assert_eq!(
        entries(&server.data_dir.join("views")),
        views_before,
        "no view was made"
    );
}

/// A sandbox named after `prefix` whose workspace `script` filled, and its snapshot: their
/// names, the md5 sum of its `big.bin`, and the snapshot as it became Ready.
fn large_snapshot(server: &Server, prefix: &str, script: &str) -> (String, String, String, Value) {
    let name = common::cow::running(server, prefix, json!({"image": TEST_IMAGE}));
    exec(&name, script);
    let sum = exec(&name, "md5sum < /workspace/big.bin");
    let snap = unique("s");
    let done = snapshot(server, &snap, &name);
    (name, snap, sum, done)
}

/// Creates a warm pool of one member of the test image and waits until it is ready.
fn ready_pool(server: &Server, prefix: &str) -> String {
    let pool = unique(prefix);
    create(
        server,
        "sandboxpools",
        "SandboxPool",
        &pool,
        json!({"image": TEST_IMAGE, "size": 1}),
    );
    ready_again(&pool);
    pool
}

#[test]
fn a_large_snapshot_restores_onto_a_view_in_the_ready_member_or_a_new_container() {
    let server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    // The bases and their snapshots first: a sandbox of the pool's image would claim its member.
    let (_, small, small_listing) = base(&server, "cow-small");
    // Past the 64 MiB limit: 80 MiB in the tar.
    let (_, big_snap, sum, done) = large_snapshot(
        &server,
        "cow-big",
        "head -c 83886080 /dev/urandom > /workspace/big.bin && echo kept > /workspace/note",
    );
    assert!(
        done["status"]["sizeBytes"].as_u64().unwrap() > 64 << 20,
        "{done}"
    );
    let pool = ready_pool(&server, "cow-pool");

    // Small: the ready member takes a view of it under runc, and is filled by copying under
    // gVisor.
    let child = unique("cow-small-child");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &child,
        json!({"image": TEST_IMAGE, "source": {"snapshot": small}}),
    );
    let running = server.wait_running(&child);
    assert_eq!(
        running["status"]["claimedFrom"],
        pool.as_str(),
        "{running:#}"
    );
    assert_eq!(exec(&child, LISTING), small_listing);
    if !gvisor() {
        assert_member_view(&server, &child);
    }

    // Large: under runc the member that refilled meanwhile takes a view of the snapshot while it
    // runs; under gVisor (whose gofer keeps the directory it opened) a new container mounts one
    // and the member stays ready.
    ready_again(&pool);
    let target = unique("cow-big-child");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &target,
        json!({"image": TEST_IMAGE, "source": {"snapshot": big_snap}}),
    );
    let from_source = server.wait_running(&target);
    // A rollback of the small child to the large snapshot.
    ready_again(&pool);
    replace(
        &server,
        &child,
        json!({"image": TEST_IMAGE, "source": {"snapshot": small},
               "rollback": {"snapshot": big_snap, "requestId": "to-big"}}),
    );
    let rolled_back = server
        .wait_for("sandboxes", &child, "rolled back", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["lastRollback"]["requestId"] == "to-big"
                    && r["status"]["phase"] == "Running"
            })
        })
        .unwrap();
    let mut member_views = Vec::new();
    for (restore, name) in [(&from_source, &target), (&rolled_back, &child)] {
        if gvisor() {
            assert!(
                restore["status"]["claimedFrom"].is_null(),
                "{name} took a pool member: {restore:#}"
            );
            assert_view(&server, name);
        } else {
            assert_eq!(
                restore["status"]["claimedFrom"],
                pool.as_str(),
                "{name} did not take the ready member: {restore:#}"
            );
            member_views.push(assert_member_view(&server, name));
        }
        assert_eq!(exec(name, "md5sum < /workspace/big.bin"), sum);
        assert_eq!(exec(name, "cat /workspace/note"), "kept\n");
        // The default working directory is the view too, for `docker exec` and for the helper
        // channel a waiting member had open before it took the view.
        assert_eq!(exec(name, "echo mine > own && ls"), "big.bin\nnote\nown\n");
        assert_eq!(
            server.exec(name, "pwd && ls && cat own"),
            (0, "/workspace\nbig.bin\nnote\nown\nmine\n".to_string())
        );
    }
    if gvisor() {
        // The member they left alone was there all along: the next small restore takes it.
        let after = unique("cow-small-after");
        create(
            &server,
            "sandboxes",
            "Sandbox",
            &after,
            json!({"image": TEST_IMAGE, "source": {"snapshot": small}}),
        );
        let running = server.wait_running(&after);
        assert_eq!(
            running["status"]["claimedFrom"],
            pool.as_str(),
            "{running:#}"
        );
        return;
    }
    // What a member's view writes lands in its own upper directory only.
    let (volume, _) = &member_views[0];
    let upper = server.data_dir.join("views").join(volume).join("upper");
    assert_eq!(entries(&upper), ["own"], "only the write is the view's own");
    // The tree outlives its snapshot while views stack it, and a stop and start binds the
    // volume's directory again, the view on it; a view whose mount the host lost while its
    // sandbox was stopped (as a reboot loses it) is mounted again before the start.
    delete(&server, "snapshots", &big_snap);
    server.wait_gone("snapshots", &big_snap);
    std::thread::sleep(Duration::from_secs(3));
    for lose_the_mount in [false, true] {
        let (status, body) = server.request(
            "POST",
            &format!("{API}/sandboxes/{target}/pause"),
            Some(&json!({"mode": "Stopped"})),
        );
        assert_eq!(status, 200, "{body}");
        if lose_the_mount {
            let mountpoint = &member_views[0].1;
            let unmounted = std::process::Command::new("umount")
                .args(["-l", mountpoint])
                .status()
                .unwrap();
            assert!(unmounted.success());
            let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(!table.contains(mountpoint.as_str()));
            // A snapshot of the stopped sandbox reads the view, mounted again for it.
            let stopped = snapshot(&server, &unique("s"), &target);
            assert!(
                stopped["status"]["sizeBytes"].as_u64().unwrap() > 64 << 20,
                "{stopped}"
            );
        }
        let (status, body) =
            server.request("POST", &format!("{API}/sandboxes/{target}/resume"), None);
        assert_eq!(status, 200, "{body}");
        server.wait_running(&target);
        assert_eq!(exec(&target, "md5sum < /workspace/big.bin"), sum);
        assert_eq!(exec(&target, "cat /workspace/own"), "mine\n");
        assert_eq!(
            server.log().contains("mounting a pool member's view again"),
            lose_the_mount
        );
    }
    assert_member_view(&server, &target);
    // A snapshot of a member's view is whole, and restores.
    let again = unique("s");
    let taken = snapshot(&server, &again, &target);
    assert!(
        taken["status"]["sizeBytes"].as_u64().unwrap() > 64 << 20,
        "{taken}"
    );
    let copy = common::cow::running(
        &server,
        "cow-again",
        json!({"image": TEST_IMAGE, "source": {"snapshot": again}}),
    );
    assert_eq!(exec(&copy, "md5sum < /workspace/big.bin"), sum);
    assert_eq!(exec(&copy, "cat /workspace/own"), "mine\n");
    // Deleted, the sandboxes take their mounts, volumes and view directories with them.
    for name in [&target, &child, &copy] {
        delete(&server, "sandboxes", name);
    }
    for name in [&target, &child, &copy] {
        server.wait_gone("sandboxes", name);
    }
    for (volume, mountpoint) in &member_views {
        wait_until("the member's view removed", LONG, || {
            let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            !table.contains(mountpoint.as_str())
                && inspect(&["--type", "volume", volume]).is_none()
                && !entries(&server.data_dir.join("views")).contains(volume)
        });
    }
}

/// Checks that `name`'s workspace is a plain volume (a pool member's) carrying a view mounted
/// over its directory on this host: an overlay of the store's tree and the view's own upper
/// directory. Returns the volume and its directory.
fn assert_member_view(server: &Server, name: &str) -> (String, String) {
    let (volume, options) = workspace_volume(name);
    assert!(options.get("type").is_none(), "{volume}: {options}");
    let inspected = inspect(&["--type", "volume", &volume]).unwrap();
    let mountpoint = inspected["Mountpoint"].as_str().unwrap().to_string();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = table
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mountpoint.as_str()))
        .unwrap_or_else(|| panic!("nothing mounted at {mountpoint}"));
    let trees = format!("lowerdir={}", server.data_dir.join("trees").display());
    let upper = format!(
        "upperdir={}",
        server
            .data_dir
            .join("views")
            .join(&volume)
            .join("upper")
            .display()
    );
    let mount_options = line.split(' ').nth(5).unwrap();
    assert!(
        line.contains(" - overlay ") && line.contains(&trees) && line.contains(&upper),
        "{line}"
    );
    assert!(
        mount_options.contains("nosuid") && mount_options.contains("nodev"),
        "{line}"
    );
    (volume, mountpoint)
}

/// Waits until `pool` has an unclaimed member running (one still under its pool name: a claim
/// renames it), as Docker shows it (the pool's status is recounted a moment after a claim).
fn ready_again(pool: &str) {
    wait_until("an unclaimed member", LONG, || {
        docker(&["ps", "--format", "{{.Names}}"])
            .lines()
            .any(|n| n.starts_with(&format!("agent-sandbox-pool.{pool}.")))
    });
}
