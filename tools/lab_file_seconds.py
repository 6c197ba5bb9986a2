#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write tests/integration/lab-file-seconds.txt from the junit report `make integration` keeps.

pytest-xdist's `--dist loadfile` hands whole test files to the lab workers in collection order
(`--no-loadscope-reorder`), giving a worker its next file when it is almost done with the last.  tests/conftest.py
collects the lab files longest first from this table, so the long files start early and no worker is left alone
with one at the end.  A file missing from the table counts as the table's median.

Usage: .venv/bin/python tools/lab_file_seconds.py build/integration-junit.xml > tests/integration/lab-file-seconds.txt
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def file_seconds(junit_path: str) -> dict[str, float]:
    """Each test file's seconds (setup, call and teardown of its tests), from a pytest junit report."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        module = case.get("classname", "").split("::")[0]
        # pytest's classname is the dotted module path, with the test class (if any) appended.
        parts = module.split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time", "0"))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = file_seconds(argv[1])
    if not seconds:
        print("%s: no test case with a time" % argv[1], file=sys.stderr)
        return 1
    print("# Seconds per lab test file, from %s (tools/lab_file_seconds.py); tests/conftest.py runs the" % argv[1])
    print("# longest first.  Refresh it when a lab file is added or changes much.")
    for path, total in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        print("%7.1f %s" % (total, path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
