# SPDX-License-Identifier: GPL-3.0-or-later
"""The core's safe reads and writes (core/_files.py), bounded parsing (core/_safe_parse.py) and commands with a
deadline (core/_command.py): issue 47's foundations, tested directly (tests/fuzz drives them through the modules)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _command, _files, _originals, _safe_parse
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ruamel.yaml import YAML

# ---------------------------------------------------------------------------------------------------------------
# resolve_in_root: links and ".." never leave the root


@pytest.fixture
def root(tmp_path):
    node = tmp_path / "node"
    (node / "etc/real").mkdir(parents=True)
    (node / "etc/real/config").write_text("inside\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/config").write_text("outside\n")
    return node


@pytest.mark.parametrize(("link", "target"), [
    ("etc/abs", "/etc/real/config"),  # absolute: from the node's root
    ("etc/rel", "real/config"),  # relative: from the link's directory
    ("etc/climb", "../../../../../../etc/real/config"),  # ".." past the root stays at the root
])
def test_links_resolve_as_the_node_sees_them(root, link, target):
    os.symlink(target, root / link)
    assert _files.resolve_in_root(str(root), "/" + link) == str(root / "etc/real/config")
    assert _files.read_text(str(root / link), root=str(root)) == "inside\n"


def test_an_absolute_link_out_of_the_root_is_read_inside_it(root, tmp_path):
    os.symlink(str(tmp_path / "outside/config"), root / "etc/out")  # the host's path: on the node it names nothing
    assert _files.resolve_in_root(str(root), "/etc/out").startswith(str(root) + "/")
    assert _files.read_text(str(root / "etc/out"), root=str(root)) is None


def test_dotdot_in_a_path_stays_inside_the_root(root):
    assert _files.resolve_in_root(str(root), "/../../outside/config") == str(root / "outside/config")
    with pytest.raises(GpuhardenError, match="outside the node root"):
        _files.node_path(str(root), str(root.parent / "outside/config"))


def test_a_link_loop_and_a_file_on_the_way_are_errors(root):
    os.symlink("b", root / "etc/a")
    os.symlink("a", root / "etc/b")
    with pytest.raises(GpuhardenError, match="more than 40 symbolic links"):
        _files.resolve_in_root(str(root), "/etc/a")
    with pytest.raises(GpuhardenError, match="is a regular file, expected a directory"):
        _files.resolve_in_root(str(root), "/etc/real/config/below")


# ---------------------------------------------------------------------------------------------------------------
# read_text: regular files only, bounded, UTF-8


def test_special_files_are_refused_without_being_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(GpuhardenError, match=r"fifo: is a FIFO \(named pipe\), expected a file"):
        _files.read_text(str(fifo))
    assert time.monotonic() - started < 2
    with pytest.raises(GpuhardenError, match="is a directory, expected a file"):
        _files.read_text(str(tmp_path))
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    with pytest.raises(GpuhardenError, match="is a socket"):
        _files.read_text(str(tmp_path / "sock"))
    server.close()
    if os.geteuid() == 0:
        os.mknod(tmp_path / "zero", 0o20644, os.makedev(1, 5))
        with pytest.raises(GpuhardenError, match="is a character device"):
            _files.read_text(str(tmp_path / "zero"))


def test_size_and_encoding_are_bounded_and_named(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(GpuhardenError, match="big: larger than 100 bytes"):
        _files.read_text(str(big), max_bytes=100)
    assert _files.read_text(str(big), max_bytes=101) == "x" * 101
    bad = tmp_path / "bad"
    bad.write_bytes(b"ok\n\xff")
    with pytest.raises(GpuhardenError) as caught:
        _files.read_text(str(bad))
    assert caught.value.msg == "%s: not UTF-8 text (byte 0xff at offset 3): refusing to read it" % bad


def test_no_follow_refuses_a_final_link_and_missing_is_none(tmp_path):
    (tmp_path / "real").write_text("x")
    os.symlink("real", tmp_path / "link")
    with pytest.raises(GpuhardenError, match="is a symbolic link"):
        _files.read_text(str(tmp_path / "link"), follow=False)
    assert _files.read_text(str(tmp_path / "link")) == "x"
    assert _files.read_text(str(tmp_path / "nothing")) is None


def test_a_control_character_in_a_path_keeps_the_message_on_one_line(tmp_path):
    odd = tmp_path / "a\nb"
    odd.mkdir()
    with pytest.raises(GpuhardenError) as caught:
        _files.read_text(str(odd))
    assert "\n" not in caught.value.msg and "a\\x0ab" in caught.value.msg


# ---------------------------------------------------------------------------------------------------------------
# check_change and apply_changes


class Module:
    _name = "gpuharden.k8s.nvidia_device_nodes"

    def __init__(self, root):
        self.params = {"root": str(root)}

    def atomic_move(self, src, dest, unsafe_writes=False):
        os.rename(src, dest)

    def backup_local(self, path):
        raise AssertionError("no backup asked")


def test_a_link_at_the_target_is_refused_unless_replacing_links_is_asked(root):
    os.symlink("real/config", root / "etc/conf")
    change = _files.FileChange(str(root / "etc/conf"), "inside\n", "new\n")
    with pytest.raises(GpuhardenError, match="is a symbolic link .* gpuharden does not write through links"):
        _files.apply_changes(Module(root), [change])
    assert (root / "etc/real/config").read_text() == "inside\n" and (root / "etc/conf").is_symlink()
    _files.apply_changes(Module(root), [change], replace_links=True)
    assert not (root / "etc/conf").is_symlink() and (root / "etc/conf").read_text() == "new\n"
    assert (root / "etc/real/config").read_text() == "inside\n"  # what the link pointed to is left alone


def test_another_writers_change_is_refused_not_lost(root):
    target = root / "etc/real/config"
    change = _files.FileChange(str(target), "what gpuharden read\n", "new\n")
    with pytest.raises(GpuhardenError, match="changed by someone else since gpuharden read it"):
        _files.apply_changes(Module(root), [change])
    assert target.read_text() == "inside\n"


def _chattr(flag, path):
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode == 0


def test_an_immutable_file_or_directory_is_refused_and_nothing_is_left(root):
    target = root / "etc/real/config"
    if not _chattr("+i", target):
        pytest.skip("chattr +i is not supported here")
    try:
        with pytest.raises(GpuhardenError, match="config: the file is immutable"):
            _files.apply_changes(Module(root), [_files.FileChange(str(target), "inside\n", "new\n")])
    finally:
        _chattr("-i", target)
    assert _chattr("+i", root / "etc/real")
    try:
        with pytest.raises(GpuhardenError, match=r"new: its directory .*/etc/real is immutable"):
            _files.apply_changes(Module(root), [_files.FileChange(str(root / "etc/real/new"), None, "x\n")])
    finally:
        _chattr("-i", root / "etc/real")
    assert sorted(os.listdir(root / "etc/real")) == ["config"]
    assert not (root / _originals.STATE_DIR).exists()  # no record of a change that was not made


def test_a_failing_second_change_puts_the_first_back(root, monkeypatch):
    first = _files.FileChange(str(root / "etc/real/config"), "inside\n", "first\n")
    second = _files.FileChange(str(root / "etc/real/other"), None, "second\n")
    write = _files.write_checked

    def failing(module, target, content, mode):
        if target.path.endswith("other"):
            raise GpuhardenError("%s: cannot replace it: Operation not permitted" % target.path)
        return write(module, target, content, mode)

    monkeypatch.setattr(_files, "write_checked", failing)
    with pytest.raises(GpuhardenError, match=r"the 1 file\(s\) changed before it were put back"):
        _files.apply_changes(Module(root), [first, second])
    assert (root / "etc/real/config").read_text() == "inside\n" and not (root / "etc/real/other").exists()
    assert not (root / _originals.STATE_DIR).exists()


def test_a_write_inside_the_root_follows_directory_links_inside_it(root):
    os.symlink("/etc/real", root / "etc/linked")  # an absolute directory link: the node's /etc/real
    _files.apply_changes(Module(root), [_files.FileChange(str(root / "etc/linked/new"), None, "x\n", mode=0o600)])
    assert (root / "etc/real/new").read_text() == "x\n" and oct((root / "etc/real/new").stat().st_mode & 0o777) == "0o600"


# ---------------------------------------------------------------------------------------------------------------
# bounded YAML and TOML


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    "%s: &%s [%s]\n" % (name, name, ", ".join(["*" + prev] * 10)) for prev, name in zip("abcde", "bcdef", strict=True))


@pytest.mark.parametrize(("text", "message"), [
    (LAUGHS, "f.yaml: line 5, column 20: more than 50000 nodes once its aliases are expanded"),
    ("a: " + "[" * 5000 + "]" * 5000, "f.yaml: line 1, column 67: nested more than 64 levels deep"),
    ("a: &a [1, *a]\n", "f.yaml: line 1, column 11: alias *a refers to a node that contains it"),
    ("x: 1\nx: 2\n", "f.yaml: line 2, column 1: key 'x' appears twice in one mapping (first at line 1)"),
    ("a: [1,\n  2\nb: c\n", "f.yaml: line 3, column 2: expected ',' or ']', but got ':' (while parsing a flow sequence)"),
])
@pytest.mark.parametrize("loader", ["safe", "round-trip"])
def test_yaml_bounds_and_errors_are_one_line(text, message, loader):
    with pytest.raises(GpuhardenError) as caught:
        if loader == "safe":
            _safe_parse.safe_load(text, "f.yaml")
        else:
            _safe_parse.round_trip_load(YAML(typ="rt"), text, "f.yaml")
    assert caught.value.msg.startswith(message) and "\n" not in caught.value.msg


def test_yaml_within_bounds_loads_with_its_aliases():
    assert _safe_parse.safe_load("a: &x {b: 1}\nc: *x\n", "f.yaml") == {"a": {"b": 1}, "c": {"b": 1}}
    assert _safe_parse.round_trip_load(YAML(typ="rt"), "a: 1 # kept\n", "f.yaml")["a"] == 1


def test_toml_nesting_is_bounded_outside_strings_and_comments():
    with pytest.raises(GpuhardenError, match="c.toml: line 2, column 69: inline arrays or tables nested more than 64 deep"):
        _safe_parse.check_toml("[plugins]\na = " + "[" * 100 + "]" * 100, "c.toml")
    _safe_parse.check_toml('[[a.b]]\nx = [[1], [2]]\ns = "[[[[" # [[[[\nm = """\n[[[[\n"""\n', "c.toml")


# ---------------------------------------------------------------------------------------------------------------
# commands with a deadline


def test_a_command_that_hangs_is_killed_with_its_children():
    started = time.monotonic()
    rc, _out, err = _command.run(["sh", "-c", "sleep 60 & sleep 60"], timeout=1)
    assert rc == 124 and "did not finish within 1 s" in err and time.monotonic() - started < 10


def test_a_command_answers_in_the_c_locale_and_a_missing_one_is_127():
    assert _command.run(["sh", "-c", 'echo "$LC_ALL"; exit 3']) == (3, "C\n", "")
    rc, _out, err = _command.run(["/nonexistent/k3s", "--version"])
    assert rc == 127 and "No such file" in err


def test_endless_output_is_bounded():
    rc, out, _err = _command.run(["sh", "-c", "yes | head -c 3000000"], timeout=20)
    assert rc == 0 and len(out) == _command.MAX_OUTPUT



def test_json_is_bounded_before_json_loads_recurses():
    with pytest.raises(GpuhardenError, match="c.json: line 1, column 65: nested more than 64 levels deep"):
        _safe_parse.json_load("[" * 100000 + "]" * 100000, "c.json")
    with pytest.raises(GpuhardenError, match='key "a" appears twice'):
        _safe_parse.json_load('{"a": 1, "a": 2}', "c.json")
    # as Go's encoding/json reads it (the kubelet's checkpoints): the last of two equal keys wins
    assert _safe_parse.json_load('{"a": 1, "a": 2}', "c.json", duplicate_keys=False) == {"a": 2}
