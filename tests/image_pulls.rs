//! Image pulls against a real registry on 127.0.0.1 (Debian's `docker-registry`, which
//! `.ci/run` installs): a missing image is pulled once however many sandboxes wait for it, its
//! progress shows in their status, and a missing tag fails with the registry's reason. The
//! daemon allows plain-HTTP registries on loopback addresses by default, so nothing is
//! configured on it.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A registry of this test's own: port, storage and log in a temporary directory.
struct Registry {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        let binary = "/usr/bin/docker-registry";
        assert!(
            std::path::Path::new(binary).exists(),
            "the image pull tests need Debian's docker-registry: apt-get install docker-registry"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = dir.path().join("registry.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary)
            .args(["serve", config.to_str().unwrap()])
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start docker-registry");
        let registry = Registry {
            child,
            port,
            log,
            _dir: dir,
        };
        wait_until("the registry answers", Duration::from_secs(30), || {
            http(
                "GET",
                &format!("http://127.0.0.1:{port}/v2/"),
                None,
                None,
                "",
            )
            .0 == 200
        });
        registry
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Pushes an image of the test image plus `mb` MiB of random bytes as `repo:tag`, then
    /// removes it locally, so that only the registry has it. Returns its full reference.
    fn push_unique(&self, repo: &str, tag: &str, mb: u32) -> String {
        let reference = self.push_only(repo, tag, mb);
        assert!(docker_status(&["rmi", &reference]));
        reference
    }

    /// [`Registry::push_unique`] without removing the local copy afterwards (a server retrying
    /// its pull may already use it).
    fn push_only(&self, repo: &str, tag: &str, mb: u32) -> String {
        let reference = format!("127.0.0.1:{}/{repo}:{tag}", self.port);
        let builder = unique("pull-build");
        let script = format!("head -c {} /dev/urandom > /blob", mb * 1024 * 1024);
        assert!(docker_status(&[
            "run",
            "--name",
            &builder,
            "--entrypoint",
            "sh",
            TEST_IMAGE,
            "-c",
            &script,
        ]));
        assert!(docker_status(&["commit", &builder, &reference]));
        let _ = docker_status(&["rm", "-f", &builder]);
        assert!(
            docker_status(&["push", &reference]),
            "push to the local registry:\n{}",
            self.log()
        );
        // The local copy stays; the caller removes it.
        reference
    }
}

/// A TCP relay to a registry that passes its answers on at about `bytes_per_second` per
/// connection, so that a pull from loopback lasts long enough to be watched. The daemon pulls
/// through it by naming the relay's port in the image reference (the registry does not care).
struct SlowRelay {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl SlowRelay {
    fn start(to: u16, bytes_per_second: usize) -> SlowRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    Err(_) => return,
                };
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let (mut from_client, mut to_upstream) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_upstream);
                    let _ = to_upstream.shutdown(Shutdown::Write);
                });
                let (mut from_upstream, mut to_client) = (upstream, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match from_upstream.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if to_client.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let pace = n as f64 / bytes_per_second as f64;
                        std::thread::sleep(Duration::from_secs_f64(pace));
                    }
                    let _ = to_client.shutdown(Shutdown::Write);
                });
            }
        });
        SlowRelay { port, stop }
    }
}

impl Drop for SlowRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn create(server: &Server, name: &str, image: &str) {
    let doc = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": { "name": name }, "spec": { "image": image },
    });
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "create {name}: {body}");
}

