# SPDX-License-Identifier: GPL-3.0-or-later
"""node_lock: one gpuharden run per node, stale locks taken over, other runs' locks left alone."""

from __future__ import annotations

import json
import os
import time

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _node_lock

from tests.unit.conftest import run_module


def _lock(path, **args):
    return run_module("node_lock", dict({"path": str(path)}, **args), {})


def test_decide_table():
    held = {"owner": "a", "acquired_at": 100.0, "stale_after": 50}
    assert _node_lock.decide(False, "a", 120, "acquired") == "create"
    assert _node_lock.decide(held, "a", 120, "acquired") == "keep"
    assert _node_lock.decide(held, "b", 120, "acquired") == "wait"
    assert _node_lock.decide(held, "b", 151, "acquired") == "take_over"
    assert _node_lock.decide(None, "b", 120, "acquired") == "take_over"
    assert _node_lock.decide(held, "b", 120, "released") == "foreign"
    assert _node_lock.decide(held, "a", 120, "released") == "remove"
    assert _node_lock.decide(False, "a", 120, "released") == "absent"
    assert _node_lock.parse("{not json") is None
    assert _node_lock.parse(json.dumps({"owner": 3, "acquired_at": 1})) is None


def test_second_owner_waits_then_fails_naming_the_holder(tmp_path):
    path = tmp_path / "run" / "gpuharden.lock"
    first = _lock(path, owner="drift@ctl-a")
    assert first["action"] == "create" and not first["changed"]
    assert _lock(path, owner="drift@ctl-a")["action"] == "keep"
    started = time.monotonic()
    blocked = _lock(path, owner="harden@ctl-b", timeout=2)
    assert blocked["failed"] and time.monotonic() - started >= 2
    assert "drift@ctl-a" in blocked["msg"] and str(path) in blocked["msg"]
    assert _lock(path, owner="harden@ctl-b", state="released")["action"] == "foreign"
    assert path.exists()
    assert _lock(path, owner="drift@ctl-a", state="released")["action"] == "remove"
    assert not path.exists()
    assert _lock(path, owner="harden@ctl-b")["action"] == "create"


def test_stale_and_garbage_locks_are_taken_over(tmp_path):
    path = tmp_path / "gpuharden.lock"
    path.write_text(json.dumps({"owner": "dead-run", "acquired_at": time.time() - 100, "stale_after": 10}))
    result = _lock(path, owner="new-run")
    assert result["action"] == "take_over" and result["holder"]["owner"] == "dead-run"
    assert json.loads(path.read_text())["owner"] == "new-run"
    path.write_text("garbage")
    assert _lock(path, owner="other")["action"] == "take_over"


def test_bad_options_fail_without_touching_the_lock(tmp_path):
    path = tmp_path / "gpuharden.lock"
    result = _lock(path, owner="x", timeout=-1)
    assert result["failed"] and "timeout" in result["msg"] and not path.exists()


# ---------------------------------------------------------------------------------------------
# A run that is provably gone (issue 43, item 8): its lock is taken over at once, with the holder named


CONTROLLER = {"host": "ctl-a", "boot_id": "boot-1", "pid_ns": "pid:[4026531836]", "pid": 500, "start": 9000,
              "live": [[500, 9000], [700, 8000]], "checked": 9100}


def _holder(**run):
    return {"owner": "harden@dead", "acquired_at": 100.0, "stale_after": 7200,
            "run": dict({"host": "ctl-a", "boot_id": "boot-1", "pid_ns": "pid:[4026531836]", "pid": 600, "start": 8500}, **run)}


def _warnings(result):
    """The result's warnings as text (ansible-core 2.19 returns each as a WarningSummary with its event's msg)."""
    return [entry["event"]["msg"] if isinstance(entry, dict) else entry for entry in result.get("warnings", [])]


def test_holder_gone_only_when_provable_on_this_controller():
    reason = _node_lock.holder_gone(_holder(), CONTROLLER)
    assert reason and "PID 600" in reason and "ctl-a" in reason
    assert _node_lock.holder_gone(_holder(pid=700, start=8000), CONTROLLER) is None  # alive
    assert _node_lock.holder_gone(_holder(pid=700, start=8400), CONTROLLER) == reason.replace("600", "700").replace("8500", "8400")  # PID reused
    assert _node_lock.holder_gone(_holder(start=9100), CONTROLLER) is None  # started after the list was made
    for other in ({"host": "ctl-b"}, {"boot_id": "boot-2"}, {"pid_ns": "pid:[1]"}):
        assert _node_lock.holder_gone(_holder(**other), CONTROLLER) is None, other
    assert _node_lock.holder_gone({"owner": "old", "acquired_at": 1.0}, CONTROLLER) is None  # a lock without a run
    assert _node_lock.holder_gone(_holder(), None) is None  # a run that names no controller proves nothing
    assert _node_lock.decide(_holder(), "new", 150.0, "acquired", reason) == "take_over"
    assert _node_lock.decide(_holder(), "new", 150.0, "acquired", None) == "wait"


