# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the collection importable as ansible_collections.gpuharden.k8s from this checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One lab instance per pytest-xdist worker (gw0 -> 0, gw1 -> 1, ...), set before anything imports
# gpuharden_lab.layout, which reads it once; subprocesses (the gpuharden CLI, ansible) inherit it.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST_WORKER.startswith("gw"):
    os.environ.setdefault("GPUHARDEN_LAB_INSTANCE", _XDIST_WORKER[2:])

# Hooks: each test's worker, start, end and children's CPU when GPUHARDEN_TEST_TIMELINE names a file; --dist loadfile
# with the modules on one shared lab as one work unit, the units longest first.
from tests.timeline import pytest_runtest_protocol  # noqa: E402,F401 (hook)
from tests.xdist_shared_lab import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: E402,F401 (hooks; after the instance is set)

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / "build" / "collections"
LINK = COLLECTIONS / "ansible_collections" / "gpuharden" / "k8s"

if not LINK.exists():
    LINK.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(REPO, LINK)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


def pytest_sessionfinish(session, exitstatus):
    """The lab that shared_lab left up for a next user comes down with the session (tests/labfixtures.py)."""
    if "tests.labfixtures" in sys.modules:
        leftovers = sys.modules["tests.labfixtures"].take_down_shared_lab()
        if leftovers:
            print("\nthe shared lab left behind: %s" % ", ".join(leftovers), file=sys.stderr)
            session.exitstatus = 1
