# SPDX-License-Identifier: GPL-3.0-or-later
"""nvml_check against the NVML double: the real module process (fork + setuid to nobody), real device nodes,
one fixture per fault; plus the pure findings logic and the malformed inputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml_health
from gpuharden_lab import NVML_FIXTURES

from tests.unit.conftest import run_module

SEVERE = ("warning", "error", "critical")


def _fixture(name):
    return json.loads((NVML_FIXTURES / (name + ".json")).read_text())


def _run(node, **args):
    return run_module("nvml_check", dict({"root": str(node.root), "node_name": "n1"}, **args), node.env())


def _ids(result, severities=SEVERE):
    return sorted((entry["id"], (entry["gpu"] or {}).get("index")) for entry in result["findings"] if entry["severity"] in severities)


def _tree_digest(root):
    """sha256 over every file's path, mode, owner and content (device nodes: their numbers) under root."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            st = os.lstat(path)
            digest.update(("%s %o %d:%d %d\n" % (path, st.st_mode, st.st_uid, st.st_gid, st.st_rdev)).encode())
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


# --- the fixtures, as the module sees them ------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["dgx-a100-80gb", "h100-sxm5-80gb", "l4", "h100-mig-enabled"])
def test_healthy_fixtures_report_nothing(make_node, fixture):
    data = _fixture(fixture)
    node = make_node(fixture)
    mig = sum(len(gpu.get("mig", {}).get("gpu_instances", [])) for gpu in data["gpus"] if gpu.get("mig", {}).get("mode"))
    result = _run(node, expected_gpus=len(data["gpus"]), expected_mig_devices=None if fixture != "dgx-a100-80gb" else 0)
    assert not result.get("failed"), result.get("msg")
    assert _ids(result, _findings.SEVERITIES) == []
    assert result["max_severity"] is None
    assert result["gpu_count"] == result["driver_gpu_count"] == len(data["gpus"])
    assert result["unprivileged"]["available"] is True and result["unprivileged"]["uid"] == 65534
    assert all(gpu["unprivileged_error"] is None and gpu["error"] is None for gpu in result["gpus"])
    if fixture == "h100-mig-enabled":
        assert result["mig_device_count"] >= mig


def test_pcie_trained_down_reports_current_max_and_ratio(make_node):
    result = _run(make_node("dgx-a100-pcie-degraded"))
    assert _ids(result) == [("nvlink_down", 3), ("pcie_link_degraded", 3)]
    pcie = next(entry for entry in result["findings"] if entry["id"] == "pcie_link_degraded")
    assert pcie["severity"] == "error"  # the width is down, not only the generation
    assert pcie["node"] == "n1" and pcie["gpu"]["pci_bus_id"] == "00000000:4E:00.0" and pcie["gpu"]["minor"] == 3
    assert pcie["expected"] == {"gen": 4, "width": 16, "bandwidth_gbps": 31.508}
    assert pcie["found"] == {"gen": 3, "width": 8, "bandwidth_gbps": 7.877, "bandwidth_ratio": 0.25}
    nvlink = next(entry for entry in result["findings"] if entry["id"] == "nvlink_down")
    assert nvlink["found"] == {"links": 12, "down": [5]}
    assert result["gpus"][3]["pcie"]["bandwidth_ratio"] == 0.25


def test_ecc_and_pending_row_remapping(make_node):
    result = _run(make_node("dgx-a100-ecc"))
    assert _ids(result) == [("ecc_uncorrectable", 2), ("remapped_rows_pending", 2)]
    ecc = next(entry for entry in result["findings"] if entry["id"] == "ecc_uncorrectable")
    assert ecc["found"]["volatile_uncorrected"] == 2
    rows = next(entry for entry in result["findings"] if entry["id"] == "remapped_rows_pending")
    assert rows["found"] == {"correctable": 1, "uncorrectable": 2, "pending": True, "failure": False}


