//! Retained output lives in the supervisor's memory, never on the sandbox's disks: a process that
//! prints many times the size of the sandbox's `/tmp` leaves `/tmp` and `/workspace` exactly as
//! they were (seen from inside the sandbox and, for the workspace volume, from the host), `/tmp`
//! keeps its room, and the retained tail still replays byte-exact.

use std::time::{Duration, Instant};

use super::*;

/// The `/tmp` tmpfs of the sandboxes of this test, in MiB.
const TMP_MB: u64 = 8;
/// Copies of the known block each stream prints (about 12 times `/tmp`, both streams together).
const COPIES: usize = 48;

/// KiB in use under `/tmp` and `/workspace` (`du`), and `/tmp`'s used and total KiB (`df`),
/// seen from inside the sandbox.
fn usage(sb: &str) -> (u64, u64, u64, u64) {
    let (code, out) = docker_exec(
        sb,
        "du -sk /tmp | cut -f1; du -sk /workspace | cut -f1; df -k /tmp | tail -n1",
    );
    assert_eq!(code, 0, "{out}");
    let mut lines = out.lines();
    let tmp_du: u64 = lines.next().unwrap().trim().parse().unwrap();
    let ws_du: u64 = lines.next().unwrap().trim().parse().unwrap();
    let df: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    // Filesystem 1K-blocks Used Available Use% Mounted on
    (
        tmp_du,
        ws_du,
        df[2].parse().unwrap(),
        df[1].parse().unwrap(),
    )
}

/// Bytes under the sandbox's workspace volume, seen from the host.
fn volume_bytes(sb: &str) -> u64 {
    let volumes = volumes_of(sb);
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    let mountpoint = docker(&["volume", "inspect", "-f", "{{.Mountpoint}}", &volumes[0]]);
    let out = std::process::Command::new("du")
        .args(["-sb", mountpoint.trim()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn retained_output_never_counts_against_tmp_or_the_workspace() {
    let tmp_mb = TMP_MB.to_string();
    let server = Server::start_with(&[("AGENT_SANDBOX_TMP_SIZE_MB", &tmp_mb)]);
    let sb = sandbox(&server);
    let block = known_block(&server, &sb);
    let expected: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take(block.len() * COPIES)
        .collect();
    assert!(expected.len() as u64 > 5 * (TMP_MB << 20));

    let (tmp_before, ws_before, tmp_used_before, tmp_total) = usage(&sb);
    // The test's own setting took effect: this `/tmp` is far smaller than what gets printed.
    assert!(
        tmp_total <= TMP_MB * 1024,
        "/tmp has {tmp_total} KiB, more than the {TMP_MB} MiB asked for"
    );
    let volume_before = volume_bytes(&sb);

    let p = start(
        &server,
        &sb,
        json!({"command": format!(
            "i=0; while [ $i -lt {COPIES} ]; do cat /workspace/block; cat /workspace/block >&2; \
             i=$((i+1)); done")}),
    );
    let id = p["id"].as_str().unwrap();
    // Nobody reads while it prints: the whole output piles up in the supervisor.
    let deadline = Instant::now() + Duration::from_secs(180);
    while get(&server, &sb, id)["state"] == "Running" {
        assert!(Instant::now() < deadline, "still printing after 3 minutes");
        std::thread::sleep(Duration::from_millis(300));
    }
    let end = expected.len();
    let ev = events(
        &server,
        &sb,
        id,
        &format!("stdoutFrom={end}&stderrFrom={end}"),
    );
    let last = ev.last().unwrap();
    assert_eq!(last["type"], "exit", "{ev:?}");
    assert_eq!(last["exitCode"], 0, "{last}");
    let p = get(&server, &sb, id);
    assert_eq!(p["stdoutBytes"].as_u64().unwrap(), expected.len() as u64);
    assert_eq!(p["stderrBytes"].as_u64().unwrap(), expected.len() as u64);

    // Nothing of it landed in /tmp or the workspace, seen from inside and from the host.
    let (tmp_after, ws_after, tmp_used_after, _) = usage(&sb);
    assert_eq!(tmp_after, tmp_before, "du /tmp changed");
    assert_eq!(tmp_used_after, tmp_used_before, "df /tmp changed");
    assert_eq!(ws_after, ws_before, "du /workspace changed");
    assert_eq!(
        volume_bytes(&sb),
        volume_before,
        "the workspace volume grew"
    );
    // /tmp keeps its room: three quarters of it can still be written.
    let fill = TMP_MB * 3 / 4;
    let (code, out) = docker_exec(
        &sb,
        &format!("dd if=/dev/zero of=/tmp/fill bs=1048576 count={fill} 2>&1 && rm /tmp/fill"),
    );
    assert_eq!(code, 0, "/tmp has no room left: {out}");

    // The retained tail of each stream still replays byte-exact, from where it starts and from
    // inside it; what is older is reported truncated, not silently skipped.
    for (stream, other) in [("stdout", "stderr"), ("stderr", "stdout")] {
        let ev = events(
            &server,
            &sb,
            id,
            &format!("{stream}From=0&{other}From={end}&encoding=base64"),
        );
        let truncated = ev.iter().find(|e| e["type"] == "truncated").unwrap();
        assert_eq!(truncated["stream"], stream, "{truncated}");
        assert_eq!(truncated["requested"], 0, "{truncated}");
        let from = truncated["retainedFrom"].as_u64().unwrap();
        let retained = end as u64 - from;
        assert!(
            retained >= 8 << 20,
            "only {retained} bytes of {stream} kept"
        );
        let got = bytes_of(&ev, stream, from);
        assert!(got == expected[from as usize..], "{stream} replay differs");
        assert_eq!(ev.last().unwrap()["type"], "exit");

        let inside = end - 4095;
        let ev = events(
            &server,
            &sb,
            id,
            &format!("{stream}From={inside}&{other}From={end}&encoding=base64"),
        );
        assert!(ev.iter().all(|e| e["type"] != "truncated"));
        assert!(bytes_of(&ev, stream, inside as u64) == expected[inside..]);
    }
}
