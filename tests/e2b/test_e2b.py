"""E2B's published Python SDK, unmodified, against this server (see tests/e2b/run.sh).

Only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point the SDK here. Every test checks what the
SDK returns against what the sandbox really did (a command's output and exit code, a file read
back, a network interface that is there or not)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
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
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

SERVER = os.environ["E2B_TEST_SERVER"]
KEY = os.environ["E2B_API_KEY"]
RUN = uuid.uuid4().hex[:8]

# A loop counting five times a second into /tmp/count. Each count is written aside and renamed
# into place, so a read just after a resume never meets the file truncated and not yet written.
COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.next; "
    "mv -f /tmp/count.next /tmp/count; sleep 0.2; done"
)


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


def listed(sandbox, pid):
    return pid in [p.pid for p in sandbox.commands.list()]


def test_a_command_timeout_ends_the_call_and_kills_the_command(sbx):
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("echo $$ > /tmp/timed.pid; sleep 60; echo never", timeout=2)
    assert time.monotonic() - started < 20
    pid = int(sbx.commands.run("cat /tmp/timed.pid").stdout)
    # The server killed it too (a deadline the client alone kept would leave it running).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and listed(sbx, pid):
        time.sleep(0.2)
    assert not listed(sbx, pid)
    # A connection's deadline ends only that connection: the command it follows runs on.
    slow = sbx.commands.run("sleep 60", background=True)
    with pytest.raises(TimeoutException):
        sbx.commands.connect(slow.pid, timeout=1).wait()
    assert listed(sbx, slow.pid)
    assert sbx.commands.kill(slow.pid) is True


def test_a_command_whose_sandbox_is_killed_says_the_sandbox_is_gone():
    doomed = Sandbox.create(timeout=120)
    handle = doomed.commands.run("sleep 100", background=True)
    Sandbox.kill(doomed.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        handle.wait()
    assert not doomed.is_running()


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
    sbx.files.remove("tree/inner")  # as envd: removing what is not there succeeds
    # A symlink is stated as what it leads to, with its target's absolute path.
    sbx.commands.run("ln -s c.txt tree/link")
    link = sbx.files.get_info("tree/link")
    assert link.type.value == "file"
    assert link.symlink_target == "/workspace/tree/c.txt"
    sbx.files.remove("tree/link")
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
    request = urllib.request.Request(
        f"{SERVER}/e2b/envd/process.Process/StreamInput",
        data=b"{}",
        headers={
            "Content-Type": "application/json",
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "X-Access-Token": sbx._envd_access_token,
        },
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 501
    body = json.load(refused.value)
    assert body["code"] == "unimplemented" and "not supported" in body["message"]


def inotify_watches(sbx):
    """How many inotify instances the sandbox's processes hold: the directory watches of its
    supervisor (nothing else in the test image uses inotify)."""
    out = sbx.commands.run("ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c inotify; true").stdout
    return int(out.split()[0])


def wait_for_events(handle, want, seconds=15):
    """Events of a polled watcher, asked for until every (type, name) in `want` came."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += [(e.type.value, e.name) for e in handle.get_new_events()]
        if all(w in got for w in want):
            return got
        time.sleep(0.1)
    raise AssertionError(f"missing {[w for w in want if w not in got]} in {got}")


