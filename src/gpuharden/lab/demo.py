# SPDX-License-Identifier: GPL-3.0-or-later
"""`make demo` before the lab fleet exists: audit one simulated DGX node on localhost.

Builds a node's driver view from an NVML fixture (a GPU whose device node lost its mode, a PCIe
link trained down), points the NVML double at it and runs the read-only audit play through
ansible-playbook, so what it prints is what the product itself found.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuharden.lab import NVML_LIBRARY_DIR, REPO_ROOT
from gpuharden.lab.noderoot import build_node_root

DEMO_ROOT = REPO_ROOT / "build" / "demo" / "node"
DEMO_FIXTURE = "dgx-a100-pcie-degraded"


def main() -> int:
    if os.geteuid() != 0:
        print("make demo needs root: it creates device nodes with mknod", file=sys.stderr)
        return 2
    if not (NVML_LIBRARY_DIR / "libnvidia-ml.so.1").exists():
        print("the NVML double is not built: run `make setup` first", file=sys.stderr)
        return 2
    node = build_node_root(DEMO_ROOT, DEMO_FIXTURE, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    print("Simulated node: fixture %s, driver view under %s" % (node.fixture.name, node.root), flush=True)
    print("Seeded: /dev/nvidia0 mode 0600 (non-root NVML fails); fixture has a PCIe link trained down.\n", flush=True)
    env = dict(os.environ, **node.env())
    env.setdefault("ANSIBLE_CONFIG", str(REPO_ROOT / "ansible.cfg"))
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(REPO_ROOT / "inventories" / "localhost" / "hosts.yml"),
        str(REPO_ROOT / "playbooks" / "audit-node.yml"),
        "-e",
        "gpuharden_node_root=%s" % node.root,
    ]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
