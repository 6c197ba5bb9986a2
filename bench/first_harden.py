# SPDX-License-Identifier: GPL-3.0-or-later
"""Goal (c) of issue 15, second half: the first ``harden_gpu_nodes.yml`` run on the drifted ``seed-failures`` fleet
(11 nodes, most of them on the real kubelet, containerd and NVIDIA device plugin), as ``make demo`` runs it; the goal
is half of 131 s (65.5 s).

Each run brings up a new ``seed-failures`` lab (``gpuharden lab up``, on the instance GPUHARDEN_LAB_INSTANCE names),
times the first harden with bench/drift.py's own function, then runs harden again, which must change nothing.
Prints JSON: each run's wall seconds, tasks, changed count and slowest tasks.  Root only; the lab is left up.

    GPUHARDEN_LAB_INSTANCE=5 python bench/first_harden.py [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import drift as bench  # noqa: E402

GOAL_S = 131 / 2
# lab/src/gpuharden_lab/demo.py's: every node in one batch, a failing post-check reported, the operator's three decisions
# (the seeds' competing plugin DaemonSets block the managed plugin unless the run deletes them)
EXTRA_VARS = {"gpuharden_max_fail_percentage": 100, "gpuharden_postcheck_fail_severity": "never",
              "gpuharden_mig_strategy": "mixed", "runtime_class_force": True, "device_plugin_remove_competing": True}


def new_lab():
    """A fresh seed-failures lab: its inventory path and its GPU nodes."""
    lab = [sys.executable, "-m", "gpuharden.cli", "lab"]
    subprocess.run(lab + ["down"], cwd=bench.REPO, env=dict(os.environ, **bench.ENV), capture_output=True, check=False)
    completed = subprocess.run(lab + ["up", "--scenario", "seed-failures"], cwd=bench.REPO, env=dict(os.environ, **bench.ENV),
                               capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit("gpuharden lab up failed: %s" % completed.stderr[-2000:])
    state = json.loads(completed.stdout)
    return state["inventory"], sorted(state["nodes"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    out = {"goal_s": GOAL_S, "first": [], "second": []}
    for _ in range(args.runs):
        inventory, _nodes = new_lab()
        out["first"].append(bench.timed_playbook("harden", inventory, ["gpu_nodes"], extravars=EXTRA_VARS))
        out["second"].append(bench.timed_playbook("harden", inventory, ["gpu_nodes"], extravars=EXTRA_VARS))
    out["first_median_s"] = statistics.median(run["wall_s"] for run in out["first"])
    print(json.dumps(out, indent=1, default=str))
    ok = all(run["rc"] == 0 for run in out["first"] + out["second"]) and all(run["changed"] == 0 for run in out["second"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
