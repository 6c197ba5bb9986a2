# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_facts against the NVML double: real pynvml, real device nodes, one fixture per node type."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _gpu_facts as gpu_facts
from gpuharden_lab import NVML_FIXTURES, NVML_LIBRARY_DIR

from tests.unit.conftest import UNPRIVILEGED_UID, run_as, run_module

FIXTURES = sorted(path.stem for path in NVML_FIXTURES.glob("*.json"))


def _fixture(name):
    return json.loads((NVML_FIXTURES / (name + ".json")).read_text())


def _cpus(spec):
    cpus = []
    for part in spec.split(","):
        low, _sep, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def test_every_required_fixture_is_shipped():
    required = {"dgx-a100-80gb", "h100-sxm5-80gb", "l4", "dgx-a100-pcie-degraded", "dgx-a100-ecc", "dgx-a100-gpu-lost"}
    assert required <= set(FIXTURES)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_facts_match_fixture(make_node, fixture):
    data = _fixture(fixture)
    node = make_node(fixture)
    facts = gpu_facts.gather(str(node.root))

    assert facts["nvml"]["available"] is True, facts["nvml"]["reason"]
    assert facts["nvml"]["reason"] is None
    assert facts["driver_version"] == data["driver_version"]
    assert facts["nvml"]["version"] == data["nvml_version"]
    major, minor = divmod(data["cuda_driver_version"], 1000)
    assert facts["cuda_driver_version"] == "%d.%d" % (major, minor // 10)
    assert facts["gpu_count"] == len(data["gpus"]) == len(facts["gpus"])

    for index, (expected, found) in enumerate(zip(data["gpus"], facts["gpus"], strict=True)):
        assert found["index"] == index
        if expected.get("lost"):
            assert found["error"]["nvml_return"] == 15, found
            assert set(found) == {"index", "error"}
            continue
        assert found["error"] is None
        assert found["minor"] == expected["minor"]
        assert found["uuid"] == expected["uuid"]
        assert found["name"] == expected["name"]
        assert found["pci_bus_id"] == expected["pci_bus_id"]
        assert int(found["pci_device_id"], 16) == int(expected["pci_device_id"], 16)
        assert found["memory_total_mib"] == expected["memory"]["total_mib"]
        assert found["numa_node"] == expected["numa_node"]
        assert _cpus(found["cpu_affinity"]) == _cpus(expected["cpu_affinity"])
        assert found["pcie"] == {key: expected["pcie"][key] for key in found["pcie"]}
        mig = found["mig"]
        assert mig["capable"] is ("mig" in expected)
        if "mig" in expected:
            mode = {0: "disabled", 1: "enabled"}[expected["mig"]["mode"]]
            assert (mig["mode_current"], mig["mode_pending"]) == (mode, mode)
            assert sum(mig["layout"].values()) == len(expected["mig"]["gpu_instances"])

    # What the driver shows outside NVML.
    assert set(facts["driver_gpus"]) == {gpu["pci_bus_id"][4:].lower() for gpu in data["gpus"]}
    assert facts["driver_params"]["DeviceFileMode"] == 438
    # The open kernel module names major 195 "nvidia" and "nvidiactl" (read on a real H200, 580.159.04); the
    # proprietary one's frontend "nvidia-frontend".
    frontend = ("nvidia", "nvidiactl") if data.get("kernel_module") == "open" else ("nvidia-frontend",)
    assert {name for name, major in facts["char_majors"].items() if major == 195} == set(frontend)
    minors = {gpu["minor"] for gpu in data["gpus"]}
    nodes = facts["device_nodes"]
    assert {"/dev/nvidia%d" % m for m in minors} | {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(nodes)
    assert nodes["/dev/nvidiactl"]["major"] == 195 and nodes["/dev/nvidiactl"]["minor"] == 255
    assert all(info["mode"] == "0666" for path, info in nodes.items() if "caps" not in path)


def test_pcie_degraded_fixture_shows_the_trained_down_link(make_node):
    node = make_node("dgx-a100-pcie-degraded")
    degraded = [
        gpu for gpu in gpu_facts.gather(str(node.root))["gpus"]
        if (gpu["pcie"]["gen_current"], gpu["pcie"]["width_current"]) < (gpu["pcie"]["gen_max"], gpu["pcie"]["width_max"])
    ]
    assert len(degraded) == 1


def test_mig_enabled_layout_in_input_form(make_node):
    data = _fixture("h100-mig-enabled")
    node = make_node("h100-mig-enabled")
    gpu0 = gpu_facts.gather(str(node.root))["gpus"][0]
    assert gpu0["mig"]["mode_current"] == "enabled"
    expected_instances = data["gpus"][0]["mig"]["gpu_instances"]
    assert gpu0["mig"]["layout"] == {"1g.10gb": len(expected_instances)}
    assert [gi["start"] for gi in gpu0["mig"]["gpu_instances"]] == sorted(gi["start"] for gi in expected_instances)
    assert len(gpu0["mig"]["devices"]) == len(expected_instances)
    assert all(device["uuid"].startswith("MIG-") for device in gpu0["mig"]["devices"])


def test_one_unreadable_gpu_is_reported_on_that_gpu_only(make_node):
    # The L4 fixture's minors are not in index order: GPU index 1 is /dev/nvidia<its minor>.
    minor = _fixture("l4")["gpus"][1]["minor"]
    node = make_node("l4", device_overrides={"/dev/nvidia%d" % minor: {"mode": 0o600}})
    facts = run_as(UNPRIVILEGED_UID, gpu_facts.gather, str(node.root))
    assert facts["nvml"]["available"] is True
    assert facts["gpus"][0]["error"] is None
    assert facts["gpus"][1]["error"]["code"] == "no_permission"
    assert facts["gpus"][1]["error"]["nvml_return"] == 4


def test_unprivileged_user_is_refused_by_the_kernel_then_allowed(make_node):
    locked = make_node("l4", device_overrides={"/dev/nvidiactl": {"mode": 0o600}})
    facts = run_as(UNPRIVILEGED_UID, gpu_facts.gather, str(locked.root))
    assert facts["nvml"]["available"] is False
    assert facts["nvml"]["reason"]["code"] == "no_permission"
    assert facts["nvml"]["reason"]["nvml_return"] == 4
    # Root is not subject to the mode bits: same node, NVML works.
    assert gpu_facts.gather(str(locked.root))["nvml"]["available"] is True
    # After a permission fix (here by hand), the same unprivileged user succeeds.
    os.chmod(locked.root / "dev/nvidiactl", 0o666)
    assert run_as(UNPRIVILEGED_UID, gpu_facts.gather, str(locked.root))["nvml"]["available"] is True


def test_driver_not_loaded_without_nvidiactl(make_node):
    node = make_node("l4", device_overrides={"/dev/nvidiactl": None})
    facts = gpu_facts.gather(str(node.root))
    assert facts["nvml"]["reason"]["code"] == "driver_not_loaded"
    assert facts["gpus"] == []
    assert "/dev/nvidiactl" not in facts["device_nodes"]


def test_driver_not_loaded_without_fixture(make_node, monkeypatch):
    node = make_node("l4")
    monkeypatch.setenv("NVML_DOUBLE_FIXTURE", str(node.root / "missing.json"))
    assert gpu_facts.gather(str(node.root))["nvml"]["reason"]["code"] == "driver_not_loaded"


def test_old_driver_without_a_needed_symbol(make_node, world_tmp, monkeypatch):
    node = make_node("l4")
    data = json.loads(node.fixture.read_text())
    data["faults"] = [{"symbol": "nvmlDeviceGetCount_v2", "error": 13}]
    node.fixture.write_text(json.dumps(data))
    reason = gpu_facts.gather(str(node.root))["nvml"]["reason"]
    assert reason["code"] == "function_not_found"


def test_module_run_reports_facts_and_library_not_found(make_node):
    node = make_node("h100-sxm5-80gb")
    ok = run_module("gpu_facts", {"root": str(node.root)}, node.env())
    assert ok["changed"] is False
    assert ok["ansible_facts"]["gpuharden"]["gpu_count"] == 4

    env = node.env()
    env.pop("LD_LIBRARY_PATH")
    missing = run_module("gpu_facts", {"root": str(node.root)}, env)
    assert "failed" not in missing
    reason = missing["ansible_facts"]["gpuharden"]["nvml"]["reason"]
    assert reason["code"] == "library_not_found"
    assert missing["ansible_facts"]["gpuharden"]["device_nodes"]  # what needs no NVML is still there


def test_module_rejects_a_missing_root(make_node, world_tmp):
    result = run_module("gpu_facts", {"root": str(world_tmp / "nope")}, {"LD_LIBRARY_PATH": str(NVML_LIBRARY_DIR)})
    assert result["failed"] is True
    assert "root=%s" % (world_tmp / "nope") in result["msg"]