def test_lost_gpu_is_critical_and_named_by_the_driver_list(make_node):
    result = _run(make_node("dgx-a100-gpu-lost"), expected_gpus=8)
    assert _ids(result) == [("gpu_lost", 6)]
    lost = result["findings"][0]
    assert lost["severity"] == "critical" and result["max_severity"] == "critical"
    assert lost["found"]["nvml_return"] == 15 and lost["found"]["return_name"] == "GPU_IS_LOST"
    assert lost["gpu"] == {"index": 6, "minor": 6, "uuid": None, "pci_bus_id": "00000000:B7:00.0", "identified_by": "pci_bus_order"}


def test_unprivileged_nvml_flips_with_the_device_mode(make_node):
    locked = make_node("dgx-a100-80gb", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    before = _run(locked)
    assert _ids(before) == [("nvml_unprivileged_gpu_denied", 0)]
    denied = before["findings"][0]
    assert denied["found"]["nvml_return"] == 4 and denied["found"]["return_name"] == "NO_PERMISSION"
    assert denied["gpu"]["minor"] == 0 and "/dev/nvidia0" in denied["expected"]
    assert before["unprivileged"]["gpus"][0]["error"]["code"] == "no_permission"
    assert before["gpus"][0]["error"] is None  # root opens it
    os.chmod(locked.root / "dev/nvidia0", 0o666)
    after = _run(locked)
    assert _ids(after, _findings.SEVERITIES) == []


def test_unprivileged_init_refused_on_nvidiactl(make_node):
    result = _run(make_node("l4", device_overrides={"/dev/nvidiactl": {"mode": 0o600}}))
    assert _ids(result) == [("nvml_unprivileged_init_failed", None)]
    assert result["findings"][0]["found"]["return_name"] == "NO_PERMISSION"
    assert result["unprivileged"]["available"] is False


def test_swapped_minors_name_the_device_node_not_the_index(make_node):
    minor = _fixture("l4")["gpus"][1]["minor"]
    result = _run(make_node("l4", device_overrides={"/dev/nvidia%d" % minor: {"mode": 0o600}}))
    assert _ids(result) == [("nvml_unprivileged_gpu_denied", 1)]
    assert result["findings"][0]["gpu"]["minor"] == minor == 0
    assert "/dev/nvidia0" in result["findings"][0]["expected"]


def test_supplementary_group_opens_a_group_only_node(make_node):
    node = make_node("l4", device_overrides={"/dev/nvidia1": {"mode": 0o660, "gid": 44}, "/dev/nvidia0": {"mode": 0o660, "gid": 44}})
    assert len(_ids(_run(node))) == 2
    assert _ids(_run(node, unprivileged_groups=["video"])) == []
    assert _ids(_run(node, unprivileged_groups=["44"])) == []


def test_a_missing_device_node_hides_its_gpu_from_nvml_and_the_driver_count_says_which(make_node):
    """The library skips a GPU whose /dev/nvidia<minor> it cannot find (tests/fakes/nvml/README.md): NVML counts one
    fewer than /proc/driver/nvidia/gpus, and the finding names the GPU it did not see."""
    fixture = _fixture("dgx-a100-80gb")
    result = _run(make_node("dgx-a100-80gb", device_overrides={"/dev/nvidia2": None}))
    assert _ids(result) == [("gpu_count_driver_mismatch", None)]
    entry = result["findings"][0]
    assert entry["expected"]["gpus"] == 8 and entry["found"]["gpus"] == 7
    assert entry["found"]["not_seen_by_nvml"] == [fixture["gpus"][2]["pci_bus_id"][4:].lower()]
    assert "/dev/nvidia<minor> node is missing" in entry["hint"]


def test_counts_against_inventory_and_driver(make_node):
    node = make_node("h100-mig-enabled")
    result = _run(node, expected_gpus=8, expected_mig_devices=3)
    assert _ids(result) == [("gpu_count_unexpected", None), ("mig_device_count_unexpected", None)]
    assert next(e for e in result["findings"] if e["id"] == "gpu_count_unexpected")["found"]["gpus"] == 4
    shutil.rmtree(next((node.root / "proc/driver/nvidia/gpus").iterdir()))
    assert ("gpu_count_driver_mismatch", None) in _ids(_run(node))


def test_processes_with_memory_and_mig_instance(make_node):
    result = _run(make_node("dgx-a100-80gb"))
    assert [(p["gpu"], p["pid"], p["used_memory_mib"]) for p in result["processes"]] == [(1, 4242, 1024), (5, 5151, 20480), (5, 5152, 512)]
    mig = _run(make_node("h100-mig-enabled"))["processes"]
    assert len(mig) == 1
    assert (mig[0]["pid"], mig[0]["gpu"], mig[0]["gpu_instance_id"], mig[0]["compute_instance_id"]) == (7001, 0, 7, 0)
    assert mig[0]["mig_device_uuid"].startswith("MIG-") and mig[0]["used_memory_mib"] == 2048


def test_topology_view(make_node):
    topology = _run(make_node("dgx-a100-80gb"))["topology"]
    assert topology["numa_nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    levels = {tuple(pair["gpus"]): pair["level"] for pair in topology["pairs"]}
    assert levels[(0, 1)] == "SINGLE" and levels[(0, 2)] == "NODE" and levels[(0, 4)] == "SYSTEM"
    assert topology["nvlink_active"]["0"] == 12


def test_fail_on_threshold(make_node):
    node = make_node("dgx-a100-pcie-degraded")
    failed = _run(node, fail_on="error")
    assert failed["failed"] is True
    assert "2 finding(s) at or above error: nvlink_down, pcie_link_degraded" in failed["msg"]
    assert len(failed["findings"]) == 2  # the findings come back with the failure
    assert not _run(node, fail_on="critical").get("failed")


# --- pure logic ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gen", "width", "gbps"), [
    (1, 16, 4.0), (2, 16, 8.0), (3, 16, 15.754), (3, 8, 7.877), (4, 16, 31.508), (5, 16, 63.015), (6, 16, 121.0),
    (7, 16, None), (4, 0, None), (None, 16, None),
])
def test_pcie_bandwidth(gen, width, gbps):
    assert _nvml_health.pcie_bandwidth_gbps(gen, width) == gbps


