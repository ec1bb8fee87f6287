"""Fixtures for the compatibility suite.

The suite talks to whatever server ``AGENT_SANDBOX_URL`` / ``AGENT_SANDBOX_API_KEY`` name (run.sh
starts one). ``SDK_TEST_TARGET`` says which server that is: ``ours`` or ``reference``; tests marked
``reference_xfail`` record behaviour the reference server gets wrong and are expected (strictly) to
fail only against it. Every sandbox a test creates is destroyed when the test ends and its ID is
appended to ``SDK_TEST_IDS_FILE`` so that run.sh can remove whatever a crash left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from agent_sandbox.client import Sandbox, SandboxAPIError, SandboxClient

TARGET = os.environ.get("SDK_TEST_TARGET", "ours")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "snapshots: snapshot, rollback and fork tests")
    config.addinivalue_line(
        "markers",
        "reference_xfail(reason): the reference server is known to fail this; expected to fail only there",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("reference_xfail")
        if marker is not None and TARGET == "reference":
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.xfail(reason=f"reference server: {reason}", strict=True))


def record_id(sandbox_id: str) -> None:
    path = os.environ.get("SDK_TEST_IDS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(sandbox_id + "\n")


@pytest.fixture(scope="session")
def client() -> Iterator[SandboxClient]:
    if not os.environ.get("AGENT_SANDBOX_URL"):
        pytest.exit("AGENT_SANDBOX_URL is not set: run tests/sdk/run.sh", returncode=2)
    with SandboxClient(timeout=120.0) as c:
        yield c


class Sandboxes:
    """Creates sandboxes through the SDK and destroys them when the test ends."""

    def __init__(self, client: SandboxClient) -> None:
        self.client = client
        self.created: list[Sandbox] = []

    def track(self, sandbox: Sandbox) -> Sandbox:
        record_id(sandbox.id)
        self.created.append(sandbox)
        return sandbox

    def create(self, **kwargs) -> Sandbox:
        kwargs.setdefault("timeout_seconds", 600)
        return self.track(self.client.create(**kwargs))

    def fork(self, snapshot, **kwargs) -> Sandbox:
        kwargs.setdefault("timeout_seconds", 600)
        return self.track(self.client.fork(snapshot, **kwargs))

    def destroy_all(self) -> None:
        for sandbox in reversed(self.created):
            try:
                sandbox.destroy()
            except SandboxAPIError as err:
                if err.status_code != 404:
                    raise


@pytest.fixture
def sandboxes(client: SandboxClient) -> Iterator[Sandboxes]:
    made = Sandboxes(client)
    try:
        yield made
    finally:
        made.destroy_all()


@pytest.fixture
def sandbox(sandboxes: Sandboxes) -> Sandbox:
    return sandboxes.create()


@pytest.fixture(scope="module")
def shared_sandbox(client: SandboxClient) -> Iterator[Sandbox]:
    """One sandbox for tests that only read from it or touch files nobody else uses."""
    made = Sandboxes(client)
    try:
        yield made.create()
    finally:
        made.destroy_all()


@pytest.fixture
def snapshot_cleanup(client: SandboxClient) -> Iterator[Callable[[str], None]]:
    ids: list[str] = []
    yield ids.append
    for snapshot_id in ids:
        try:
            client.delete_snapshot(snapshot_id)
        except SandboxAPIError as err:
            if err.status_code != 404:
                raise
