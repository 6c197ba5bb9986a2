"""Kernel permission decisions: real char nodes (mknod) and a child that drops to nobody."""

from __future__ import annotations

import os

import pynvml
from nvml_double_support import NOBODY


def test_nvidiactl_root_only_blocks_unprivileged_init(make_node):
    node = make_node("dgx-a100-80gb.json")
    node.mknod("nvidiactl", 255, 0o600)
    code = """
        e = err(n.nvmlInit)
        result = {"err": e, "str": str(n.NVMLError(e)) if e else None}
        """
    assert node.run(code, uid=NOBODY) == {"err": pynvml.NVML_ERROR_NO_PERMISSION, "str": "Insufficient Permissions"}
    assert node.run(code) == {"err": None, "str": None}  # root opens it (ENXIO = no driver, but allowed)


def test_one_gpu_node_unreadable(make_node):
    node = make_node("dgx-a100-80gb.json")
    node.mknod("nvidia3", 3, 0o600)
    code = """
        n.nvmlInit()
        result = {"count": n.nvmlDeviceGetCount(),
                  "errs": [err(n.nvmlDeviceGetHandleByIndex, i) for i in range(n.nvmlDeviceGetCount())],
                  "by_uuid": err(n.nvmlDeviceGetHandleByUUID, %r)}
        """ % node.fixture["gpus"][3]["uuid"]
    out = node.run(code, uid=NOBODY)
    assert out["count"] == 8
    assert out["errs"] == [None, None, None, pynvml.NVML_ERROR_NO_PERMISSION, None, None, None, None]
    assert out["by_uuid"] == pynvml.NVML_ERROR_NO_PERMISSION
    assert node.run(code)["errs"] == [None] * 8


def test_group_permission_fix_is_honoured(make_node):
    """0660 root:video denies nobody; adding nobody's gid as the group grants it."""
    node = make_node("l4.json")
    for name, minor in (("nvidiactl", 255), ("nvidia0", 0), ("nvidia1", 1)):
        path = node.mknod(name, minor, 0o660)
        os.chown(path, 0, 44)
    code = "result = err(n.nvmlInit)"
    assert node.run(code, uid=NOBODY) == pynvml.NVML_ERROR_NO_PERMISSION
    for name in ("nvidiactl", "nvidia0", "nvidia1"):
        os.chown(node.dev / name, 0, NOBODY)
    assert node.run(code, uid=NOBODY) is None


def test_unprivileged_reads_but_cannot_change_mig(make_node):
    node = make_node("h100-mig-enabled.json")
    code = """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(2)
        h0 = n.nvmlDeviceGetHandleByIndex(0)
        gi = n.nvmlDeviceGetGpuInstanceById(h0, 8)
        ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
        result = {"mode": n.nvmlDeviceGetMigMode(h), "set": err(n.nvmlDeviceSetMigMode, h, 0),
                  "create": err(n.nvmlDeviceCreateGpuInstance, h, 19),
                  "ci_destroy": err(n.nvmlComputeInstanceDestroy, ci),
                  "gi_destroy": err(n.nvmlGpuInstanceDestroy, gi),
                  "mig0": n.nvmlDeviceGetName(n.nvmlDeviceGetMigDeviceHandleByIndex(h0, 0))}
        """
    out = node.run(code, uid=NOBODY)
    assert out == {
        "mode": [1, 1],
        "set": pynvml.NVML_ERROR_NO_PERMISSION,
        "create": pynvml.NVML_ERROR_NO_PERMISSION,
        "ci_destroy": pynvml.NVML_ERROR_NO_PERMISSION,
        "gi_destroy": pynvml.NVML_ERROR_NO_PERMISSION,
        "mig0": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    }
    root = node.run("""
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(2)
        gi = n.nvmlDeviceCreateGpuInstance(h, 19)
        result = n.nvmlGpuInstanceGetInfo(gi).profileId
        """)
    assert root == 19


def test_mig_config_capability_grants_create(make_node):
    """Access to <dev>/nvidia-caps/nvidia-cap1 (mig/config) allows GI/CI management without root."""
    node = make_node("h100-mig-enabled.json")
    node.run("n.nvmlInit()")  # root materialises the state file
    os.chmod(node.state_path.parent, 0o777)
    os.chmod(str(node.state_path) + ".lock", 0o666)
    code = """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(2)
        result = err(n.nvmlDeviceCreateGpuInstance, h, 0)
        """
    assert node.run(code, uid=NOBODY) == pynvml.NVML_ERROR_NO_PERMISSION
    cap = node.mknod("nvidia-caps/nvidia-cap1", 1, 0o444)
    os.chmod(cap.parent, 0o755)
    assert node.run(code, uid=NOBODY) is None
    assert (
        node.run(
            """
        n.nvmlInit()
        result = err(n.nvmlDeviceSetMigMode, n.nvmlDeviceGetHandleByIndex(3), 1)
        """,
            uid=NOBODY,
        )
        == pynvml.NVML_ERROR_NO_PERMISSION
    )  # mode changes still need root


def test_ld_library_path_loading_and_no_fixture(make_node):
    node = make_node("l4.json")
    out = node.run(
        """
        import ctypes
        e = err(n.nvmlInit)
        result = {"err": e, "lib": n.nvmlLib._name}
        """,
        env={"NVML_DOUBLE_FIXTURE": str(node.root / "absent.json")},
    )
    assert out == {"err": pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "lib": "libnvidia-ml.so.1"}


def test_fixture_unreadable_for_unprivileged_is_driver_not_loaded(make_node):
    node = make_node("l4.json")
    os.chmod(node.fixture_path, 0o600)
    assert node.run("result = err(n.nvmlInit)", uid=NOBODY) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
