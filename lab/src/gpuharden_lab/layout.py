# SPDX-License-Identifier: GPL-3.0-or-later
"""Names and paths of everything the lab creates: all carry the lab prefix, so `lab down` finds them."""

from __future__ import annotations

import os
from pathlib import Path

from gpuharden_lab import REPO_ROOT

PREFIX = "gpuhlab"
# Not under /run or /var/lib: nodes mount their own /run and an overlay on /var/lib, and must
# still see the lab's files (sshd config, keys, logs) at the same paths as the host does.
LAB_DIR = Path(os.environ.get("GPUHARDEN_LAB_DIR", "/var/tmp/gpuharden-lab"))
STATE_FILE = LAB_DIR / "lab.json"
SSH_DIR = LAB_DIR / "ssh"
NODES_DIR = LAB_DIR / "nodes"
CONTROL_PLANE_DIR = LAB_DIR / "controlplane"
NODE_PYTHON = REPO_ROOT / "build" / "node-python"
INVENTORY_DIR = REPO_ROOT / "inventories" / "lab"

BRIDGE = PREFIX + "-br0"
SUBNET_PREFIX = "10.213.0."
BRIDGE_ADDRESS = SUBNET_PREFIX + "1"
PREFIX_LENGTH = 24
FIRST_NODE_HOST = 11

CGROUP2_HOST_MOUNT = Path("/sys/fs/cgroup/unified")
CGROUP_ROOT_NAME = "gpuharden-lab"


def cgroup2_mount() -> Path:
    """Where the host's cgroup2 hierarchy is: /sys/fs/cgroup/unified on hybrid hosts, else /sys/fs/cgroup."""
    if CGROUP2_HOST_MOUNT.is_dir() and (CGROUP2_HOST_MOUNT / "cgroup.procs").exists():
        return CGROUP2_HOST_MOUNT
    return Path("/sys/fs/cgroup")


def lab_cgroup() -> Path:
    return cgroup2_mount() / CGROUP_ROOT_NAME


def netns_name(index: int) -> str:
    return "%s-n%d" % (PREFIX, index)


def host_veth(index: int) -> str:
    return "%s-h%d" % (PREFIX, index)


def node_address(index: int) -> str:
    return SUBNET_PREFIX + str(FIRST_NODE_HOST + index)
