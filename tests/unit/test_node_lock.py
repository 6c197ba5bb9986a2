# SPDX-License-Identifier: GPL-3.0-or-later
"""node_lock: one gpuharden run per node, stale locks taken over, other runs' locks left alone."""

from __future__ import annotations

import json
import time

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
