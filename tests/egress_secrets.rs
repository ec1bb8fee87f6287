//! Secrets through the egress gateway, against the real daemon (runc, and gVisor with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): a sandbox holds a placeholder, the gateway puts the value
//! in the Secret's header of requests to the Secret's hosts only, a rotated value applies to the
//! next request, and the value is nowhere else: not in API answers, the server's log, status,
//! events, `docker inspect`, a sandbox process's environment, or the data directory outside the
//! Secret's own owner-only file. Bad Secrets are refused naming the field.
//!
//! The only addresses any request goes to are those of containers and networks this suite made.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

struct ContainerGuard(String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = docker_status(&["rm", "-f", &self.0]);
    }
}

/// An upstream that answers every GET with the request headers it got: plain HTTP on 8000 and,
/// when `/certs` holds a certificate, HTTPS on 8443.
const ECHO_SERVER: &str = "import http.server, os, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('path=' + self.path + '\\n' + str(self.headers)).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
def serve(port, tls):
    server = http.server.ThreadingHTTPServer(('', port), H)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain('/certs/up.pem', '/certs/up.key')
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
if os.path.exists('/certs/up.pem'):
    threading.Thread(target=serve, args=(8443, True), daemon=True).start()
serve(8000, False)
";

/// The test's own "internet": the echo server on a network of the test's own.
struct Internet {
    _container: ContainerGuard,
    _network: NetworkGuard,
    subnet: String,
    ip: String,
}

fn internet() -> Internet {
    internet_with(None)
}

/// [`internet`], serving HTTPS too with the certificate and key in `certs` (`up.pem`, `up.key`).
fn internet_with(certs: Option<&Path>) -> Internet {
    let net = unique("sec-inet");
    let network = NetworkGuard(vec![net.clone()]);
    docker(&["network", "create", &net]);
    let name = unique("sec-echo");
    let container = ContainerGuard(name.clone());
    let mount = certs.map(|dir| format!("{}:/certs:ro", dir.display()));
    let mut args = vec!["run", "-d", "--name", &name, "--network", &net];
    if let Some(mount) = &mount {
        args.extend(["-v", mount.as_str()]);
    }
    args.extend([PYTHON_IMAGE, "python3", "-c", ECHO_SERVER]);
    docker(&args);
    let ip = inspect(&[&name]).expect("container")["NetworkSettings"]["Networks"][&net]
        ["IPAddress"]
        .as_str()
        .unwrap()
        .to_string();
    let subnet = inspect(&["--type", "network", &net]).expect("network")["IPAM"]["Config"][0]
        ["Subnet"]
        .as_str()
        .unwrap()
        .to_string();
    Internet {
        _container: container,
        _network: network,
        subnet,
        ip,
    }
}

fn secret_doc(name: &str, spec: Value, value: Option<&str>) -> Value {
    let mut doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
                         "metadata": {"name": name}, "spec": spec});
    if let Some(value) = value {
        doc["value"] = json!(value);
    }
    doc
}

