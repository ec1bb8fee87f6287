"""`agent-sandbox mcp` driven by the official Python MCP client over stdio.

tests/mcp/run.sh starts a server and sets AGENT_SANDBOX_URL, AGENT_SANDBOX_API_KEY and
MCP_TEST_BINARY. Each test spawns its own `agent-sandbox mcp` process, as an MCP client would.
"""

import json
import os
from contextlib import asynccontextmanager

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

TOOLS = {
    "sandbox_create",
    "sandbox_list",
    "sandbox_exec",
    "sandbox_read_file",
    "sandbox_write_file",
    "sandbox_list_files",
    "sandbox_snapshot",
    "sandbox_rollback",
    "sandbox_fork",
    "sandbox_destroy",
    "process_start",
    "process_output",
    "process_write_stdin",
    "process_signal",
    "process_list",
}
SUMMARY_KEYS = {"id", "status", "image", "network", "expires_at", "source_snapshot_id"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def session(env=None):
    params = StdioServerParameters(
        command=os.environ["MCP_TEST_BINARY"],
        args=["mcp"],
        env=env
        or {
            "AGENT_SANDBOX_URL": os.environ["AGENT_SANDBOX_URL"],
            "AGENT_SANDBOX_API_KEY": os.environ["AGENT_SANDBOX_API_KEY"],
        },
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            yield s, await s.initialize()


async def call(s, tool, **arguments):
    result = await s.call_tool(tool, arguments)
    text = "\n".join(c.text for c in result.content if c.type == "text")
    assert not result.is_error, f"{tool} failed: {text}"
    return result


@pytest.mark.anyio
async def test_tools_and_instructions():
    async with session() as (s, init):
        assert init.server_info.name == "agent-sandbox"
        instructions = init.instructions or ""
        for word in ("sandbox_snapshot", "sandbox_rollback", "/workspace", "network"):
            assert word in instructions, instructions
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == TOOLS
        schema = lambda name: tools[name].input_schema  # noqa: E731
        assert set(schema("sandbox_create")["properties"]) == {
            "image",
            "network",
            "timeout_seconds",
            "cpus",
            "memory_mb",
        }
        assert not schema("sandbox_create").get("required")
        assert schema("sandbox_exec")["required"] == ["sandbox_id", "command"]
        assert set(schema("sandbox_exec")["properties"]) == {
            "sandbox_id",
            "command",
            "workdir",
            "timeout_seconds",
        }
        assert schema("sandbox_write_file")["required"] == ["sandbox_id", "path", "content"]
        assert schema("sandbox_list_files")["properties"]["path"]["default"] == "/workspace"
        assert schema("sandbox_rollback")["required"] == ["sandbox_id", "snapshot_id"]
        assert schema("sandbox_fork")["required"] == ["snapshot_id"]
        for tool in tools.values():
            assert tool.description


@pytest.mark.anyio
async def test_create_exec_snapshot_rollback_fork_destroy():
    async with session() as (s, _):
        created = await call(s, "sandbox_create", timeout_seconds=600)
        sandbox = created.structured_content
        assert set(sandbox) == SUMMARY_KEYS, sandbox
        assert sandbox["id"].startswith("sb_")
        assert sandbox["status"] == "running"
        assert sandbox["image"] == os.environ["MCP_TEST_DEFAULT_IMAGE"]
        assert sandbox["network"] is False
        assert json.loads(created.content[0].text) == sandbox
        sid = sandbox["id"]

        info = (await call(s, "sandbox_write_file", sandbox_id=sid, path="notes/a.txt", content="v1\n")).structured_content
        assert info["path"] == "/workspace/notes/a.txt" and info["type"] == "file" and info["size"] == 3

        ran = (
            await call(
                s,
                "sandbox_exec",
                sandbox_id=sid,
                command="cat notes/a.txt; echo err >&2; exit 3",
            )
        ).structured_content
        assert ran["stdout"] == "v1\n"
        assert ran["stderr"] == "err\n"
        assert ran["exit_code"] == 3
        assert ran["timed_out"] is False
        assert set(ran) == {"stdout", "stderr", "exit_code", "timed_out", "truncated", "duration_ms"}

        ran = (await call(s, "sandbox_exec", sandbox_id=sid, command="pwd", workdir="notes")).structured_content
        assert ran["stdout"] == "/workspace/notes\n"

        listed = await call(s, "sandbox_list_files", sandbox_id=sid)
        names = [e["name"] for e in listed.structured_content["result"]]
        assert "notes" in names
        assert len(listed.content) == len(names)

        snap = (await call(s, "sandbox_snapshot", sandbox_id=sid, name="v1")).structured_content
        assert snap["id"].startswith("snap_") and snap["sandbox_id"] == sid and snap["name"] == "v1"

        await call(s, "sandbox_write_file", sandbox_id=sid, path="notes/a.txt", content="broken\n")
        read = await call(s, "sandbox_read_file", sandbox_id=sid, path="/workspace/notes/a.txt")
        assert read.content[0].text == "broken\n"
        assert read.structured_content == {"result": "broken\n"}

        rolled = (await call(s, "sandbox_rollback", sandbox_id=sid, snapshot_id=snap["id"])).structured_content
        assert rolled["id"] == sid and rolled["source_snapshot_id"] == snap["id"]
        read = await call(s, "sandbox_read_file", sandbox_id=sid, path="notes/a.txt")
        assert read.content[0].text == "v1\n"

        forked = (await call(s, "sandbox_fork", snapshot_id=snap["id"], timeout_seconds=300)).structured_content
        assert set(forked) == SUMMARY_KEYS
        assert forked["id"] != sid and forked["source_snapshot_id"] == snap["id"]
        read = await call(s, "sandbox_read_file", sandbox_id=forked["id"], path="notes/a.txt")
        assert read.content[0].text == "v1\n"

        live = [x["id"] for x in (await call(s, "sandbox_list")).structured_content["result"]]
        assert sid in live and forked["id"] in live

        for victim in (forked["id"], sid):
            done = await call(s, "sandbox_destroy", sandbox_id=victim)
            assert done.content[0].text == f"destroyed {victim}"
        live = [x["id"] for x in (await call(s, "sandbox_list")).structured_content["result"]]
        assert sid not in live

        gone = await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": "true"})
        assert gone.is_error
        assert "not found" in gone.content[0].text


@pytest.mark.anyio
async def test_failures_are_tool_errors_that_say_why():
    async with session() as (s, _):
        result = await s.call_tool("sandbox_exec", {"sandbox_id": "sb_0000000000000000", "command": "true"})
        assert result.is_error
        text = result.content[0].text
        assert text.startswith("Error executing tool sandbox_exec:") and "not found" in text, text

        result = await s.call_tool("sandbox_create", {"image": "not-allowed/image:1"})
        assert result.is_error and "allowed" in result.content[0].text, result.content[0].text

    env = {"AGENT_SANDBOX_URL": os.environ["AGENT_SANDBOX_URL"], "AGENT_SANDBOX_API_KEY": "wrong-key-wrong-key"}
    async with session(env) as (s, _):
        result = await s.call_tool("sandbox_list", {})
        assert result.is_error and "401" in result.content[0].text, result.content[0].text


@pytest.mark.anyio
async def test_process_tools_read_on_from_offsets():
    async with session() as (s, _):
        sid = (await call(s, "sandbox_create", timeout_seconds=600)).structured_content["id"]
        started = (await call(s, "process_start", sandbox_id=sid, command="cat", stdin=True)).structured_content
        pid = started["id"]
        assert pid.startswith("p_") and started["state"] == "Running"

        await call(s, "process_write_stdin", sandbox_id=sid, process_id=pid, data="one\n")
        first = {"stdout": ""}
        for _ in range(50):
            first = (await call(s, "process_output", sandbox_id=sid, process_id=pid)).structured_content
            if first["stdout"]:
                break
        assert first["stdout"] == "one\n" and first["state"] == "Running", first
        assert first["stdout_offset"] == 4

        await call(s, "process_write_stdin", sandbox_id=sid, process_id=pid, data="two\n", close=True)
        later = {"state": "Running"}
        for _ in range(50):
            later = (
                await call(s, "process_output", sandbox_id=sid, process_id=pid, stdout_from=first["stdout_offset"])
            ).structured_content
            if later["state"] != "Running":
                break
        assert later["stdout"] == "two\n" and later["state"] == "Exited" and later["exit_code"] == 0, later

        sleeper = (await call(s, "process_start", sandbox_id=sid, command="sleep 300")).structured_content["id"]
        await call(s, "process_signal", sandbox_id=sid, process_id=sleeper, signal="KILL")
        listed = (await call(s, "process_list", sandbox_id=sid)).structured_content["result"]
        assert {p["id"] for p in listed} == {pid, sleeper}
        await call(s, "sandbox_destroy", sandbox_id=sid)
