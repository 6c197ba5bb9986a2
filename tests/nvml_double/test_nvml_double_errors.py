"""Error paths: missing driver, malformed fixtures, lost GPUs, faults, versions, init refcount."""

from __future__ import annotations

import ctypes

import pynvml
import pytest
from nvml_double_support import load_fixture


def err(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return e.value
    return None


def test_no_fixture_is_driver_not_loaded(make_node, nvml):
    node = make_node("dgx-a100-80gb.json")
    node.fixture_path.unlink()
    assert err(nvml.init) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.init()


def test_malformed_fixture_is_unknown_and_names_file(make_node, nvml, capfd):
    node = make_node("l4.json")
    node.write_fixture('{"gpus": [ {"name": "x", ')
    assert err(nvml.init) == pynvml.NVML_ERROR_UNKNOWN
    assert str(node.fixture_path) in capfd.readouterr().err


def test_bad_profile_table_is_malformed(make_node, nvml, capfd):
    fx = load_fixture("h100-sxm5-80gb.json")
    fx["gpus"][0]["mig"]["profile_table"] = "B200"
    node = make_node(fx)
    assert err(nvml.init) == pynvml.NVML_ERROR_UNKNOWN
    out = capfd.readouterr().err
    assert str(node.fixture_path) in out and "B200" in out


def test_missing_nvidiactl_is_driver_not_loaded(make_node, nvml):
    node = make_node("dgx-a100-80gb.json")
    (node.dev / "nvidiactl").unlink()
    assert err(nvml.init) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED


def test_a_gpu_without_its_device_node_is_not_enumerated(make_node, nvml):
    """As the real library in a container given only some GPUs (NVIDIA/nvidia-docker#170): the others do not exist
    for it, and the indices are those of the GPUs it sees."""
    node = make_node("dgx-a100-80gb.json")
    (node.dev / "nvidia3").unlink()
    nvml.init()
    assert nvml.nvmlDeviceGetCount() == 7
    uuids = [node.fixture["gpus"][i]["uuid"] for i in (0, 1, 2, 4, 5, 6, 7)]
    assert [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(7)] == uuids
    assert [nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)) for uuid in uuids] == list(range(7))
    assert err(nvml.nvmlDeviceGetHandleByIndex, 7) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert err(nvml.nvmlDeviceGetHandleByUUID, node.fixture["gpus"][3]["uuid"]) == pynvml.NVML_ERROR_NOT_FOUND
    assert err(nvml.nvmlDeviceGetHandleByPciBusId, node.fixture["gpus"][3]["pci_bus_id"]) == pynvml.NVML_ERROR_NOT_FOUND


def test_memory_of_a_mig_enabled_gpu_needs_the_mig_monitor_capability(make_node, nvml):
    """k8s-device-plugin#399 / nvidia-container-toolkit#1740: without nvidia-cap2 in its /dev (or denied by its devices
    cgroup), a process gets Insufficient Permissions for a MIG-enabled GPU's memory, root included; other GPUs and
    the MIG devices themselves are unaffected."""
    node = make_node("h100-mig-enabled.json")
    nvml.init()
    mig_on = [i for i, gpu in enumerate(node.fixture["gpus"]) if gpu.get("mig", {}).get("mode") == 1]
    assert mig_on and len(mig_on) < len(node.fixture["gpus"])
    for i in range(len(node.fixture["gpus"])):
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i))
    (node.dev / "nvidia-caps" / "nvidia-cap2").unlink()
    for i, _gpu in enumerate(node.fixture["gpus"]):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if i in mig_on:
            assert err(nvml.nvmlDeviceGetMemoryInfo, handle) == pynvml.NVML_ERROR_NO_PERMISSION
        else:
            nvml.nvmlDeviceGetMemoryInfo(handle)
    mig_device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(mig_on[0]), 0)
    assert nvml.nvmlDeviceGetMemoryInfo(mig_device).total > 0


def test_missing_gpu_node_error_is_configurable(make_node, nvml):
    fx = load_fixture("l4.json")
    fx["missing_node_error"] = pynvml.NVML_ERROR_NOT_FOUND
    node = make_node(fx)
    (node.dev / "nvidia1").unlink()  # minor 1 == GPU index 0 on the L4 fixture
    nvml.init()
    assert err(nvml.nvmlDeviceGetHandleByIndex, 0) == pynvml.NVML_ERROR_NOT_FOUND
    nvml.nvmlDeviceGetHandleByIndex(1)


def test_lost_gpu(make_node, nvml):
    node = make_node("dgx-a100-gpu-lost.json")
    nvml.init()
    assert nvml.nvmlDeviceGetCount() == 8
    assert err(nvml.nvmlDeviceGetHandleByIndex, 6) == pynvml.NVML_ERROR_GPU_IS_LOST
    assert err(nvml.nvmlDeviceGetHandleByUUID, node.fixture["gpus"][6]["uuid"]) == pynvml.NVML_ERROR_GPU_IS_LOST
    assert (
        err(nvml.nvmlDeviceGetHandleByPciBusId, node.fixture["gpus"][6]["pci_bus_id"]) == pynvml.NVML_ERROR_GPU_IS_LOST
    )
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(7)) == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(6)


