"""MIG lifecycle through the real pynvml: mode, profiles, placements, GIs, CIs, MIG devices, persistence."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

import pynvml
import pytest
from nvml_double_support import BUILD_DIR, CTL

MIB = 1024 * 1024
P = pynvml

# enum -> (id, name, slices, instances, memory slices) for both profile tables
PROFILES = {
    P.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, "1g.10gb", 1, 7, 1),
    P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, "1g.10gb+me", 1, 1, 1),
    P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, "1g.20gb", 1, 4, 2),
    P.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, "2g.20gb", 2, 3, 2),
    P.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, "3g.40gb", 3, 2, 4),
    P.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, "4g.40gb", 4, 1, 4),
    P.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, "7g.80gb", 7, 1, 8),
}
PLACEMENTS = {
    19: [0, 1, 2, 3, 4, 5, 6],
    20: [0, 1, 2, 3, 4, 5, 6],
    15: [0, 2, 4, 6],
    14: [0, 2, 4],
    9: [0, 4],
    5: [0],
    0: [0],
}
# (sm, ce, dec, memorySizeMB) per GPU type for 1g.10gb, 3g.40gb, 7g.80gb
RESOURCES = {
    "A100": {19: (14, 1, 0, 9728), 9: (42, 3, 2, 40192), 0: (98, 7, 5, 80896)},
    "H100": {19: (16, 1, 1, 9984), 9: (60, 3, 3, 40448), 0: (132, 8, 7, 81152)},
}


def err(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return e.value
    return None


def placements(h, profile_id):
    count = pynvml.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, pynvml.byref(count))
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, pynvml.byref(count))
    return [(p.start, p.size) for p in arr[: count.value]]


def gpu_instances(h, profile_id):
    count = pynvml.c_uint(0)
    arr = (pynvml.c_nvmlGpuInstance_t * 7)()
    pynvml.nvmlDeviceGetGpuInstances(h, profile_id, arr, pynvml.byref(count))
    return [pynvml.nvmlGpuInstanceGetInfo(arr[i]) for i in range(count.value)]


def compute_instances(gi, profile_id):
    count = pynvml.c_uint(0)
    arr = (pynvml.c_nvmlComputeInstance_t * 8)()
    pynvml.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, pynvml.byref(count))
    return [pynvml.nvmlComputeInstanceGetInfo(arr[i]) for i in range(count.value)]


def place(start, size):
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return pynvml.byref(p)


def ci_place(start, size):
    p = pynvml.c_nvmlComputeInstancePlacement_t()
    p.start, p.size = start, size
    return pynvml.byref(p)


@pytest.fixture
def a100(make_node, nvml):
    """DGX A100 node with MIG enabled on (idle) GPU 0; yields (node, handle0)."""
    node = make_node("dgx-a100-80gb.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_SUCCESS
    return node, h


def test_enable_mode_on_idle_gpu(make_node, nvml):
    node = make_node("dgx-a100-80gb.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    # The profile table is answered with MIG disabled, as a real H200 did (driver 580.159.04); instances are not.
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0).id == 19
    assert err(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, 0x11) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert err(nvml.nvmlDeviceCreateGpuInstance, h, 19) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert err(nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    assert node.state()["gpus"][node.fixture["gpus"][0]["uuid"]]["mig_current"] == 1
    assert err(nvml.nvmlDeviceSetMigMode, h, 2) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_busy_gpu_goes_pending_until_reset(make_node, nvml):
    node = make_node("dgx-a100-80gb.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(1)  # pid 4242 runs here
    assert nvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    assert err(nvml.nvmlDeviceCreateGpuInstance, h, 19) == pynvml.NVML_ERROR_NOT_SUPPORTED
    refused = node.ctl("reset", "--gpu", "1", check=False)
    assert refused.returncode == 3 and "processes running" in refused.stderr
    node.ctl("set-processes", "--gpu", "1", "--clear")
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]  # still pending: only a reset activates it
    node.ctl("reset", "--gpu", "1")
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    # other GPUs untouched
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


def test_setting_current_mode_cancels_pending(make_node, nvml):
    make_node("dgx-a100-80gb.json")
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(5)
    assert nvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceSetMigMode(h, 0) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]


@pytest.mark.parametrize("fixture,kind", [("dgx-a100-80gb.json", "A100"), ("h100-sxm5-80gb.json", "H100")])
def test_profile_info_by_enum(fixture, kind, make_node, nvml):
    make_node(fixture)
    nvml.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(h, 1)
    for enum, (pid, name, slices, inst, _msize) in PROFILES.items():
        for version in (2, 1):
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, enum, version)
            assert (info.id, info.sliceCount, info.instanceCount, info.isP2pSupported) == (pid, slices, inst, 0)
            if version == 2:
                assert info.name == f"MIG {name}"
            if pid in RESOURCES[kind]:
                sm, ce, dec, mem = RESOURCES[kind][pid]
                assert (info.multiprocessorCount, info.copyEngineCount, info.decoderCount, info.memorySizeMB) == (
                    sm,
                    ce,
                    dec,
                    mem,
                )
    assert err(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, 5) == pynvml.NVML_ERROR_NOT_SUPPORTED  # 8_SLICE
    assert err(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, 0x12) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_possible_placements(a100):
    _node, h = a100
    for pid, starts in PLACEMENTS.items():
        size = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}[pid]
        assert placements(h, pid) == [(s, size) for s in starts]
    assert err(placements, h, 1) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # an enum, not a profile id


@pytest.mark.parametrize(
    "pid,start,gi_id",
    [
        (19, 0, 7),
        (19, 3, 10),
        (19, 6, 13),
        (15, 6, 6),
        (14, 0, 3),
        (14, 4, 5),
        (9, 4, 1),
        (9, 0, 2),
        (5, 0, 2),
        (0, 0, 0),
    ],
)
def test_create_with_placement_gives_buddy_ids(a100, pid, start, gi_id):
    _node, h = a100
    size = {19: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}[pid]
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, place(start, size))
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (gi_id, pid, start, size)
    assert pynvml.nvmlDeviceGetIndex(info.device) == 0


def test_overlap_invalid_placement_and_limits(a100):
    _node, h = a100
    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(0, 4))
    assert (
        err(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, 5, place(0, 4))
        == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    assert (
        err(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, 19, place(2, 1))
        == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    assert err(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, 9, place(1, 4)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert err(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, 9, place(4, 2)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert err(pynvml.nvmlDeviceCreateGpuInstance, h, 0) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert err(pynvml.nvmlDeviceCreateGpuInstance, h, 1) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 3  # slices 4,5,6 (slot 7 unusable)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 0) == 0
    pynvml.nvmlDeviceCreateGpuInstance(h, 9)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 0
    assert err(pynvml.nvmlDeviceCreateGpuInstance, h, 9) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_instance_limits_without_placement(a100):
    _node, h = a100
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 7
    for _ in range(7):
        pynvml.nvmlDeviceCreateGpuInstance(h, 19)
    assert err(pynvml.nvmlDeviceCreateGpuInstance, h, 19) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    infos = gpu_instances(h, 19)
    assert sorted(i.placement.start for i in infos) == list(range(7))
    assert len({i.id for i in infos}) == 7
    assert gpu_instances(h, 9) == []


def test_me_profile_limit(a100):
    _node, h = a100
    pynvml.nvmlDeviceCreateGpuInstance(h, 20)
    assert err(pynvml.nvmlDeviceCreateGpuInstance, h, 20) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 6


def test_list_and_lookup_gpu_instances(a100):
    _node, h = a100
    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, place(0, 2))
    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, place(2, 2))
    assert [(i.id, i.placement.start) for i in gpu_instances(h, 14)] == [(3, 0), (4, 2)]
    gi = pynvml.nvmlDeviceGetGpuInstanceById(h, 4)
    assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.start == 2
    assert err(pynvml.nvmlDeviceGetGpuInstanceById, h, 1) == pynvml.NVML_ERROR_NOT_FOUND


def test_compute_instances_and_teardown_order(a100):
    _node, h = a100
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))
    cip = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo
    one = cip(gi, P.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, P.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    assert (one.id, one.sliceCount, one.instanceCount, one.multiprocessorCount, one.name) == (
        0,
        1,
        3,
        14,
        "MIG 1c.3g.40gb",
    )
    two = cip(gi, P.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0)
    assert (two.id, two.sliceCount, two.instanceCount) == (1, 2, 1)
    full = cip(gi, P.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
    assert (full.id, full.instanceCount, full.name) == (2, 1, "MIG 3g.40gb")
    v1 = cip(gi, 0, 0, 1)
    assert (v1.id, v1.instanceCount) == (0, 3)
    assert err(cip, gi, P.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, 0) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 3
    cis = [pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(3)]
    assert err(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, 0) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert err(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, 2) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 0
    infos = compute_instances(gi, 0)
    assert [(i.id, i.placement.start, i.placement.size) for i in infos] == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]
    assert pynvml.nvmlGpuInstanceGetInfo(infos[0].gpuInstance).id == 1
    by_id = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 2)
    assert pynvml.nvmlComputeInstanceGetInfo(by_id).placement.start == 2
    assert err(pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, 5) == pynvml.NVML_ERROR_NOT_FOUND
    assert err(pynvml.nvmlGpuInstanceDestroy, gi) == pynvml.NVML_ERROR_IN_USE
    for ci in cis:
        pynvml.nvmlComputeInstanceDestroy(ci)
    assert compute_instances(gi, 0) == []
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert gpu_instances(h, 9) == []
    assert err(pynvml.nvmlGpuInstanceGetInfo, gi) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_compute_instance_placements(a100):
    _node, h = a100
    gi = pynvml.nvmlDeviceCreateGpuInstance(h, 0)
    count = pynvml.c_uint(0)
    arr = (pynvml.c_nvmlComputeInstancePlacement_t * 8)()
    pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, 1, arr, pynvml.byref(count))
    assert [(arr[i].start, arr[i].size) for i in range(count.value)] == [(0, 2), (2, 2), (4, 2)]
    ci = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, 1, ci_place(2, 2))
    assert pynvml.nvmlComputeInstanceGetInfo(ci).placement.start == 2
    assert (
        err(pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, 0, ci_place(3, 1))
        == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    assert (
        err(pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, 1, ci_place(1, 2))
        == pynvml.NVML_ERROR_INVALID_ARGUMENT
    )
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 5
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 4) == 0


def test_mig_device_handles(a100):
    _node, h = a100
    gi_big = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(0, 4))
    gi_small = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, place(4, 1))
    assert err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0) == pynvml.NVML_ERROR_NOT_FOUND  # no CIs yet
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi_big, 2)
    pynvml.nvmlGpuInstanceCreateComputeInstance(gi_small, 0)
    devs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2)]
    assert err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 2) == pynvml.NVML_ERROR_NOT_FOUND
    assert err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 7) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    # ordered by GPU instance id: gi 2 (3g at 0:4) then gi 11 (1g at 4:1)
    assert [pynvml.nvmlDeviceGetGpuInstanceId(d) for d in devs] == [2, 11]
    assert [pynvml.nvmlDeviceGetComputeInstanceId(d) for d in devs] == [0, 0]
    assert [pynvml.nvmlDeviceGetName(d) for d in devs] == [
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    ]
    uuids = [pynvml.nvmlDeviceGetUUID(d) for d in devs]
    assert all(u.startswith("MIG-") and len(u) == 40 for u in uuids) and uuids[0] != uuids[1]
    assert [pynvml.nvmlDeviceGetMemoryInfo(d).total // MIB for d in devs] == [40192, 9728]
    assert [pynvml.nvmlDeviceIsMigDeviceHandle(d).value for d in devs] == [1, 1]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 0
    assert [pynvml.nvmlDeviceGetIndex(d) for d in devs] == [0, 1]
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(devs[1])
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(h)
    assert err(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert err(pynvml.nvmlDeviceGetGpuInstanceId, h) == pynvml.NVML_ERROR_NOT_SUPPORTED
    same = pynvml.nvmlDeviceGetHandleByUUID(uuids[1])
    assert pynvml.nvmlDeviceGetGpuInstanceId(same) == 11
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(devs[0]) == []
    assert err(pynvml.nvmlDeviceGetMinorNumber, devs[0]) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_disable_clears_instances(a100):
    _node, h = a100
    pynvml.nvmlDeviceCreateGpuInstance(h, 0)
    assert pynvml.nvmlDeviceSetMigMode(h, 0) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
    pynvml.nvmlDeviceSetMigMode(h, 1)
    assert gpu_instances(h, 0) == []


def test_prebuilt_layout_fixture(make_node, nvml):
    node = make_node("h100-mig-enabled.json")
    nvml.init()
    h0, h1, h2, h3 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(4))
    assert [nvml.nvmlDeviceGetMigMode(h) for h in (h0, h1, h2, h3)] == [[1, 1], [1, 1], [1, 1], [0, 0]]
    assert [(i.id, i.placement.start) for i in gpu_instances(h0, 19)] == [(7 + s, s) for s in range(7)]
    devs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(h0, i) for i in range(7)]
    assert {nvml.nvmlDeviceGetName(d) for d in devs} == {"NVIDIA H100 80GB HBM3 MIG 1g.10gb"}
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(devs[0])
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(7001, 7, 0)]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(devs[1]) == []
    assert nvml.nvmlDeviceGetMemoryInfo(devs[0]).used == 2048 * MIB
    gi7 = nvml.nvmlDeviceGetGpuInstanceById(h0, 7)
    assert err(nvml.nvmlGpuInstanceDestroy, gi7) == pynvml.NVML_ERROR_IN_USE
    assert [(i.id, i.placement.start) for i in gpu_instances(h1, 14)] == [(3, 0), (4, 2)]
    gi1 = nvml.nvmlDeviceGetGpuInstanceById(h1, 1)
    assert [c.id for c in compute_instances(gi1, 0)] == [0, 1, 2]
    names = {nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h1, i)) for i in range(5)}
    assert names == {"NVIDIA H100 80GB HBM3 MIG 2g.20gb", "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"}
    assert err(nvml.nvmlDeviceGetMigDeviceHandleByIndex, h2, 0) == pynvml.NVML_ERROR_NOT_FOUND
    # with the process gone, the busy GPU's mode can change immediately
    node.ctl("set-processes", "--gpu", "0", "--clear")
    assert nvml.nvmlDeviceSetMigMode(h0, 0) == pynvml.NVML_SUCCESS


def test_state_persists_across_processes(a100):
    node, h = a100
    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))
    child = node.run(
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        gi = n.nvmlDeviceGetGpuInstanceById(h, 1)
        n.nvmlGpuInstanceCreateComputeInstance(gi, 2)
        g2 = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, __import__('ctypes').byref(
            n.c_nvmlGpuInstancePlacement_t(0, 2)))
        result = {"mode": n.nvmlDeviceGetMigMode(h), "gi": n.nvmlGpuInstanceGetInfo(g2).id,
                  "mig_devices": n.nvmlDeviceGetName(n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))}
        """
    )
    assert child == {"mode": [1, 1], "gi": 3, "mig_devices": "NVIDIA A100-SXM4-80GB MIG 3g.40gb"}
    assert [i.id for i in gpu_instances(h, 14)] == [3]
    gi = pynvml.nvmlDeviceGetGpuInstanceById(h, 1)
    assert [c.profileId for c in compute_instances(gi, 2)] == [2]
    shown = json.loads(node.ctl("show").stdout)
    gi_ids = sorted(g["id"] for g in shown["gpus"][0]["gpu_instances"])
    assert gi_ids == [1, 3] and shown["gpus"][0]["mig_current"] == 1


