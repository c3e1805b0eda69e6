"""Registry records and socket vetting: type checks, liveness as Claude judges it, and the connect boundary."""

import json
import os
import socket
import stat

import pytest
from hypothesis import given, settings, strategies as st

from courier import registry

JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=20,
)


def test_parse_record_type_checks_every_field():
    good = {"pid": 10, "sessionId": "S", "procStart": "1", "messagingSocketPath": "/r/cc-socks/10.sock"}
    assert registry.parse_record(good).socket_path == "/r/cc-socks/10.sock"
    for key, value in [("pid", "10"), ("pid", True), ("pid", -1), ("sessionId", 5), ("sessionId", ""),
                       ("procStart", 12), ("messagingSocketPath", ["x"]), ("status", {})]:
        bad = dict(good, **{key: value})
        with pytest.raises(registry.BadRecord):
            registry.parse_record(bad)
    with pytest.raises(registry.BadRecord):
        registry.parse_record(good, expect_pid=11)


@given(JSONS)
@settings(max_examples=1000)
def test_arbitrary_json_records_never_crash(value):
    try:
        registry.parse_record(value)
    except registry.BadRecord as exc:
        assert exc.reason.startswith("record_")


def test_proc_start_of_self_matches_proc():
    token = registry.proc_start(os.getpid())
    assert token and token.isdigit()
    assert registry.proc_start(2 ** 22 + 12345) is None


def test_torn_then_whole_record_is_reread(tmp_path):
    path = tmp_path / "123.json"
    path.write_text('{"pid": 123, "sess')
    calls = []

    def sleep(s):
        calls.append(s)
        path.write_text(json.dumps({"pid": 123, "sessionId": "S"}))

    assert registry.read_record(tmp_path, 123, sleep=sleep).session_id == "S"
    assert calls == [0.025]


def test_socket_shape():
    assert registry.vet_socket_shape("/run/user/1/cc-socks/42.sock") is None
    assert registry.vet_socket_shape("/tmp/cc-socks/42-0123abcd.sock") is None
    assert registry.vet_socket_shape("/tmp/cc-socks/deadbeef.sock") is None
    assert registry.vet_socket_shape("rel/42.sock") == "socket_path_not_absolute"
    assert registry.vet_socket_shape("/a/../b/42.sock") == "socket_path_invalid"
    assert registry.vet_socket_shape("/" + "a" * 100 + "/42.sock") == "socket_path_too_long"
    assert registry.vet_socket_shape("/var/run/docker.sock") == "socket_name_unexpected"
    assert registry.vet_socket_shape("/tmp/cc-socks/courier-12.sock") == "socket_name_unexpected"


def test_vet_socket_against_real_files(tmp_path):
    d = tmp_path / "cc-socks"
    d.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    path = str(d / "42.sock")
    s.bind(path)
    try:
        assert registry.vet_socket(path) is None
        os.chmod(d, 0o755)
        assert registry.vet_socket(path) == "socket_dir_permissive"
        os.chmod(d, 0o700)
        assert registry.vet_socket(str(d / "43.sock")) == "socket_missing"
        (d / "44.sock").write_text("")
        assert registry.vet_socket(str(d / "44.sock")) == "not_a_socket"
        os.symlink(path, d / "45.sock")
        assert registry.vet_socket(str(d / "45.sock")) == "socket_symlink"
        assert registry.vet_socket(path, uid=os.getuid() + 1) == "foreign_owner"
    finally:
        s.close()


def test_vet_stats_refuses_root_owned_socket():
    sock = os.stat_result((stat.S_IFSOCK | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    parent = os.stat_result((stat.S_IFDIR | 0o700, 0, 0, 1, 1000, 0, 0, 0, 0, 0))
    assert registry.vet_socket_stats(sock, parent, 1000) == "foreign_owner"
