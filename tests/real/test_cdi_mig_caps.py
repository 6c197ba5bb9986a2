# SPDX-License-Identifier: GPL-3.0-or-later
"""Why the product wants the MIG capability device nodes before anything asks for them, shown with the real NVIDIA
container toolkit (``nvidia-ctk cdi generate``, the release `make real-components` builds) on the NVML double.

The toolkit maps each MIG device's GPU- and compute-instance capabilities to ``/dev/nvidia-caps/nvidia-cap<minor>``
through the driver's ``/proc/driver/nvidia-caps/mig-minors`` (internal/nvcaps/nvcaps.go, read from the host root), and
looks each node up under the dev root. A node it cannot find is logged ("Could not locate") and left out of the spec
(internal/discover/mounts.go, mounts.Mounts), so the spec lets a MIG container start without its capability nodes.
The product's device_permissions stage (nvidia_device_nodes) creates them from the same driver files, and the spec
generated afterwards carries them.

Needs root (mknod, a private mount namespace: the toolkit reads /proc/driver from the host root, so the node root's is
bind-mounted there) and the toolkit's binaries (skips without them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gpuharden_lab import realnode
from gpuharden_lab.noderoot import build_node_root
from gpuharden_lab.system import LabError

from tests.builds import skip_unbuilt
from tests.unit.conftest import run_module

pytestmark = pytest.mark.real

# The driver's user-space libraries the toolkit's common edits look for by the driver's version (empty files: the spec
# only names them).
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


def nvidia_ctk() -> Path:
    try:
        return realnode.container_toolkit_binaries()["nvidia-ctk"]
    except LabError as error:
        skip_unbuilt("the NVIDIA container toolkit is not built (%s): run `make real-components`" % error)
        raise


def generate(ctk: Path, node) -> tuple[dict, str]:
    """The CDI spec the real toolkit generates for the node root, and its log."""
    if not shutil.which("unshare") or os.geteuid() != 0 or not os.path.isdir("/proc/driver"):
        pytest.skip("needs root, unshare (a private mount namespace) and /proc/driver to mount the node's over")
    script = 'mount --bind "$1/proc/driver" /proc/driver && exec "$2" --debug cdi generate --driver-root "$1" --dev-root "$1" --format json'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(node.root), str(ctk)],
                          env=dict(os.environ, **node.env()), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout), done.stderr


def mig_device_nodes(spec: dict) -> dict[str, list[str]]:
    """{"<gpu>:<mig index>": the device nodes of that MIG device's edits}."""
    return {device["name"]: [node["path"] for node in device.get("containerEdits", {}).get("deviceNodes", [])]
            for device in spec["devices"] if ":" in device["name"]}


def test_the_spec_leaves_missing_capability_nodes_out_and_has_them_once_the_product_made_them(world_tmp):
    ctk = nvidia_ctk()
    node = build_node_root(world_tmp / "node", "h100-mig-enabled", mig_capabilities=True)
    libraries = node.root / "usr/lib/x86_64-linux-gnu"
    libraries.mkdir(parents=True, exist_ok=True)
    driver_version = json.loads(node.fixture.read_text())["driver_version"]
    for name in DRIVER_LIBRARIES:
        (libraries / ("%s.%s" % (name, driver_version))).touch()

    before, log = generate(ctk, node)
    devices = mig_device_nodes(before)
    assert devices, before["devices"]
    # every MIG device gets its parent GPU and nothing else: its capability nodes are not there to find
    assert {tuple(paths) for paths in devices.values()} <= {("/dev/nvidia0",), ("/dev/nvidia1",)}, devices
    assert "Could not locate /dev/nvidia-caps/nvidia-cap" in log

    made = run_module("nvidia_device_nodes", {"root": str(node.root)}, {})
    assert not made.get("failed") and made["changed"], made

    after, log = generate(ctk, node)
    devices = mig_device_nodes(after)
    assert devices.keys() == mig_device_nodes(before).keys(), devices
    for name, paths in devices.items():
        caps = [path for path in paths if path.startswith("/dev/nvidia-caps/nvidia-cap")]
        # the GPU instance's and the compute instance's capability, both made by the product
        assert len(caps) == 2, (name, paths)
        for path in caps:
            assert (node.root / path.lstrip("/")).is_char_device(), path
    assert "Could not locate /dev/nvidia-caps/nvidia-cap" not in log