def test_ctl_show_creates_nothing_and_reset_all(make_node, nvml):
    node = make_node("h100-sxm5-80gb.json")
    shown = json.loads(node.ctl("show").stdout)
    assert [g["mig_current"] for g in shown["gpus"]] == [0, 0, 0, 0]
    assert not node.state_path.exists()
    nvml.init()  # init materialises the state file
    assert node.state_path.exists()
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    node.ctl("set-processes", "--gpu", "2", "--json", '[{"pid": 99, "used_memory_mib": 10}]')
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [99]
    assert nvml.nvmlDeviceSetMigMode(h, 1) == pynvml.NVML_ERROR_IN_USE
    node.ctl("reset", "--force")
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_concurrent_creates_are_serialised(a100):
    """Four processes race to create 1g GIs: the flock'd state admits exactly 7."""
    node, _h = a100
    code = (
        "import pynvml as n\n"
        "n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); ok = 0\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        n.nvmlDeviceCreateGpuInstance(h, 19); ok += 1\n"
        "    except n.NVMLError_InsufficientResources:\n"
        "        pass\n"
        "print(ok)\n"
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(BUILD_DIR), **node.env)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)
    ]
    created = sum(int(p.communicate(timeout=60)[0]) for p in procs)
    assert created == 7
    assert len(node.state()["gpus"][node.fixture["gpus"][0]["uuid"]]["gpu_instances"]) == 7