/// What a GET of `url` from inside `sandbox` printed, with `Authorization: Bearer $VAR`.
fn fetch(server: &Server, sandbox: &str, var: &str, url: &str) -> String {
    let body = json!({
        "command": format!(
            "wget -q -O - --header \"Authorization: Bearer ${var}\" {url} 2>&1; echo rc=$?"
        ),
        "timeout_seconds": 30,
    });
    let (status, out) = server.request(
        "POST",
        &format!("/v1/sandboxes/{sandbox}/exec"),
        Some(&body),
    );
    assert_eq!(status, 200, "{out}");
    format!(
        "{}{}",
        out["stdout"].as_str().unwrap_or_default(),
        out["stderr"].as_str().unwrap_or_default()
    )
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_secret_reaches_only_its_hosts_and_is_nowhere_else() {
    if !python_image("the egress secrets test") {
        return;
    }
    let world = internet();
    let hosts = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        hosts.path(),
        format!(
            "{ip} api.example.test other.example.test denied.example.test\n",
            ip = world.ip
        ),
    )
    .unwrap();
    let net = unique("sec-gw");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let hosts_path = hosts.path().to_str().unwrap().to_string();
    // A Secret declared in a folder reads its value from the server's environment.
    let from_env = format!("sk-env-{:032x}", rand::random::<u128>());
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &net),
        ("AGENT_SANDBOX_EGRESS_HOSTS", &hosts_path),
        ("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW", &world.subnet),
        ("TEST_FOLDER_SECRET", &from_env),
    ]);
    let folder_secret = unique("folder-key");
    write_manifest(
        &server.watch_dir,
        "folder-key.yaml",
        &format!(
            "apiVersion: agent-sandbox.io/v1\nkind: Secret\nmetadata:\n  name: {folder_secret}\n\
             spec:\n  valueFrom: {{env: TEST_FOLDER_SECRET}}\n  hosts: [\"api.example.test:8000\"]\n\
             \x20 header: X-Api-Key\n"
        ),
    );
    wait_until(
        "the folder's Secret has its value",
        Duration::from_secs(15),
        || {
            server
                .get("secrets", &folder_secret)
                .is_some_and(|s| s["status"]["hasValue"] == true)
        },
    );

    let value = format!("sk-test-{:032x}", rand::random::<u128>());
    let secret = unique("openai");
    let spec = json!({"hosts": ["api.example.test:8000"], "header": "Authorization",
                      "format": "Bearer {value}"});
    let (status, answer) = server.request(
        "POST",
        &format!("{API}/secrets"),
        Some(&secret_doc(&secret, spec.clone(), Some(&value))),
    );
    assert_eq!(status, 201, "{answer}");
    assert!(!answer.to_string().contains(&value), "{answer}");

    let name = unique("sec-sb");
    let missing = unique("sec-missing");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": TEST_IMAGE, "network": true,
                 "egress": {"allow": ["api.example.test:8000", "other.example.test:8000"]},
                 "secrets": [{"env": "OPENAI_API_KEY", "secret": secret},
                             {"env": "MISSING_KEY", "secret": missing},
                             {"env": "FOLDER_KEY", "secret": folder_secret}],
                 "services": [{"name": "keeper",
                               "command": "printf %s \"$OPENAI_API_KEY\" > /workspace/service-saw; exec sleep 3600"}]}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);

    // Inside, the variable holds a placeholder, not the value.
    let (_, placeholder) = server.exec(&name, "printf %s \"$OPENAI_API_KEY\"");
    assert!(
        placeholder.starts_with("agent-sandbox-secret-"),
        "{placeholder}"
    );
    assert!(!placeholder.contains(&value));
    // A declared service gets the same placeholder.
    let mut seen = String::new();
    wait_until(
        "the service wrote what it saw",
        Duration::from_secs(20),
        || {
            seen = server
                .exec(&name, "cat /workspace/service-saw 2>/dev/null")
                .1;
            !seen.is_empty()
        },
    );
    assert_eq!(seen, placeholder);

    // The listed host gets the real header.
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://api.example.test:8000/v1",
    );
    assert!(out.contains("rc=0"), "{out}\n{}", server.log());
    assert!(
        out.contains(&format!("Authorization: Bearer {value}")),
        "{out}"
    );
    assert!(!out.contains(&placeholder), "{out}");
    // The folder's Secret, in its own header, with the default format.
    let (_, out) = server.exec(
        &name,
        "wget -q -O - --header \"X-Api-Key: $FOLDER_KEY\" http://api.example.test:8000/ 2>&1",
    );
    assert!(out.contains(&format!("X-Api-Key: {from_env}")), "{out}");
    // An allowed host the Secret does not list sees only the placeholder.
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://other.example.test:8000/",
    );
    assert!(out.contains("rc=0"), "{out}");
    assert!(
        out.contains(&format!("Authorization: Bearer {placeholder}")),
        "{out}"
    );
    assert!(!out.contains(&value), "{out}");
    // A denied host gets nothing at all.
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://denied.example.test:8000/",
    );
    assert!(!out.contains("rc=0") && !out.contains(&value), "{out}");
    // The placeholder anywhere but the Secret's header stays what it is.
    let (_, out) = server.exec(
        &name,
        "wget -q -O - --header \"X-Other: $OPENAI_API_KEY\" \
         \"http://api.example.test:8000/$OPENAI_API_KEY\" 2>&1",
    );
    assert!(
        out.contains(&format!("path=/{placeholder}")) && !out.contains(&value),
        "{out}"
    );

    // A rotated value is used from the next request on.
    let rotated = format!("sk-rotated-{:032x}", rand::random::<u128>());
    let (status, answer) = server.request(
        "PUT",
        &format!("{API}/secrets/{secret}"),
        Some(&secret_doc(&secret, spec.clone(), Some(&rotated))),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(!answer.to_string().contains(&rotated), "{answer}");
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://api.example.test:8000/",
    );
    assert!(
        out.contains(&format!("Authorization: Bearer {rotated}")),
        "{out}"
    );
    // An edit of the Secret's hosts applies within a second, with no restart.
    let mut narrowed = spec.clone();
    narrowed["hosts"] = json!(["other.example.test:8000"]);
    let (status, answer) = server.request(
        "PUT",
        &format!("{API}/secrets/{secret}"),
        Some(&secret_doc(&secret, narrowed, None)),
    );
    assert_eq!(status, 200, "{answer}");
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://api.example.test:8000/",
    );
    assert!(
        out.contains(&placeholder) && !out.contains(&rotated),
        "{out}"
    );
    let out = fetch(
        &server,
        &name,
        "OPENAI_API_KEY",
        "http://other.example.test:8000/",
    );
    assert!(out.contains(&format!("Bearer {rotated}")), "{out}");

    // The missing Secret is named in the sandbox's status; the sandbox runs all the same.
    let mut sandbox = Value::Null;
    wait_until(
        "SecretsReady names the missing Secret",
        Duration::from_secs(15),
        || {
            sandbox = server.get("sandboxes", &name).unwrap();
            sandbox["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "SecretsReady"
                        && c["status"] == "False"
                        && c["message"].as_str().is_some_and(|m| {
                            m.contains(&missing)
                                && m.contains("not found")
                                && m.contains("MISSING_KEY")
                        })
                })
        },
    );
    assert_eq!(sandbox["status"]["phase"], "Running", "{sandbox}");

    // A snapshot of the sandbox: its workspace holds what the service saw (the placeholder),
    // and the search of the data directory below reads it too.
    let snapshot = unique("sec-snap");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/snapshots"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
                     "metadata": {"name": snapshot}, "spec": {"sandbox": name}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let taken = server
        .wait_for(
            "snapshots",
            &snapshot,
            "ready",
            Duration::from_secs(60),
            |r| {
                r.is_some_and(|r| {
                    r["status"]["phase"] == "Ready" || r["status"]["phase"] == "Failed"
                })
            },
        )
        .unwrap();
    assert_eq!(taken["status"]["phase"], "Ready", "{taken}");
    let in_snapshots = files(&server.data_dir.join("snapshots"))
        .iter()
        .any(|p| holds(&std::fs::read(p).unwrap_or_default(), &placeholder));
    assert!(in_snapshots, "the snapshot is searched as written");

    // Nowhere else: the sandbox's processes, docker inspect, API answers, the log, the disk.
    for secret_value in [&value, &rotated, &from_env] {
        let environ = as_root(
            &name,
            "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
        );
        assert!(!environ.contains(secret_value.as_str()));
        let (_, mine) = server.exec(&name, "cat /proc/self/environ | tr '\\0' '\\n'");
        assert!(
            mine.contains(&placeholder) && !mine.contains(secret_value.as_str()),
            "{mine}"
        );
        let inspected = container(&name).expect("container").to_string();
        assert!(!inspected.contains(secret_value.as_str()));
        for path in [
            format!("{API}/secrets/{secret}"),
            format!("{API}/secrets"),
            format!("{API}/sandboxes/{name}"),
            format!("{API}/sandboxes"),
            format!("{API}/events"),
            format!("{API}/events?involvedObject={secret}"),
        ] {
            let (status, body) = server.request("GET", &path, None);
            assert_eq!(status, 200, "{path}: {body}");
            assert!(!body.to_string().contains(secret_value.as_str()), "{path}");
        }
        let (_, log) = server.request_raw(
            "GET",
            &format!("{API}/sandboxes/{name}/egress?follow=false"),
            None,
            "application/json",
        );
        assert!(!log.contains(secret_value.as_str()));
        assert!(!server.log().contains(secret_value.as_str()));
        let holders: Vec<PathBuf> = files(&server.data_dir)
            .into_iter()
            .filter(|p| holds(&std::fs::read(p).unwrap_or_default(), secret_value))
            .collect();
        if secret_value == &rotated {
            // Only the Secret's own file, owner-only, outside manifests/.
            let own = server.data_dir.join("secrets").join(&secret);
            assert_eq!(holders, std::slice::from_ref(&own), "{holders:?}");
            let mode = std::fs::metadata(&own).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        } else {
            assert!(holders.is_empty(), "{holders:?}");
        }
    }

    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    server.wait_gone("sandboxes", &name);
}

