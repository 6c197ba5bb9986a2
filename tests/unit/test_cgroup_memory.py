# SPDX-License-Identifier: GPL-3.0-or-later
"""cgroup_memory: the pure planner, the hierarchy check, and the module run on temp cgroup trees."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _cgroup_memory
from ansible_collections.gpuharden.k8s.plugins.modules import cgroup_memory

from tests.unit.conftest import run_module

GI = 1024**3
PAGE = 4096
UID_A = "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162"
UID_B = "9b1e7c55-0000-4a4a-8b8b-123456789abc"
UID_C = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
UID_MISSING = "11111111-2222-3333-4444-555555555555"
CONTAINER = "cri-containerd-" + "ab" * 32 + ".scope"
EXPECTED_16G = (16 * GI * 9 // 10) // PAGE * PAGE  # floor(16Gi x 0.9 / 4096) x 4096


def systemd_pod(uid, qos):
    escaped = uid.replace("-", "_")
    if qos == "guaranteed":
        return "/kubepods.slice/kubepods-pod%s.slice" % escaped
    return "/kubepods.slice/kubepods-%s.slice/kubepods-%s-pod%s.slice" % (qos, qos, escaped)


def cgroupfs_pod(uid, qos):
    return "/kubepods/pod%s" % uid if qos == "guaranteed" else "/kubepods/%s/pod%s" % (qos, uid)


def write_cgroup(root: Path, cgroup: str, memory_max, memory_high="max"):
    directory = root / cgroup.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    if memory_max is not None:
        (directory / "memory.max").write_text("%s\n" % memory_max)
    if memory_high is not None:
        (directory / "memory.high").write_text("%s\n" % memory_high)
    return directory


@pytest.fixture
def tree(world_tmp):
    """A cgroup v2 root with three GPU pods: A limited (systemd, burstable), B unlimited, C cgroupfs guaranteed."""
    root = world_tmp / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    pod_a = systemd_pod(UID_A, "burstable")
    write_cgroup(root, pod_a, 16 * GI)
    write_cgroup(root, pod_a + "/" + CONTAINER, 16 * GI)
    write_cgroup(root, pod_a + "/cri-containerd-" + "cd" * 32 + ".scope", "max")  # the sandbox: no limit
    pod_b = systemd_pod(UID_B, "besteffort")
    write_cgroup(root, pod_b, "max")
    write_cgroup(root, pod_b + "/" + CONTAINER, "max")
    pod_c = cgroupfs_pod(UID_C, "guaranteed")
    write_cgroup(root, pod_c, 8 * GI)
    write_cgroup(root, pod_c + "/" + "ef" * 32, 8 * GI)
    return root


def snapshot_tree(root: Path):
    """Every path below root with its content hash and mtime: 'byte-identical and untouched'."""
    state = {}
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            with open(path, "rb") as handle:
                state[path] = (hashlib.sha256(handle.read()).hexdigest(), os.stat(path).st_mtime_ns)
        for name in dirs:
            state[os.path.join(top, name)] = "dir"
    return state


def run(tree_root, **args):
    args.setdefault("cgroup_root", str(tree_root))
    args.setdefault("page_size", PAGE)
    return run_module("cgroup_memory", args, {})


# ---------------------------------------------------------------------------------------------
# Pure functions


@pytest.mark.parametrize(
    ("memory_max", "factor", "page", "expected"),
    [
        (16 * GI, "0.9", 4096, EXPECTED_16G),
        (16 * GI, "1.0", 4096, 16 * GI),
        (1000 * 1000 * 1000, "0.9", 4096, 899997696),
        (8 * GI, "0.8", 65536, 6871908352),
        (4096, "0.5", 4096, 0),
    ],
)
def test_memory_high_for_is_floor_to_page(memory_max, factor, page, expected):
    assert _cgroup_memory.memory_high_for(memory_max, Decimal(factor), page) == expected
    assert expected % page == 0


def test_memory_high_uses_exact_arithmetic():
    # 0.9 as a binary float is 0.90000000000000002220...; exact decimal keeps a boundary case on its page.
    pages = 10
    memory_max = pages * PAGE * 10 // 9 * 1  # not a multiple: floor must not jump a page either way
    assert _cgroup_memory.memory_high_for(memory_max, _cgroup_memory.check_factor(0.9), PAGE) == (memory_max * 9 // 10) // PAGE * PAGE
    assert _cgroup_memory.memory_high_for(10 * PAGE, _cgroup_memory.check_factor(0.9), PAGE) == 9 * PAGE


@pytest.mark.parametrize(
    ("name", "driver", "expected"),
    [
        ("kubepods-burstable-pod0f3c2a1e_5b7d_4c8e_9a6f_1d2e3f405162.slice", "systemd", (UID_A, "burstable")),
        ("kubepods-besteffort-pod0f3c2a1e_5b7d_4c8e_9a6f_1d2e3f405162.slice", "systemd", (UID_A, "besteffort")),
        ("kubepods-pod0f3c2a1e_5b7d_4c8e_9a6f_1d2e3f405162.slice", "systemd", (UID_A, "guaranteed")),
        ("kubepods-burstable.slice", "systemd", None),
        ("pod0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162", "cgroupfs", (UID_A, None)),
        ("burstable", "cgroupfs", None),
    ],
)
def test_pod_dir_uid(name, driver, expected):
    assert _cgroup_memory.pod_dir_uid(name, driver) == expected


def test_normalize_uids_lowercases_and_dedupes():
    static = "d41d8cd98f00b204e9800998ecf8427e"
    assert _cgroup_memory.normalize_uids([UID_A.upper(), UID_A, static]) == [UID_A, static]


@pytest.mark.parametrize(
    ("controllers", "mounts", "where", "message"),
    [
        (None, "tmpfs /sys/fs/cgroup tmpfs ro 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n", None, "cgroup v1 hierarchy (memory)"),
        (None, "tmpfs /sys/fs/cgroup tmpfs ro 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n", None, "v1"),
        (None, "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n", "/sys/fs/cgroup/memory", "cgroup v1 hierarchy (memory)"),
        (None, "/dev/sda1 / ext4 rw 0 0\n", None, "not a cgroup v2 hierarchy (no cgroup.controllers, mounted as ext4)"),
        (None, "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", None, "has no cgroup.controllers"),
        ("cpuset cpu io pids\n", "", None, "has no memory controller"),
        ("", "", None, "(empty) has no memory controller"),
    ],
)
def test_check_hierarchy_refuses(controllers, mounts, where, message):
    with pytest.raises(GpuhardenError) as caught:
        _cgroup_memory.check_hierarchy("/sys/fs/cgroup", controllers, mounts, where=where)
    assert message in caught.value.msg.replace("cgroup.controllers (empty)", "(empty)")


def test_check_hierarchy_accepts_v2_with_memory():
    assert "memory" in _cgroup_memory.check_hierarchy("/sys/fs/cgroup", "cpu io memory pids\n", "")


def test_mount_points_with_escaped_spaces():
    mounts = "cgroup /mnt/my\\040cgroups/memory cgroup rw,memory 0 0\n"
    with pytest.raises(GpuhardenError, match="cgroup v1"):
        _cgroup_memory.check_hierarchy("/mnt/my cgroups", None, mounts)


def test_plan_decides_pod_and_container_writes(tree):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A, UID_B, UID_C])
    assert {uid: [entry["driver"] for entry in entries] for uid, entries in snapshot.items()} == {
        UID_A: ["systemd"], UID_B: ["systemd"], UID_C: ["cgroupfs"]
    }
    planned = _cgroup_memory.plan("/sys/fs/cgroup", [UID_A, UID_B, UID_C, UID_MISSING], snapshot, Decimal("0.9"), PAGE)
    paths = sorted(change.path for change in planned["changes"])
    pod_a = "/sys/fs/cgroup" + systemd_pod(UID_A, "burstable")
    pod_c = "/sys/fs/cgroup" + cgroupfs_pod(UID_C, "guaranteed")
    assert paths == sorted(
        [pod_a + "/memory.high", pod_a + "/" + CONTAINER + "/memory.high", pod_c + "/memory.high", pod_c + "/" + "ef" * 32 + "/memory.high"]
    )
    values = {change.path: change.after for change in planned["changes"]}
    assert values[pod_a + "/memory.high"] == "%d\n" % EXPECTED_16G
    assert values[pod_c + "/memory.high"] == "%d\n" % ((8 * GI * 9 // 10) // PAGE * PAGE)
    assert planned["unlimited_pods"] == [UID_B]
    assert planned["not_found"] == [UID_MISSING]
    by_uid = {pod["uid"]: pod for pod in planned["pods"]}
    assert by_uid[UID_A]["qos"] == "burstable" and by_uid[UID_C]["qos"] == "guaranteed"
    assert [entry["action"] for entry in by_uid[UID_A]["containers"]] == ["set", "unlimited"]
    assert {finding["id"] for finding in planned["findings"]} == {"gpu-pod-memory-high-unset", "gpu-pod-no-memory-limit"}


def test_plan_leaves_a_set_memory_high_alone(tree):
    pod_a = systemd_pod(UID_A, "burstable")
    (tree / pod_a.lstrip("/") / "memory.high").write_text("%d\n" % (12 * GI))
    planned = _cgroup_memory.plan("/x", [UID_A], _cgroup_memory.scan_pods(str(tree), [UID_A]), Decimal("0.9"), PAGE)
    assert planned["pods"][0]["action"] == "already_set"
    assert [change.path for change in planned["changes"]] == ["/x" + pod_a + "/" + CONTAINER + "/memory.high"]


def test_scan_reads_only_the_wanted_pods(tree):
    (tree / systemd_pod(UID_B, "besteffort").lstrip("/") / "memory.max").write_text("garbage\n")
    # B's broken file is never read when B is not asked for.
    planned = _cgroup_memory.plan("/x", [UID_A], _cgroup_memory.scan_pods(str(tree), [UID_A]), Decimal("0.9"), PAGE)
    assert planned["not_found"] == [] and len(planned["changes"]) == 2


# ---------------------------------------------------------------------------------------------
# The module, run as Ansible runs it


def test_module_check_mode_then_apply_then_idempotent(tree):
    before = snapshot_tree(tree)
    args = {"pod_uids": [UID_A, UID_B, UID_C, UID_MISSING], "_ansible_check_mode": True, "_ansible_diff": True}
    checked = run(tree, **args)
    assert checked["changed"] is True, checked
    assert len(checked["updated"]) == 4 and len(checked["diff"]) == 4
    assert checked["diff"][0]["before"] == "max\n"
    assert snapshot_tree(tree) == before  # check mode touched nothing

    applied = run(tree, pod_uids=[UID_A, UID_B, UID_C, UID_MISSING])
    assert applied["changed"] is True
    assert applied["updated"] == checked["updated"]
    assert applied["unlimited_pods"] == [UID_B]
    assert applied["not_found"] == [UID_MISSING]
    assert UID_B in str(applied["warnings"])  # structured warning events in ansible-core 2.19
    pod_a = tree / systemd_pod(UID_A, "burstable").lstrip("/")
    assert (pod_a / "memory.high").read_text() == "%d\n" % EXPECTED_16G
    assert (pod_a / CONTAINER / "memory.high").read_text() == "%d\n" % EXPECTED_16G
    assert (pod_a / ("cri-containerd-" + "cd" * 32 + ".scope") / "memory.high").read_text() == "max\n"
    assert (tree / systemd_pod(UID_B, "besteffort").lstrip("/") / "memory.high").read_text() == "max\n"

    after = snapshot_tree(tree)
    again = run(tree, pod_uids=[UID_A, UID_B, UID_C, UID_MISSING], _ansible_diff=True)
    assert again["changed"] is False and again["updated"] == [] and again["diff"] == []
    assert snapshot_tree(tree) == after


def test_module_with_root_reads_below_it(tree):
    result = run(tree, root=str(tree.parent), cgroup_root="/" + tree.name, pod_uids=[UID_A], _ansible_check_mode=True)
    assert result["changed"] is True
    assert result["cgroup_root"] == "/" + tree.name
    assert result["updated"][0]["path"].startswith("/%s/kubepods.slice/" % tree.name)


def test_module_empty_pod_list_only_checks_the_hierarchy(tree):
    result = run(tree)
    assert result["changed"] is False and result["pods"] == []


def test_module_page_size_defaults_to_the_nodes(tree):
    result = run_module("cgroup_memory", {"cgroup_root": str(tree), "pod_uids": [UID_A], "_ansible_check_mode": True}, {})
    assert result["page_size"] == os.sysconf("SC_PAGE_SIZE")


def test_argument_spec_matches_documentation():
    import yaml

    documented = yaml.safe_load(cgroup_memory.DOCUMENTATION)["options"]
    spec = _cgroup_memory.argument_spec()
    assert set(documented) | {"root"} == set(spec)
    for name, option in documented.items():
        assert option["type"] == spec[name]["type"]
        assert option.get("default") == spec[name].get("default")


# ---------------------------------------------------------------------------------------------
# Malformed input: a clear message naming the file/field/value, and the tree byte-identical.

POD_A = systemd_pod(UID_A, "burstable")
POD_A_CONTAINER = POD_A + "/" + CONTAINER


def _put(relative, content):
    def mutate(root):
        path = root / relative.lstrip("/")
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return mutate


def _replace_with_dir(relative):
    def mutate(root):
        path = root / relative.lstrip("/")
        path.unlink()
        path.mkdir()

    return mutate


def _v1(root):
    (root / "cgroup.controllers").unlink()


def _no_memory_controller(root):
    (root / "cgroup.controllers").write_text("cpuset cpu io pids\n")


def _second_driver(root):
    write_cgroup(root, cgroupfs_pod(UID_A, "burstable"), 16 * GI)


MALFORMED = [
    ("factor-zero", None, {"factor": 0}, "factor=0.0 is out of range"),
    ("factor-above-one", None, {"factor": 1.5}, "factor=1.5 is out of range"),
    ("factor-negative", None, {"factor": -0.1}, "factor=-0.1 is out of range"),
    ("factor-nan", None, {"factor": "nan"}, "factor=nan is out of range"),
    ("factor-not-a-number", None, {"factor": "ninety"}, "factor"),
    ("page-size-zero", None, {"page_size": 0}, "page_size=0 is not a positive power of two"),
    ("page-size-odd", None, {"page_size": 3000}, "page_size=3000 is not a positive power of two"),
    ("page-size-text", None, {"page_size": "big"}, "page_size"),
    ("uid-not-a-uid", None, {"pod_uids": [UID_A, "infer-0"]}, "pod_uids[1]='infer-0' is not a Kubernetes pod UID"),
    ("uid-path-traversal", None, {"pod_uids": ["../../etc"]}, "pod_uids[0]='../../etc' is not a Kubernetes pod UID"),
    ("uid-with-underscores", None, {"pod_uids": [UID_A.replace("-", "_")]}, "is not a Kubernetes pod UID"),
    ("pod-uids-not-a-list", None, {"pod_uids": {"a": 1}}, "pod_uids"),
    ("memory-max-garbage", _put(POD_A + "/memory.max", "sixteen gigs\n"), {}, "memory.max holds 'sixteen gigs\\n', expected \"max\" or a byte count"),
    ("memory-max-negative", _put(POD_A + "/memory.max", "-5\n"), {}, "memory.max holds '-5\\n'"),
    ("memory-max-empty", _put(POD_A + "/memory.max", ""), {}, "memory.max holds ''"),
    ("memory-max-two-lines", _put(POD_A + "/memory.max", "1\n2\n"), {}, "memory.max holds '1\\n2\\n'"),
    ("memory-high-suffix", _put(POD_A + "/memory.high", "12G\n"), {}, "memory.high holds '12G\\n'"),
    ("memory-max-not-utf8", _put(POD_A + "/memory.max", b"\xff\xfe\n"), {}, "memory.max: not UTF-8 text"),
    ("memory-max-directory", _replace_with_dir(POD_A + "/memory.max"), {}, "memory.max: is a directory"),
    ("container-garbage-pod-fine", _put(POD_A_CONTAINER + "/memory.max", "lots\n"), {}, CONTAINER + "/memory.max holds 'lots\\n'"),
    ("cgroup-v1", _v1, {}, "is not a cgroup v2 hierarchy"),
    ("no-memory-controller", _no_memory_controller, {}, "has no memory controller"),
    ("two-pod-cgroups", _second_driver, {}, "has more than one pod cgroup"),
    ("cgroup-root-missing", None, {"cgroup_root": "/nonexistent/cgroup"}, "cgroup_root=/nonexistent/cgroup is not a directory"),
    ("root-missing", None, {"root": "/nonexistent-root"}, "root=/nonexistent-root is not a directory"),
]


@pytest.mark.parametrize(("case", "mutate", "args", "message"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_malformed_input_fails_clearly_and_touches_nothing(tree, case, mutate, args, message):
    if mutate:
        mutate(tree)
    before = snapshot_tree(tree)
    result = run(tree, **dict({"pod_uids": [UID_A, UID_B, UID_C]}, **args))
    assert result.get("failed") is True, (case, result)
    assert message in result["msg"], (case, result["msg"])
    assert snapshot_tree(tree) == before


def test_malformed_case_count():
    assert len(MALFORMED) >= 15


def test_file_named_cgroup_root_is_refused(world_tmp):
    target = world_tmp / "file"
    target.write_text("x")
    result = run(target)
    assert result["failed"] and "is not a directory" in result["msg"]
    assert target.read_text() == "x"


def test_a_target_that_is_no_cgroup_file_is_refused_before_the_first_write(tree):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A])
    planned = _cgroup_memory.plan(str(tree), [UID_A], snapshot, Decimal("0.9"), PAGE)
    first, second = planned["changes"]
    os.unlink(second.path)
    os.mkdir(second.path)
    before = snapshot_tree(tree)
    with pytest.raises(GpuhardenError) as caught:
        _cgroup_memory.write_values(planned["changes"])
    assert "is a directory, not a cgroup file" in caught.value.msg
    assert snapshot_tree(tree) == before  # the first file was not written either


def test_a_value_the_kernel_refuses_puts_the_earlier_writes_back(tree, monkeypatch):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A])
    planned = _cgroup_memory.plan(str(tree), [UID_A], snapshot, Decimal("0.9"), PAGE)
    first, second = planned["changes"]
    write_one = _cgroup_memory._write_one

    def kernel(target, value):  # the kernel refuses the second value (EINVAL), as it does for a value it cannot take
        if target == second.path and value == second.after:
            raise OSError(errno.EINVAL, "Invalid argument")
        return write_one(target, value)

    monkeypatch.setattr(_cgroup_memory, "_write_one", kernel)
    with pytest.raises(GpuhardenError) as caught:
        _cgroup_memory.write_values(planned["changes"])
    assert caught.value.result == {"changed": False, "written": []}
    assert "Invalid argument" in caught.value.msg and "put back" in caught.value.msg
    assert Path(first.path).read_text().strip() == "max"


def test_an_immutable_memory_file_is_refused_before_the_first_write(tree):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A])
    planned = _cgroup_memory.plan(str(tree), [UID_A], snapshot, Decimal("0.9"), PAGE)
    _first, second = planned["changes"]
    if subprocess.run(["chattr", "+i", second.path], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not supported here")
    before = snapshot_tree(tree)
    try:
        with pytest.raises(GpuhardenError, match="the file is immutable"):
            _cgroup_memory.write_values(planned["changes"])
        assert snapshot_tree(tree) == before
    finally:
        subprocess.run(["chattr", "-i", second.path], check=True)


def test_a_cgroup_that_vanishes_before_its_write_is_reported(tree):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A])
    planned = _cgroup_memory.plan(str(tree), [UID_A], snapshot, Decimal("0.9"), PAGE)
    first, second = planned["changes"]
    os.unlink(second.path)
    written, vanished = _cgroup_memory.write_values(planned["changes"])
    assert written == [first] and vanished == [second]
    assert not os.path.exists(second.path)  # never created


def test_a_memory_high_changed_since_it_was_read_is_not_overwritten(tree):
    snapshot = _cgroup_memory.scan_pods(str(tree), [UID_A])
    planned = _cgroup_memory.plan(str(tree), [UID_A], snapshot, Decimal("0.9"), PAGE)
    _first, second = planned["changes"]
    with open(second.path, "w") as handle:
        handle.write("1234567\n")
    with pytest.raises(GpuhardenError, match="someone else set it"):
        _cgroup_memory.write_values(planned["changes"])
    assert Path(second.path).read_text() == "1234567\n"
