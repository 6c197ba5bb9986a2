# SPDX-License-Identifier: GPL-3.0-or-later
"""Mitogen for Ansible side by side with Ansible's own strategy, runs alternating, on the running scale lab.

Each round runs ``gpuharden drift`` on one node and on ``--nodes`` nodes, and a no-op ``harden_gpu_nodes.yml`` of
one compliant node (scale-0, hardened once first, not timed), once without and once with Mitogen (bench/mitogen_env.py),
so that both see the same lab and the same load.  Prints each run's wall and controller CPU per node (bench/drift.py's
CpuMeter) and the medians.  Root only; the lab must be up (``gpuharden lab up --scenario scale --nodes N``).
Mitogen's connection timeout (Ansible's ``timeout``, 10 s by default) covers its whole bootstrap on the node (ssh,
the node's Python, Mitogen's core sent over the wire), where Ansible's own covers only ssh's connect: on a loaded
controller raise it for both (``ANSIBLE_TIMEOUT``), or Mitogen's runs report the nodes unreachable.

    python bench/mitogen.py [--nodes 8] [--runs 2] [--no-harden] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import drift  # noqa: E402  (bench/drift.py)
from gpuharden_lab import manager  # noqa: E402
from mitogen_env import mitogen_env  # noqa: E402

STRATEGIES = {"linear": {}, "mitogen_linear": mitogen_env()}
HARDEN_VARS = {"gpuharden_postcheck_fail_severity": "never"}


def with_strategy(name, function, *args, **kwargs):
    for variable in ("ANSIBLE_STRATEGY", "ANSIBLE_STRATEGY_PLUGINS"):
        drift.ENV.pop(variable, None)
    drift.ENV.update(STRATEGIES[name])
    try:
        return function(*args, **kwargs)
    finally:
        for variable in STRATEGIES[name]:
            drift.ENV.pop(variable, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-harden", action="store_true", help="leave out the no-op harden runs")
    parser.add_argument("--json", help="write the figures here")
    options = parser.parse_args(argv)
    state = manager.load_state()
    inventory = state["inventory"]
    names = sorted(state["nodes"], key=lambda name: int(name.rsplit("-", 1)[1]))[:options.nodes]
    cases = {"drift_1": (drift.timed_cli, inventory, names[:1]), "drift_%d" % len(names): (drift.timed_cli, inventory, names)}
    if not options.no_harden:
        prepare = drift.timed_playbook("harden", inventory, names[:1], HARDEN_VARS)
        if prepare["rc"] != 0:
            raise SystemExit("hardening %s failed: %s" % (names[0], prepare["failures"]))
        cases["harden_noop_1"] = (drift.timed_playbook, "harden", inventory, names[:1], HARDEN_VARS)
    samples = {case: {strategy: [] for strategy in STRATEGIES} for case in cases}
    for round_number in range(options.runs):
        for case, (function, *args) in cases.items():
            for strategy in STRATEGIES:
                sample = with_strategy(strategy, function, *args)
                samples[case][strategy].append(sample)
                cpu = sample.get("cpu", {})
                print("round %d %-14s %-15s wall %6.2f s  controller %s ms/node  node %s ms/audit  rc/failed %s" % (
                    round_number + 1, case, strategy, sample["wall_s"], cpu.get("controller_ms_per_node", "-"), cpu.get("node_ms_per_audit", "-"),
                    sample.get("rc", sample.get("failed"))), flush=True)
    summary = {case: {strategy: {"wall_s_median": round(statistics.median(s["wall_s"] for s in runs), 2),
                                 "controller_ms_per_node_median": (round(statistics.median(s["cpu"]["controller_ms_per_node"] for s in runs), 1)
                                                                   if runs and "cpu" in runs[0] else None)}
                      for strategy, runs in by_strategy.items()} for case, by_strategy in samples.items()}
    for case, by_strategy in summary.items():
        print("%-14s %s" % (case, "; ".join("%s: wall %s s, controller %s ms/node" % (
            strategy, figures["wall_s_median"], figures["controller_ms_per_node_median"]) for strategy, figures in by_strategy.items())))
    if options.json:
        Path(options.json).write_text(json.dumps({"summary": summary, "samples": samples}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