#[test]
fn bad_secrets_are_refused_naming_the_field() {
    let server = Server::start();
    let good = json!({"hosts": ["api.example.test"], "header": "Authorization",
                      "format": "Bearer {value}"});
    let with = |key: &str, value: Value| {
        let mut spec = good.clone();
        if value.is_null() {
            spec.as_object_mut().unwrap().remove(key);
        } else {
            spec[key] = value;
        }
        spec
    };
    for (spec, field) in [
        (with("header", Value::Null), "spec.header"),
        (with("format", json!("Bearer")), "spec.format"),
        (
            with("hosts", json!(["api.example.test", "*.com"])),
            "spec.hosts[1]",
        ),
        (with("hosts", json!(["10.0.0.0/8"])), "spec.hosts[0]"),
        (with("header", json!("Bad Header")), "spec.header"),
        (with("surprise", json!(true)), "surprise"),
    ] {
        let doc = secret_doc(&unique("bad-secret"), spec.clone(), Some("v"));
        let (status, body) = server.request("POST", &format!("{API}/secrets"), Some(&doc));
        assert_eq!(status, 422, "{spec}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{field} in {message}");
    }
    // A sandbox's secrets need the gateway, a variable name, and no clash with env.
    for (spec, needle) in [
        (
            json!({"network": true, "secrets": [{"env": "K", "secret": "s"}]}),
            "spec.secrets needs",
        ),
        (
            json!({"network": true, "egress": {"allow": ["a.example"]},
                   "secrets": [{"env": "1K", "secret": "s"}]}),
            "spec.secrets[0].env",
        ),
        (
            json!({"network": true, "egress": {"allow": ["a.example"]}, "env": {"K": "x"},
                   "secrets": [{"env": "K", "secret": "s"}]}),
            "spec.secrets[0].env",
        ),
        (
            json!({"network": true, "egress": {"allow": ["a.example"]},
                   "secrets": [{"env": "K", "secret": "Bad/Name"}]}),
            "spec.secrets[0].secret",
        ),
    ] {
        let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                         "metadata": {"name": unique("bad-sb")}, "spec": spec});
        let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
        assert_eq!(status, 422, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{needle} in {message}");
    }
}

