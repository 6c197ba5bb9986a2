# SPDX-License-Identifier: GPL-3.0-or-later
"""One lab at a time per lab instance (gpuharden_lab.layout.INSTANCE; one per pytest-xdist worker, see
tests/conftest.py): tests that use the lab take this lock for as long as they use it."""

from __future__ import annotations

import contextlib
import fcntl
import os

from gpuharden_lab import layout, manager, realnode
from gpuharden_lab.scenario import load

from tests.builds import skip_unbuilt


@contextlib.contextmanager
def lab_lock():
    with open(layout.LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _require_built(scenario: str, node_count: int | None = None, stand_ins: bool = False) -> None:
    nodes = load(scenario, node_count=node_count, stand_ins=stand_ins).nodes
    if any(spec.real_containerd is not None for spec in nodes) and not realnode.available():
        skip_unbuilt("the %s lab runs the real kubelet and containerd, which are not built: run `make real-lab` "
                     "(or `make real-components`)" % scenario)


# "lab": the lab (scenario and unit) this process left up for the next shared_lab user; None once discarded, which the
# next shared_lab replaces and the session's end still takes down.  Empty: nothing left up.
_kept: dict[str, str | None] = {}


@contextlib.contextmanager
def running_lab(scenario: str, **kwargs):
    """A freshly brought-up lab for the duration of the block; always torn down, and checked for leftovers.  A module
    that passes ``stand_ins=True`` says in its docstring what it reads that only the stand-ins give."""
    assert os.geteuid() == 0, "the lab tests need root"
    _require_built(scenario, kwargs.get("node_count"), kwargs.get("stand_ins", False))
    with lab_lock():
        _kept.clear()
        manager.down()
        try:
            yield manager.up(scenario, **kwargs)
        finally:
            leftovers = manager.down()
        assert leftovers == []


@contextlib.contextmanager
def shared_lab(scenario: str, unit: str | None = None):
    """The scenario's lab, shared by consecutive test modules of this process: the first one brings it up, and it stays
    up for the next shared_lab of the same scenario and unit (a unit: another set of users, on a lab of its own).  A
    user that changes what a later user reads (their order: tests/xdist_shared_lab.py) puts it back before the block
    ends, or calls discard_shared_lab() so that the next user starts afresh.  running_lab, another lab, and the end of
    the session (take_down_shared_lab, tests/conftest.py) take it down."""
    assert os.geteuid() == 0, "the lab tests need root"
    _require_built(scenario)
    lab = scenario + ("/" + unit if unit else "")
    with lab_lock():
        state = manager.load_state()
        if _kept.get("lab") != lab or state is None or state.get("status") != "up":
            _kept.clear()
            manager.down()
            state = manager.up(scenario)
            _kept["lab"] = lab
        yield state


def discard_shared_lab() -> None:
    """The shared lab was changed and is not put back: the next shared_lab brings a fresh one up.  It stays up until
    then, or until the session's end takes it down (take_down_shared_lab)."""
    if _kept:
        _kept["lab"] = None


def take_down_shared_lab() -> list[str]:
    """At the session's end: the shared lab, if this process left one up, comes down; what is left behind."""
    if not _kept:
        return []
    with lab_lock():
        _kept.clear()
        return manager.down()
