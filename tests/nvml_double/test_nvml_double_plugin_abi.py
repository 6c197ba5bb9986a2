# SPDX-License-Identifier: GPL-3.0-or-later
"""The symbols the real NVIDIA k8s-device-plugin (go-nvml) calls beyond pynvml's usual set.

A symbol the library lacks kills the plugin with `symbol lookup error`, so every one is exported;
compute capability, MIG attributes and XID events carry fixture values.
"""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml
import pytest
from nvml_double_support import LIB, load_fixture, nvml_error

XID = pynvml.nvmlEventTypeXidCriticalError
NA_ID = 0xFFFFFFFF

# Everything the device plugin v0.18.2 resolves at run time (go-nvml v0.13.0-1 picks the _v2 forms when exported).
PLUGIN_SYMBOLS = [
    "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceGetComputeInstanceById", "nvmlComputeInstanceGetInfo_v2", "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetNvLinkState",
    # added for the plugin
    "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetAttributes", "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlEventSetCreate",
    "nvmlEventSetFree", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents", "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
]


def test_every_symbol_the_plugin_calls_is_exported(nvml_lib):
    lib = ctypes.CDLL(str(LIB))
    missing = [s for s in PLUGIN_SYMBOLS if not hasattr(lib, s)]
    assert missing == []


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [("l4.json", (8, 9)), ("dgx-a100-80gb.json", (8, 0)), ("h100-sxm5-80gb.json", (9, 0))],
)
def test_cuda_compute_capability_from_the_product_name(fixture, expected, make_node, nvml):
    make_node(fixture)
    nvml.init()
    for i in range(nvml.nvmlDeviceGetCount()):
        assert nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(i)) == expected


def test_cuda_compute_capability_override_and_unknown_product(make_node, nvml):
    fx = load_fixture("l4.json")
    fx["gpus"][0]["cuda_compute_capability"] = "12.1"
    fx["gpus"][1]["name"] = "NVIDIA Mystery"
    make_node(fx)
    nvml.init()
    assert nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(0)) == (12, 1)
    assert nvml_error(nvml.nvmlDeviceGetCudaComputeCapability, nvml.nvmlDeviceGetHandleByIndex(1)) == \
        pynvml.NVML_ERROR_NOT_SUPPORTED


def test_malformed_compute_capability_is_a_fixture_error(make_node, nvml):
    fx = load_fixture("l4.json")
    fx["gpus"][0]["cuda_compute_capability"] = "nine"
    make_node(fx)
    assert nvml_error(nvml.init) == pynvml.NVML_ERROR_UNKNOWN


def test_mig_device_attributes(make_node, nvml):
    make_node("h100-mig-enabled.json")
    nvml.init()
    gpu0, gpu1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml_error(nvml.nvmlDeviceGetAttributes_v2, gpu0) == pynvml.NVML_ERROR_NOT_SUPPORTED
    a = nvml.nvmlDeviceGetAttributes_v2(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0))
    assert (a.gpuInstanceSliceCount, a.computeInstanceSliceCount, a.memorySizeMB, a.multiprocessorCount) == \
        (1, 1, 9984, 16)
    seen = {}
    for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu1)):
        if nvml_error(nvml.nvmlDeviceGetMigDeviceHandleByIndex, gpu1, k) == pynvml.NVML_ERROR_NOT_FOUND:
            continue
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, k)
        a = nvml.nvmlDeviceGetAttributes(mig)
        seen[nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)] = (
            a.gpuInstanceSliceCount, a.computeInstanceSliceCount, a.memorySizeMB, a.multiprocessorCount)
    # 3g.40gb (GI 1) split into three 1-slice CIs, and two 2g.20gb.
    assert seen == {(1, 0): (3, 1, 40448, 20), (1, 1): (3, 1, 40448, 20), (1, 2): (3, 1, 40448, 20),
                    (3, 0): (2, 2, 20096, 32), (4, 0): (2, 2, 20096, 32)}
    # The C symbol without _v2 (go-nvml's fallback) gives the same answer.
    lib = ctypes.CDLL(str(LIB))
    raw = pynvml.c_nvmlDeviceAttributes()
    assert lib.nvmlDeviceGetAttributes(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0), ctypes.byref(raw)) == 0
    assert raw.memorySizeMB == 9984


