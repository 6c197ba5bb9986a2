# SPDX-License-Identifier: GPL-3.0-or-later
"""The one wait loop (plugins/module_utils/core/_waiter.py), on an injected clock: no test waits for real; and no other
hand-written wait loop in the modules and module_utils."""

from __future__ import annotations

import pathlib
import re

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _waiter
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def answers(*states):
    """A condition that answers ``states`` in turn (done when the state is "ready"), then the last one forever."""
    seen = list(states)

    def condition():
        state = seen.pop(0) if len(seen) > 1 else seen[0]
        return state == "ready", state

    return condition


def test_done_at_the_first_look_sleeps_never():
    clock = Clock()
    waited = _waiter.wait_until("x", answers("ready"), clock() + 10, 1, clock=clock, sleep=clock.sleep)
    assert waited == _waiter.Waited(True, "ready", 1, 0.0) and clock.sleeps == []


def test_looks_again_after_each_interval_until_done():
    clock = Clock()
    waited = _waiter.wait_until("x", answers("starting", "starting", "ready"), clock() + 10, 2, clock=clock, sleep=clock.sleep)
    assert waited == _waiter.Waited(True, "ready", 3, 4.0) and clock.sleeps == [2, 2]


def test_an_interval_that_would_end_past_the_deadline_is_not_slept():
    clock = Clock()
    waited = _waiter.wait_until("x", answers("starting"), clock() + 5, 2, clock=clock, sleep=clock.sleep)
    # looks at 0, 2, 4: a sleep to 6 would pass the deadline (5), so the wait ends at 4 with the last state seen
    assert waited == _waiter.Waited(False, "starting", 3, 4.0) and clock.sleeps == [2, 2]


def test_final_look_sleeps_to_the_deadline_and_looks_once_more():
    clock = Clock()
    waited = _waiter.wait_until("x", answers("starting", "starting", "starting", "ready"), clock() + 5, 2, final_look=True,
                                clock=clock, sleep=clock.sleep)
    assert waited == _waiter.Waited(True, "ready", 4, 5.0) and clock.sleeps == [2, 2, 1]
    clock = Clock()
    assert _waiter.wait_until("x", answers("starting"), clock() + 5, 2, final_look=True, clock=clock, sleep=clock.sleep).looks == 4
    assert clock.now == 105.0  # never past the deadline


def test_backoff_multiplies_the_interval_up_to_its_cap():
    clock = Clock()
    _waiter.wait_until("x", answers("starting"), clock() + 30, 1, backoff=2, max_interval=5, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [1, 2, 4, 5, 5, 5, 5]  # 27 s; a further 5 would end at 32


def test_must_raises_naming_what_it_waited_for_and_the_last_state_seen():
    clock = Clock()
    with pytest.raises(GpuhardenError) as raised:
        _waiter.wait_until("DaemonSet kube-system/plugin rolled out", answers({"ready": 1, "desired": 2}), clock() + 3, 1, must=True,
                           clock=clock, sleep=clock.sleep)
    assert raised.value.msg == ("timed out after 3.0 s (4 looks) waiting for DaemonSet kube-system/plugin rolled out; "
                                "last seen: {'ready': 1, 'desired': 2}")


def test_a_deadline_already_passed_looks_once():
    clock = Clock()
    waited = _waiter.wait_until("x", answers("starting"), clock() - 1, 1, final_look=True, clock=clock, sleep=clock.sleep)
    assert (waited.done, waited.looks, clock.sleeps) == (False, 1, [])


@pytest.mark.parametrize(("interval", "backoff"), [(-1, 1), (1, 0.5)])
def test_bad_interval_or_backoff_is_refused(interval, backoff):
    with pytest.raises(GpuhardenError, match="wait for x: interval"):
        _waiter.wait_until("x", answers("ready"), 10, interval, backoff=backoff)


# A loop that sleeps between looks is a wait: it belongs in _waiter.
def test_no_other_wait_loop_sleeps():
    found = []
    for root in ("plugins/modules", "plugins/module_utils", "plugins/action"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            relative = str(path.relative_to(REPO_ROOT))
            if relative == "plugins/module_utils/core/_waiter.py":
                continue
            if re.search(r"^\s*(?:time\.)?sleep\(", path.read_text(encoding="utf-8"), re.MULTILINE):
                found.append(relative)
    assert found == [], "a wait loop outside _waiter.wait_until: %s" % found


class Reads:
    """A Client whose reads of one object answer ``answers`` in turn (the last one forever)."""

    who = "runtime_class"

    def __init__(self, *answers):
        self.answers, self.reads = list(answers), 0

    def read(self, _kind, _name, _namespace=None):
        self.reads += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_an_object_deleted_is_waited_for_until_gone_and_a_timeout_names_what_holds_it():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_objects  # noqa: PLC0415 (controller side)

    held = {"metadata": {"name": "nvidia", "finalizers": ["example.com/hold"], "deletionTimestamp": "2026-12-07T03:00:00Z"}}
    clock, client = Clock(), Reads(held, held, None)
    _k8s_objects.wait_gone(client, "RuntimeClass", "nvidia", None, timeout=60, clock=clock, sleep=clock.sleep)
    assert client.reads == 3 and clock.sleeps == [0.5, 0.5]
    clock = Clock()
    with pytest.raises(GpuhardenError) as raised:
        _k8s_objects.wait_gone(Reads(held), "RuntimeClass", "nvidia", None, timeout=2, clock=clock, sleep=clock.sleep)
    assert raised.value.msg == ("runtime_class: timed out after 2.0 s (5 looks) waiting for RuntimeClass nvidia gone after its deletion "
                                "(finalizers?); last seen: {'finalizers': ['example.com/hold'], 'deletionTimestamp': '2026-12-07T03:00:00Z'}")
