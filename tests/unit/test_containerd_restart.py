# SPDX-License-Identifier: GPL-3.0-or-later
"""containerd_nvidia_runtime's restart option: the write, containerd's restart and the wait until it serves again, in
one module run.

The module runs as Ansible runs it (a fresh Python), against a node root with a containerd config, with a systemctl on
PATH that records its arguments and, on restart, starts a listener on the node's socket path the way containerd
creates its socket anew (unlink, then listen).  The socket's address, where containerd takes it from, is pinned
against the configs of the fixtures.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _containerd, _containerd_restart

from tests.unit.conftest import run_module
from tests.unit.test_containerd import DROP_IN, install

SOCKET = "run/containerd/containerd.sock"


def _systemctl(world_tmp, root, states="active"):
    """A systemctl that logs its arguments, answers is-active with the next of ``states`` (comma-separated, the last
    repeats) and, on ``restart``, listens on the node's socket for 20 s from a detached child (a new inode each time),
    except for a unit named broken* (one that exits before it serves)."""
    bin_dir = world_tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls, answers = world_tmp / "systemctl.calls", world_tmp / "systemctl.states"
    answers.write_text(states)
    fake = bin_dir / "systemctl"
    fake.write_text(textwrap.dedent("""\
        #!%s
        import os, socket, sys, time
        open(%r, "a").write(" ".join(sys.argv[1:]) + "\\n")
        if sys.argv[1] == "is-active":
            states = open(%r).read().split(",")
            print(states[0])
            if len(states) > 1:
                open(%r, "w").write(",".join(states[1:]))
        elif sys.argv[1] == "restart" and not sys.argv[2].startswith("broken") and os.fork() == 0:
            os.setsid()
            path = %r
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.exists(path):
                os.unlink(path)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(path)
            listener.listen(8)
            for fd in (0, 1, 2):
                os.close(fd)
            time.sleep(20)
            os._exit(0)
        elif sys.argv[2] == "broken":
            sys.stderr.write("Unit broken.service not found.\\n")
            sys.exit(5)
        """) % (sys.executable, str(calls), str(answers), str(answers), str(root / SOCKET)))
    fake.chmod(0o755)
    return calls, {"PATH": "%s:%s" % (bin_dir, os.environ["PATH"])}


def _old_socket(root):
    """The socket file the running containerd left (no listener behind it any more after a stop)."""
    path = root / SOCKET
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()
    return _identity(root)


def _identity(root):
    info = (root / SOCKET).stat()
    return info.st_ino, info.st_ctime_ns


def test_write_restarts_and_waits_until_the_new_socket_accepts(world_tmp):
    root = install(world_tmp / "node", "v3-confd")
    old = _old_socket(root)
    calls, env = _systemctl(world_tmp, root)
    result = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required"}, env)
    assert result["changed"] and result["restarted"], result
    readiness = result["readiness"]
    assert readiness["ready"] is True and readiness["status"] == "active" and readiness["error"] is None, readiness
    assert readiness["address"] == "/" + SOCKET and readiness["seconds"] < 10
    assert _identity(root) != old  # a new socket file (the inode number itself may come back after an unlink)
    assert calls.read_text().splitlines()[0] == "restart containerd"
    again = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required"}, env)
    assert again["changed"] is False and again["restarted"] is False and again["readiness"] is None
    assert calls.read_text().count("restart") == 1  # nothing to load: no second restart


def test_nothing_restarts_by_default_or_in_check_mode(world_tmp):
    root = install(world_tmp / "node", "v3-confd")
    calls, env = _systemctl(world_tmp, root)
    checked = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required", "_ansible_check_mode": True}, env)
    assert checked["changed"] and checked["restarted"] is False and checked["readiness"] is None
    plain = run_module("containerd_nvidia_runtime", {"root": str(root)}, env)
    assert plain["changed"] and plain["restarted"] is False and plain["restart_required"] is True
    assert not calls.exists()


def test_a_containerd_that_exits_after_the_restart_is_reported_at_once_not_raised(world_tmp):
    root = install(world_tmp / "node", "v3-confd")
    _old_socket(root)
    _calls, env = _systemctl(world_tmp, root, states="active,failed")
    result = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required", "service": "broken-later",
                                                      "ready_timeout": 60, "_ansible_module_name": "gpuharden.k8s.containerd_nvidia_runtime"}, env)
    readiness = result["readiness"]
    assert not result.get("failed") and result["changed"], result  # written: the role fails the host, naming it
    assert readiness["ready"] is False and readiness["status"] == "failed" and readiness["timed_out"] is False, readiness
    assert "broken-later is failed after the restart" in readiness["error"] and readiness["seconds"] < 10
    # rolled back: the drop-in this run created is gone, and the second restart did not bring it back either
    assert result["rollback"]["restored"] == [DROP_IN] and not (root / DROP_IN.lstrip("/")).exists()
    [planned] = run_module("unharden_files", {"root": str(root), "_ansible_check_mode": True}, {})["files"]
    assert (planned["path"], planned["action"], planned["reason"]) == (DROP_IN, "forget", "absent, as before gpuharden")
    assert result["rollback"]["readiness"]["ready"] is False and result["rollback"]["readiness"]["status"] == "failed"


def test_a_containerd_that_comes_back_only_with_its_old_files_gets_them_back(world_tmp):
    root = install(world_tmp / "node", "v2-single.toml")
    config = root / "etc/containerd/config.toml"
    original = config.read_text()
    config.chmod(0o600)
    _old_socket(root)
    calls, env = _systemctl(world_tmp, root, states="failed,active")
    result = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required", "backup": True,
                                                      "_ansible_module_name": "gpuharden.k8s.containerd_nvidia_runtime"}, env)
    assert result["readiness"]["ready"] is False and result["readiness"]["status"] == "failed", result["readiness"]
    rollback = result["rollback"]
    assert rollback["restored"] == ["/etc/containerd/config.toml"] and rollback["readiness"]["ready"] is True, rollback
    assert config.read_text() == original and oct(config.stat().st_mode & 0o777) == "0o600"  # as it was, mode too
    assert calls.read_text().splitlines().count("restart containerd") == 2
    assert list(result["backup_files"]) == ["/etc/containerd/config.toml"]  # the backup of the original stays
    # the uninstall's record of the file: it is the original again, so unharden has nothing to put back
    [planned] = run_module("unharden_files", {"root": str(root), "_ansible_check_mode": True}, {})["files"]
    assert (planned["path"], planned["action"], planned["reason"]) == ("/etc/containerd/config.toml", "forget", "already the original")


def test_a_bad_ready_timeout_is_refused_before_anything_is_written(world_tmp):
    root = install(world_tmp / "node", "v3-confd")
    refused = run_module("containerd_nvidia_runtime", {"root": str(root), "restart": "if_required", "ready_timeout": 0}, {})
    assert refused["failed"] and "option ready_timeout=0 must be a positive number of seconds" in refused["msg"]
    assert not (root / DROP_IN.lstrip("/")).exists()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _answers(*states):
    answers = list(states)

    def run_command(argv):
        if argv[1] == "restart":
            return 0, "", ""
        return 0, (answers.pop(0) if len(answers) > 1 else answers[0]) + "\n", ""
    return run_command


def test_without_a_socket_before_the_restart_containerd_must_stay_active_for_the_settle_time(world_tmp):
    clock = Clock()
    waited = _containerd_restart.restart_and_wait(_answers("activating", "active"), "k3s", str(world_tmp), "/run/k3s/containerd.sock",
                                                  30, clock, clock.sleep)
    assert waited["ready"] is True and waited["error"] is None
    # one poll activating, then active from 0.25 s on: ready once 2 s have passed since
    assert waited["seconds"] == pytest.approx(0.25 + _containerd_restart.STABLE_SECONDS, abs=0.3)


def test_a_socket_that_is_not_created_again_times_out_naming_it(world_tmp):
    clock = Clock()
    (world_tmp / "run/containerd").mkdir(parents=True)
    _old_socket(world_tmp)
    waited = _containerd_restart.restart_and_wait(_answers("active"), "containerd", str(world_tmp), "/" + SOCKET, 3, clock, clock.sleep)
    assert waited["ready"] is False and waited["timed_out"] is True
    assert waited["error"] == "not serving 3 s after the restart: containerd is active but has not created /%s again" % SOCKET
    failed = _containerd_restart.restart_and_wait(lambda argv: (5, "", "Unit broken.service not found.\n"), "broken", str(world_tmp),
                                                  "/" + SOCKET, 3, clock, clock.sleep)
    assert failed["ready"] is False and failed["attempts"] == 0 and "rc 5" in failed["error"]


@pytest.mark.parametrize(("fixture", "files", "address"), [
    ("v4-single.toml", {}, "/run/containerd/containerd.sock"),  # containerd's default (defaults/defaults_linux.go)
    ("v2-single.toml", {}, "/run/containerd/containerd.sock"),
    (None, {"/etc/containerd/config.toml": 'version = 2\n[grpc]\n  address = "/run/custom/containerd.sock"\n'},
     "/run/custom/containerd.sock"),
    (None, {"/etc/containerd/config.toml": 'version = 4\n[plugins."io.containerd.server.v1.grpc"]\n  address = "/run/v4/c.sock"\n'},
     "/run/v4/c.sock"),
    # an imported file is read after the main one: its address wins
    (None, {"/etc/containerd/config.toml": 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n[grpc]\n  address = "/run/a.sock"\n',
            "/etc/containerd/conf.d/10-grpc.toml": 'version = 3\n[grpc]\n  address = "/run/b.sock"\n'}, "/run/b.sock"),
])
def test_the_address_containerd_listens_on(world_tmp, fixture, files, address):
    root = install(world_tmp, fixture, files)
    assert _containerd.grpc_address(_containerd.read_config_set(str(root), "/etc/containerd/config.toml")) == address
