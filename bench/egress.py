#!/usr/bin/env python3
"""Egress: what the gateway costs a sandbox's connections, against open networking, same run.

One server of the given binary (throwaway data directory and key) with an "internet" of the
benchmark's own: a container of the Python test image on a Docker network of its own, serving
plain HTTP on 8000 (`/small` answers 1 KiB, `/big` a 256 MiB file with sendfile) and HTTPS on 8443
(the same, `/big` in 1 MiB writes, with a certificate for both names below issued by a CA made
for the run with `openssl`). The server reads the names from `AGENT_SANDBOX_EGRESS_HOSTS`
(`up.bench.test` and `sec.bench.test`, both that container), trusts the CA through
`AGENT_SANDBOX_EGRESS_EXTRA_CA`, and may reach the network's subnet
(`AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW`). Two sandboxes of the Python image:

- policed: `network: true`, `egress.allow: [up.bench.test, sec.bench.test]`, and a Secret for
  `sec.bench.test` (so HTTPS there is intercepted: the gateway ends TLS with its own CA, puts the
  value in and opens TLS to the upstream); `up.bench.test` is tunnelled end to end;
- open: `network: true` without `egress`. An open sandbox may not reach other Docker networks
  (Docker isolates bridges), so for the run two rules at the top of `DOCKER-USER` let its bridge
  reach the upstream's (and the answers back); they are removed at the end.

Every figure is taken by one python3 process inside a sandbox (started with `/v1` exec, whose
own cost is not in any figure), each request on a new TCP connection, timed from before the
connection to the last byte of the answer; 5 untimed requests first. Paths: `open` (straight to
the upstream's address), `proxy` (through `HTTP_PROXY`: an absolute `GET` for HTTP, `CONNECT`
for TLS) and `transparent` (the client ignores the proxy and dials the upstream's address; the
host's firewall hands the connection to the gateway, which decides by `Host` or SNI). Rounds
alternate the order of the paths. The 256 MiB download is taken over plain HTTP and over
HTTPS to the tunnelled name (TLS end to end, as a download from a package index): in the
second, both ends pay for the encryption and the gateway's share of the work is smaller.
Checked, untimed, in every TLS batch: the certificate's issuer (the gateway's CA for
`sec.bench.test`, the run's CA otherwise) and whether the upstream saw the Secret's real value.

    python3 bench/egress.py target/release/agent-sandbox [--rounds 5] [--n 200] [--big-rounds 3]

Needs root (the `DOCKER-USER` rules; the server's own firewall rules), Docker, openssl and the
test images (`scripts/build-test-images.sh`). `--runtime runsc` runs the sandboxes under gVisor.
The tables go to stdout (markdown), raw samples to `--json` if given. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import API, API_VERSION, OPENER, Throwaway, log, percentile  # noqa: E402

IMAGE = "agent-sandbox-test/python:latest"
BIG_MIB = 256
PLAIN, TLS = 8000, 8443
OPEN_HOST, SECRET_HOST = "up.bench.test", "sec.bench.test"
RULE_COMMENT = "agent-sandbox egress bench"
# The 256 MiB downloads: the client's kind, and how the report names it.
DOWNLOADS = (("big", "HTTP"), ("bigtls", "HTTPS (tunnelled)"))

# The upstream: HTTP and HTTPS, TCP_NODELAY as production servers set it. `X-Value-Seen` tells
# whether the request carried the Secret's real value (the value never goes back).
UPSTREAM = f"""
import http.server, os, socket, ssl, threading
block = os.urandom(1 << 20)
with open("/tmp/big.tmp", "wb") as f:
    for _ in range({BIG_MIB}):
        f.write(block)
