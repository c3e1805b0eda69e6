"""The e2e suite's Claude Code release: resolved once per run and made part of every e2e test's id.

Every test that (through `claude_bin`) uses the real CLI is parametrized, at session scope, with the one release
this run drives (COURIER_E2E_CLAUDE_VERSION, default the pinned one; `latest` asked of npm once), so its node id
reads `test_wake[2.1.332]` and a failing release is named in CI's output and in artifacts/e2e/<test>/.

Trust: the requested version is checked by harness.resolve_version before it names anything.
Logs: the terminal summary says which release ran and what was asked for.
Limits: one release per pytest process; `npm view` at most once per run (harness caches it), and only when some
    collected test needs the CLI and the request is a dist-tag.
"""

from __future__ import annotations

import os

import pytest

from e2e import harness


def unavailable(reason: str):
    """In CI a missing prerequisite is a failure, so a broken runner cannot pass by skipping; elsewhere a skip."""
    if os.environ.get("CI"):
        pytest.fail(f"e2e prerequisites missing in CI: {reason}")
    pytest.skip(reason)


def _run_version() -> tuple[str, str, str]:
    """(id for the test, exact version or '', why it could not be resolved or '')."""
    requested = harness.requested_version()
    try:
        exact = harness.active_version()
    except (RuntimeError, ValueError) as e:
        return f"{requested}-unresolved", "", str(e)
    return exact, exact, ""


def pytest_generate_tests(metafunc):
    if "claude_version" in metafunc.fixturenames:
        label, exact, why = _run_version()
        metafunc.parametrize("claude_version", [(exact, why)], ids=[label], indirect=True, scope="session")


@pytest.fixture(scope="session")
def claude_version(request) -> str:
    """The exact Claude Code release this run drives (its id is in every e2e test's node id)."""
    exact, why = request.param
    if not exact:
        unavailable(f"cannot resolve {harness.VERSION_ENV}={harness.requested_version()!r}: {why}")
    return exact


def pytest_terminal_summary(terminalreporter):
    requested = harness.requested_version()
    if requested in harness._resolved:  # only when this run drove (or tried to drive) the CLI
        exact = harness._resolved[requested]
        asked = "" if exact == requested else f" ({harness.VERSION_ENV}={requested})"
        terminalreporter.write_line(f"e2e: Claude Code {exact}{asked}")