fn condition<'a>(doc: &'a Value, type_: &str) -> Option<&'a Value> {
    doc["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[test]
fn twenty_sandboxes_waiting_for_one_image_cause_one_pull_and_then_run() {
    let registry = Registry::start();
    let image = registry.push_unique("pulltest/busybox", &unique("t"), 24);
    let _pulled = RemoveImage(image.clone());
    let pushed = registry.log().len();
    let server = Server::start();
    let names: Vec<String> = (0..20).map(|i| unique(&format!("pull{i}"))).collect();
    // All at once, so that they wait for the pull together.
    std::thread::scope(|scope| {
        for name in &names {
            let (server, image) = (&server, &image);
            scope.spawn(move || create(server, name, image));
        }
    });
    // The first shows the pull while it runs, or its final count once it ran.
    let first = server
        .wait_for(
            "sandboxes",
            &names[0],
            "pulling",
            Duration::from_secs(120),
            |r| r.is_some_and(|r| r["status"]["imagePull"].is_object()),
        )
        .unwrap();
    eprintln!("while pulling: {}", first["status"]);
    let mut waited = 0;
    for name in &names {
        let doc = server.wait_running(name);
        // One created after the pull finished found the image there and waited for nothing.
        let Some(pulled) = condition(&doc, "ImagePulled") else {
            continue;
        };
        waited += 1;
        assert_eq!(pulled["status"], "True", "{doc}");
        let progress = &doc["status"]["imagePull"];
        let total = progress["bytesTotal"].as_u64().unwrap_or(0);
        assert!(total >= 24 * 1024 * 1024 / 2, "the layer's bytes: {doc}");
        assert_eq!(progress["bytesDone"], progress["bytesTotal"], "{doc}");
    }
    eprintln!("{waited} of 20 sandboxes waited for the pull");
    assert!(
        waited >= 2,
        "several sandboxes waited for the one pull ({waited})"
    );
    let (code, out) = server.exec(&names[7], "test -s /blob && echo pulled");
    assert_eq!((code, out.as_str()), (0, "pulled\n"));
    let pulls = server.log().matches("pulling image").count();
    assert_eq!(pulls, 1, "one pull for twenty sandboxes:\n{}", server.log());
    // And the registry was asked for the tag once (a pull resolves it, then fetches by digest).
    let log = registry.log();
    let tag = image.rsplit(':').next().unwrap();
    let lookups = log[pushed..]
        .lines()
        .filter(|l| {
            l.starts_with("127.0.0.1 - -")
                && (l.contains("\"HEAD /v2/") || l.contains("\"GET /v2/"))
                && l.contains(&format!("/manifests/{tag} "))
        })
        .count();
    assert_eq!(
        lookups,
        1,
        "registry log since the push:\n{}",
        &log[pushed..]
    );
}

/// Removes the image this test pulled, whether it passes or not (after its server's sandboxes).
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = docker_status(&["rmi", "-f", &self.0]);
    }
}

#[test]
fn a_missing_tag_fails_with_the_registrys_reason_and_never_pulls_what_is_not_allowed() {
    let registry = Registry::start();
    let repo = format!("127.0.0.1:{}/pulltest/none", registry.port);
    let server = Server::start_with(&[(
        "AGENT_SANDBOX_ALLOWED_IMAGES",
        &format!("{TEST_IMAGE},{repo}:*"),
    )]);
    let missing = unique("pull-missing");
    create(&server, &missing, &format!("{repo}:nope"));
    let doc = server
        .wait_for(
            "sandboxes",
            &missing,
            "Failed",
            Duration::from_secs(60),
            |r| r.is_some_and(|r| r["status"]["phase"] == "Failed"),
        )
        .unwrap();
    let pulled = condition(&doc, "ImagePulled").expect("an ImagePulled condition");
    assert_eq!(pulled["status"], "False", "{doc}");
    assert_eq!(pulled["reason"], "ImagePullFailed", "{doc}");
    let message = pulled["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("manifest unknown") || message.contains("not found"),
        "the registry's reason: {message}"
    );

    // An image outside the allowlist is not pulled at all.
    let refused = unique("pull-refused");
    let other = format!("127.0.0.1:{}/elsewhere/x:1", registry.port);
    create(&server, &refused, &other);
    let doc = server
        .wait_for(
            "sandboxes",
            &refused,
            "Failed",
            Duration::from_secs(60),
            |r| r.is_some_and(|r| r["status"]["phase"] == "Failed"),
        )
        .unwrap();
    assert_eq!(
        condition(&doc, "ImagePulled").unwrap()["reason"],
        "ImageNotAllowed",
        "{doc}"
    );
    assert!(
        !registry.log().contains("/v2/elsewhere/"),
        "nothing was asked of the registry:\n{}",
        registry.log()
    );
}