os.rename("/tmp/big.tmp", "/tmp/big")
SMALL = b"x" * 1024
WANT = "Bearer " + os.environ["BENCH_VALUE"]

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self):
        if self.path == "/big":
            with open("/tmp/big", "rb") as f:
                self.send_response(200)
                self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
                self.end_headers()
                self.wfile.flush()
                if isinstance(self.connection, ssl.SSLSocket):
                    # 1 MiB writes (OpenSSL cuts them into 16 KiB records): Python's sendfile
                    # over TLS writes 8 KiB at a time, which would slow the upstream itself.
                    while chunk := f.read(1 << 20):
                        self.connection.sendall(chunk)
                else:
                    self.connection.sendfile(f)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(SMALL)))
        seen = self.headers.get("Authorization") == WANT
        self.send_header("X-Value-Seen", "yes" if seen else "no")
        self.end_headers()
        self.wfile.write(SMALL)

    def log_message(self, *args):
        pass

class TlsServer(http.server.ThreadingHTTPServer):
    # TCP_NODELAY before the handshake, as Go's and Node's servers have it from the accept on.
    def get_request(self):
        sock, address = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.context.wrap_socket(sock, server_side=True), address

def serve(port, tls):
    server = (TlsServer if tls else http.server.ThreadingHTTPServer)(("", port), Handler)
    server.daemon_threads = True
    if tls:
        server.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.context.load_cert_chain("/certs/up.pem", "/certs/up.key")
    server.serve_forever()

threading.Thread(target=serve, args=({TLS}, True), daemon=True).start()
serve({PLAIN}, False)
"""

# The client, run inside a sandbox: `python3 -c "$S" KIND PATH N HOST`. Prints one JSON line.
CLIENT = r"""
import json, os, socket, ssl, sys, time
kind, path, n, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
up = os.environ["UP_IP"]
port = 8443 if kind in ("tls", "bigtls") else 8000
proxy = os.environ.get("HTTP_PROXY", "")[len("http://"):].rsplit(":", 1)
if path == "proxy" and len(proxy) != 2:
    sys.exit("no HTTP_PROXY in this sandbox")
buffer = bytearray(1 << 20)
view = memoryview(buffer)

def dial():
    where = (proxy[0], int(proxy[1])) if path == "proxy" else (up, port)
    s = socket.create_connection(where, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def head_of(s):
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit(f"closed before the head: {got[:200]!r}")
        got += chunk
    head, rest = got.split(b"\r\n\r\n", 1)
    return head.decode("latin-1"), rest

def answer(s):
    head, rest = head_of(s)
    lines = head.split("\r\n")
    if lines[0].split(" ")[1] != "200":
        raise SystemExit(f"answer: {lines[0]}")
    fields = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    left = int(fields["content-length"]) - len(rest)
    total = len(rest)
    while left > 0:
        got = s.recv_into(view, min(left, len(buffer)))
        if not got:
            raise SystemExit(f"closed with {left} bytes to come")
        left -= got
        total += got
    return fields, total

def http_get(target):
    s = dial()
    line = f"http://{host}:{port}{target}" if path == "proxy" else target
    s.sendall(f"GET {line} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    fields, total = answer(s)
    s.close()
    return fields, total

context = ssl.create_default_context()
for file in ("/etc/agent-sandbox-ca/ca.pem",):
    if os.path.exists(file):
        context.load_verify_locations(cafile=file)
context.load_verify_locations(cadata=os.environ["UP_CA"])
key = os.environ.get("BENCH_KEY", "none")
checks = {"issuers": set(), "valueSeen": set()}

def tls_get(target="/small"):
    s = dial()
    if path == "proxy":
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head, rest = head_of(s)
        if " 200 " not in head.split("\r\n")[0] + " " or rest:
            raise SystemExit(f"CONNECT: {head[:200]}")
    t = context.wrap_socket(s, server_hostname=host)
    t.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
              "Connection: close\r\n\r\n".encode())
    fields, total = answer(t)
    issuer = dict(x[0] for x in t.getpeercert()["issuer"]).get("commonName", "?")
    t.close()
    return fields, total, issuer

times = []
if kind in ("big", "bigtls"):
    start = time.perf_counter()
    fields, total = http_get("/big") if kind == "big" else tls_get("/big")[:2]
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "bytes": total}))
    sys.exit(0)
