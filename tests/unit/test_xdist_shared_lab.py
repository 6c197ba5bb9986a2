# SPDX-License-Identifier: GPL-3.0-or-later
"""tests/xdist_shared_lab.py: under --dist loadfile the modules of one shared lab run on one xdist worker, in a row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.xdist_shared_lab import shared_lab_scopes

REPO = Path(__file__).resolve().parents[2]
RECORD = """
import json, os
def record(name):
    with open(os.path.join(os.environ["RECORD_DIR"], name), "w") as out:
        json.dump(os.environ.get("PYTEST_XDIST_WORKER"), out)
"""


def test_the_repo_s_healthy_modules_are_one_unit():
    scopes = shared_lab_scopes(REPO)
    assert {module for module, scope in scopes.items() if scope == "shared-lab:healthy"} == {
        "tests/integration/test_identity.py", "tests/integration/test_installed_artifacts.py",
        "tests/integration/test_node_maintenance.py", "tests/integration/test_postcheck_healthy.py"}


@pytest.mark.parametrize("grouped", [True, False])
def test_modules_on_one_shared_lab_run_on_one_worker(tmp_path, grouped):
    """Two modules with six tests each on one shared lab, and a small one: loadfile alone hands the two big ones to
    different workers (its work units go largest first); grouped, one worker runs both."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "record.py").write_text(RECORD)
    for name, count, scenario in (("test_a", 6, "demo"), ("test_b", 6, "demo"), ("test_c", 1, None)):
        body = "from record import record\n# uses: %s\n" % ('shared_lab("%s")' % scenario if scenario else "no lab")
        body += "".join("def test_%d():\n    record('%s-%d')\n" % (i, name, i) for i in range(count))
        (tests / (name + ".py")).write_text(body)
    (tmp_path / "conftest.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nsys.path.insert(0, %r)\n" % (str(REPO), str(tests))
        + ("from tests.xdist_shared_lab import pytest_xdist_make_scheduler\n" if grouped else ""))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "record"
    record.mkdir()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                        "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "RECORD_DIR": str(record)})
    assert p.returncode == 0, p.stdout + p.stderr
    workers = {path.name: json.loads(path.read_text()) for path in record.iterdir()}
    assert len(workers) == 13
    a = {workers["test_a-%d" % i] for i in range(6)}
    b = {workers["test_b-%d" % i] for i in range(6)}
    assert len(a) == len(b) == 1
    assert (a == b) is grouped
