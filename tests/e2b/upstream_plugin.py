"""pytest plugin for tests/e2b/upstream.sh: runs E2B's own Python SDK tests (a checkout of theirs,
never kept here) against this server, and reports how they fare.

- Selection: the groups in EXCLUDED are deselected, each with its reason (template building,
  volumes, E2B cloud features); everything else E2B publishes runs, also what is expected to fail
  here, so that the counts are honest.
- Counts: passed / failed / skipped / errors, split into the tests that reach a server (they
  create sandboxes: `tests/sync`, `tests/async`, `tests/shared/git`) and E2B's offline unit
  tests of the SDK itself (mocked transports; they never reach this server, and being from the
  checkout's SDK version they can disagree with the pinned SDK's internals).
- Failures grouped by their first line, so that each cause shows once with its tests.

Loaded with `-p upstream_plugin` (tests/e2b on PYTHONPATH); it defines no fixtures and changes no
test.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

# (path prefix or node ID prefix, relative to the checkout's python-sdk directory; why).
EXCLUDED = [
    ("tests/sync/template_sync", "template building (Template.build and E2B's build service)"),
    ("tests/async/template_async", "template building (Template.build and E2B's build service)"),
    ("tests/shared/template", "template building (the SDK's template builder helpers)"),
    ("tests/sync/volume_sync", "volumes"),
    ("tests/async/volume_async", "volumes"),
    ("tests/test_volume_client.py", "volumes"),
    ("tests/test_volume_connection_config.py", "volumes"),
    ("tests/sync/secret_sync", "E2B's Secrets API, a cloud feature (mocked in these tests)"),
    ("tests/async/secret_async", "E2B's Secrets API, a cloud feature (mocked in these tests)"),
    ("tests/sync/sandbox_sync/test_network.py::test_firewall_transform_injects_headers",
     "needs E2B's `httpbin` template (built by E2B) on a public sandbox host"),
    ("tests/async/sandbox_async/test_network.py::test_firewall_transform_injects_headers",
     "needs E2B's `httpbin` template (built by E2B) on a public sandbox host"),
]

SERVER_GROUPS = ("tests/sync/", "tests/async/", "tests/shared/git/")

_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}
_excluded: Counter = Counter()


def _relative(nodeid: str) -> str:
    at = nodeid.find("tests/")
    return nodeid[at:] if at >= 0 else nodeid


def _group(nodeid: str) -> str:
    return "server" if _relative(nodeid).startswith(SERVER_GROUPS) else "offline"


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        rel = _relative(item.nodeid)
        reason = next((why for prefix, why in EXCLUDED if rel.startswith(prefix)), None)
        if reason is None:
            keep.append(item)
        else:
            drop.append(item)
            _excluded[reason] += 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    line = text.strip().splitlines()[0] if text.strip() else "?"
    # Sandbox IDs, addresses, times and paths under test differ per run: one cause, one line.
    line = re.sub(r"sb_[0-9a-f]{16}", "sb_…", line)
    line = re.sub(r"p_[0-9a-f]{16}", "p_…", line)
    line = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line)
    line = re.sub(r"\d{4}-\d\d-\d\d[ T][\d:.+]+", "TIME", line)
    return line[:220]


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.skipped:
            _outcomes[nodeid] = "skipped"
        elif report.failed:
            _outcomes[nodeid] = "failed" if report.when == "call" else "error"
            _messages[nodeid] = _first_line(report)
        else:
            _outcomes[nodeid] = "passed"
    elif report.when == "teardown" and report.failed and _outcomes.get(nodeid) == "passed":
        _outcomes[nodeid] = "error"
        _messages[nodeid] = "teardown: " + _first_line(report)


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "error"
        _messages[report.nodeid] = "collection: " + _first_line(report)


def pytest_terminal_summary(terminalreporter):
    if not _outcomes:
        return
    write = terminalreporter.write_line
    write("")
    write("== E2B's own SDK tests against this server ==")
    if _excluded:
        for reason, count in sorted(_excluded.items()):
            write(f"excluded: {count:4d}  {reason}")
    else:  # deselected on pytest-xdist's workers: the groups, without counts
        for prefix, reason in EXCLUDED:
            write(f"excluded: {prefix} ({reason})")
    kinds = ("passed", "failed", "skipped", "error")
    for group, label in (("server", "reach the server"), ("offline", "offline (SDK unit tests)")):
        counts = Counter(v for k, v in _outcomes.items() if _group(k) == group)
        write(f"{label:>26}: " + ", ".join(f"{counts[k]} {k}" for k in kinds))
    causes: dict[str, list] = defaultdict(list)
    for nodeid, message in _messages.items():
        causes[(_group(nodeid), message)].append(_relative(nodeid))
    for (group, message), nodes in sorted(causes.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        write(f"[{group}] {len(nodes)} × {message}")
        for node in sorted(nodes):
            write(f"      {node}")