def _reading(**gpu):
    base = {"index": 0, "minor": 0, "uuid": "GPU-x", "pci_bus_id": "00000000:07:00.0", "error": None,
            "pcie": {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16},
            "mig": {"capable": False}, "health": {"ecc": None, "remapped_rows": None, "nvlink": None, "errors": {}}}
    base.update(gpu)
    return {"available": True, "reason": None, "gpu_count": 1, "gpus": [base], "topology_pairs": []}


def test_generation_only_downshift_is_a_warning():
    result = _nvml_health.evaluate("n", _reading(pcie={"gen_current": 1, "gen_max": 4, "width_current": 16, "width_max": 16}))
    assert [(entry["id"], entry["severity"]) for entry in result["findings"]] == [("pcie_link_degraded", "warning")]
    assert result["findings"][0]["found"]["bandwidth_ratio"] == 0.127


def test_row_remap_failure_is_critical_and_pending_mig_mode_a_warning():
    result = _nvml_health.evaluate("n", _reading(
        health={"ecc": None, "nvlink": None, "errors": {"nvlink": {"nvml_return": 4, "code": "no_permission", "message": "x"}},
                "remapped_rows": {"correctable": 0, "uncorrectable": 9, "pending": True, "failure": True}},
        mig={"capable": True, "mode_current": "disabled", "mode_pending": "enabled"}))
    assert sorted((entry["id"], entry["severity"]) for entry in result["findings"]) == [
        ("gpu_health_unreadable", "warning"), ("mig_mode_pending", "warning"), ("remapped_rows_failure", "critical")]