def test_watch_dir_reports_create_write_chmod_rename_remove(sbx):
    from e2b.envd.filesystem import filesystem_pb
    from e2b.envd.filesystem.filesystem_connect import FilesystemClientSync

    before = inotify_watches(sbx)
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    assert inotify_watches(sbx) == before + 1
    sbx.commands.run(
        "cd /workspace/watched && echo a > a.txt && chmod 600 a.txt && mv a.txt b.txt && rm b.txt"
        " && mkdir sub && echo x > sub/not-seen"
    )
    sbx.files.write("watched/through-files.txt", "hello")
    story = [
        ("create", "a.txt"),
        ("write", "a.txt"),
        ("chmod", "a.txt"),
        ("rename", "a.txt"),
        ("create", "b.txt"),
        ("remove", "b.txt"),
    ]
    got = wait_for_events(handle, story + [("create", "sub"), ("create", "through-files.txt")])
    # One file's story in the order it happened.
    assert [e for e in got if e in story] == story
    # Not recursive: nothing from inside `sub`.
    assert not [e for e in got if e[1].startswith("sub/")]
    watcher_id = handle._watcher_id
    handle.stop()
    assert inotify_watches(sbx) == before
    with pytest.raises(SandboxException):
        handle.get_new_events()
    # The server removed it too (not only the SDK's handle): asking for it is a clear error.
    files = FilesystemClientSync(
        os.environ["E2B_SANDBOX_URL"], send_compression=None, accept_compression=()
    )
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
    from connectrpc.errors import ConnectError

    with pytest.raises(ConnectError) as gone:
        files.get_watcher_events(
            filesystem_pb.GetWatcherEventsRequest(watcher_id=watcher_id), headers=headers
        )
    assert "not found" in str(gone.value)


def test_a_file_written_through_the_sdk_is_seen_as_envd_writes_it(sbx):
    sbx.files.make_dir("inplace")
    handle = sbx.files.watch_dir("inplace")
    sbx.files.write("inplace/new.txt", "first")
    # Exactly envd's story: the file itself created, its mode set, then written (no temporary
    # file renamed into place).
    got = wait_for_events(handle, [("write", "new.txt")])
    assert got == [("create", "new.txt"), ("chmod", "new.txt"), ("write", "new.txt")]
    sbx.files.write("inplace/new.txt", "second, longer")
    got = wait_for_events(handle, [("chmod", "new.txt")])
    assert all(name == "new.txt" for _, name in got)
    assert sbx.files.read("inplace/new.txt") == "second, longer"
    assert sbx.commands.run("stat -c %a /workspace/inplace/new.txt").stdout == "644\n"
    handle.stop()
    # A link at the target is replaced by the file, not followed; a FIFO is refused at once
    # rather than waited on.
    sbx.commands.run("ln -s /tmp/outside /workspace/inplace/link && mkfifo /workspace/inplace/pipe")
    sbx.files.write("inplace/link", "in the workspace")
    assert sbx.commands.run("test -L /workspace/inplace/link; echo $?").stdout == "1\n"
    assert sbx.commands.run("test -e /tmp/outside; echo $?").stdout == "1\n"
    assert sbx.files.read("inplace/link") == "in the workspace"
    started = time.monotonic()
    with pytest.raises(SandboxException):
        sbx.files.write("inplace/pipe", "never read")
    assert time.monotonic() - started < 10


def test_watch_dir_recursive_anywhere_in_the_sandbox(sbx):
    sbx.commands.run("mkdir -p /tmp/rtree")
    deep = sbx.files.watch_dir("/tmp/rtree", recursive=True)
    shallow = sbx.files.watch_dir("/tmp/rtree")
    sbx.commands.run(
        "mkdir -p /tmp/rtree/a/b && echo deep > /tmp/rtree/a/b/deep.txt && sleep 0.2"
        " && echo more >> /tmp/rtree/a/b/deep.txt && rm -r /tmp/rtree/a"
    )
    got = wait_for_events(
        deep,
        [
            ("create", "a"),
            ("create", "a/b/deep.txt"),
            ("write", "a/b/deep.txt"),
            ("remove", "a/b/deep.txt"),
            ("remove", "a/b"),
            ("remove", "a"),
        ],
    )
    assert got.index(("create", "a/b/deep.txt")) < got.index(("remove", "a/b/deep.txt"))
    top = wait_for_events(shallow, [("create", "a"), ("remove", "a")])
    assert all("/" not in name for _, name in top)
    deep.stop()
    shallow.stop()


def test_watch_dir_on_a_missing_path_or_a_file_is_a_clear_error(sbx):
    from e2b import InvalidArgumentException, NotFoundException

    with pytest.raises(NotFoundException) as missing:
        sbx.files.watch_dir("no/such/dir")
    assert "/workspace/no/such/dir not found" in str(missing.value)
    sbx.files.write("plain.txt", "x")
    with pytest.raises(InvalidArgumentException) as not_dir:
        sbx.files.watch_dir("plain.txt")
    assert "not a directory" in str(not_dir.value)