/// `apply --wait` and `wait` show the pull a sandbox waits for: plain lines on a pipe (the
/// figures of the status, a tenth at a time, then one when it is done), and a bar on a terminal
/// (here `script`'s pseudo-terminal).
#[test]
fn apply_wait_and_wait_show_the_pull_as_lines_on_a_pipe_and_a_bar_on_a_terminal() {
    let registry = Registry::start();
    let pushed = registry.push_unique("pulltest/progress", &unique("t"), 16);
    // Pulled through a relay at 4 MiB/s: the pull lasts about four seconds, so the client sees
    // it under way whatever the machine's load.
    let relay = SlowRelay::start(registry.port, 4 << 20);
    let image = pushed.replacen(
        &format!("127.0.0.1:{}/", registry.port),
        &format!("127.0.0.1:{}/", relay.port),
        1,
    );
    let _pulled = RemoveImage(image.clone());
    let server = Server::start();
    let name = unique("pull-cli");
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("sandbox.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n"
        ),
    )
    .unwrap();
    let (code, out, err) = server.cli(&[
        "apply",
        "-f",
        manifest.to_str().unwrap(),
        "--wait",
        "--timeout=120s",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out,
        format!("sandbox/{name} created\nsandbox/{name} ready\n"),
        "stderr:\n{err}"
    );
    assert!(
        !err.contains('\r') && !err.contains('\x1b'),
        "no terminal codes on a pipe: {err:?}"
    );
    let lines: Vec<&str> = err.lines().collect();
    let prefix = format!("sandbox/{name}: ");
    assert!(lines.iter().all(|l| l.starts_with(&prefix)), "{err}");
    // Whatever this run's poll saw of the pull in progress, its end is said once, with the
    // total the status reports.
    let doc = server.get("sandboxes", &name).unwrap();
    let total = doc["status"]["imagePull"]["bytesTotal"].as_u64().unwrap();
    assert!(total >= 16 * 1024 * 1024 / 2, "{doc}");
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with(&format!("{prefix}pulled {image} (")),
        "the last line says the pull ended: {err}"
    );
    let pulling = lines.iter().filter(|l| l.contains(": pulling ")).count();
    assert!(pulling <= 10, "at most a line per tenth: {err}");
    let mut midway = 0;
    for line in lines.iter().filter(|l| l.contains(": pulling ")) {
        assert!(
            line.starts_with(&format!("{prefix}pulling {image}: ")),
            "{line}"
        );
        let percent = line
            .rsplit_once(" (")
            .and_then(|(_, p)| p.strip_suffix("%)"))
            .and_then(|p| p.parse::<u32>().ok());
        if percent.is_some_and(|p| p > 0 && p < 100) {
            midway += 1;
        }
    }
    assert!(midway >= 1, "the pull was seen under way: {err}");
    eprintln!("apply --wait printed, on a pipe:\n{err}");

    // On a terminal: `wait` draws the (finished) pull as a full bar and ends its line.
    let command = format!(
        "{} wait sandbox/{name} --for=condition=Ready",
        env!("CARGO_BIN_EXE_agent-sandbox")
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .env("COLUMNS", "200")
        .output()
        .expect("run script (util-linux)");
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("\rsandbox/{name}  pulled {image}  [#")),
        "{shown:?}"
    );
    assert!(shown.contains("100%"), "{shown:?}");
    drop(relay);
    assert!(!shown.contains("#-"), "a full bar: {shown:?}");
    assert!(
        shown.contains(&format!("sandbox/{name} condition met")),
        "{shown:?}"
    );
}

/// How many pulls the server started (its pulls module logs each once; a reconcile waiting for
/// one may name it in its own lines too).
fn pulls_started(server: &Server) -> usize {
    server
        .log()
        .lines()
        .filter(|l| l.contains("controller::pulls") && l.contains("pulling image"))
        .count()
}

