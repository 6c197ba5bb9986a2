# SPDX-License-Identifier: GPL-3.0-or-later
"""The xdist scheduler of the lab tests: --dist loadfile, except that the modules that use
tests.labfixtures.shared_lab("<scenario>") (found by their text) are one work unit per scenario, so that one worker runs
them in a row on one lab instead of each module's worker bringing that lab up.  --dist loadgroup would do this with
xdist_group marks, but with pytest 9.2 and pytest-xdist 3.8 it silently stops grouping (pytest-xdist#1386).

The units go out longest first (UNIT_SECONDS), and the modules of one shared lab run in the order SHARED_LAB_ORDER
gives: both by pytest_collection_modifyitems, with or without xdist."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

# shared_lab("<scenario>") or shared_lab("<scenario>", unit="<name>"): its lab is "<scenario>" or "<scenario>/<name>".
SHARED_LAB_CALL = re.compile(r"""\bshared_lab\(["']([a-z0-9-]+)["'](?:,\s*unit=["']([a-z0-9-]+)["'])?\)""")

# Per shared lab, its users in the order they run; a user missing here runs after these, in file order.
# seed-failures: gpu_consistency and device_cgroup_audit only read.  drift reads every seeded fault, then its last test
# remediates three nodes and rolls the plugin out, so it discards the lab.  postcheck, on a fresh one, deletes the
# Deployment it adds; its last test fixes seed-dev-perm's device permissions, which cgroup_limits reads only to be
# refused there for want of a memory controller.  cgroup_limits changes seed-memory-high, and discards the lab.
SHARED_LAB_ORDER = {
    "seed-failures": ["tests/integration/test_gpu_consistency.py", "tests/integration/test_device_cgroup_audit.py",
                      "tests/integration/test_drift.py", "tests/integration/test_postcheck.py",
                      "tests/integration/test_cgroup_limits.py"],
    # Each changes its own things on nodes, and reads nothing the ones before it change: kubelet_topology the kubelet
    # of three nodes, device_permissions /dev and modprobe.d on every node, container_runtime containerd's
    # configuration (the last, as it replaces seed-topology-none's with its fixtures).
    "seed-failures/node-roles": ["tests/integration/test_kubelet_topology.py", "tests/integration/test_device_permissions.py",
                                 "tests/integration/test_container_runtime.py"],
}

# Seconds each lab work unit took in a fresh-clone `make test` here (2026-12-05, build/integration-junit.xml, tests'
# times summed).  Only the order the units go out in: the longest first, so that the last ones are short and the two
# workers end together.  A unit missing here goes after these; a stale figure costs balance, never a result.
UNIT_SECONDS = {
    "shared-lab:seed-failures": 715, "shared-lab:seed-failures/node-roles": 498, "shared-lab:healthy": 398,
    "tests/integration/test_unharden.py": 227, "tests/integration/test_disruption.py": 226,
    "tests/integration/test_device_plugin.py": 201, "tests/integration/test_bootstrap.py": 300,
    "tests/integration/test_mig.py": 168, "tests/integration/test_real_nodes.py": 156,
    "tests/integration/test_admission_and_restarts.py": 147, "tests/integration/test_real_nodes_harden.py": 138,
    "tests/integration/test_unharden_seeded.py": 94, "tests/integration/test_numa_limit.py": 90, "tests/integration/test_kubelet_json.py": 25,
    "tests/integration/test_explain.py": 420, "tests/integration/test_node_prerequisites.py": 47,
    "tests/integration/test_gpu_operator.py": 60, "tests/lab/test_scenarios.py": 45, "tests/lab/test_lab_cluster.py": 28,
    "tests/integration/test_k8s_retry.py": 33, "tests/integration/test_drift_parity.py": 460,
    "tests/lab/test_lab_lifecycle.py": 22, "tests/lab/test_scenarios_mixed.py": 9,
}


@functools.cache  # the scheduler and the collection hook both ask, once per process
def shared_lab_scopes(root: Path) -> dict[str, str]:
    """{test module path as node ids spell it: "shared-lab:<lab>"} for the modules that share one lab."""
    scopes = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        labs = {scenario + ("/" + unit if unit else "") for scenario, unit in SHARED_LAB_CALL.findall(path.read_text())}
        if len(labs) == 1:
            scopes[path.relative_to(root).as_posix()] = "shared-lab:" + labs.pop()
    return scopes


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """Under --dist loadfile, group by shared lab, else by file (xdist/scheduler/loadfile.py's _split_scope); the units
    go out in collection order, not largest first by test count (xdist/scheduler/loadscope.py's schedule)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    scopes = shared_lab_scopes(Path(str(config.rootpath)))
    config.option.loadscopereorder = False  # hand the units out in collection order: pytest_collection_modifyitems's

    class SharedLabScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return scopes.get(module, module)

    return SharedLabScheduling(config, log)


def shared_lab_position(module: str, scope: str) -> int:
    """Where a module of a shared lab runs among that lab's users: its SHARED_LAB_ORDER place, else after those."""
    order = SHARED_LAB_ORDER.get(scope.split(":", 1)[1], [])
    return order.index(module) if module in order else len(order)


def pytest_collection_modifyitems(session, config, items):
    """The work units in a row, the longest first (UNIT_SECONDS; the unlisted after them, as collected); a shared
    lab's modules in SHARED_LAB_ORDER; each module's tests in their order (the sorts are stable)."""
    scopes = shared_lab_scopes(Path(str(config.rootpath)))
    units: dict[str, list] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        units.setdefault(scopes.get(module, module), []).append(item)
    ordered = []
    for scope in sorted(units, key=lambda unit: -UNIT_SECONDS.get(unit, 0)):
        members = units[scope]
        if scope.startswith("shared-lab:"):
            members = sorted(members, key=lambda member, scope=scope: shared_lab_position(member.nodeid.split("::", 1)[0], scope))
        ordered.extend(members)
    items[:] = ordered