def test_async_watch_dir_streams_events_and_stops(sbx):
    """The async SDK watches over the WatchDir stream; stopping it removes the watch."""
    import asyncio

    from e2b import AsyncSandbox

    before = inotify_watches(sbx)

    async def main():
        asbx = await AsyncSandbox.connect(sbx.sandbox_id)
        await asbx.files.make_dir("streamed")
        events, exits = [], []
        handle = await asbx.files.watch_dir(
            "streamed", on_event=events.append, on_exit=exits.append, recursive=True
        )
        await asbx.commands.run(
            "cd /workspace/streamed && mkdir d && echo 1 > d/f && mv d/f d/g && rm d/g"
        )
        want = [("create", "d"), ("create", "d/f"), ("rename", "d/f"), ("create", "d/g"),
                ("remove", "d/g")]
        for _ in range(150):
            if all(w in [(e.type.value, e.name) for e in events] for w in want):
                break
            await asyncio.sleep(0.1)
        during = await asyncio.to_thread(inotify_watches, sbx)
        await handle.stop()
        return [(e.type.value, e.name) for e in events], exits, during, want

    got, exits, during, want = asyncio.run(main())
    assert all(w in got for w in want), got
    assert during == before + 1
    assert exits == [None]
    # The server noticed the client went and removed the watch.
    deadline = time.monotonic() + 10
    while inotify_watches(sbx) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert inotify_watches(sbx) == before


