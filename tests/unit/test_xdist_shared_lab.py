# SPDX-License-Identifier: GPL-3.0-or-later
"""tests/xdist_shared_lab.py: under --dist loadfile the modules of one shared lab run on one xdist worker, in a row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.xdist_shared_lab import SHARED_LAB_ORDER, UNIT_SECONDS, shared_lab_scopes

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


def test_the_repo_s_shared_lab_orders_name_their_users():
    """SHARED_LAB_ORDER names every user of each lab it orders, and nothing else; the readers of seed-failures run
    before drift, the first that changes what they read."""
    scopes = shared_lab_scopes(REPO)
    for lab, modules in SHARED_LAB_ORDER.items():
        assert {module for module, scope in scopes.items() if scope == "shared-lab:" + lab} == set(modules), lab
    order = SHARED_LAB_ORDER["seed-failures"]
    assert order.index("tests/integration/test_gpu_consistency.py") < order.index("tests/integration/test_drift.py")
    assert order.index("tests/integration/test_device_cgroup_audit.py") < order.index("tests/integration/test_drift.py")
    assert scopes["tests/integration/test_container_runtime.py"] == "shared-lab:seed-failures/node-roles"


def test_a_unit_is_a_lab_of_its_own(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, call in (("test_a", 'shared_lab("demo")'), ("test_b", 'shared_lab("demo", unit="other")'),
                       ("test_c", 'shared_lab("demo",  unit="other")'), ("test_d", 'shared_lab("demo") and shared_lab("x")')):
        (tests / (name + ".py")).write_text("# uses: %s\n" % call)
    assert shared_lab_scopes(tmp_path) == {"tests/test_a.py": "shared-lab:demo", "tests/test_b.py": "shared-lab:demo/other",
                                           "tests/test_c.py": "shared-lab:demo/other"}


def _recording_module(name, uses_lab, count):
    """Test module ``name`` with ``count`` tests, each appending "<name>-<index> <xdist worker>" to $RECORD."""
    body = "import os, time\n# uses: %s\n" % ('shared_lab("demo")' if uses_lab else "no lab")
    for index in range(count):
        body += "def test_%d():\n    open(os.environ['RECORD'], 'a').write('%s-%d %%s\\n' %% os.environ.get('PYTEST_XDIST_WORKER'))\n" % (
            index, name, index)
        body += "    time.sleep(0.2)\n"
    return body


def _run_project(tmp_path, modules, tables, xdist):
    """Run a throwaway project's tests under this repo's ordering hooks, after ``tables`` (Python statements on
    ``xdist_shared_lab``) set its tables; the lines its tests recorded, in the order they were written."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, body in modules.items():
        (tests / (name + ".py")).write_text(body)
    (tmp_path / "conftest.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom tests import xdist_shared_lab\n%s\n" % (str(REPO), tables)
        + "from tests.xdist_shared_lab import pytest_collection_modifyitems, pytest_xdist_make_scheduler\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "record"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, "tests"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "RECORD": str(record)})
    assert p.returncode == 0, p.stdout + p.stderr
    return [line.split() for line in record.read_text().splitlines()]


@pytest.mark.parametrize("xdist", [["-n", "2", "--dist", "loadfile"], ["-p", "no:xdist"]])
def test_a_shared_lab_s_modules_run_in_the_declared_order(tmp_path, xdist):
    """Collected a, b, c, z; the table puts z before a: z's tests run first, then a's, each module's in its own order;
    b (no shared lab) and c (unlisted user) keep their places relative to the group."""
    modules = {name: _recording_module(name, uses, count) for name, count, uses in
               (("test_a", 3, True), ("test_b", 2, False), ("test_c", 1, True), ("test_z", 3, True))}
    ran = [name for name, _worker in _run_project(
        tmp_path, modules, "xdist_shared_lab.SHARED_LAB_ORDER['demo'] = ['tests/test_z.py', 'tests/test_a.py']", xdist)]
    group = [name for name in ran if not name.startswith("test_b")]
    assert group == ["test_z-0", "test_z-1", "test_z-2", "test_a-0", "test_a-1", "test_a-2", "test_c-0"], ran
    if xdist == ["-p", "no:xdist"]:
        assert ran[:7] == group  # the group stands at the place of its first test, a's, before b


@pytest.mark.parametrize("xdist", [["-n", "2", "--dist", "loadfile"], ["-p", "no:xdist"]])
def test_the_longest_units_go_out_first(tmp_path, xdist):
    """UNIT_SECONDS puts c (10 s) before the demo lab's a and b (5 s), and those before d (unlisted): with one worker
    they run in that order, and with two one worker takes c, the other the lab's unit."""
    modules = {name: _recording_module(name, uses, 1) for name, uses in
               (("test_a", True), ("test_b", True), ("test_c", False), ("test_d", False))}
    tables = "xdist_shared_lab.UNIT_SECONDS.clear()\nxdist_shared_lab.UNIT_SECONDS.update({'tests/test_c.py': 10, 'shared-lab:demo': 5})"
    ran = _run_project(tmp_path, modules, tables, xdist)
    if xdist == ["-p", "no:xdist"]:
        assert [name for name, _worker in ran] == ["test_c-0", "test_a-0", "test_b-0", "test_d-0"]
    else:
        worker = dict(ran)
        assert worker["test_a-0"] == worker["test_b-0"] != worker["test_c-0"]
        assert [name for name, _worker in ran][:2] in (["test_c-0", "test_a-0"], ["test_a-0", "test_c-0"])


def test_every_timed_unit_exists():
    scopes = shared_lab_scopes(REPO)
    for unit in UNIT_SECONDS:
        assert unit in set(scopes.values()) or ((REPO / unit).is_file() and unit not in scopes), unit