def test_root_init_failure_is_critical():
    result = _nvml_health.evaluate("n", {"available": False, "gpu_count": None, "gpus": [], "reason": {
        "code": "driver_not_loaded", "nvml_return": 9, "message": "Driver Not Loaded", "hint": "load it"}})
    assert [(entry["id"], entry["severity"]) for entry in result["findings"]] == [("nvml_init_failed", "critical")]


def test_threshold_helpers():
    findings = [{"severity": "info"}, {"severity": "error"}, {"severity": "warning"}]
    assert len(_findings.at_or_above(findings, "warning")) == 2
    assert _findings.at_or_above(findings, "never") == []
    assert _findings.max_severity(findings) == "error"


# --- malformed inputs: a clear message, and nothing under the node's root changes --------------------------

MALFORMED = [
    ({"unprivileged_user": "no-such-user-xyz"}, "option unprivileged_user='no-such-user-xyz': no such user on the node"),
    ({"unprivileged_user": "root"}, "option unprivileged_user='root' is root, not an unprivileged user"),
    ({"unprivileged_user": "0"}, "option unprivileged_user='0' is root"),
    ({"unprivileged_user": "4000000"}, "option unprivileged_user='4000000': no such user"),
    ({"unprivileged_groups": ["no-such-group-xyz"]}, "option unprivileged_groups: group 'no-such-group-xyz' does not exist"),
    ({"unprivileged_groups": ["3999999"]}, "option unprivileged_groups: group '3999999' does not exist"),
    ({"unprivileged_timeout": 0}, "option unprivileged_timeout=0 must be at least 1 second"),
    ({"unprivileged_timeout": -5}, "option unprivileged_timeout=-5 must be at least 1 second"),
    ({"expected_gpus": -1}, "option expected_gpus=-1 must be 0 or more"),
    ({"expected_mig_devices": -2}, "option expected_mig_devices=-2 must be 0 or more"),
    ({"expected_gpus": "eight"}, "expected_gpus"),
    ({"fail_on": "loud"}, "fail_on"),
    ({"check_unprivileged": "maybe"}, "check_unprivileged"),
    ({"unprivileged_groups": {"a": 1}}, "unprivileged_groups"),
    ({"no_such_option": 1}, "no_such_option"),
    ({"root": "/nonexistent/gpuharden-root"}, "option root=/nonexistent/gpuharden-root is not a directory"),
]


@pytest.mark.parametrize(("args", "message"), MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_input_fails_clearly_and_changes_nothing(make_node, args, message):
    node = make_node("dgx-a100-80gb", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    _run(node)  # let the double create its state file first: the runs below must not touch anything
    before = _tree_digest(node.root)
    result = _run(node, **args)
    assert result.get("failed") is True, result
    assert message in result["msg"]
    assert _tree_digest(node.root) == before


def test_malformed_node_files_are_reported_not_fatal(make_node):
    node = make_node("dgx-a100-80gb")
    (node.root / "sys/bus/pci/devices/0000:07:00.0/numa_node").write_text("garbage\n")
    (node.root / "proc/driver/nvidia/gpus/0000:07:00.0/information").write_text("\x00\x01 not a table")
    _run(node)  # the double writes its state file on the first init
    before = _tree_digest(node.root)
    result = _run(node)
    assert not result.get("failed"), result.get("msg")
    assert result["gpus"][0]["numa_node"] is None
    assert result["topology"]["numa_nodes"]["unknown"] == [0]
    assert _tree_digest(node.root) == before


def test_malformed_fixture_is_an_init_finding(make_node, world_tmp):
    node = make_node("l4")
    broken = world_tmp / "broken.json"
    broken.write_text("{not json")
    result = run_module("nvml_check", {"root": str(node.root), "node_name": "n1"}, dict(node.env(), NVML_DOUBLE_FIXTURE=str(broken)))
    assert _ids(result) == [("nvml_init_failed", None), ("nvml_unprivileged_init_failed", None)]
    assert result["findings"][0]["found"]["return_name"] == "UNKNOWN"