for i in range(n + 5):
    start = time.perf_counter()
    if kind == "http":
        fields, total = http_get("/small")
    else:
        fields, total, issuer = tls_get()
        checks["issuers"].add(issuer)
        checks["valueSeen"].add(fields.get("x-value-seen", "?"))
    elapsed = (time.perf_counter() - start) * 1000.0
    if total != 1024:
        raise SystemExit(f"{total} bytes, expected 1024")
    if i >= 5:
        times.append(elapsed)
print(json.dumps({"ms": times, "issuers": sorted(checks["issuers"]),
                  "valueSeen": sorted(checks["valueSeen"])}))
"""


def sh(*args: str, check: bool = True) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()[:300]}")
    return out.stdout.strip()


def certificates(work: pathlib.Path) -> None:
    """A CA of the run's own and a leaf for both names, in `work` (readable by the upstream)."""
    names = f"DNS:{OPEN_HOST},DNS:{SECRET_HOST}"
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
       "-nodes", "-keyout", str(work / "ca.key"), "-out", str(work / "ca.pem"), "-days", "2",
       "-subj", "/CN=egress bench upstream CA")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", str(work / "up.key"), "-out", str(work / "up.csr"), "-subj", f"/CN={OPEN_HOST}")
    (work / "ext.cnf").write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", str(work / "up.csr"), "-CA", str(work / "ca.pem"),
       "-CAkey", str(work / "ca.key"), "-CAcreateserial", "-out", str(work / "up.pem"),
       "-days", "2", "-extfile", str(work / "ext.cnf"))
    for name in ("ca.pem", "up.pem", "up.key"):
        (work / name).chmod(0o644)
    work.chmod(0o755)


class Api:
    """The few calls this benchmark makes to its server."""

    def __init__(self, server: Throwaway):
        self.url, self.key = server.url, server.key

    def call(self, method: str, path: str, body=None, timeout: float = 600.0):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.key}")
        request.add_header("Content-Type", "application/json")
        with OPENER.open(request, timeout=timeout) as response:
            text = response.read()
        return json.loads(text) if text else None

    def sandbox(self, name: str, spec: dict) -> dict:
        doc = {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": {"name": name},
               "spec": {"image": IMAGE, **spec}}
        self.call("POST", f"{API}/sandboxes", doc)
        deadline = time.monotonic() + 180
        while True:
            status = self.call("GET", f"{API}/sandboxes/{name}").get("status") or {}
            if status.get("phase") == "Running" and status.get("containerID"):
                return status
            if time.monotonic() > deadline:
                raise RuntimeError(f"sandbox {name} is not running: {status}")
            time.sleep(0.2)

    def run(self, name: str, env: dict, *args: str) -> dict:
        """Runs the client in `name`; its JSON line."""
        command = 'python3 -c "$S" ' + " ".join(args)
        answer = self.call("POST", f"/v1/sandboxes/{name}/exec",
                           {"command": command, "env": {"S": CLIENT, **env},
                            "timeout_seconds": 600})
        if answer.get("exit_code") != 0:
            raise RuntimeError(f"client {args} in {name}: {answer.get('stdout', '')[-300:]}"
                               f"{answer.get('stderr', '')[-600:]}")
        return json.loads(answer["stdout"].strip().splitlines()[-1])


def network(name: str) -> dict:
    return json.loads(sh("docker", "network", "inspect", name))[0]


def bridge_of(name: str) -> str:
    info = network(name)
    return info["Options"].get("com.docker.network.bridge.name") or f"br-{info['Id'][:12]}"


def forward_rules(open_bridge: str, up_bridge: str) -> list[list[str]]:
    """Open bridge → upstream bridge, and the answers back, before Docker's isolation."""
    tail = ["-m", "comment", "--comment", RULE_COMMENT, "-j", "ACCEPT"]
    return [
        ["DOCKER-USER", "-i", open_bridge, "-o", up_bridge, *tail],
        ["DOCKER-USER", "-i", up_bridge, "-o", open_bridge, "-m", "conntrack", "--ctstate",
         "ESTABLISHED,RELATED", *tail],
    ]


def summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), percentile(samples, 95)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the per-request paths")
    parser.add_argument("--n", type=int, default=200, help="requests per path and round")
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--runtime", default="", help="Docker runtime of the sandboxes (runsc)")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()

    tag = secrets.token_hex(4)
    work = pathlib.Path(tempfile.mkdtemp(prefix="egress-bench."))
    net, up_net, upstream = f"egb-{tag}", f"egb-up-{tag}", f"egb-upstream-{tag}"
    value = "sk-bench-" + secrets.token_hex(16)
    server = None
    rules: list[list[str]] = []
    samples: dict[str, list[float]] = {}
    checks: dict[str, dict] = {}
    try:
        certificates(work)
        sh("docker", "network", "create", "--label", "io.agent-sandbox.bench=egress", up_net)
        sh("docker", "run", "-d", "--name", upstream, "--label", "io.agent-sandbox.bench=egress",
           "--network", up_net, "-e", f"BENCH_VALUE={value}", "-v", f"{work}:/certs:ro", IMAGE,
           "python3", "-c", UPSTREAM)
        up_ip = json.loads(sh("docker", "inspect", upstream))[0]["NetworkSettings"]["Networks"][
            up_net]["IPAddress"]
        subnet = network(up_net)["IPAM"]["Config"][0]["Subnet"]
        (work / "hosts").write_text(f"{up_ip} {OPEN_HOST} {SECRET_HOST}\n")
        settings = {
            "AGENT_SANDBOX_NETWORK_NAME": net,
            "AGENT_SANDBOX_EGRESS_HOSTS": str(work / "hosts"),
            "AGENT_SANDBOX_EGRESS_EXTRA_CA": str(work / "ca.pem"),
            "AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW": subnet,
        }
        if args.runtime:
            settings["AGENT_SANDBOX_DOCKER_RUNTIME"] = args.runtime
        log(f"egress: upstream {up_ip} on {up_net}; starting the server")
        server = Throwaway(args.binary, IMAGE, "egress", f"egb-{tag}", settings)
        api = Api(server)
        api.call("POST", f"{API}/secrets", {
            "apiVersion": API_VERSION, "kind": "Secret", "metadata": {"name": "bench-key"},
            "spec": {"hosts": [SECRET_HOST], "header": "Authorization",
                     "format": "Bearer {value}"},
            "value": value})
        policed, open_ = f"egb-policed-{tag}", f"egb-open-{tag}"
        api.sandbox(policed, {"network": True, "memoryMB": 1024,
                              "egress": {"allow": [OPEN_HOST, SECRET_HOST]},
                              "secrets": [{"env": "BENCH_KEY", "secret": "bench-key"}]})
        api.sandbox(open_, {"network": True, "memoryMB": 1024})
        for rule in forward_rules(bridge_of(net), bridge_of(up_net)):
            sh("iptables", "-w", "-I", *rule)
            rules.append(rule)
        env = {"UP_IP": up_ip, "UP_CA": (work / "ca.pem").read_text()}
        # The upstream listens once its big file is written: wait for it from the open sandbox.
        deadline = time.monotonic() + 120
        while True:
            try:
                api.run(open_, env, "http", "open", "1", OPEN_HOST)
                break
            except RuntimeError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the upstream does not answer the open sandbox: {error}")
                time.sleep(1)

        http_paths = [("open", open_), ("proxy", policed), ("transparent", policed)]
        tls_paths = [(f"tls {p} {h}", s, p, h) for p, s in (("proxy", policed),
                                                            ("transparent", policed))
                     for h in (OPEN_HOST, SECRET_HOST)]
        tls_paths.append(("tls open " + OPEN_HOST, open_, "open", OPEN_HOST))
        for r in range(args.rounds):
            log(f"egress: round {r + 1} of {args.rounds}")
            steps = [(f"http {p}", s, "http", p, OPEN_HOST) for p, s in http_paths]
            steps += [(op, s, "tls", p, h) for op, s, p, h in tls_paths]
            shift = r % len(steps)
            for op, sandbox, kind, path, host in steps[shift:] + steps[:shift]:
                out = api.run(sandbox, env, kind, path, str(args.n), host)
                samples.setdefault(op, []).extend(out["ms"])
                if kind == "tls":
                    seen = checks.setdefault(op, {"issuers": set(), "valueSeen": set()})
                    seen["issuers"].update(out["issuers"])
                    seen["valueSeen"].update(out["valueSeen"])
        big = [(f"{kind} {path}", sandbox, kind, path)
               for kind, _ in DOWNLOADS
               for path, sandbox in (("open", open_), ("proxy", policed),
                                     ("transparent", policed))]
        for r in range(args.big_rounds):
            log(f"egress: {BIG_MIB} MiB round {r + 1} of {args.big_rounds}")
            shift = r % len(big)
            for op, sandbox, kind, path in big[shift:] + big[:shift]:
                out = api.run(sandbox, env, kind, path, "1", OPEN_HOST)
                if out["bytes"] != BIG_MIB << 20:
                    raise RuntimeError(f"{op}: {out['bytes']} bytes")
                samples.setdefault(op, []).append((BIG_MIB << 20) / 1e6 / out["seconds"])
    finally:
        for rule in rules:
            sh("iptables", "-w", "-D", *rule, check=False)
        if server is not None:
            server.close()
        sh("docker", "rm", "-f", "-v", upstream, check=False)
        for name in (up_net, net, f"{net}-egress"):
            sh("docker", "network", "rm", name, check=False)
        subprocess.run(["rm", "-rf", str(work)])

    report(samples, checks, args)
    if args.json:
        args.json.write_text(json.dumps({
            "samples": samples,
            "checks": {k: {c: sorted(v) for c, v in d.items()} for k, d in checks.items()},
        }, indent=2) + "\n")
    return 0


