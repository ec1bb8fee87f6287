//! What the copy-on-write suites share: resource calls, a base workspace with what views must
//! keep, and a listing that shows all of it.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;

pub const LONG: Duration = Duration::from_secs(120);

pub fn replace(server: &Server, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    });
    let (status, answer) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&body));
    assert_eq!(status, 200, "{answer}");
}

pub fn delete(server: &Server, plural: &str, name: &str) {
    let (status, answer) = server.request("DELETE", &format!("{API}/{plural}/{name}"), None);
    assert!(status == 200 || status == 202, "{status} {answer}");
}

pub fn exec(name: &str, script: &str) -> String {
    let (code, out) = docker_exec(name, script);
    assert_eq!(code, 0, "{script}: {out}");
    out
}

pub fn snapshot(server: &Server, name: &str, of: &str) -> Value {
    create(
        server,
        "snapshots",
        "Snapshot",
        name,
        json!({"sandbox": of}),
    );
    let done = server
        .wait_for("snapshots", name, "Ready", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Ready" || r["status"]["phase"] == "Failed")
        })
        .unwrap();
    assert_eq!(done["status"]["phase"], "Ready", "{done}");
    done
}

/// A base with what views must keep: modes, owners, symlinks, a hard link, an empty directory,
/// mtimes, and a file big enough that copying it would show.
pub const BASE: &str = r#"
set -e
cd /workspace
mkdir -p src empty private
chmod 700 private
printf 'base\n' > src/main.py
printf 'secret' > private/key
chmod 600 private/key
head -c 2000000 /dev/urandom > src/blob.bin
ln -s main.py src/link
ln src/main.py hard
touch -d '2021-02-03 04:05:06' src/main.py private
"#;

pub const LISTING: &str = r#"cd /workspace && find . -mindepth 1 | sort | while read -r p; do
  s=$(stat -c '%F %a %u:%g %s %Y' "$p")
  if [ -L "$p" ]; then echo "$p $s -> $(readlink "$p")";
  elif [ -f "$p" ]; then echo "$p $s $(md5sum < "$p" | cut -c1-32) links=$(stat -c %h "$p")";
  else echo "$p ${s% *}"; fi
done"#;

/// Whether restores are views here: under runc and gVisor alike.
pub fn views() -> bool {
    true
}

/// Checks that `name`'s workspace is a view (or, where views are not used, a plain volume).
pub fn assert_view(server: &Server, name: &str) -> String {
    let (volume, options) = workspace_volume(name);
    if !views() {
        assert!(options.get("type").is_none(), "{volume}: {options}");
        return volume;
    }
    assert_eq!(
        options["type"],
        "overlay",
        "{volume}: {options}; what the server said of views and workspaces:\n{}",
        views_said(server)
    );
    let o = options["o"].as_str().unwrap();
    assert!(
        o.contains(&format!(
            "lowerdir={}",
            server.data_dir.join("trees").display()
        )),
        "{o}"
    );
    volume
}

/// The server's log lines about views, copies and what it learned of this host's workspaces.
fn views_said(server: &Server) -> String {
    server
        .log()
        .lines()
        .filter(|l| l.contains("learned") || l.contains("instead") || l.contains("view"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A new sandbox named after `prefix` with `spec`, once it runs.
pub fn running(server: &Server, prefix: &str, spec: Value) -> String {
    let name = unique(prefix);
    create(server, "sandboxes", "Sandbox", &name, spec);
    server.wait_running(&name);
    name
}

/// A base sandbox holding [`BASE`], its snapshot and the listing of it.
pub fn base(server: &Server, prefix: &str) -> (String, String, String) {
    let name = running(server, prefix, json!({"image": TEST_IMAGE}));
    exec(&name, BASE);
    let listing = exec(&name, LISTING);
    let snap = unique("s");
    snapshot(server, &snap, &name);
    (name, snap, listing)
}
