# SPDX-License-Identifier: GPL-3.0-or-later
"""Names and paths of everything the lab creates: all carry the lab prefix, so `lab down` finds them."""

from __future__ import annotations

import os
from pathlib import Path

from gpuharden_lab import REPO_ROOT


def _instance() -> int:
    value = os.environ.get("GPUHARDEN_LAB_INSTANCE", "0")
    if not (value.isdigit() and 0 <= int(value) <= MAX_INSTANCE):
        raise ValueError("GPUHARDEN_LAB_INSTANCE=%r: expected an integer from 0 to %d" % (value, MAX_INSTANCE))
    return int(value)


# Several labs can be up at once on one machine, one per instance (GPUHARDEN_LAB_INSTANCE, default 0; the test
# suite runs one per pytest-xdist worker).  Instance 0 keeps the historical names.  Every name, address, port and
# path below differs per instance, and no instance's prefix starts with another's, so `lab down` of one never
# touches another (it matches netns and links by prefix, processes by LAB_DIR + "/").
MAX_INSTANCE = 9
INSTANCE = _instance()
SUFFIX = "" if INSTANCE == 0 else str(INSTANCE)
PREFIX = "gpuhlab" if INSTANCE == 0 else "gpuhl%d" % INSTANCE
# Not under /run or /var/lib: nodes mount their own /run and an overlay on /var/lib, and must
# still see the lab's files (sshd config, keys, logs) at the same paths as the host does.
LAB_DIR = Path(os.environ.get("GPUHARDEN_LAB_DIR", "/var/tmp/gpuharden-lab" + SUFFIX))
# One lab per instance at a time: the lab tests, molecule and the demo hold this while they use the lab.
LOCK_FILE = Path("/var/tmp/gpuharden-lab%s.lock" % SUFFIX)
STATE_FILE = LAB_DIR / "lab.json"
SSH_DIR = LAB_DIR / "ssh"
NODES_DIR = LAB_DIR / "nodes"
CONTROL_PLANE_DIR = LAB_DIR / "controlplane"
NODE_PYTHON = REPO_ROOT / "build" / "node-python"
INVENTORY_DIR = REPO_ROOT / "inventories" / "lab"
INVENTORY_FILE = INVENTORY_DIR / ("hosts%s.yml" % ("" if INSTANCE == 0 else "-lab%d" % INSTANCE))

BRIDGE = PREFIX + "-br0"
SUBNET_PREFIX = "10.213.%d." % INSTANCE
BRIDGE_ADDRESS = SUBNET_PREFIX + "1"
PREFIX_LENGTH = 24
FIRST_NODE_HOST = 11

CGROUP2_HOST_MOUNT = Path("/sys/fs/cgroup/unified")
CGROUP_ROOT_NAME = "gpuharden-lab" + SUFFIX

# The control plane's host ports (127.0.0.1 only), shifted by 1000 per instance.
PORT_OFFSET = 1000 * INSTANCE
ETCD_PORT, ETCD_PEER_PORT = 2379 + PORT_OFFSET, 2380 + PORT_OFFSET
API_PORT = 6443 + PORT_OFFSET
KCM_PORT, SCHEDULER_PORT = 10257 + PORT_OFFSET, 10259 + PORT_OFFSET


def cgroup2_mount() -> Path:
    """Where the host's cgroup2 hierarchy is: /sys/fs/cgroup/unified on hybrid hosts, else /sys/fs/cgroup."""
    if CGROUP2_HOST_MOUNT.is_dir() and (CGROUP2_HOST_MOUNT / "cgroup.procs").exists():
        return CGROUP2_HOST_MOUNT
    return Path("/sys/fs/cgroup")


def lab_cgroup() -> Path:
    return cgroup2_mount() / CGROUP_ROOT_NAME


def in_v1_hierarchy(cgroup: Path, hierarchy: Path) -> Path:
    """The cgroup at the same place as ``cgroup`` (a path in the lab's cgroup2 tree) in the v1 ``hierarchy``."""
    return hierarchy / cgroup.relative_to(cgroup2_mount())


def netns_name(index: int) -> str:
    return "%s-n%d" % (PREFIX, index)


def host_veth(index: int) -> str:
    return "%s-h%d" % (PREFIX, index)


def node_address(index: int) -> str:
    return SUBNET_PREFIX + str(FIRST_NODE_HOST + index)
