"""E2B's published Python SDK, unmodified, against this server (see tests/e2b/run.sh).

Only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point the SDK here. Every test checks what the
SDK returns against what the sandbox really did (a command's output and exit code, a file read
back, a network interface that is there or not)."""

import json
import os
import time
import urllib.error
import urllib.request
import uuid

import pytest

from e2b import (
    AuthenticationException,
    CommandExitException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
)

SERVER = os.environ["E2B_TEST_SERVER"]
KEY = os.environ["E2B_API_KEY"]
RUN = uuid.uuid4().hex[:8]


def resource(sandbox_id):
    """The sandbox as the resource API shows it (None when it is gone)."""
    request = urllib.request.Request(
        f"{SERVER}/apis/agent-sandbox.io/v1/sandboxes/{sandbox_id}",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(timeout=600, metadata={"suite": RUN}, envs={"FROM_CREATE": "yes"})
    yield sandbox
    sandbox.kill()


def test_a_created_sandbox_is_a_sandbox_resource(sbx):
    doc = resource(sbx.sandbox_id)
    assert doc is not None
    assert doc["kind"] == "Sandbox"
    assert doc["status"]["phase"] == "Running"
    assert json.loads(doc["metadata"]["annotations"]["e2b.dev/metadata"]) == {"suite": RUN}
    assert doc["spec"]["env"]["FROM_CREATE"] == "yes"
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata == {"suite": RUN}
    assert info.template_id == "base"
    assert sbx.is_running()


def test_run_streams_stdout_and_stderr_to_callbacks(sbx):
    out, err = [], []
    result = sbx.commands.run(
        "echo hello; echo oops >&2; echo $FROM_CREATE $FOO; pwd",
        envs={"FOO": "bar"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "hello\nyes bar\n/workspace\n"
    assert result.stderr == "oops\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == "oops\n"


def test_exit_codes_are_truthful(sbx):
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"


def test_cwd_under_the_e2b_home_is_the_workspace(sbx):
    sbx.commands.run("mkdir -p /workspace/sub")
    assert sbx.commands.run("pwd", cwd="/home/user/sub").stdout == "/workspace/sub\n"


def test_background_command_wait_list_and_kill(sbx):
    quick = sbx.commands.run("sleep 0.3; echo done", background=True)
    assert quick.wait().stdout == "done\n"
    slow = sbx.commands.run("sleep 120", background=True)
    assert slow.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(slow.pid) is True
    with pytest.raises(CommandExitException) as killed:
        slow.wait()
    assert killed.value.exit_code == -1
    assert slow.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(999999) is False


def test_stdin_reaches_the_command(sbx):
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "line one\n")
    sbx.commands.send_stdin(cat.pid, b"line two\n")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "line one\nline two\n"


def test_a_second_connection_follows_a_running_command(sbx):
    handle = sbx.commands.run("sleep 1; echo first; sleep 1; echo second", background=True)
    other = Sandbox.connect(sbx.sandbox_id)
    followed = other.commands.connect(handle.pid)
    result = followed.wait()
    assert "second\n" in result.stdout
    assert handle.wait().stdout == "first\nsecond\n"


def test_root_is_refused_not_downgraded(sbx):
    with pytest.raises(SandboxException) as refused:
        sbx.commands.run("id -u", user="root")
    assert "root is never granted" in str(refused.value)
    assert sbx.commands.run("id -u", user="user").stdout.strip() != "0"


def test_pty_runs_a_shell_and_resizes(sbx):
    chunks = []
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit 7\n")
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=lambda data: chunks.append(bytes(data)))
    assert ended.value.exit_code == 7
    assert b"40 100" in b"".join(chunks)


def test_files_text_and_binary(sbx):
    info = sbx.files.write("notes/hello.txt", "hello world\n")
    assert info.path == "/workspace/notes/hello.txt"
    assert sbx.files.read("notes/hello.txt") == "hello world\n"
    assert sbx.files.read("/home/user/notes/hello.txt") == "hello world\n"
    assert sbx.commands.run("cat /workspace/notes/hello.txt").stdout == "hello world\n"
    blob = os.urandom(10 * 1024 * 1024)
    sbx.files.write("/home/user/blob.bin", blob)
    assert bytes(sbx.files.read("blob.bin", format="bytes")) == blob
    sums = sbx.commands.run("sha256sum /workspace/blob.bin").stdout.split()[0]
    import hashlib

    assert sums == hashlib.sha256(blob).hexdigest()


def test_files_list_exists_rename_remove_make_dir(sbx):
    assert sbx.files.make_dir("tree/inner") is True
    assert sbx.files.make_dir("tree/inner") is False
    sbx.files.write("tree/a.txt", "a")
    sbx.files.write("tree/inner/b.txt", "bb")
    names = sorted(e.name for e in sbx.files.list("tree"))
    assert names == ["a.txt", "inner"]
    deep = sorted(e.path for e in sbx.files.list("tree", depth=2))
    assert deep == ["/workspace/tree/a.txt", "/workspace/tree/inner", "/workspace/tree/inner/b.txt"]
    assert sbx.files.exists("tree/a.txt") is True
    assert sbx.files.exists("tree/missing") is False
    info = sbx.files.get_info("tree/inner/b.txt")
    assert info.size == 2 and info.type.value == "file"
    moved = sbx.files.rename("tree/a.txt", "tree/c.txt")
    assert moved.path == "/workspace/tree/c.txt"
    assert sbx.files.exists("tree/a.txt") is False
    assert sbx.files.read("tree/c.txt") == "a"
    sbx.files.remove("tree/inner")
    assert sbx.files.exists("tree/inner") is False
    assert sorted(e.name for e in sbx.files.list("tree")) == ["c.txt"]


def test_writing_several_files_at_once(sbx):
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = sbx.files.write_files(
        [WriteEntry(path="multi/one.txt", data="1"), WriteEntry(path="multi/two.bin", data=b"\x00\x02")]
    )
    assert sorted(w.path for w in written) == ["/workspace/multi/one.txt", "/workspace/multi/two.bin"]
    assert sbx.files.read("multi/one.txt") == "1"
    assert bytes(sbx.files.read("multi/two.bin", format="bytes")) == b"\x00\x02"


def test_unsupported_calls_say_so(sbx):
    with pytest.raises(SandboxException) as watch:
        sbx.files.watch_dir("/workspace")
    assert "not supported" in str(watch.value)
    with pytest.raises(SandboxException) as fork:
        sbx.fork()
    assert "not supported" in str(fork.value)


def test_pause_then_connect_keeps_processes_and_files():
    paused = Sandbox.create(timeout=300)
    try:
        paused.files.write("kept.txt", "still here")
        counter = paused.commands.run(
            "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done",
            background=True,
        )
        time.sleep(1)
        assert paused.pause() is True
        assert paused.get_info().state.value == "paused"
        assert resource(paused.sandbox_id)["status"]["phase"] == "Paused"
        assert paused.pause() is False
        resumed = Sandbox.connect(paused.sandbox_id)
        assert resumed.get_info().state.value == "running"
        assert resumed.files.read("kept.txt") == "still here"
        assert counter.pid in [p.pid for p in resumed.commands.list()]
        first = int(resumed.commands.run("cat /tmp/count").stdout)
        time.sleep(1)
        assert int(resumed.commands.run("cat /tmp/count").stdout) > first
    finally:
        paused.kill()


def test_envd_calls_need_the_access_token(sbx):
    request = urllib.request.Request(
        f"{SERVER}/e2b/envd/filesystem.Filesystem/Stat",
        data=b'{"path": "/workspace"}',
        headers={
            "Content-Type": "application/json",
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "X-Access-Token": "forged",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(request, timeout=10)
    assert denied.value.code == 401
    assert json.load(denied.value)["code"] == "unauthenticated"


def test_list_filters_by_metadata_and_set_timeout_moves_the_end():
    tag = f"{RUN}-list"
    first = Sandbox.create(timeout=300, metadata={"group": tag, "which": "a b&c"})
    second = Sandbox.create(timeout=300, metadata={"group": tag, "which": "other"})
    try:
        both = Sandbox.list(query=SandboxQuery(metadata={"group": tag})).next_items()
        assert sorted(s.sandbox_id for s in both) == sorted([first.sandbox_id, second.sandbox_id])
        one = Sandbox.list(query=SandboxQuery(metadata={"group": tag, "which": "a b&c"})).next_items()
        assert [s.sandbox_id for s in one] == [first.sandbox_id]
        # One at a time: the paginator follows the server's next token to the end.
        pages = Sandbox.list(query=SandboxQuery(metadata={"group": tag}), limit=1)
        page_one = pages.next_items()
        assert len(page_one) == 1 and pages.has_next
        page_two = pages.next_items()
        assert len(page_two) == 1 and not pages.has_next
        assert sorted(s.sandbox_id for s in page_one + page_two) == sorted(s.sandbox_id for s in both)
        before = first.get_info().end_at
        first.set_timeout(3000)
        after = first.get_info().end_at
        assert (after - before).total_seconds() > 2000
    finally:
        assert second.kill() is True
        first.kill()
    assert resource(second.sandbox_id) is None
    assert Sandbox.list(query=SandboxQuery(metadata={"group": tag})).next_items() == []
    assert Sandbox.kill(second.sandbox_id) is False


def test_a_sandbox_expires_at_its_timeout():
    short = Sandbox.create(timeout=2)
    short.commands.run("true")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and short.is_running():
        time.sleep(0.5)
    assert not short.is_running()


# The network interfaces a sandbox has (if_nameindex works under runc and gVisor alike).
INTERFACES = "python3 -c 'import socket; print(*sorted(n for _, n in socket.if_nameindex()))'"


def test_allow_internet_access_false_means_no_network(sbx):
    assert "eth0" in sbx.commands.run(INTERFACES).stdout.split()
    offline = Sandbox.create(timeout=120, allow_internet_access=False)
    try:
        assert offline.commands.run(INTERFACES).stdout.split() == ["lo"]
        assert resource(offline.sandbox_id)["spec"]["network"] is False
    finally:
        offline.kill()


def test_unknown_template_is_a_clear_error():
    with pytest.raises(SandboxException) as missing:
        Sandbox.create("no-such-template")
    assert "no-such-template" in str(missing.value)
    assert "not found" in str(missing.value)


def test_a_wrong_key_is_refused():
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="wrong").next_items()


def test_a_template_id_names_a_sandbox_template():
    name = f"e2b-tmpl-{RUN}"
    body = json.dumps(
        {
            "apiVersion": "agent-sandbox.io/v1",
            "kind": "SandboxTemplate",
            "metadata": {"name": name},
            "spec": {
                "image": "agent-sandbox-test/python:latest",
                "env": {"FROM_TEMPLATE": "t", "SHARED": "template"},
            },
        }
    ).encode()
    request = urllib.request.Request(
        f"{SERVER}/apis/agent-sandbox.io/v1/sandboxtemplates",
        data=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status in (200, 201)
    made = Sandbox.create(name, timeout=120, envs={"SHARED": "create"})
    try:
        assert made.get_info().template_id == name
        assert resource(made.sandbox_id)["spec"]["template"] == name
        assert made.commands.run("echo $FROM_TEMPLATE $SHARED").stdout == "t create\n"
    finally:
        made.kill()


def test_the_binary_protobuf_encoding_is_served_too(sbx):
    """The SDK sends JSON; connectrpc's own default codec, binary protobuf, is served as well."""
    from protobuf import Oneof

    from e2b.envd.filesystem import filesystem_pb
    from e2b.envd.filesystem.filesystem_connect import FilesystemClientSync
    from e2b.envd.process import process_pb
    from e2b.envd.process.process_connect import ProcessClientSync

    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
    base = os.environ["E2B_SANDBOX_URL"]
    plain = {"send_compression": None, "accept_compression": ()}
    process = ProcessClientSync(base, **plain)
    events = list(
        process.start(
            process_pb.StartRequest(
                process=process_pb.ProcessConfig(
                    cmd="/bin/sh", args=["-c", "echo proto; echo err >&2; exit 4"], envs={"X": "1"}
                ),
                stdin=False,
            ),
            headers=headers,
        )
    )
    kinds = [e.event.event.field for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert events[0].event.event.value.pid > 0
    output = {}
    for e in events:
        match e.event.event:
            case Oneof(field="data", value=data):
                output.setdefault(data.output.field, b"")
                output[data.output.field] += data.output.value
    assert output == {"stdout": b"proto\n", "stderr": b"err\n"}
    end = events[-1].event.event.value
    assert (end.exit_code, end.exited) == (4, True)

    files = FilesystemClientSync(base, **plain)
    sbx.files.write("proto/x.txt", "12345")
    entry = files.stat(filesystem_pb.StatRequest(path="proto/x.txt"), headers=headers).entry
    assert (entry.name, entry.path, entry.size) == ("x.txt", "/workspace/proto/x.txt", 5)
    assert entry.type == filesystem_pb.FileType.FILE
    listed = files.list_dir(filesystem_pb.ListDirRequest(path="/workspace/proto", depth=1), headers=headers)
    assert [e.name for e in listed.entries] == ["x.txt"]


def test_a_repeated_create_with_the_same_idempotency_key_is_the_same_sandbox():
    key = f"job-{RUN}"
    first = Sandbox.create(timeout=120, idempotency_key=key)
    try:
        again = Sandbox.create(timeout=120, idempotency_key=key)
        assert again.sandbox_id == first.sandbox_id
        assert again.commands.run("echo same").stdout == "same\n"
        other = Sandbox.create(timeout=120, idempotency_key=f"{key}-other")
        assert other.sandbox_id != first.sandbox_id
        other.kill()
    finally:
        first.kill()


def test_signed_urls_download_and_upload(sbx):
    sbx.files.write("signed/in.txt", "signed read")
    url = sbx.download_url("signed/in.txt")
    assert url.startswith(SERVER + "/files?")
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"signed read"
    tampered = url.replace("in.txt", "other.txt")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(tampered, timeout=10)
    assert denied.value.code == 401
    boundary = "e2bsuiteboundary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"out.txt\"\r\n"
        f"Content-Type: application/octet-stream\r\n\r\nuploaded\r\n--{boundary}--\r\n"
    ).encode()
    upload = urllib.request.Request(
        sbx.upload_url("signed/out.txt"),
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(upload, timeout=10) as r:
        assert json.load(r)[0]["path"] == "/workspace/signed/out.txt"
    assert sbx.files.read("signed/out.txt") == "uploaded"
    # A read signature does not allow a write, and an expired one nothing.
    wrong_op = urllib.request.Request(
        url, data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(wrong_op, timeout=10)
    assert refused.value.code == 401
    short = sbx.download_url("signed/in.txt", use_signature_expiration=1)
    time.sleep(2.1)
    with pytest.raises(urllib.error.HTTPError) as expired:
        urllib.request.urlopen(short, timeout=10)
    assert expired.value.code == 401


def test_get_metrics_reports_the_sampled_cpu_and_memory(sbx):
    """The server samples every running sandbox every 15 s; two samples make one metric."""
    deadline = time.monotonic() + 60
    metrics = sbx.get_metrics()
    while not metrics and time.monotonic() < deadline:
        time.sleep(2)
        metrics = sbx.get_metrics()
    assert metrics, "no metrics within 60 s"
    last = metrics[-1]
    assert last.mem_used > 0
    assert last.cpu_count >= 1
    assert last.cpu_used_pct >= 0
