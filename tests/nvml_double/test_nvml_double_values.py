"""Every shipped fixture read back through the real pynvml."""

from __future__ import annotations

import json

import pynvml
import pytest
from nvml_double_support import FIXTURES, load_fixture

ALL_FIXTURES = sorted(p.name for p in FIXTURES.glob("*.json"))
MIB = 1024 * 1024


def err(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return e.value
    return None


def test_all_fixtures_present():
    assert (
        sorted(
            [
                "dgx-a100-80gb.json",
                "dgx-a100-ecc.json",
                "dgx-a100-gpu-lost.json",
                "dgx-a100-pcie-degraded.json",
                "gb200-nvl.json",
                "gh200.json",
                "h100-mig-enabled.json",
                "h100-sxm5-80gb.json",
                "h200-vm.json",
                "l4.json",
            ]
        )
        == ALL_FIXTURES
    )


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_identity(name, make_node, nvml):
    fx = load_fixture(name)
    make_node(fx)
    nvml.init()
    assert nvml.nvmlSystemGetDriverVersion() == fx["driver_version"]
    assert nvml.nvmlSystemGetNVMLVersion() == fx["nvml_version"]
    assert nvml.nvmlSystemGetCudaDriverVersion() == fx["cuda_driver_version"]
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == fx["cuda_driver_version"]
    assert nvml.nvmlDeviceGetCount() == len(fx["gpus"])
    for i, g in enumerate(fx["gpus"]):
        if g.get("lost"):
            assert err(nvml.nvmlDeviceGetHandleByIndex, i) == pynvml.NVML_ERROR_GPU_IS_LOST
            continue
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert nvml.nvmlDeviceGetName(h) == g["name"]
        assert nvml.nvmlDeviceGetUUID(h) == g["uuid"]
        assert nvml.nvmlDeviceGetIndex(h) == i
        assert nvml.nvmlDeviceGetMinorNumber(h) == g["minor"]
        pci = nvml.nvmlDeviceGetPciInfo(h)
        assert pci.busId == g["pci_bus_id"]
        assert pci.busIdLegacy == g["pci_bus_id"][4:]
        assert pci.pciDeviceId == int(g["pci_device_id"], 16)
        assert pci.pciSubSystemId == int(g["pci_subsystem_id"], 16)
        # Grace systems put their GPUs in PCI domains other than 0 (gh200.json, gb200-nvl.json)
        assert (pci.domain, pci.bus, pci.device) == (int(g["pci_bus_id"][:8], 16), int(g["pci_bus_id"][9:11], 16),
                                                     int(g["pci_bus_id"][12:14], 16))
        # lookups by UUID and bus id (full and short form) give the same GPU
        for other in (
            nvml.nvmlDeviceGetHandleByUUID(g["uuid"]),
            nvml.nvmlDeviceGetHandleByPciBusId(g["pci_bus_id"]),
            nvml.nvmlDeviceGetHandleByPciBusId(g["pci_bus_id"][4:].lower()),
        ):
            assert nvml.nvmlDeviceGetIndex(other) == i
        assert nvml.nvmlDeviceGetPersistenceMode(h) == g["persistence_mode"]
        assert nvml.nvmlDeviceGetTemperature(h, 0) == g["temperature_c"]
        assert nvml.nvmlDeviceGetPowerUsage(h) == g["power_mw"]
    assert (
        err(nvml.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000") == pynvml.NVML_ERROR_NOT_FOUND
    )
    assert err(nvml.nvmlDeviceGetHandleByPciBusId, "0000:FF:1F.0") == pynvml.NVML_ERROR_NOT_FOUND
    assert err(nvml.nvmlDeviceGetHandleByIndex, len(fx["gpus"])) == pynvml.NVML_ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_health_and_links(name, make_node, nvml):
    fx = load_fixture(name)
    make_node(fx)
    nvml.init()
    for i, g in enumerate(fx["gpus"]):
        if g.get("lost"):
            continue
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        p = g["pcie"]
        assert nvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == p["gen_current"]
        assert nvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == p["gen_max"]
        assert nvml.nvmlDeviceGetCurrPcieLinkWidth(h) == p["width_current"]
        assert nvml.nvmlDeviceGetMaxPcieLinkWidth(h) == p["width_max"]
        if "nvlink" in g:
            states = [nvml.nvmlDeviceGetNvLinkState(h, link) for link in range(g["nvlink"]["links"])]
            assert states == [0 if link in g["nvlink"]["down"] else 1 for link in range(g["nvlink"]["links"])]
            assert err(nvml.nvmlDeviceGetNvLinkState, h, g["nvlink"]["links"]) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        else:
            assert err(nvml.nvmlDeviceGetNvLinkState, h, 0) == pynvml.NVML_ERROR_NOT_SUPPORTED
        for ctype, ckey in ((pynvml.NVML_VOLATILE_ECC, "volatile"), (pynvml.NVML_AGGREGATE_ECC, "aggregate")):
            for etype, ekey in (
                (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
            ):
                assert nvml.nvmlDeviceGetTotalEccErrors(h, etype, ctype) == g["ecc"][ckey][ekey]
        rr = g["remapped_rows"]
        gis = g.get("mig", {}).get("gpu_instances")
        if g.get("mig", {}).get("mode") and gis:
            assert err(nvml.nvmlDeviceGetRemappedRows, h) == pynvml.NVML_ERROR_NOT_SUPPORTED
        else:
            assert nvml.nvmlDeviceGetRemappedRows(h) == (
                rr["correctable"],
                rr["uncorrectable"],
                int(rr["pending"]),
                int(rr["failure"]),
            )
        if g.get("gpu_memory_numa_node", -1) < 0:
            assert err(nvml.nvmlDeviceGetNumaNodeId, h) == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_memory_and_processes(name, make_node, nvml):
    fx = load_fixture(name)
    make_node(fx)
    nvml.init()
    for i, g in enumerate(fx["gpus"]):
        if g.get("lost"):
            continue
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        m = g["memory"]
        proc_mib = sum(p["used_memory_mib"] for p in g["processes"])
        v1 = nvml.nvmlDeviceGetMemoryInfo(h)
        assert v1.total == m["total_mib"] * MIB
        assert v1.used == (m["used_mib"] + m["reserved_mib"] + proc_mib) * MIB
        assert v1.free == v1.total - v1.used
        v2 = nvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert (v2.total, v2.reserved, v2.used) == (
            m["total_mib"] * MIB,
            m["reserved_mib"] * MIB,
            (m["used_mib"] + proc_mib) * MIB,
        )
        assert v2.free == v2.total - v2.reserved - v2.used
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [
            (p["pid"], p["used_memory_mib"] * MIB) for p in g["processes"]
        ]
        mig_on = g.get("mig", {}).get("mode") == 1
        for p, want in zip(procs, g["processes"], strict=True):
            na = 0xFFFFFFFF
            assert p.gpuInstanceId == (want.get("gpu_instance_id", na) if mig_on else na)
            assert p.computeInstanceId == (want.get("compute_instance_id", na) if mig_on else na)


def _cpus(spec: str) -> set[int]:
    out = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


@pytest.mark.parametrize("name", ["dgx-a100-80gb.json", "h100-sxm5-80gb.json", "l4.json"])
def test_affinity(name, make_node, nvml):
    fx = load_fixture(name)
    make_node(fx)
    nvml.init()
    for i, g in enumerate(fx["gpus"]):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        words = nvml.nvmlDeviceGetCpuAffinity(h, 4)
        got = {w * 64 + b for w in range(4) for b in range(64) if (words[w] >> b) & 1}
        assert got == _cpus(g["cpu_affinity"])
        nodes = nvml.nvmlDeviceGetMemoryAffinity(h, 1, 0)
        assert nodes[0] == 1 << g["numa_node"]


@pytest.mark.parametrize("name", ["gh200.json", "gb200-nvl.json", "h100-sxm5-80gb.json"])
def test_numa_node_id_only_where_gpu_memory_is_a_numa_node(name, make_node, nvml):
    """Grace Hopper / Grace Blackwell: the GPU's memory is a CPU-less NUMA node of its own, and
    nvmlDeviceGetNumaNodeId names it; x86 PCIe/SXM GPUs answer NOT_SUPPORTED."""
    fx = load_fixture(name)
    make_node(fx)
    nvml.init()
    for i, g in enumerate(fx["gpus"]):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        if g.get("gpu_memory_numa_node", -1) < 0:
            assert err(nvml.nvmlDeviceGetNumaNodeId, h) == pynvml.NVML_ERROR_NOT_SUPPORTED
            continue
        assert nvml.nvmlDeviceGetNumaNodeId(h) == g["gpu_memory_numa_node"]
        assert g["gpu_memory_numa_node"] in fx["numa"]["gpu_memory_nodes"]
        assert g["gpu_memory_numa_node"] not in fx["numa"]["cpu_nodes"]


def test_topology_dgx(make_node, nvml):
    make_node("dgx-a100-80gb.json")
    nvml.init()
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    anc = nvml.nvmlDeviceGetTopologyCommonAncestor
    assert anc(h[0], h[0]) == pynvml.NVML_TOPOLOGY_INTERNAL
    assert anc(h[0], h[1]) == pynvml.NVML_TOPOLOGY_SINGLE
    assert anc(h[6], h[7]) == pynvml.NVML_TOPOLOGY_SINGLE
    assert anc(h[0], h[2]) == pynvml.NVML_TOPOLOGY_NODE
    assert anc(h[5], h[7]) == pynvml.NVML_TOPOLOGY_NODE
    assert anc(h[0], h[4]) == pynvml.NVML_TOPOLOGY_SYSTEM
    assert anc(h[7], h[3]) == pynvml.NVML_TOPOLOGY_SYSTEM


def test_topology_l4_no_switch(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    a, b = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(a, b) == pynvml.NVML_TOPOLOGY_SYSTEM


def test_l4_has_no_mig(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert err(nvml.nvmlDeviceGetMigMode, h) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert err(nvml.nvmlDeviceGetMaxMigDeviceCount, h) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert err(nvml.nvmlDeviceSetMigMode, h, 1) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert err(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, 0) == pynvml.NVML_ERROR_NOT_SUPPORTED
    # L4 minors are deliberately not the NVML index
    assert [nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)] == [1, 0]


def test_degraded_fixture_differs_only_where_intended():
    base, deg = load_fixture("dgx-a100-80gb.json"), load_fixture("dgx-a100-pcie-degraded.json")
    assert deg["gpus"][3]["pcie"] == {"gen_current": 3, "gen_max": 4, "width_current": 8, "width_max": 16}
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert json.dumps(base["gpus"][i]) == json.dumps(deg["gpus"][i])
    ecc = load_fixture("dgx-a100-ecc.json")["gpus"][2]
    assert ecc["ecc"]["volatile"]["uncorrected"] > 0 and ecc["remapped_rows"]["pending"] is True
    assert [g["lost"] for g in load_fixture("dgx-a100-gpu-lost.json")["gpus"]] == [False] * 6 + [True, False]