/// A CA of the test's own and a certificate it issued for `hosts`: (CA PEM, leaf PEM, key PEM).
fn upstream_certificates(hosts: &[&str]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

#[test]
fn https_to_a_secrets_host_is_intercepted_and_every_other_host_tunnelled() {
    if !python_image("the egress secrets HTTPS test") {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (up_ca, up_cert, up_key) =
        upstream_certificates(&["api.example.test", "other.example.test"]);
    std::fs::write(certs.path().join("up.pem"), &up_cert).unwrap();
    std::fs::write(certs.path().join("up.key"), &up_key).unwrap();
    std::fs::write(certs.path().join("ca.pem"), &up_ca).unwrap();
    std::fs::set_permissions(certs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for file in ["up.pem", "up.key", "ca.pem"] {
        std::fs::set_permissions(
            certs.path().join(file),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }
    let world = internet_with(Some(certs.path()));
    let hosts = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        hosts.path(),
        format!("{ip} api.example.test other.example.test\n", ip = world.ip),
    )
    .unwrap();
    let net = unique("sec-tls");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let hosts_path = hosts.path().to_str().unwrap().to_string();
    let extra_ca = certs.path().join("ca.pem").to_str().unwrap().to_string();
    let mut server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &net),
        ("AGENT_SANDBOX_EGRESS_HOSTS", &hosts_path),
        ("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW", &world.subnet),
        ("AGENT_SANDBOX_EGRESS_EXTRA_CA", &extra_ca),
    ]);
    // The authority is made once, its key owner-only.
    let key = server.data_dir.join("egress-ca/ca.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let value = format!("sk-tls-{:032x}", rand::random::<u128>());
    let secret = unique("openai");
    let spec = json!({"hosts": ["api.example.test"], "header": "Authorization",
                      "format": "Bearer {value}"});
    let (status, answer) = server.request(
        "POST",
        &format!("{API}/secrets"),
        Some(&secret_doc(&secret, spec, Some(&value))),
    );
    assert_eq!(status, 201, "{answer}");
    let name = unique("sec-tls-sb");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": PYTHON_IMAGE, "network": true,
                 "egress": {"allow": ["api.example.test:8443", "other.example.test:8443"]},
                 "secrets": [{"env": "OPENAI_API_KEY", "secret": secret}]}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    let (_, placeholder) = server.exec(&name, "printf %s \"$OPENAI_API_KEY\"");
    let (_, env) = server.exec(&name, "env");
    for var in [
        "SSL_CERT_FILE=/etc/agent-sandbox-ca/bundle.pem",
        "REQUESTS_CA_BUNDLE=",
        "CURL_CA_BUNDLE=",
        "GIT_SSL_CAINFO=",
        "PIP_CERT=",
        "NODE_EXTRA_CA_CERTS=/etc/agent-sandbox-ca/ca.pem",
    ] {
        assert!(env.contains(var), "{var} in {env}");
    }
    // The sandbox's own trust, the upstream's CA, is written where the tunnel test reads it.
    server.exec(
        &name,
        &format!("cat > /workspace/up-ca.pem <<'EOF'\n{up_ca}\nEOF"),
    );
    let get = |server: &Server, url: &str, cafile: Option<&str>| {
        let context = match cafile {
            Some(file) => format!("ssl.create_default_context(cafile='{file}')"),
            None => "ssl.create_default_context()".to_string(),
        };
        let script = format!(
            "import os, ssl, urllib.request as u\n\
             r = u.Request('{url}', headers={{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}})\n\
             print(u.urlopen(r, timeout=15, context={context}).read().decode())\n"
        );
        let body = json!({"command": format!("python3 -c \"$S\" 2>&1; echo rc=$?"),
                          "env": {"S": script}, "timeout_seconds": 60});
        let (status, out) =
            server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
        assert_eq!(status, 200, "{out}");
        out["stdout"].as_str().unwrap_or_default().to_string()
    };

    // To the Secret's host: intercepted (the sandbox trusts the gateway's CA through
    // SSL_CERT_FILE), the value put in, the upstream verified against EGRESS_EXTRA_CA.
    let out = get(&server, "https://api.example.test:8443/v1", None);
    assert!(out.contains("rc=0"), "{out}\n{}", server.log());
    assert!(
        out.contains(&format!("Authorization: Bearer {value}")),
        "{out}"
    );
    // Trusting only the upstream's own CA fails there: the connection was taken over.
    let out = get(
        &server,
        "https://api.example.test:8443/",
        Some("/workspace/up-ca.pem"),
    );
    assert!(!out.contains("rc=0") && !out.contains(&value), "{out}");
    // To another allowed host: tunnelled end to end (the upstream's own certificate verifies),
    // and the placeholder stays a placeholder.
    let out = get(
        &server,
        "https://other.example.test:8443/",
        Some("/workspace/up-ca.pem"),
    );
    assert!(out.contains("rc=0"), "{out}");
    assert!(
        out.contains(&format!("Authorization: Bearer {placeholder}")),
        "{out}"
    );
    assert!(!out.contains(&value), "{out}");

    // The value is in no answer, the log, or the container.
    assert!(!server.log().contains(&value));
    assert!(!container(&name).unwrap().to_string().contains(&value));
    let environ = as_root(
        &name,
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
    );
    assert!(!environ.contains(&value));
    let (_, decisions) = server.request_raw(
        "GET",
        &format!("{API}/sandboxes/{name}/egress?follow=false"),
        None,
        "application/json",
    );
    assert!(!decisions.contains(&value));
    assert!(decisions.contains("api.example.test"), "{decisions}");

    // The authority is made once: a restarted server keeps it, and intercepts with it.
    let kept = std::fs::read(&key).unwrap();
    server.restart();
    server.wait_running(&name);
    assert_eq!(std::fs::read(&key).unwrap(), kept);
    let mut out = String::new();
    wait_until(
        "interception works after a restart",
        Duration::from_secs(20),
        || {
            out = get(&server, "https://api.example.test:8443/", None);
            out.contains(&format!("Authorization: Bearer {value}"))
        },
    );

    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    server.wait_gone("sandboxes", &name);
}