def test_nvlink_remote_pci_info(make_node, nvml):
    fx = load_fixture("dgx-a100-80gb.json")
    fx["gpus"][0]["nvlink"]["remote"] = [fx["gpus"][1]["pci_bus_id"]]
    make_node(fx)
    nvml.init()
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    peer = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 0)
    assert peer.busId == fx["gpus"][1]["pci_bus_id"] and peer.pciDeviceId == 0x20B210DE
    switch = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 1)
    assert switch.busId == "00000000:C1:00.0" and switch.pciDeviceId == 0x1AF110DE
    assert nvml_error(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h0, 12) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nvlink_remote_pci_info_without_nvlink(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml_error(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, 0) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_supported_event_types(make_node, nvml):
    fx = load_fixture("dgx-a100-80gb.json")
    fx["gpus"][1]["event_types"] = XID
    del fx["gpus"][2]["ecc"]
    make_node(fx)
    nvml.init()
    types = [nvml.nvmlDeviceGetSupportedEventTypes(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    assert types == [0x1F, XID, 0x1C]
    s = nvml.nvmlEventSetCreate()
    try:
        h1 = nvml.nvmlDeviceGetHandleByIndex(1)
        assert nvml_error(nvml.nvmlDeviceRegisterEvents, h1, XID | pynvml.nvmlEventTypePState, s) == \
            pynvml.NVML_ERROR_NOT_SUPPORTED
        nvml.nvmlDeviceRegisterEvents(h1, XID, s)
    finally:
        nvml.nvmlEventSetFree(s)


def test_no_event_times_out_after_the_timeout(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    s = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), XID, s)
        t0 = time.monotonic()
        assert nvml_error(nvml.nvmlEventSetWait_v2, s, 300) == pynvml.NVML_ERROR_TIMEOUT
        assert 0.28 <= time.monotonic() - t0 < 2
        assert nvml_error(nvml.nvmlEventSetWait_v2, s, 0) == pynvml.NVML_ERROR_TIMEOUT
    finally:
        nvml.nvmlEventSetFree(s)


def test_injected_xid_reaches_a_waiting_event_set(make_node, nvml):
    node = make_node("l4.json")
    uuid1 = node.fixture["gpus"][1]["uuid"]
    nvml.init()
    s = nvml.nvmlEventSetCreate()
    try:
        for i in range(2):
            nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), XID, s)
        threading.Timer(0.3, node.ctl, ("inject-xid", "--gpu", "1", "--xid", "79")).start()
        t0 = time.monotonic()
        ev = nvml.nvmlEventSetWait_v2(s, 10000)
        assert time.monotonic() - t0 < 5
        assert (ev.eventType, ev.eventData, ev.gpuInstanceId, ev.computeInstanceId) == (XID, 79, NA_ID, NA_ID)
        assert nvml.nvmlDeviceGetUUID(ev.device) == uuid1
        # Consumed: the next wait times out.
        assert nvml_error(nvml.nvmlEventSetWait_v2, s, 50) == pynvml.NVML_ERROR_TIMEOUT
    finally:
        nvml.nvmlEventSetFree(s)


def test_events_only_for_registered_gpus_and_only_after_the_set_exists(make_node, nvml):
    node = make_node("h100-mig-enabled.json")
    node.ctl("inject-xid", "--gpu", "0", "--xid", "48")  # before any event set: never delivered
    nvml.init()
    s = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(1), XID, s)
        node.ctl("inject-xid", "--gpu", "0", "--xid", "63")  # GPU 0 is not registered
        node.ctl("inject-xid", "--gpu", "1", "--xid", "94", "--gi", "3", "--ci", "0")
        ev = nvml.nvmlEventSetWait_v2(s, 2000)
        assert (ev.eventData, ev.gpuInstanceId, ev.computeInstanceId) == (94, 3, 0)
        assert nvml.nvmlDeviceGetUUID(ev.device) == node.fixture["gpus"][1]["uuid"]
        assert nvml_error(nvml.nvmlEventSetWait_v2, s, 50) == pynvml.NVML_ERROR_TIMEOUT
    finally:
        nvml.nvmlEventSetFree(s)


def test_wait_does_not_block_other_calls(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    s = nvml.nvmlEventSetCreate()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceRegisterEvents(h, XID, s)
    waiter = threading.Thread(target=nvml_error, args=(nvml.nvmlEventSetWait_v2, s, 1500))
    waiter.start()
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        assert nvml.nvmlDeviceGetName(h) == "NVIDIA L4"
        assert time.monotonic() - t0 < 0.5
    finally:
        waiter.join()
        nvml.nvmlEventSetFree(s)


def test_event_set_handles_are_checked(make_node, nvml):
    make_node("l4.json")
    nvml.init()
    s = nvml.nvmlEventSetCreate()
    nvml.nvmlEventSetFree(s)
    assert nvml_error(nvml.nvmlEventSetFree, s) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert nvml_error(nvml.nvmlEventSetWait_v2, s, 10) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_mig_handles_have_no_events(make_node, nvml):
    make_node("h100-mig-enabled.json")
    nvml.init()
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert nvml_error(nvml.nvmlDeviceGetSupportedEventTypes, mig) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_lost_gpu_fails_event_registration(make_node, nvml):
    fx = load_fixture("l4.json")
    fx["gpus"][1]["lost"] = "after_handle"
    make_node(fx)
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml_error(nvml.nvmlDeviceGetSupportedEventTypes, h) == pynvml.NVML_ERROR_GPU_IS_LOST


def test_inject_xid_usage_errors(make_node):
    node = make_node("l4.json")
    assert node.ctl("inject-xid", "--gpu", "5", "--xid", "79", check=False).returncode == 2
    assert node.ctl("inject-xid", "--gpu", "0", "--xid", "79", "--gi", "1", check=False).returncode == 2