/// A pool pulls its image before any sandbox asks for it; `Always` pulls an image that is there,
/// `IfNotPresent` does not, and `Never` refuses one that is not.
#[test]
fn a_pool_pulls_ahead_and_the_pull_policies_hold() {
    let registry = Registry::start();
    let image = registry.push_unique("pulltest/pool", &unique("t"), 2);
    let _pulled = RemoveImage(image.clone());
    let tag = image.rsplit(':').next().unwrap().to_string();
    let manifest_lookups = |since: usize| {
        registry.log()[since..]
            .lines()
            .filter(|l| {
                l.starts_with("127.0.0.1 - -")
                    && (l.contains("\"HEAD /v2/") || l.contains("\"GET /v2/"))
                    && l.contains(&format!("/manifests/{tag} "))
            })
            .count()
    };

    let server = Server::start();
    let pool = unique("pullpool");
    let doc = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "SandboxPool",
        "metadata": { "name": pool }, "spec": { "image": image, "size": 1 },
    });
    let (status, body) = server.request("POST", &format!("{API}/sandboxpools"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server
        .wait_for(
            "sandboxpools",
            &pool,
            "filled",
            Duration::from_secs(120),
            |r| r.is_some_and(|r| r["status"]["readyReplicas"] == 1),
        )
        .unwrap();
    assert!(
        docker_status(&["image", "inspect", &image]),
        "pulled ahead, before any sandbox asked"
    );
    assert_eq!(pulls_started(&server), 1, "{}", server.log());
    let (status, body) = server.request("DELETE", &format!("{API}/sandboxpools/{pool}"), None);
    assert!(status < 300, "{status}: {body}");
    server.wait_gone("sandboxpools", &pool);
    drop(server);

    // A server of its own, so that no earlier pull counts as fresh.
    let server = Server::start();
    let since = registry.log().len();
    let present = unique("pull-ifnotpresent");
    create(&server, &present, &image);
    server.wait_running(&present);
    assert_eq!(pulls_started(&server), 0, "present: not pulled");
    assert_eq!(manifest_lookups(since), 0);

    let always = unique("pull-always");
    let doc = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": { "name": always },
        "spec": { "image": image, "imagePullPolicy": "Always" },
    });
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&always);
    assert_eq!(pulls_started(&server), 1, "Always pulls");
    assert_eq!(manifest_lookups(since), 1, "the registry was asked");

    let never = unique("pull-never");
    let doc = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": { "name": never },
        "spec": { "image": format!("{image}-missing"), "imagePullPolicy": "Never" },
    });
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    let doc = server
        .wait_for(
            "sandboxes",
            &never,
            "Failed",
            Duration::from_secs(60),
            |r| r.is_some_and(|r| r["status"]["phase"] == "Failed"),
        )
        .unwrap();
    assert_eq!(
        doc["status"]["conditions"][0]["reason"], "ImageMissing",
        "{doc}"
    );
    assert_eq!(pulls_started(&server), 1, "Never never pulls");
}

#[test]
fn a_failed_pull_is_retried_and_the_sandbox_runs_once_the_tag_exists() {
    let registry = Registry::start();
    let repo = "pulltest/later";
    let tag = unique("t");
    let reference = format!("127.0.0.1:{}/{repo}:{tag}", registry.port);
    let _remove = RemoveImage(reference.clone());
    let server = Server::start();
    let name = unique("pull-later");
    create(&server, &name, &reference);
    let doc = server
        .wait_for(
            "sandboxes",
            &name,
            "failed to pull",
            Duration::from_secs(60),
            |r| {
                r.is_some_and(|r| {
                    condition(r, "ImagePulled").is_some_and(|c| c["reason"] == "ImagePullFailed")
                })
            },
        )
        .unwrap();
    assert_ne!(doc["status"]["phase"], "Running", "{doc}");
    // Nobody touches the sandbox again: the pull is retried with backoff, and once the tag is
    // in the registry the sandbox comes up by itself.
    assert_eq!(registry.push_only(repo, &tag, 1), reference);
    let running = server.wait_running(&name);
    let pulled = condition(&running, "ImagePulled").expect("an ImagePulled condition");
    assert_eq!(pulled["status"], "True", "{running}");
    assert_eq!(server.exec(&name, "echo up").1, "up\n");
}