def test_ctl_waits_for_the_library_lock(make_node):
    node = make_node("l4.json")
    fd = os.open(str(node.state_path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    proc = subprocess.Popen(
        [sys.executable, str(CTL), "set-processes", "--gpu", "1", "--clear"], env=dict(os.environ, **node.env)
    )
    time.sleep(0.5)
    assert proc.poll() is None  # blocked on the lock
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    assert proc.wait(timeout=30) == 0
    assert node.state()["gpus"][node.fixture["gpus"][1]["uuid"]]["processes"] == []


def _capability_tree(caps):
    """{relative path of each access file: its DeviceFileMinor} under the driver's capability tree."""
    tree = {}
    for path in sorted(caps.rglob("access")):
        fields = dict(line.split(": ", 1) for line in path.read_text().splitlines())
        assert fields["DeviceFileMode"] == str(0o444) and fields["DeviceFileModify"] == "1", fields
        tree[str(path.relative_to(caps).parent)] = int(fields["DeviceFileMinor"])
    return tree


def test_the_drivers_mig_capability_tree_follows_the_instances(a100, monkeypatch):
    """As the kernel module adds and removes /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access
    with the instances, so does the double, where the node's view holds that tree (its mig/config entry); the minors
    are the ones the lab numbers /proc/driver/nvidia-caps/mig-minors with (gpuharden_lab.noderoot.mig_gi_minor)."""
    from gpuharden_lab.noderoot import mig_gi_minor

    node, h = a100
    caps = node.root / "capabilities"
    (caps / "mig").mkdir(parents=True)
    (caps / "mig" / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    stale = caps / "gpu0" / "mig" / "gi13"
    stale.mkdir(parents=True)
    (stale / "access").write_text("DeviceFileMinor: 999\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    monkeypatch.setenv("NVML_DOUBLE_CAPS_DIR", str(caps))

    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))
    gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
    cis = [pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(2)]
    base = mig_gi_minor(0, gi_id)
    assert _capability_tree(caps) == {"gpu0/mig/gi%d" % gi_id: base, "gpu0/mig/gi%d/ci0" % gi_id: base + 1,
                                      "gpu0/mig/gi%d/ci1" % gi_id: base + 2}
    for ci in cis:
        pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert _capability_tree(caps) == {}
    assert (caps / "mig" / "config").exists()


def test_no_capability_tree_is_made_where_the_node_has_none(a100, monkeypatch):
    node, h = a100
    caps = node.root / "capabilities"
    monkeypatch.setenv("NVML_DOUBLE_CAPS_DIR", str(caps))
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4))
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert not caps.exists()


