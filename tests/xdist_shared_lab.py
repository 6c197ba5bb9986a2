# SPDX-License-Identifier: GPL-3.0-or-later
"""The xdist scheduler of the lab tests: --dist loadfile, except that the modules that use
tests.labfixtures.shared_lab("<scenario>") (found by their text) are one work unit per scenario, so that one worker runs
them in a row on one lab instead of each module's worker bringing that lab up.  --dist loadgroup would do this with
xdist_group marks, but with pytest 9.2 and pytest-xdist 3.8 it silently stops grouping (pytest-xdist#1386)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SHARED_LAB_CALL = re.compile(r"""\bshared_lab\(["']([a-z0-9-]+)["']\)""")


def shared_lab_scopes(root: Path) -> dict[str, str]:
    """{test module path as node ids spell it: "shared-lab:<scenario>"} for the modules that share one lab."""
    scopes = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        scenarios = set(SHARED_LAB_CALL.findall(path.read_text()))
        if len(scenarios) == 1:
            scopes[path.relative_to(root).as_posix()] = "shared-lab:" + scenarios.pop()
    return scopes


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """Under --dist loadfile, group by shared lab, else by file (xdist/scheduler/loadfile.py's _split_scope)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    scopes = shared_lab_scopes(Path(str(config.rootpath)))

    class SharedLabScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return scopes.get(module, module)

    return SharedLabScheduling(config, log)