def test_lost_after_handle(make_node, nvml):
    fx = load_fixture("dgx-a100-80gb.json")
    fx["gpus"][2]["lost"] = "after_handle"
    make_node(fx)
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetIndex(h) == 2
    assert nvml.nvmlDeviceGetPciInfo(h).busId == fx["gpus"][2]["pci_bus_id"]
    for fn, args in (
        (nvml.nvmlDeviceGetName, ()),
        (nvml.nvmlDeviceGetUUID, ()),
        (nvml.nvmlDeviceGetMemoryInfo, ()),
        (nvml.nvmlDeviceGetCurrPcieLinkWidth, ()),
        (nvml.nvmlDeviceGetMigMode, ()),
        (nvml.nvmlDeviceGetTotalEccErrors, (1, 0)),
        (nvml.nvmlDeviceGetComputeRunningProcesses, ()),
    ):
        assert err(fn, h, *args) == pynvml.NVML_ERROR_GPU_IS_LOST, fn.__name__
    other = nvml.nvmlDeviceGetHandleByIndex(3)
    assert err(nvml.nvmlDeviceGetTopologyCommonAncestor, h, other) == pynvml.NVML_ERROR_GPU_IS_LOST


def test_fault_for_one_gpu(make_node, nvml):
    fx = load_fixture("dgx-a100-80gb.json")
    fx["faults"] = [{"symbol": "nvmlDeviceGetHandleByIndex_v2", "error": 4, "gpu": 2}]
    make_node(fx)
    nvml.init()
    assert err(nvml.nvmlDeviceGetHandleByIndex, 2) == pynvml.NVML_ERROR_NO_PERMISSION
    for i in (0, 1, 3):
        nvml.nvmlDeviceGetHandleByIndex(i)


def test_fault_for_all_gpus_and_system_calls(make_node, nvml):
    fx = load_fixture("h100-sxm5-80gb.json")
    fx["faults"] = [
        {"symbol": "nvmlDeviceGetCurrPcieLinkWidth", "error": 999},
        {"symbol": "nvmlDeviceGetRemappedRows", "error": 3, "gpu": 1},
        {"symbol": "nvmlSystemGetDriverVersion", "error": 13},
    ]
    make_node(fx)
    nvml.init()
    assert err(nvml.nvmlSystemGetDriverVersion) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    for i in range(4):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert err(nvml.nvmlDeviceGetCurrPcieLinkWidth, h) == pynvml.NVML_ERROR_UNKNOWN
        assert err(nvml.nvmlDeviceGetRemappedRows, h) == (pynvml.NVML_ERROR_NOT_SUPPORTED if i == 1 else None)


def test_fault_at_init(make_node, nvml):
    fx = load_fixture("l4.json")
    fx["faults"] = [{"symbol": "nvmlInitWithFlags", "error": 17}]
    make_node(fx)
    assert err(nvml.init) == pynvml.NVML_ERROR_OPERATING_SYSTEM


def test_fixture_is_reread_on_every_init(make_node, nvml):
    make_node("dgx-a100-80gb.json")
    nvml.init()
    assert nvml.nvmlDeviceGetCount() == 8
    pynvml.nvmlShutdown()
    make_node("l4.json")
    nvml.init()
    assert nvml.nvmlDeviceGetCount() == 2
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA L4"


def test_version_mismatch(make_node, nvml, nvml_lib):
    make_node("h100-mig-enabled.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert err(nvml.nvmlDeviceGetMemoryInfo, h, 0x01000028) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    lib = ctypes.CDLL(str(nvml_lib))
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0x01000098
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(h, 0, ctypes.byref(info)) == 25
    info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(h, 0, ctypes.byref(info)) == 0
    v3 = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()  # same size as v3; only the version differs
    v3.version = 0x03000098
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(h, 0, ctypes.byref(v3)) == 0
    gi = nvml.nvmlDeviceGetGpuInstanceById(h, 7)
    ci_info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
    ci_info.version = 0x02000000
    assert lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, 0, 0, ctypes.byref(ci_info)) == 25


def test_uninitialized_and_refcount(make_node, nvml):
    make_node("l4.json")
    assert err(nvml.nvmlDeviceGetCount) == pynvml.NVML_ERROR_UNINITIALIZED
    assert err(pynvml.nvmlShutdown) == pynvml.NVML_ERROR_UNINITIALIZED
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 2  # still one reference
    pynvml.nvmlShutdown()
    assert err(nvml.nvmlDeviceGetCount) == pynvml.NVML_ERROR_UNINITIALIZED
    assert err(pynvml.nvmlShutdown) == pynvml.NVML_ERROR_UNINITIALIZED


def test_error_strings(nvml_lib):
    lib = ctypes.CDLL(str(nvml_lib))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(4) == b"Insufficient Permissions"
    assert lib.nvmlErrorString(19) == b"In use by another client"
    assert lib.nvmlErrorString(9) == b"Driver Not Loaded"
    assert lib.nvmlErrorString(12345) == b"Unknown Error"
    assert pynvml.nvmlErrorString(16) == "GPU requires restart"
    assert str(pynvml.NVMLError(3)) == "Not Supported"


def test_struct_sizes_match_pynvml():
    assert ctypes.sizeof(pynvml.nvmlPciInfo_t) == 68
    assert ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) == 40
    assert ctypes.sizeof(pynvml.c_nvmlGpuInstanceProfileInfo_v2_t) == 0x98
    assert ctypes.sizeof(pynvml.c_nvmlComputeInstanceProfileInfo_v2_t) == 0x88
    assert ctypes.sizeof(pynvml.c_nvmlGpuInstanceInfo_t) == 24
    assert ctypes.sizeof(pynvml.c_nvmlComputeInstanceInfo_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t) == 24
