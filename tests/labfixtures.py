# SPDX-License-Identifier: GPL-3.0-or-later
"""One lab at a time per lab instance (gpuharden_lab.layout.INSTANCE; one per pytest-xdist worker, see
tests/conftest.py): tests that use the lab take this lock for as long as they use it."""

from __future__ import annotations

import contextlib
import fcntl
import os

from gpuharden_lab import layout, manager


@contextlib.contextmanager
def lab_lock():
    with open(layout.LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def running_lab(scenario: str, **kwargs):
    """A freshly brought-up lab for the duration of the block; always torn down, and checked for leftovers."""
    assert os.geteuid() == 0, "the lab tests need root"
    with lab_lock():
        manager.down()
        try:
            yield manager.up(scenario, **kwargs)
        finally:
            leftovers = manager.down()
        assert leftovers == []