/// Run inside a policed sandbox with every proxy variable removed: each case connects as a
/// client that ignores proxies would, and prints `name<TAB>seconds<TAB>outcome`.
const TRANSPARENT_CLIENT: &str = r#"
import os, socket, ssl, sys, time, urllib.request as u, urllib.error
for k in ['http_proxy', 'https_proxy', 'HTTP_PROXY', 'HTTPS_PROXY']:
    os.environ.pop(k, None)
key = os.environ['OPENAI_API_KEY']
up_ip, gateway = sys.argv[1], sys.argv[2]
def get(url, ctx=None):
    opener = u.build_opener(u.ProxyHandler({}), u.HTTPSHandler(context=ctx))
    r = u.Request(url, headers={'Authorization': 'Bearer ' + key})
    try:
        return opener.open(r, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return 'HTTP %d %s' % (e.code, e.read().decode())
def raw(address, port, data, name=None):
    s = socket.create_connection((address, port), timeout=10)
    if name is not None:
        ctx = ssl.create_default_context(cafile='/workspace/up-ca.pem')
        s = ctx.wrap_socket(s, server_hostname=name)
    s.sendall(data)
    out = b''
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
    return out.decode(errors='replace')
def udp(address, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.connect((address, port))
    s.send(b'x')
    return 'got ' + repr(s.recv(100))
def icmp(address):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError as e:
        return 'ERR nosocket %s' % e
    s.settimeout(3)
    s.connect((address, 0))
    s.send(b'\x08\x00\x00\x00\x12\x34\x00\x01' + b'ping')
    return 'got ' + repr(s.recv(100))
up_ca = ssl.create_default_context(cafile='/workspace/up-ca.pem')
cases = [
    ('http-allowed', lambda: get('http://other.example.test:8000/plain')),
    ('http-secret', lambda: get('http://api.example.test:8000/plain')),
    ('https-intercepted', lambda: get('https://api.example.test:8443/tls', ssl.create_default_context())),
    ('https-tunnelled', lambda: get('https://other.example.test:8443/tls', up_ca)),
    ('http-host-denied', lambda: raw(up_ip, 8000, b'GET / HTTP/1.1\r\nHost: denied.example.test\r\n\r\n')),
    ('tls-sni-denied', lambda: raw(up_ip, 8443, b'GET / HTTP/1.0\r\n\r\n', 'denied.example.test')),
    ('http-by-cidr', lambda: raw(up_ip, 8000, b'GET /cidr HTTP/1.0\r\n\r\n')),
    ('tcp-by-cidr', lambda: raw(up_ip, 8000, b'\x00\x01 not http\r\n\r\n')),
    ('tcp-port-denied', lambda: raw(up_ip, 8001, b'\x00\x01 not http\r\n\r\n')),
    ('tcp-metadata', lambda: raw('169.254.169.254', 80, b'\x00\x01 not http\r\n\r\n')),
    ('tcp-host', lambda: raw(gateway, 22, b'hello\r\n')),
    ('udp', lambda: udp(up_ip, 9999)),
    ('udp-dns-elsewhere', lambda: udp(up_ip, 53)),
    ('icmp', lambda: icmp(up_ip)),
]
for name, case in cases:
    start = time.monotonic()
    try:
        outcome = case().replace('\n', ' | ')
    except Exception as e:
        outcome = 'ERR %s %s' % (type(e).__name__, e)
    print('%s\t%.3f\t%s' % (name, time.monotonic() - start, outcome), flush=True)
"#;

#[test]
fn clients_ignoring_the_proxy_are_decided_by_host_sni_and_cidr() {
    if !python_image("the transparent egress test") {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (up_ca, up_cert, up_key) = upstream_certificates(&[
        "api.example.test",
        "other.example.test",
        "denied.example.test",
    ]);
    std::fs::write(certs.path().join("up.pem"), &up_cert).unwrap();
    std::fs::write(certs.path().join("up.key"), &up_key).unwrap();
    std::fs::write(certs.path().join("ca.pem"), &up_ca).unwrap();
    std::fs::set_permissions(certs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for file in ["up.pem", "up.key", "ca.pem"] {
        std::fs::set_permissions(
            certs.path().join(file),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }
    let world = internet_with(Some(certs.path()));
    let hosts = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        hosts.path(),
        format!(
            "{ip} api.example.test other.example.test denied.example.test\n",
            ip = world.ip
        ),
    )
    .unwrap();
    let net = unique("tr-net");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let hosts_path = hosts.path().to_str().unwrap().to_string();
    let extra_ca = certs.path().join("ca.pem").to_str().unwrap().to_string();
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &net),
        ("AGENT_SANDBOX_EGRESS_HOSTS", &hosts_path),
        ("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW", &world.subnet),
        ("AGENT_SANDBOX_EGRESS_EXTRA_CA", &extra_ca),
    ]);
    let value = format!("sk-tr-{:032x}", rand::random::<u128>());
    let secret = unique("openai");
    let spec = json!({"hosts": ["api.example.test"], "header": "Authorization",
                      "format": "Bearer {value}"});
    let (status, answer) = server.request(
        "POST",
        &format!("{API}/secrets"),
        Some(&secret_doc(&secret, spec, Some(&value))),
    );
    assert_eq!(status, 201, "{answer}");
    let name = unique("tr-sb");
    let cidr = format!("{}/32:8000", world.ip);
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": PYTHON_IMAGE, "network": true,
                 "egress": {"allow": ["api.example.test", "other.example.test", cidr]},
                 "secrets": [{"env": "OPENAI_API_KEY", "secret": secret}]}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    let (_, placeholder) = server.exec(&name, "printf %s \"$OPENAI_API_KEY\"");
    server.exec(
        &name,
        &format!("cat > /workspace/up-ca.pem <<'EOF'\n{up_ca}\nEOF"),
    );
    let gateway = inspect(&["--type", "network", &format!("{net}-egress")]).unwrap()["IPAM"]
        ["Config"][0]["Gateway"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({"command": format!("python3 -c \"$S\" {} {gateway} 2>&1", world.ip),
                      "env": {"S": TRANSPARENT_CLIENT}, "timeout_seconds": 120});
    let (status, out) = server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
    assert_eq!(status, 200, "{out}");
    let out = out["stdout"].as_str().unwrap_or_default().to_string();
    let case = |case: &str| -> (f64, String) {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{case}\t")))
            .unwrap_or_else(|| panic!("{case} in {out}\n{}", server.log()));
        let mut parts = line.splitn(3, '\t').skip(1);
        let seconds = parts.next().unwrap().parse().unwrap();
        (seconds, parts.next().unwrap_or_default().to_string())
    };
    // Allowed by name, without the proxy: HTTP by Host, TLS by SNI (tunnelled end to end: the
    // upstream's own certificate verifies), the placeholder a placeholder.
    let (_, got) = case("http-allowed");
    assert!(got.contains("path=/plain"), "{got}");
    assert!(got.contains(&format!("Bearer {placeholder}")), "{got}");
    let (_, got) = case("https-tunnelled");
    assert!(got.contains("path=/tls"), "{got}");
    assert!(got.contains(&format!("Bearer {placeholder}")), "{got}");
    // To the Secret's host the value is put in, over HTTP and intercepted HTTPS alike.
    for secret_case in ["http-secret", "https-intercepted"] {
        let (_, got) = case(secret_case);
        assert!(
            got.contains(&format!("Authorization: Bearer {value}")),
            "{secret_case}: {got}"
        );
    }
    // By address and port, through a CIDR entry, when no name is said (HTTP without a Host,
    // and bytes that are neither HTTP nor TLS, which the upstream answers with a 400).
    let (_, got) = case("http-by-cidr");
    assert!(got.contains("path=/cidr"), "{got}");
    let (_, got) = case("tcp-by-cidr");
    assert!(got.contains("400"), "{got}");
    // Everything else fails fast.
    let (seconds, got) = case("http-host-denied");
    assert!(
        got.contains("403") && got.contains("denied.example.test"),
        "{got}"
    );
    assert!(seconds < 5.0, "{seconds}");
    for denied in [
        "tls-sni-denied",
        "tcp-port-denied",
        "tcp-metadata",
        "tcp-host",
    ] {
        let (seconds, got) = case(denied);
        assert!(got.starts_with("ERR") || got.is_empty(), "{denied}: {got}");
        assert!(!got.contains("path="), "{denied}: {got}");
        assert!(seconds < 5.0, "{denied}: {seconds}");
    }

    // UDP (but DNS to the gateway, which every name above went through) is refused at once;
    // ICMP gets no answer (where the runtime lets a sandbox open an ICMP socket at all).
    for denied in ["udp", "udp-dns-elsewhere"] {
        let (seconds, got) = case(denied);
        assert!(
            got.starts_with("ERR ConnectionRefusedError"),
            "{denied}: {got}"
        );
        assert!(seconds < 2.0, "{denied}: {seconds}");
    }
    let (_, icmp) = case("icmp");
    assert!(icmp.starts_with("ERR"), "{icmp}");
    let icmp_sent = !icmp.contains("nosocket");

    // Each is in the decision log with its protocol and rule.
    let mut log = Vec::new();
    wait_until("the decisions are logged", Duration::from_secs(10), || {
        let (_, text) = server.request_raw(
            "GET",
            &format!("{API}/sandboxes/{name}/egress?follow=false"),
            None,
            "application/json",
        );
        log = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        log.iter().filter(|d| d["protocol"] == "tcp").count() >= 4
            && log.iter().filter(|d| d["protocol"] == "http").count() >= 4
            && log.iter().filter(|d| d["protocol"] == "udp").count() >= 2
            && (!icmp_sent || log.iter().any(|d| d["protocol"] == "icmp"))
    });
    let find = |protocol: &str, host: &str, port: u64, allowed: bool| -> Value {
        log.iter()
            .find(|d| {
                d["protocol"] == protocol
                    && d["host"] == host
                    && d["port"] == port
                    && d["allowed"] == allowed
            })
            .unwrap_or_else(|| panic!("{protocol} {host}:{port} {allowed} in {log:#?}"))
            .clone()
    };
    assert_eq!(
        find("http", "other.example.test", 8000, true)["rule"],
        "other.example.test"
    );
    assert_eq!(
        find("tls", "other.example.test", 8443, true)["rule"],
        "other.example.test"
    );
    find("tls", "api.example.test", 8443, true);
    assert_eq!(find("tcp", &world.ip, 8000, true)["rule"], cidr.as_str());
    assert_eq!(find("http", &world.ip, 8000, true)["rule"], cidr.as_str());
    let rule = |d: Value| d["rule"].as_str().unwrap_or_default().to_string();
    assert!(rule(find("http", "denied.example.test", 8000, false)).contains("no entry allows"));
    assert!(rule(find("tls", "denied.example.test", 8443, false)).contains("no entry allows"));
    assert!(rule(find("tcp", &world.ip, 8001, false)).contains("no entry allows"));
    find("tcp", "169.254.169.254", 80, false);
    find("tcp", &gateway, 22, false);
    for port in [9999, 53] {
        let refused = find("udp", &world.ip, port, false);
        assert!(rule(refused).contains("udp is not allowed"));
    }
    if icmp_sent {
        let refused = log
            .iter()
            .find(|d| d["protocol"] == "icmp" && d["host"] == world.ip.as_str())
            .unwrap_or_else(|| panic!("icmp in {log:#?}"));
        assert_eq!(refused["allowed"], false);
        assert_eq!(refused["rule"], "icmp is not allowed");
    }
    assert!(
        !log.iter()
            .any(|d| d["protocol"] == "udp" && d["host"] == gateway.as_str()),
        "DNS to the gateway is not refused: {log:#?}"
    );
    let text = serde_json::to_string(&log).unwrap();
    assert!(!text.contains(&value));
    assert!(!server.log().contains(&value));

    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    server.wait_gone("sandboxes", &name);
}
