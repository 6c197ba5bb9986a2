# SPDX-License-Identifier: GPL-3.0-or-later
"""`make bench`: every benchmark goal of the operations issue in one run, printed side by side as ratios.

(a)-(c) bench/drift.py (scale lab, 32 nodes), (d) bench/consistency.py (5,000 kwok nodes), (e) bench/ebpf_audit.py
(10,000 cgroups), (f) bench/explain.py (gpuharden explain for one pod, healthy lab).  Each script's own output is
shown as it runs; the table at the end is also written to
build/bench/results.md (the README's performance table is copied from it) and the figures to build/bench/*.json.
Root only; the labs are taken one after the other under the shared lab lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "bench"
sys.path.insert(0, str(REPO / "bench"))

from goals import (  # noqa: E402  (bench/goals.py)
    CONTROLLER_MS_GOAL,
    DRIFT_SPEEDUP_GOAL,
    NODE_MS_GOAL,
    NOOP_HARDEN_RATIO_GOAL,
    PROJECTED_MINUTES_GOAL,
    PROJECTED_NODES,
    SCALE_RATIO_GOAL,
)


def run(script, *args):
    target = OUT / (Path(script).stem + ".json")
    target.unlink(missing_ok=True)
    print("\n=== %s %s" % (script, " ".join(args)), flush=True)
    started = time.monotonic()
    completed = subprocess.run([sys.executable, str(REPO / script), "--json", str(target), *args], cwd=REPO, check=False)
    print("(%s: rc %d in %.0f s)" % (script, completed.returncode, time.monotonic() - started), flush=True)
    return json.loads(target.read_text()) if target.exists() else None


CONTROLLER_CPUS = 2


def projected_minutes(controller_ms_per_node, nodes=PROJECTED_NODES, cpus=CONTROLLER_CPUS):
    """Minutes one controller of ``cpus`` CPUs needs to drift ``nodes`` nodes, were its CPU the only limit: the
    controller's CPU per node of (b) times the nodes, spread over its CPUs.  An extrapolation, stated as such: it
    assumes each node audits itself on its own CPUs (a real fleet; in the lab all nodes share the controller's) and
    that Ansible's cost per host stays flat from 32 to 10,000 hosts, which this machine cannot check."""
    return controller_ms_per_node / 1000 * nodes / cpus / 60


def row(goal, measured, target, ratio, verdict):
    return "| %s | %s | %s | %s | %s |" % (goal, measured, target, ratio, verdict)


def table(drift, consistency, ebpf, explain=None):
    lines = ["| goal | measured | target | ratio | met |", "| --- | --- | --- | --- | --- |"]
    if drift:
        a, b, c = drift["a"], drift["b"], drift["c"]
        nodes = str(drift["nodes"])
        lines.append(row("(a) drift vs builtin-module baseline, 8 nodes", "%.2f s vs %.2f s" % (a["drift"]["wall_s"], a["baseline"]["wall_s"]),
                         ">= %dx faster" % DRIFT_SPEEDUP_GOAL, "%.1fx" % a["ratio"], "yes" if a["ratio"] >= DRIFT_SPEEDUP_GOAL else "no"))
        lines.append(row("(b) drift on 1 / 8 / %s nodes" % nodes, " / ".join("%.2f s" % b[k]["wall_s"] for k in ("1", "8", nodes) if k in b),
                         "%s nodes <= %dx one" % (nodes, SCALE_RATIO_GOAL), "%.2fx" % b["ratio"], "yes" if b["ratio"] <= SCALE_RATIO_GOAL else "no"))
        cpu = b[nodes].get("cpu") or {}
        if cpu.get("node_ms_per_audit") is not None:
            lines.append(row("(b) node-side CPU per audit, %s nodes" % nodes,
                             "%.0f ms (at most %.0f ms)" % (cpu["node_ms_per_audit"], cpu["node_ms_per_audit_max"]), "<= %d ms" % NODE_MS_GOAL,
                             "%.2fx of goal" % (cpu["node_ms_per_audit"] / NODE_MS_GOAL), "yes" if cpu["node_ms_per_audit"] <= NODE_MS_GOAL else "no"))
        if cpu:
            lines.append(row("(b) controller CPU per node per drift run, %s nodes" % nodes,
                             "%.0f ms (%s ms with ssh's masters and the rest of the machine)"
                             % (cpu["controller_ms_per_node"], cpu["controller_ms_per_node_upper"]),
                             "<= %d ms" % CONTROLLER_MS_GOAL, "%.1fx of goal" % (cpu["controller_ms_per_node"] / CONTROLLER_MS_GOAL),
                             "yes" if cpu["controller_ms_per_node"] <= CONTROLLER_MS_GOAL else "no"))
        if cpu.get("controller_ms_per_node") is not None:
            minutes = projected_minutes(cpu["controller_ms_per_node"])
            lines.append(row("projected: one 2-core controller drifts %d nodes (extrapolated from (b)'s controller CPU per node)"
                             % PROJECTED_NODES, "%.1f min" % minutes, "<= %d min" % PROJECTED_MINUTES_GOAL,
                             "%.2fx of goal" % (minutes / PROJECTED_MINUTES_GOAL), "yes" if minutes <= PROJECTED_MINUTES_GOAL else "no"))
        lines.append(row("(c) no-op harden vs drift, 1 compliant node", "%.2f s vs %.2f s" % (c["harden_noop"]["wall_s"], c["drift"]["wall_s"]),
                         "<= %.1fx" % NOOP_HARDEN_RATIO_GOAL, "%.2fx" % c["ratio"], "yes" if c["ratio"] <= NOOP_HARDEN_RATIO_GOAL else "no"))
    else:
        lines.append(row("(a)-(c) drift", "did not run", "", "", "no"))
    if consistency:
        seconds = consistency["seconds"]
        scale = (consistency.get("kwok_nodes"), consistency.get("gpus"), consistency.get("pods"))
        lines.append(row("(d) cluster consistency, %s nodes / %s GPUs / %s pods" % scale,
                         "%.2f s" % seconds, "<= 5 s", "%.2fx of goal" % (seconds / 5.0), "yes" if seconds <= 5 else "no"))
    else:
        lines.append(row("(d) cluster consistency", "did not run", "<= 5 s", "", "no"))
    if ebpf:
        lines.append(row("(e) eBPF device-cgroup audit, %d cgroups" % ebpf["containers"], "%.3f s" % ebpf["best_audit_s"], "<= 1 s",
                         "%.2fx of goal" % ebpf["best_audit_s"], "yes" if ebpf["best_audit_s"] <= 1 else "no"))
    else:
        lines.append(row("(e) eBPF audit", "did not run", "<= 1 s", "", "no"))
    if explain:
        typo, node_side = explain["typo"], explain["node_side"]
        lines.append(row("(f) explain pod, misspelt resource (Pending)", "%.2f s, %d node trips" % (typo["median_s"], typo["node_trips"]),
                         "<= 5 s, no trip", "%.2fx of goal" % (typo["median_s"] / 5.0),
                         "yes" if typo["median_s"] <= 5 and typo["node_trips"] == 0 else "no"))
        lines.append(row("(f) explain pod, a cause on the node (one drift check of it)",
                         "%.2f s, %d node trip" % (node_side["median_s"], node_side["node_trips"]), "<= 5 s, <= 1 trip",
                         "%.2fx of goal" % (node_side["median_s"] / 5.0),
                         "yes" if node_side["median_s"] <= 5 and node_side["node_trips"] <= 1 else "no"))
    else:
        lines.append(row("(f) explain", "did not run", "<= 5 s", "", "no"))
    return "\n".join(lines)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    drift = run("bench/drift.py")
    consistency = run("bench/consistency.py")
    ebpf = run("bench/ebpf_audit.py")
    explain = run("bench/explain.py")
    text = table(drift, consistency, ebpf, explain)
    (OUT / "results.md").write_text(text + "\n")
    print("\n" + text)
    return 0 if drift and consistency and ebpf and explain else 1


if __name__ == "__main__":
    sys.exit(main())
