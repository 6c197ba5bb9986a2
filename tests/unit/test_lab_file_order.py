# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab files run longest first under pytest-xdist (tests/conftest.py, tools/lab_file_seconds.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.conftest import LAB_FILE_SECONDS, REPO, lab_file_seconds, longest_files_first

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_short" name="test_a" time="10.5"/>
<testcase classname="tests.integration.test_long" name="test_a" time="100.0"/>
<testcase classname="tests.integration.test_long" name="test_b" time="20.0"/>
<testcase classname="tests.integration.test_classy.TestGroup" name="test_c" time="30.0"/>
</testsuite></testsuites>
"""


def _items(*nodeids):
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def test_the_tool_sums_each_file_and_writes_the_longest_first(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    out = subprocess.run([sys.executable, str(REPO / "tools" / "lab_file_seconds.py"), str(junit)],
                         check=True, capture_output=True, text=True).stdout
    assert lab_file_seconds(out) == {"tests/integration/test_long.py": 120.0,
                                     "tests/integration/test_classy.py": 30.0,
                                     "tests/integration/test_short.py": 10.5}
    rows = [line.split()[1] for line in out.splitlines() if not line.startswith("#")]
    assert rows == ["tests/integration/test_long.py", "tests/integration/test_classy.py",
                    "tests/integration/test_short.py"]


def test_files_move_whole_longest_first_keeping_their_own_order():
    items = _items("a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "c.py::t3")
    ordered = longest_files_first(items, {"a.py": 5.0, "b.py": 50.0, "c.py": 20.0})
    assert [item.nodeid for item in ordered] == ["b.py::t1", "c.py::t1", "c.py::t2", "c.py::t3", "a.py::t1",
                                                 "a.py::t2"]


def test_a_file_the_table_lacks_counts_as_the_median():
    items = _items("new.py::t", "short.py::t", "mid.py::t", "long.py::t")
    ordered = longest_files_first(items, {"short.py": 1.0, "mid.py": 10.0, "long.py": 100.0})
    # median 10: after long, and before mid, which it ties with but precedes in collection order
    assert [item.nodeid for item in ordered] == ["long.py::t", "new.py::t", "mid.py::t", "short.py::t"]


def test_the_committed_table_names_existing_lab_files():
    table = lab_file_seconds(LAB_FILE_SECONDS.read_text())
    assert len(table) >= 10
    missing = [path for path in table if not (REPO / path).is_file()]
    assert not missing, "tests/integration/lab-file-seconds.txt names files that are gone: %s" % missing