def report(samples: dict, checks: dict, args) -> None:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load}, "
          f"runtime {args.runtime or 'runc'}; {args.rounds} rounds × {args.n} requests per path, "
          f"{args.big_rounds} downloads per path\n")
    print("| path | p50 ms | p95 ms | n | checks |\n|---|---|---|---|---|")
    for op, values in samples.items():
        if op.startswith("big"):
            continue
        p50, p95 = summary(values)
        seen = checks.get(op)
        note = "" if not seen else (f"issuer {', '.join(sorted(seen['issuers']))}; value seen "
                                    f"{', '.join(sorted(seen['valueSeen']))}")
        print(f"| {op} | {p50:.2f} | {p95:.2f} | {len(values)} | {note} |")
    def download(kind: str, path: str) -> float:
        """A download's median MB/s; 0 when it was not taken."""
        return statistics.median(samples.get(f"{kind} {path}") or [0])

    print(f"\n| {BIG_MIB} MiB download | MB/s median | min–max | ratio to open |\n|---|---|---|---|")
    for kind, label in DOWNLOADS:
        base = download(kind, "open")
        for path in ("open", "proxy", "transparent"):
            values = samples.get(f"{kind} {path}", [])
            if values:
                med = download(kind, path)
                ratio = f"{med / base:.2f}" if base else "–"
                print(f"| {label} {path} | {med:.0f} | {min(values):.0f}–{max(values):.0f} "
                      f"| {ratio} |")
    print("\nTargets:")
    open_p50 = statistics.median(samples["http open"])
    for path in ("proxy", "transparent"):
        added = statistics.median(samples[f"http {path}"]) - open_p50
        print(f"- HTTP request, {path}: {added:+.2f} ms at p50 over open (≤ 1 ms: "
              f"{'met' if added <= 1 else 'not met'})")
        for kind, label in DOWNLOADS:
            base, med = download(kind, "open"), download(kind, path)
            if base:
                print(f"- {BIG_MIB} MiB over {label}, {path}: {med / base:.0%} of open (≥ 70 %: "
                      f"{'met' if med / base >= 0.7 else 'not met'})")
        added = (statistics.median(samples[f"tls {path} {SECRET_HOST}"])
                 - statistics.median(samples[f"tls {path} {OPEN_HOST}"]))
        print(f"- new TLS connection, {path}: intercepted {added:+.2f} ms over tunnelled at p50 "
              f"(≤ 3 ms: {'met' if added <= 3 else 'not met'})")


if __name__ == "__main__":
    sys.exit(main())
