# SPDX-License-Identifier: GPL-3.0-or-later
"""`make demo`: bring up the seed-failures lab and show the fleet's state through the product.

The lab (simulated GPU nodes over real SSH, a real control plane) stays up afterwards so it can be
explored: `ansible -i inventories/lab/hosts.yml all -m gpuharden.k8s.gpu_facts`; `gpuharden lab down`
removes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuharden.lab import REPO_ROOT, cluster, manager
from gpuharden.lab.system import LabError

SCENARIO = os.environ.get("GPUHARDEN_DEMO_SCENARIO", "seed-failures")
BIN = Path(sys.executable).parent


def _section(title: str) -> None:
    print("\n=== %s %s" % (title, "=" * max(0, 70 - len(title))), flush=True)


def _run(argv: list[str]) -> int:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, check=False).returncode


def main() -> int:
    try:
        if manager.load_state() is not None or manager.leftovers():
            print("demo: removing the previous lab first", flush=True)
            manager.down()
        _section("gpuharden lab up --scenario %s" % SCENARIO)
        state = manager.up(SCENARIO)
    except LabError as error:
        print("demo: %s" % error, file=sys.stderr)
        return 2
    print("lab up in %.1fs: %d nodes over SSH, kube-apiserver on 127.0.0.1:6443 (timings: %s)"
          % (state["timings"]["total"], len(state["nodes"]), state["timings"]))

    _section("Fleet as the cluster sees it")
    summary = cluster.node_summary(cluster.api_client(state["cluster"]["admin_kubeconfig"]))
    services = state.get("services", {})
    print("%-22s %-24s %-6s %-9s %s" % ("NODE", "FIXTURE", "READY", "KUBELET", "ALLOCATABLE (nvidia.com/*)"))
    for name in sorted(state["nodes"]):
        kubelet = manager.ssh(state["nodes"][name]["address"], "systemctl is-active kubelet k3s-agent 2>/dev/null | head -1")
        print("%-22s %-24s %-6s %-9s %s" % (
            name, state["nodes"][name]["fixture"] or "(CPU only)", summary.get(name, {}).get("ready"),
            kubelet.stdout.strip() or services.get(name), summary.get(name, {}).get("allocatable_gpu") or "-",
        ))

    _section("gpuharden facts -i inventories/lab/hosts.yml")
    _run([str(BIN / "gpuharden"), "facts", "-i", state["inventory"]])

    _section("ansible-playbook playbooks/audit-node.yml (read-only)")
    rc = _run([str(BIN / "ansible-playbook"), "-i", state["inventory"], str(REPO_ROOT / "playbooks/audit-node.yml")])
    print("\nThe lab is still up. Explore it with the inventory %s; remove it with `gpuharden lab down`." % state["inventory"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