def test_a_reset_that_ends_mig_mode_drops_the_destroyed_instances_capability_entries(a100, nvml, monkeypatch):
    """The control tool's reset destroys the GPU's instances when the pending mode takes effect: their capability
    entries go with them (nvml_double_ctl.drop_mig_capabilities), those of the other GPUs stay."""
    from gpuharden_lab.noderoot import mig_gi_minor

    node, h0 = a100
    caps = node.root / "capabilities"
    (caps / "mig").mkdir(parents=True)
    (caps / "mig" / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    monkeypatch.setenv("NVML_DOUBLE_CAPS_DIR", str(caps))
    node.ctl("set-processes", "--gpu", "1", "--clear")
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceSetMigMode(h1, 1) == pynvml.NVML_SUCCESS
    for h in (h0, h1):
        pynvml.nvmlGpuInstanceCreateComputeInstance(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, place(4, 4)), 0)
    assert len(_capability_tree(caps)) == 4

    state = json.loads(node.state_path.read_text())
    state["gpus"][node.fixture["gpus"][0]["uuid"]]["mig_pending"] = 0
    node.state_path.write_text(json.dumps(state))
    node.ctl("reset", "--gpu", "0")
    assert node.state()["gpus"][node.fixture["gpus"][0]["uuid"]]["gpu_instances"] == []
    gi_id = [key for key in _capability_tree(caps) if key.count("/") == 2][0].rsplit("gi", 1)[1]
    base = mig_gi_minor(1, int(gi_id))
    assert _capability_tree(caps) == {"gpu1/mig/gi%s" % gi_id: base, "gpu1/mig/gi%s/ci0" % gi_id: base + 1}
