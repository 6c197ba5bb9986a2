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

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / "build" / "collections"
LINK = COLLECTIONS / "ansible_collections" / "gpuharden" / "k8s"

if not LINK.exists():
    LINK.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(REPO, LINK)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

LAB_FILE_SECONDS = REPO / "tests" / "integration" / "lab-file-seconds.txt"


def lab_file_seconds(text: str) -> dict[str, float]:
    """The table tools/lab_file_seconds.py writes: `seconds path` per line, `#` comments."""
    seconds = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            value, path = line.split(None, 1)
            seconds[path] = float(value)
    return seconds


def longest_files_first(items, seconds: dict[str, float]):
    """The items, whole files together and each file's own order kept, the longest files (by the table) first; a
    file the table lacks counts as its median.  pytest-xdist's `--dist loadfile --no-loadscope-reorder` then hands
    the long lab files out first (Makefile: integration)."""
    known = sorted(seconds.values())
    default = known[len(known) // 2] if known else 0.0
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        first_index.setdefault(item.nodeid.split("::")[0], index)

    def key(item):
        path = item.nodeid.split("::")[0]
        return (-seconds.get(path, default), first_index[path])

    return sorted(items, key=key)


def pytest_collection_modifyitems(config, items):
    # Only on pytest-xdist's workers, whose collection order is the order the files are handed out in.
    if _XDIST_WORKER and LAB_FILE_SECONDS.exists():
        items[:] = longest_files_first(items, lab_file_seconds(LAB_FILE_SECONDS.read_text()))