def test_a_dead_runs_lock_is_taken_over_at_once_naming_the_holder(tmp_path):
    path = tmp_path / "gpuharden.lock"
    path.write_text(json.dumps(dict(_holder(), acquired_at=time.time())))
    started = time.monotonic()
    result = _lock(path, owner="harden@next", controller=CONTROLLER, timeout=30)
    assert time.monotonic() - started < 10, "no wait for a run that is gone"
    assert result["action"] == "take_over" and result["holder"]["owner"] == "harden@dead", result
    assert "PID 600" in result["taken_over"]
    [warning] = _warnings(result)
    assert "harden@dead" in warning and "ansible-playbook PID 600 on ctl-a" in warning and "its run is gone" in warning
    written = json.loads(path.read_text())
    assert written["owner"] == "harden@next"
    assert written["run"] == {key: CONTROLLER[key] for key in ("host", "boot_id", "pid_ns", "pid", "start")}


def test_a_live_runs_lock_still_waits_and_the_failure_names_its_process(tmp_path):
    path = tmp_path / "gpuharden.lock"
    path.write_text(json.dumps(dict(_holder(pid=700, start=8000), acquired_at=time.time())))
    result = _lock(path, owner="harden@next", controller=CONTROLLER, timeout=1)
    assert result["failed"] and "harden@dead" in result["msg"] and "ansible-playbook PID 700 on ctl-a" in result["msg"]
    assert "stale_after (7200 s)" in result["msg"]
    assert json.loads(path.read_text())["owner"] == "harden@dead"


def test_a_stale_lock_is_taken_over_with_the_reason(tmp_path):
    path = tmp_path / "gpuharden.lock"
    path.write_text(json.dumps({"owner": "drift@other-ctl", "acquired_at": time.time() - 100, "stale_after": 10}))
    result = _lock(path, owner="new-run")
    assert result["taken_over"].startswith("it is older than its stale_after (10 s)")
    assert "drift@other-ctl" in _warnings(result)[0]


@pytest.mark.parametrize("controller", [
    "ctl-a", dict(CONTROLLER, host=""), dict(CONTROLLER, pid="500"), dict(CONTROLLER, live=[[1]]), dict(CONTROLLER, checked=True)])
def test_a_malformed_controller_is_refused_before_the_lock_is_touched(tmp_path, controller):
    path = tmp_path / "gpuharden.lock"
    result = _lock(path, owner="x", controller=controller)
    assert result["failed"] and "controller" in result["msg"] and not path.exists(), result


def _fake_proc(tmp_path, processes, uptime="812.34"):
    """A /proc with {pid: (ppid, start, argv)}; comm holds a space and a parenthesis, as a real one may."""
    proc = tmp_path / "proc"
    for pid, (ppid, start, argv) in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        fields = ["S", str(ppid)] + ["0"] * 17 + [str(start), "0"]
        (proc / str(pid) / "stat").write_text("%d (py (x) y) %s\n" % (pid, " ".join(fields)))
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(part.encode() for part in argv) + b"\0")
    (proc / "uptime").write_text("%s 100.0\n" % uptime)
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("boot-xyz\n")
    (proc / "self/ns").mkdir(parents=True)
    (proc / "self/ns/pid").symlink_to("pid:[4026531836]")
    return proc


def test_controller_identity_finds_the_playbook_process_above_its_workers(tmp_path):
    playbook = ["/usr/bin/python3", "/venv/bin/ansible-playbook", "site.yml"]
    proc = _fake_proc(tmp_path, {
        10: (1, 50, ["/bin/bash"]), 20: (10, 7000, playbook), 21: (20, 7100, playbook),  # the run, and its worker
        30: (10, 7200, ["ansible-playbook", "other.yml"]), 40: (10, 7300, ["/usr/bin/python3", "/bin/ansible", "all"])})
    identity = _node_lock.controller_identity(str(proc), pid=21)
    assert identity["pid"] == 20 and identity["start"] == 7000 and identity["boot_id"] == "boot-xyz"
    assert identity["pid_ns"] == "pid:[4026531836]"
    assert identity["live"] == [[20, 7000], [21, 7100], [30, 7200]]  # ansible (ad hoc) is no playbook run
    assert identity["checked"] == int(812.34 * os.sysconf("SC_CLK_TCK"))
    assert _node_lock.check_controller(identity) is identity
    assert _node_lock.process_start(99, str(proc)) is None


def test_controller_identity_of_this_very_process():
    """Against the real /proc: pytest is no ansible-playbook, so the run is this process, and it is not 'live'."""
    identity = _node_lock.controller_identity()
    assert identity["pid"] == os.getpid() and identity["start"] == _node_lock.process_start(os.getpid())
    assert identity["start"] <= identity["checked"]
    assert [os.getpid(), identity["start"]] not in identity["live"]
