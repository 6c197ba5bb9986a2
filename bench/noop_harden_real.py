# SPDX-License-Identifier: GPL-3.0-or-later
"""Goal (c) of issue 15 on the real components: a no-op ``harden_gpu_nodes.yml`` on one node of a hardened
``real-nodes`` lab (real kubelet, containerd and NVIDIA device plugin) against ``gpuharden drift`` of that node,
timed with bench/drift.py's own functions, runs alternating.  ``make bench`` measures (c) on the scale lab's
stand-in nodes; this one is the same ratio where the device plugin and the kubelet are the real ones.

The lab must be up and hardened once (``GPUHARDEN_LAB_INSTANCE=N gpuharden lab up real-nodes``, then one harden run
with the same extra variables).  Prints JSON: each run's wall seconds, tasks, changed count and slowest tasks.

    python bench/noop_harden_real.py INVENTORY [--host real-c2-0] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import drift as bench  # noqa: E402

# As tests/integration/test_real_nodes_harden.py: the plugin release the lab builds, and the H100 node has MIG enabled.
EXTRA_VARS = {"device_plugin_version": "v0.18.2", "gpuharden_mig_strategy": "mixed"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--host", default="real-c2-0")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    args.inventory = str(Path(args.inventory).resolve())  # ansible-runner runs in a private directory of its own
    out = {"harden": [], "drift": []}
    for _ in range(args.runs):
        out["harden"].append(bench.timed_playbook("harden", args.inventory, [args.host], extravars=EXTRA_VARS))
        out["drift"].append(bench.timed_cli(args.inventory, [args.host]))
    harden = [run["wall_s"] for run in out["harden"]]
    drift = [run["wall_s"] for run in out["drift"]]
    out["ratio_of_medians"] = round(statistics.median(harden) / statistics.median(drift), 2)
    print(json.dumps(out, indent=1, default=str))
    return 0 if all(run["rc"] == 0 and run["changed"] == 0 for run in out["harden"]) else 1


if __name__ == "__main__":
    sys.exit(main())
