"""The e2e harness's version handling, without npm's registry or a real CLI: which release a run asks for, how a
dist-tag resolves, where each release is installed and which file is its entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from e2e import harness

FAKE_NPM = """#!{python}
# A stand-in for `npm install --prefix P @anthropic-ai/claude-code@V`: writes a package whose bin prints V.
import json, os, sys
args = sys.argv[1:]
prefix = args[args.index("--prefix") + 1]
version = args[-1].rsplit("@", 1)[1]
with open(os.environ["FAKE_NPM_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
pkg = os.path.join(prefix, "node_modules", "@anthropic-ai", "claude-code")
os.makedirs(pkg, exist_ok=True)
said = os.environ.get("FAKE_NPM_SAYS", version)
with open(os.path.join(pkg, "package.json"), "w") as f:
    json.dump({{"name": "@anthropic-ai/claude-code", "version": version, "bin": {{"claude": "cli.js"}}}}, f)
entry = os.path.join(pkg, "cli.js")
with open(entry, "w") as f:
    f.write("#!/bin/sh\\necho '" + said + " (Claude Code)'\\n")
os.chmod(entry, 0o755)
"""


def make_package(prefix: Path, version: str, bin_field) -> Path:
    pkg = harness.package_dir(prefix)
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": harness.PACKAGE, "version": version, "bin": bin_field}))
    return pkg


def write_entry(path: Path, says: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{says} (Claude Code)'\n")
    path.chmod(0o755)


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    npm = bindir / "npm"
    npm.write_text(FAKE_NPM.format(python=sys.executable))
    npm.chmod(0o755)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    return log


@pytest.fixture(autouse=True)
def own_state(monkeypatch):
    """ensure_cli sets the module's run version and active_version caches: keep both out of other tests."""
    monkeypatch.setattr(harness, "CLI_VERSION", harness.CLI_VERSION)
    monkeypatch.setattr(harness, "_resolved", {})


def test_requested_version_defaults_to_the_pinned_release():
    assert harness.requested_version({}) == harness.PINNED_VERSION == "2.1.328"
    assert harness.requested_version({harness.VERSION_ENV: ""}) == harness.PINNED_VERSION
    assert harness.requested_version({harness.VERSION_ENV: " 2.1.248\n"}) == "2.1.248"
    assert harness.requested_version({harness.VERSION_ENV: "latest"}) == "latest"


def test_an_exact_version_is_not_asked_of_npm():
    def npm_view(tag):
        raise AssertionError("npm must not be asked")

    assert harness.resolve_version("2.1.248", npm_view) == "2.1.248"
    assert harness.resolve_version("3.0.0-beta.2", npm_view) == "3.0.0-beta.2"


def test_latest_resolves_through_npm_view():
    asked = []

    def npm_view(tag):
        asked.append(tag)
        return "2.1.332\n"

    assert harness.resolve_version("latest", npm_view) == "2.1.332"
    assert asked == ["latest"]


@pytest.mark.parametrize("answer", ["", "2.1.332\n2.1.333\n", "npm warn something\n2.1.332", "../../etc", "latest"])
def test_an_answer_that_is_not_one_version_is_refused(answer):
    with pytest.raises(ValueError):
        harness.resolve_version("latest", lambda tag: answer)


@pytest.mark.parametrize("requested", ["../2.1.328", "2.1.328/x", "Latest", "2.1", "x" * 60, "latest;rm"])
def test_a_request_that_is_neither_version_nor_tag_is_refused_before_npm(requested):
    def npm_view(tag):
        raise AssertionError("npm must not be asked")

    with pytest.raises(ValueError):
        harness.resolve_version(requested, npm_view)


def test_latest_is_asked_of_npm_once_per_run():
    asked = []

    def npm_view(tag):
        asked.append(tag)
        return "2.1.332"

    env = {harness.VERSION_ENV: "latest"}
    assert harness.active_version(env, npm_view) == harness.active_version(env, npm_view) == "2.1.332"
    assert asked == ["latest"]
    assert harness.active_version({}, npm_view) == harness.PINNED_VERSION
    assert asked == ["latest"]


def test_each_release_has_its_own_install_dir(tmp_path):
    assert harness.install_dir("2.1.248", tmp_path) == tmp_path / "2.1.248"
    assert harness.install_dir("2.1.332", tmp_path) != harness.install_dir("2.1.248", tmp_path)
    assert harness.install_dir("2.1.328") == harness.REPO / ".cache" / "claude-code" / "2.1.328"
    for bad in ("latest", "../2.1.248", "2.1.248/..", ""):
        with pytest.raises(ValueError):
            harness.install_dir(bad, tmp_path)


@pytest.mark.parametrize("bin_field, expected", [
    ({"claude": "bin/claude.exe"}, "bin/claude.exe"),  # native releases (2.1.150 on)
    ({"claude": "cli.js"}, "cli.js"),  # node releases (2.1.100)
    ("cli.js", "cli.js"),  # the string form npm also allows
    ({"other": "run.js"}, "run.js"),  # a single entry under another name
])
def test_the_entry_point_comes_from_the_bin_field(tmp_path, bin_field, expected):
    pkg = make_package(tmp_path, "2.1.100", bin_field)
    assert harness.binary_from_package(pkg) == (pkg / expected).resolve()


@pytest.mark.parametrize("bin_field", [None, "", {}, {"a": "x.js", "b": "y.js"}, "../../../../bin/sh", {"claude": "/bin/sh"}])
def test_an_unusable_or_escaping_bin_field_is_refused(tmp_path, bin_field):
    pkg = make_package(tmp_path, "2.1.100", bin_field)
    with pytest.raises(ValueError):
        harness.binary_from_package(pkg)


def test_version_output_must_name_exactly_the_release():
    assert harness.version_matches("2.1.328 (Claude Code)\n", "2.1.328")
    assert not harness.version_matches("2.1.3280 (Claude Code)\n", "2.1.328")  # a prefix is not a match
    assert not harness.version_matches("2.1.332 (Claude Code)\n", "2.1.328")
    assert not harness.version_matches("", "2.1.328")


def test_an_installed_release_is_used_without_npm_and_becomes_the_run_version(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no npm: the install must not be needed
    for v in ("2.1.248", "2.1.332"):
        pkg = make_package(tmp_path / v, v, {"claude": "bin/claude.exe"})
        write_entry(pkg / "bin" / "claude.exe", v)
    entry, why = harness.ensure_cli("2.1.248", cache=tmp_path)
    assert (entry, why) == ((harness.package_dir(tmp_path / "2.1.248") / "bin" / "claude.exe").resolve(), "")
    assert harness.CLI_VERSION == "2.1.248"
    entry, why = harness.ensure_cli("2.1.332", cache=tmp_path)
    assert entry.is_relative_to(tmp_path / "2.1.332") and harness.CLI_VERSION == "2.1.332"


def test_a_release_is_installed_once_into_its_own_dir(tmp_path, fake_npm):
    other = make_package(tmp_path / "2.1.248", "2.1.248", "cli.js")
    write_entry(other / "cli.js", "2.1.248")
    before = (other / "cli.js").read_text()
    entry, why = harness.ensure_cli("2.1.100", cache=tmp_path)
    assert why == "" and entry == (harness.package_dir(tmp_path / "2.1.100") / "cli.js").resolve()
    calls = [json.loads(line) for line in fake_npm.read_text().splitlines()]
    assert len(calls) == 1 and calls[0][-1] == "@anthropic-ai/claude-code@2.1.100"
    assert (other / "cli.js").read_text() == before  # another release's install is left alone
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".partial-")]
    harness.ensure_cli("2.1.100", cache=tmp_path)
    assert len(fake_npm.read_text().splitlines()) == 1  # the second run reuses it


def test_an_install_reporting_another_version_is_refused_and_not_kept(tmp_path, fake_npm, monkeypatch):
    monkeypatch.setenv("FAKE_NPM_SAYS", "2.1.999")
    entry, why = harness.ensure_cli("2.1.100", cache=tmp_path)
    assert entry is None and "2.1.999" in why
    assert not (tmp_path / "2.1.100").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".partial-")]


def test_without_npm_a_missing_release_has_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert harness.ensure_cli("2.1.248", cache=tmp_path) == (None, "npm is not installed")


def test_an_unresolvable_request_has_a_reason(monkeypatch):
    monkeypatch.setenv(harness.VERSION_ENV, "../etc")
    entry, why = harness.ensure_cli()
    assert entry is None and harness.VERSION_ENV in why