def api(method, path, body=None):
    """A call to this server's own API: (status, parsed body or None)."""
    request = urllib.request.Request(
        f"{SERVER}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {KEY}",
            "X-API-Key": KEY,
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_fork_starts_new_sandboxes_from_one_snapshot_of_the_source():
    source = Sandbox.create(timeout=300, metadata={"forked": RUN})
    forks = []
    try:
        source.files.write("state.txt", "before")
        end = source.get_info().end_at
        results = source.fork(count=2, timeout=120)
        forks = [f for f in results if isinstance(f, Sandbox)]
        assert len(forks) == 2, results
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 2 and source.sandbox_id not in ids
        snapshots = set()
        for f in forks:
            assert f.files.read("state.txt") == "before"
            assert f.commands.run("cat state.txt").stdout == "before"
            assert f.get_info().metadata == {"forked": RUN}
            doc = resource(f.sandbox_id)
            assert doc["status"]["phase"] == "Running"
            snapshots.add(doc["spec"]["source"]["snapshot"])
        # One snapshot for all forks, a Snapshot resource of the source like any other.
        assert len(snapshots) == 1
        (snapshot,) = snapshots
        status, doc = api("GET", f"/apis/agent-sandbox.io/v1/snapshots/{snapshot}")
        assert status == 200 and doc["spec"]["sandbox"] == source.sandbox_id
        # Each fork is its own sandbox; the source runs on with its end untouched.
        forks[0].files.write("state.txt", "fork zero")
        assert forks[1].files.read("state.txt") == "before"
        assert source.files.read("state.txt") == "before"
        assert source.is_running()
        assert source.get_info().end_at == end
        # The server checks the count itself too (the SDK checks it before sending).
        status, body = api(
            "POST", f"/e2b/sandboxes/{source.sandbox_id}/fork", {"count": 21}
        )
        assert status == 400 and "count" in body["message"], body
        with pytest.raises(SandboxException):
            Sandbox.fork(f"sb_missing{RUN}")
    finally:
        for f in forks:
            f.kill()
        source.kill()


def test_snapshots_are_taken_listed_used_and_deleted():
    source = Sandbox.create(timeout=300)
    made = None
    name = f"e2b-snap-{RUN}"
    try:
        source.files.write("snap.txt", "one")
        info = source.create_snapshot(name=name)
        assert info.snapshot_id.startswith("snap_")
        assert info.names == [name]
        status, doc = api("GET", f"/apis/agent-sandbox.io/v1/snapshots/{info.snapshot_id}")
        assert status == 200
        assert doc["spec"]["sandbox"] == source.sandbox_id
        assert doc["status"]["phase"] == "Ready"
        source.files.write("snap.txt", "two")
        assert info.snapshot_id in [s.snapshot_id for s in source.list_snapshots().next_items()]
        by_name = Sandbox.list_snapshots(name=name).next_items()
        assert [s.snapshot_id for s in by_name] == [info.snapshot_id]
        assert Sandbox.list_snapshots(name=f"none-{RUN}").next_items() == []
        other = Sandbox.list_snapshots(sandbox_id=f"sb_other{RUN}").next_items()
        assert other == []
        # A snapshot's ID is a template to create from: the new sandbox has its files.
        made = Sandbox.create(info.snapshot_id, timeout=120)
        assert made.files.read("snap.txt") == "one"
        assert resource(made.sandbox_id)["spec"]["source"]["snapshot"] == info.snapshot_id
        assert made.get_info().template_id == info.snapshot_id
        made.kill()
        made = None
        assert source.files.read("snap.txt") == "two"
        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Sandbox.delete_snapshot(info.snapshot_id) is False
        status, _ = api("GET", f"/apis/agent-sandbox.io/v1/snapshots/{info.snapshot_id}")
        assert status == 404
        with pytest.raises(Exception) as gone:
            Sandbox.create(info.snapshot_id, timeout=60)
        assert "not found" in str(gone.value)
    finally:
        if made is not None:
            made.kill()
        source.kill()


def test_pause_then_connect_keeps_processes_and_files():
    paused = Sandbox.create(timeout=300)
    try:
        paused.files.write("kept.txt", "still here")
        counter = paused.commands.run(
            COUNTER,
            background=True,
        )
        time.sleep(1)
        assert paused.pause() is True
        assert paused.is_running() is False  # envd's /health answers 502, as E2B's proxy does
        assert paused.get_info().state.value == "paused"
        assert resource(paused.sandbox_id)["status"]["phase"] == "Paused"
        assert paused.pause() is False
        resumed = Sandbox.connect(paused.sandbox_id)
        assert resumed.get_info().state.value == "running"
        assert resumed.is_running() is True
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
        # Newest first unless asked otherwise; by start time; by template.
        query = SandboxQuery(metadata={"group": tag})
        assert [s.sandbox_id for s in both] == [second.sandbox_id, first.sandbox_id]
        oldest = Sandbox.list(query=query, order="asc").next_items()
        assert [s.sandbox_id for s in oldest] == [first.sandbox_id, second.sandbox_id]
        started = second.get_info().started_at
        later = Sandbox.list(query=SandboxQuery(metadata={"group": tag}, started_after=started))
        assert [s.sandbox_id for s in later.next_items()] == [second.sandbox_id]
        base = Sandbox.list(query=SandboxQuery(metadata={"group": tag}, template="base"))
        assert len(base.next_items()) == 2
        other = Sandbox.list(query=SandboxQuery(metadata={"group": tag}, template="nope"))
        assert other.next_items() == []
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


PROXIED_GET = """python3 - <<'EOF'
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://%s/", timeout=10)
    print("reached")
except urllib.error.HTTPError as e:
    print(e.code)
EOF"""


def test_network_allow_lists_become_the_egress_policy():
    limited = Sandbox.create(
        timeout=120,
        network={"allow_out": ["allowed.invalid"], "deny_out": ["0.0.0.0/0"]},
    )
    try:
        spec = resource(limited.sandbox_id)["spec"]
        assert spec["network"] is True
        assert spec["egress"]["allow"] == ["allowed.invalid"]
        # The gateway refuses what the list does not name, at once, without going anywhere.
        assert limited.commands.run(PROXIED_GET % "denied.invalid").stdout == "403\n"
        # update_network replaces the list in place: the sandbox keeps running its processes.
        sleeper = limited.commands.run("sleep 300", background=True)
        limited.update_network({"allow_out": ["denied.invalid"], "deny_out": ["0.0.0.0/0"]})
        spec = resource(limited.sandbox_id)["spec"]
        assert spec["egress"]["allow"] == ["denied.invalid"]
        assert limited.commands.run(PROXIED_GET % "allowed.invalid").stdout == "403\n"
        assert sleeper.pid in [p.pid for p in limited.commands.list()]
        # Changing to an open network would end its processes: refused, saying why.
        with pytest.raises(SandboxException) as opened:
            limited.update_network({})
        assert "allow list" in str(opened.value)
    finally:
        limited.kill()
    # Denying all traffic with nothing allowed is no network at all.
    closed = Sandbox.create(timeout=60, network={"deny_out": ["0.0.0.0/0"]})
    try:
        assert resource(closed.sandbox_id)["spec"]["network"] is False
        assert closed.commands.run(INTERFACES).stdout.split() == ["lo"]
    finally:
        closed.kill()
    # A deny list of some destinations cannot be said as an allow list: refused by name.
    with pytest.raises(SandboxException) as partial:
        Sandbox.create(timeout=60, network={"deny_out": ["1.1.1.1"]})
    assert "network.denyOut" in str(partial.value)


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
    # The key outlives its sandbox: a late retry answers the same (now gone) sandbox rather
    # than making a second one.
    late = Sandbox.create(timeout=120, idempotency_key=key)
    assert late.sandbox_id == first.sandbox_id
    assert not late.is_running()
    assert resource(first.sandbox_id) is None


def keyed_sandboxes(key):
    """The names of the sandboxes whose create carried idempotency key `key`."""
    request = urllib.request.Request(
        f"{SERVER}/apis/agent-sandbox.io/v1/sandboxes",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        items = json.load(r)["items"]
    return [i["metadata"]["name"] for i in items
            if i["metadata"].get("annotations", {}).get("e2b.dev/idempotency-key") == key]


def test_a_create_whose_client_left_before_the_answer_still_keeps_its_key():
    """A client that gives up waiting (a timeout, then a retry) must not make a second sandbox:
    the create it left goes on, and its key is kept past the sandbox it made."""
    key = f"left-{RUN}"
    body = json.dumps({"templateID": "base", "timeout": 120}).encode()
    host, port = SERVER.removeprefix("http://").split(":")
    made = []
    # The client leaves after `wait`: long enough for the request to be taken up, far shorter
    # than a create without a pool. Should the request not have been taken up yet (nothing was
    # made), it leaves later the next time.
    for wait in (0.05, 0.1, 0.2, 0.4, 0.8):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                f"POST /e2b/sandboxes HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {KEY}\r\n"
                f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(wait)
        deadline = time.time() + 5
        while not made and time.time() < deadline:
            made = keyed_sandboxes(key)
            time.sleep(0.1)
        if made:
            break
    assert len(made) == 1, made
    # A retry finds it while it lives...
    again = Sandbox.create(timeout=120, idempotency_key=key)
    assert again.sandbox_id == made[0]
    assert again.commands.run("echo here").stdout == "here\n"
    again.kill()
    # ... and once it is gone, answers it still, not a new one.
    late = Sandbox.create(timeout=120, idempotency_key=key)
    assert late.sandbox_id == made[0]
    assert not late.is_running()
    assert keyed_sandboxes(key) == []


class OwnServer:
    """A server of this test's own (E2B_TEST_BINARY) on a free port with a data directory that
    outlives its restarts, so that what must survive a restart can be checked."""

    def __init__(self, env=None):
        self.env = env or {}
        self.data = tempfile.mkdtemp(prefix="agent-sandbox-e2b-own.")
        self.key = uuid.uuid4().hex
        # The kernel's choice on the first start, read back from the ready line (a port picked
        # here could be taken by another suite's server before this one binds it); restarts keep
        # it.
        self.port = 0
        self.url = None
        self.process = None
        self.made = set()

    def params(self, key=None):
        """What points the SDK at this server instead of the suite's (with its admin key, or
        `key`). Only once started: its port is the one its first start got."""
        assert self.url, "params() of a server not started yet"
        return {
            "api_key": key or self.key,
            "api_url": f"{self.url}/e2b",
            "sandbox_url": f"{self.url}/e2b/envd",
        }

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SANDBOX_", "E2B_"))}
        env.update(
            AGENT_SANDBOX_HOST="127.0.0.1",
            AGENT_SANDBOX_PORT=str(self.port),
            AGENT_SANDBOX_DATA_DIR=os.path.join(self.data, "data"),
            AGENT_SANDBOX_API_KEYS=self.key,
            AGENT_SANDBOX_DEFAULT_IMAGE=os.environ["E2B_TEST_IMAGE"],
            AGENT_SANDBOX_ALLOWED_IMAGES="agent-sandbox-test/*",
        )
        if os.environ.get("E2B_TEST_RUNTIME"):
            env["AGENT_SANDBOX_DOCKER_RUNTIME"] = os.environ["E2B_TEST_RUNTIME"]
        env.update(self.env)
        log_path = os.path.join(self.data, "server.log")
        log_start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [os.environ["E2B_TEST_BINARY"], "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the server exited before it answered /healthz"
            if not self.port:
                with open(log_path, errors="replace") as f:
                    f.seek(log_start)
                    ready = re.search(r" ready at http://127\.0\.0\.1:(\d+)", f.read())
                if not ready:
                    time.sleep(0.05)
                    continue
                self.port = int(ready.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not answer /healthz within 120 s")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self):
        """Stops the server and removes whatever it left on the daemon, then its directory."""
        self.stop()
        for sandbox_id in self.made:
            for kind in ("ps -aq", "volume ls -q"):
                found = subprocess.run(
                    f"docker {kind} --filter label=io.agent-sandbox.id={sandbox_id}".split(),
                    capture_output=True,
                    text=True,
                ).stdout.split()
                if found:
                    remove = ["docker", "rm", "-f", "-v"] if kind.startswith("ps") else ["docker", "volume", "rm", "-f"]
                    subprocess.run(remove + found, capture_output=True)
        server_id = os.path.join(self.data, "data", "server-id")
        if os.path.exists(server_id):
            with open(server_id) as f:
                label = f"io.agent-sandbox.heartbeat={f.read().strip()}"
            volumes = subprocess.run(
                ["docker", "volume", "ls", "-q", "--filter", f"label={label}"], capture_output=True, text=True
            ).stdout.split()
            if volumes:
                subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True)
        shutil.rmtree(self.data, ignore_errors=True)


def test_an_idempotency_key_survives_a_restart_of_the_server():
    server = OwnServer()
    try:
        server.start()
        key = f"restart-{RUN}"
        first = Sandbox.create(timeout=300, idempotency_key=key, **server.params())
        server.made.add(first.sandbox_id)
        first.files.write("mark.txt", "made once")
        server.stop()
        server.start()
        again = Sandbox.create(timeout=300, idempotency_key=key, **server.params())
        server.made.add(again.sandbox_id)
        assert again.sandbox_id == first.sandbox_id
        assert again.files.read("mark.txt") == "made once"
        other = Sandbox.create(timeout=300, idempotency_key=f"{key}-other", **server.params())
        server.made.add(other.sandbox_id)
        assert other.sandbox_id != first.sandbox_id
        assert other.kill() is True
        # A key whose sandbox was deleted is kept across a restart too.
        server.stop()
        server.start()
        late = Sandbox.create(timeout=300, idempotency_key=f"{key}-other", **server.params())
        assert late.sandbox_id == other.sandbox_id
        assert not late.is_running()
        assert again.kill() is True
    finally:
        server.close()


def test_scoped_keys_act_in_their_own_namespaces():
    import hashlib

    keys = {team: uuid.uuid4().hex for team in ("team-a", "team-b")}
    data = tempfile.mkdtemp(prefix="agent-sandbox-e2b-keys.")
    keys_file = os.path.join(data, "keys.yaml")
    with open(keys_file, "w") as f:
        for team, key in keys.items():
            digest = hashlib.sha256(key.encode()).hexdigest()
            f.write(f"- name: {team}\n  sha256: {digest}\n  namespaces: [{team}]\n  role: edit\n")
    server = OwnServer(env={"AGENT_SANDBOX_KEYS_FILE": keys_file})
    try:
        server.start()
        a, b = (server.params(keys[team]) for team in ("team-a", "team-b"))
        mine = Sandbox.create(timeout=300, metadata={"who": "a"}, idempotency_key="same-key", **a)
        server.made.add(f"team-a.{mine.sandbox_id}")
        # A plain ID, in the key's namespace; commands and files reach it by its access token.
        assert "." not in mine.sandbox_id
        assert mine.commands.run("echo in a").stdout == "in a\n"
        mine.files.write("a.txt", "a's")
        assert mine.files.read("a.txt") == "a's"
        assert mine.is_running()
        request = urllib.request.Request(
            f"{server.url}/apis/agent-sandbox.io/v1/namespaces/team-a/sandboxes/{mine.sandbox_id}",
            headers={"Authorization": f"Bearer {server.key}"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.load(r)["metadata"]["namespace"] == "team-a"
        snapshot = mine.create_snapshot()
        # The other team's key cannot see, reach or guess its way to it.
        theirs = Sandbox.create(timeout=300, idempotency_key="same-key", **b)
        server.made.add(f"team-b.{theirs.sandbox_id}")
        assert theirs.sandbox_id != mine.sandbox_id
        for sandbox_id in (mine.sandbox_id, f"team-a.{mine.sandbox_id}"):
            with pytest.raises(SandboxException):
                Sandbox.connect(sandbox_id, **b)
            assert Sandbox.kill(sandbox_id, **b) is False
        assert [s.sandbox_id for s in Sandbox.list(**b).next_items()] == [theirs.sandbox_id]
        assert [s.sandbox_id for s in Sandbox.list(**a).next_items()] == [mine.sandbox_id]
        assert snapshot.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots(**b).next_items()]
        assert snapshot.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots(**a).next_items()]
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **b) is False
        # The admin key acts in the default namespace, where neither is.
        assert Sandbox.list(**server.params()).next_items() == []
        # A sandbox made from the snapshot, and forks, stay in team-a.
        again = Sandbox.create(snapshot.snapshot_id, timeout=300, **a)
        server.made.add(f"team-a.{again.sandbox_id}")
        assert again.files.read("a.txt") == "a's"
        assert Sandbox.kill(again.sandbox_id, **a) is True
        assert mine.kill() is True
        assert theirs.kill() is True
    finally:
        server.close()
        shutil.rmtree(data, ignore_errors=True)


def wait_state(sandbox, state, limit=60):
    """Waits until E2B reports the sandbox in `state`; answers its info then."""
    deadline = time.monotonic() + limit
    info = Sandbox.get_info(sandbox.sandbox_id)
    while time.monotonic() < deadline and info.state.value != state:
        time.sleep(0.5)
        info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.state.value == state, f"{sandbox.sandbox_id} is {info.state.value}, not {state}"
    return info


def test_on_timeout_pause_pauses_at_the_timeout_and_connect_resumes():
    kept = Sandbox.create(timeout=6, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        assert kept.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        doc = resource(kept.sandbox_id)
        assert (doc["spec"]["expiryAction"], doc["spec"]["autoResume"]) == ("Pause", False)
        kept.files.write("kept.txt", "still here")
        counter = kept.commands.run(COUNTER, background=True)
        wait_state(kept, "paused")
        # Paused, not killed: the resource is there, paused as its spec says, and listed so.
        doc = resource(kept.sandbox_id)
        assert doc["spec"]["state"] == "Paused"
        assert doc["status"]["phase"] == "Paused"
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert kept.sandbox_id in [s.sandbox_id for s in paused]
        # auto_resume False: a call does not wake it.
        with pytest.raises(Exception) as refused:
            kept.files.read("kept.txt")
        assert "paused" in str(refused.value)
        assert Sandbox.get_info(kept.sandbox_id).state.value == "paused"
        # connect resumes it anyway, its processes going on where they were.
        resumed = Sandbox.connect(kept.sandbox_id)
        assert resumed.get_info().state.value == "running"
        assert resumed.files.read("kept.txt") == "still here"
        assert counter.pid in [p.pid for p in resumed.commands.list()]
        first = int(resumed.commands.run("cat /tmp/count").stdout)
        time.sleep(1)
        assert int(resumed.commands.run("cat /tmp/count").stdout) > first
        # A new lifetime from the resume, as long as the first: it pauses again.
        wait_state(resumed, "paused")
        assert resource(kept.sandbox_id) is not None
    finally:
        kept.kill()


def test_auto_resume_wakes_a_sandbox_its_timeout_paused():
    kept = Sandbox.create(timeout=6, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert kept.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        kept.files.write("kept.txt", "woken")
        wait_state(kept, "paused")
        # Any call resumes it, without a connect.
        assert kept.files.read("kept.txt") == "woken"
        assert kept.commands.run("echo awake").stdout == "awake\n"
        assert Sandbox.get_info(kept.sandbox_id).state.value == "running"
        assert resource(kept.sandbox_id)["status"]["resumes"] >= 1
    finally:
        kept.kill()


def test_on_timeout_pause_in_filesystem_mode_stops_and_keeps_the_files():
    kept = Sandbox.create(timeout=6, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        assert resource(kept.sandbox_id)["spec"]["expiryAction"] == "Stop"
        kept.files.write("kept.txt", "on disk")
        kept.commands.run("sleep 600", background=True)
        wait_state(kept, "paused")
        stopped = resource(kept.sandbox_id)
        assert stopped["status"]["phase"] == "Stopped"
        resumed = Sandbox.connect(kept.sandbox_id, timeout=120)
        # The resume and the new end are one write: the 6 s lifetime the resume starts cannot
        # end before the 120 s asked for replaces it.
        running = resource(kept.sandbox_id)
        assert running["metadata"]["generation"] == stopped["metadata"]["generation"] + 1
        assert "ttlSeconds" not in running["spec"] and running["spec"]["state"] == "Running"
        assert resumed.files.read("kept.txt") == "on disk"
        # A cold start: the processes of before are gone.
        assert [p.cmd for p in resumed.commands.list()] == []
    finally:
        kept.kill()


def test_without_lifecycle_the_timeout_kills_and_calls_resume():
    plain = Sandbox.create(timeout=60)
    try:
        # This server's default: calls resume a paused sandbox (E2B's is not to).
        assert plain.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": True}
    finally:
        plain.kill()


PREVIEW_DOMAIN = os.environ["E2B_TEST_PREVIEW_DOMAIN"]


def through_host(host, headers=None):
    """A GET of / on the server's own address with `host` as the Host header: (status, body)."""
    request = urllib.request.Request(f"{SERVER}/", headers={"Host": host, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_get_host_is_served_by_the_server_as_a_preview_host(sbx):
    sbx.files.write("site/index.html", "served from the sandbox")
    sbx.commands.run("python3 -m http.server 8000 --bind 127.0.0.1 --directory /workspace/site", background=True)
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.{PREVIEW_DOMAIN}"
    token = sbx.traffic_access_token
    assert token
    deadline = time.monotonic() + 30
    status, body = through_host(host, {"e2b-traffic-access-token": token})
    while time.monotonic() < deadline and status != 200:
        time.sleep(0.5)
        status, body = through_host(host, {"e2b-traffic-access-token": token})
    assert (status, body) == (200, b"served from the sandbox")
    # The API key opens it too; nothing, a forged token or the envd access token does not.
    assert through_host(host, {"X-API-Key": KEY}) == (200, b"served from the sandbox")
    assert through_host(host)[0] == 401
    assert through_host(host, {"e2b-traffic-access-token": "forged"})[0] == 401
    envd_token = sbx.connection_config.sandbox_headers["X-Access-Token"]
    assert through_host(host, {"e2b-traffic-access-token": envd_token})[0] == 401
    # Nor does one sandbox's token open another's ports.
    other = Sandbox.create(timeout=60)
    try:
        assert through_host(other.get_host(8000), {"e2b-traffic-access-token": token})[0] == 401
    finally:
        other.kill()


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
    assert json.load(expired.value) == {"code": 401, "message": "signature is already expired"}


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
    # A time range keeps only the samples within it.
    import datetime

    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    assert sbx.get_metrics(start=long_ago, end=long_ago + datetime.timedelta(minutes=1)) == []
    assert len(sbx.get_metrics(start=long_ago)) >= len(metrics)
