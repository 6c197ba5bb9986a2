# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmarks (a), (b) and (c) of the operations issue, side by side on one lab fleet (the scale scenario).

(a) ``gpuharden drift`` vs bench/baseline-drift.yml (the same checks with builtin modules) on 8 nodes.
(b) ``gpuharden drift`` on 1, 8 and 32 nodes, and at 32 nodes the controller's CPU per node per run and the node's CPU
    per audit.
(c) a no-op ``harden_gpu_nodes.yml`` on a compliant node vs the drift check of that node.
The goals are issue 45's, item 7 (bench/goals.py).

Brings up ``gpuharden lab up --scenario scale --nodes 32`` under the shared lab lock (or uses the running lab with
``--use-running``), hardens scale-0 once (not timed) so that it is compliant, then times each run ``--runs`` times
(best and median) and prints, per run, where the time goes: Ansible's own start-up and the per-task time of the
slowest host.  Root only.

CPU, per ``gpuharden drift`` run: the node side is each node's ``audit_cpu_seconds`` in the drift report (node_audit's
whole process on the node, Python's start and the imports included; the sshd session around it is not counted).  The
controller side (CpuMeter) is given twice: the run's own process tree as ``getrusage(RUSAGE_CHILDREN)`` sees it (the
CLI, ansible-playbook, its workers, the controller modules and the ssh clients, but not ssh's ControlPersist masters,
which detach: a lower bound), and the whole machine's busy time less the lab's cgroup (the control plane and every
node), an upper bound that also holds whatever else ran meanwhile.
The control plane's CPU (the API server's, etcd's, ...) is reported apart.

With ``--mitogen`` every run (the CLI's and the playbooks') goes through Mitogen for Ansible's ``mitogen_linear``
strategy (the optional extra ``.[mitogen]``; bench/mitogen_env.py): the opt-in, measured beside a run without it in
the same sitting.  Under Mitogen a module runs inside the interpreter Mitogen keeps on the node, so the node's
``audit_cpu_seconds`` (the module's own process) no longer counts the interpreter's start and the imports it
shares with other tasks: compare the controller's figures and the walls, not the node's.  ``--goals`` picks some of
a, b, c (default all; c needs b's one-node run).

    python bench/drift.py [--nodes 32] [--runs 2] [--json FILE] [--use-running] [--mitogen] [--goals a,b,c]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

import ansible_runner  # noqa: E402
from goals import CONTROLLER_MS_GOAL, DRIFT_SPEEDUP_GOAL, NODE_MS_GOAL, NOOP_HARDEN_RATIO_GOAL, SCALE_RATIO_GOAL  # noqa: E402  (bench/goals.py)
from gpuharden_lab import layout, manager  # noqa: E402

from tests.labfixtures import lab_lock  # noqa: E402

ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
PLAYBOOKS = {"drift": REPO / "playbooks/drift_check.yml", "baseline": REPO / "bench/baseline-drift.yml",
             "harden": REPO / "playbooks/harden_gpu_nodes.yml"}


def timed_playbook(name, inventory, hosts, extravars=None, forks=32):
    """One run: wall seconds, per-task seconds of the slowest host, tasks run, and the playbook's rc."""
    events = []
    with tempfile.TemporaryDirectory(prefix="gpuharden-bench-") as private:
        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=inventory, playbook=str(PLAYBOOKS[name]),
                                    limit=",".join(hosts), forks=forks, extravars=extravars or {}, quiet=True,
                                    event_handler=lambda event: events.append(event) or True)
        wall = time.monotonic() - started
    tasks, first_start = {}, None
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped") and data.get("duration") is not None:
            key = data.get("task", "?")
            tasks[key] = max(tasks.get(key, 0.0), float(data["duration"]))
        if event.get("event") == "playbook_on_task_start" and first_start is None:
            first_start = event.get("created")
    failures = [(event["event_data"].get("host"), (event["event_data"].get("res") or {}).get("msg"))
                for event in events if event.get("event") in ("runner_on_failed", "runner_on_unreachable")
                and not event["event_data"].get("ignore_errors")]
    changed = sum(1 for event in events if event.get("event") == "runner_on_ok" and (event["event_data"].get("res") or {}).get("changed"))
    return {"wall_s": round(wall, 3), "rc": runner.rc, "tasks": len(tasks), "changed": changed, "failures": failures[:5],
            "task_seconds": dict(sorted(tasks.items(), key=lambda item: -item[1])[:int(os.environ.get("BENCH_TOP_TASKS", "6"))]),
            "task_seconds_total": round(sum(tasks.values()), 3)}


def _usage_usec(cgroup):
    """usage_usec of a cgroup v2 (cpu.stat has it whether or not the cpu controller is on); None when it is gone."""
    try:
        lines = (cgroup / "cpu.stat").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("usage_usec ")), None)


def _machine_busy_usec():
    """Busy CPU time of the whole machine since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy * 1_000_000 // os.sysconf("SC_CLK_TCK")


def _children_usec():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((usage.ru_utime + usage.ru_stime) * 1_000_000)


class CpuMeter:
    """CPU seconds of one run on the controller and the lab's control plane (see the module's docstring)."""

    def __init__(self, hosts):
        self.lab = layout.lab_cgroup()
        self.hosts = len(hosts)

    def sample(self):
        return {"machine": _machine_busy_usec(), "lab": _usage_usec(self.lab), "controlplane": _usage_usec(self.lab / "controlplane"),
                "children": _children_usec()}

    def figures(self, before, after):
        delta = {key: None if before[key] is None or after[key] is None else after[key] - before[key] for key in before}
        upper = None if delta["lab"] is None else delta["machine"] - delta["lab"]
        return {
            "controller_ms_per_node": round(delta["children"] / 1000 / self.hosts, 1),
            "controller_ms_per_node_upper": None if upper is None else round(upper / 1000 / self.hosts, 1),
            "controlplane_s": None if delta["controlplane"] is None else round(delta["controlplane"] / 1e6, 2),
        }


def timed_cli(inventory, hosts, forks=32):
    """`gpuharden drift` itself, as users run it: wall seconds, nodes reported, slowest node_audit run, CPU."""
    meter = CpuMeter(hosts)
    before = meter.sample()
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", inventory, "-l", ",".join(hosts), "-f", str(forks),
                                "-q", "--json"], cwd=REPO, env=dict(os.environ, **ENV), capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    cpu = meter.figures(before, meter.sample())
    if completed.returncode not in (0, 1):
        raise SystemExit("gpuharden drift failed (%d): %s" % (completed.returncode, completed.stderr[-2000:]))
    data = json.loads(completed.stdout)
    audits = [node["audit_seconds"] or 0 for node in data["nodes"].values()]
    audit_cpu = [node.get("audit_cpu_seconds") for node in data["nodes"].values()]
    if audit_cpu and None not in audit_cpu:
        cpu.update(node_ms_per_audit=round(1000 * statistics.mean(audit_cpu), 1), node_ms_per_audit_max=round(1000 * max(audit_cpu), 1))
    else:
        cpu.update(node_ms_per_audit=None, node_ms_per_audit_max=None)
    return {"wall_s": round(wall, 3), "nodes": len(data["nodes"]), "unreachable": data["summary"]["unreachable"],
            "failed": data["summary"]["failed"], "slowest_audit_s": round(max(audits, default=0), 3), "cpu": cpu}


def repeat(runs, function, *args, **kwargs):
    samples = [function(*args, **kwargs) for _ in range(runs)]
    best = min(samples, key=lambda sample: sample["wall_s"])
    return dict(best, runs=[sample["wall_s"] for sample in samples], median_s=round(statistics.median(s["wall_s"] for s in samples), 3))


def where(sample):
    overhead = sample["wall_s"] - sample["task_seconds_total"]
    top = ", ".join("%s %.2fs" % (name, seconds) for name, seconds in list(sample["task_seconds"].items())[:3])
    return "%d tasks, %.2fs in tasks (slowest host), %.2fs Ansible start-up/scheduling; top: %s" % (
        sample["tasks"], sample["task_seconds_total"], overhead, top)


def measure(state, runs, nodes, goals=("a", "b", "c")):
    inventory = state["inventory"]
    names = sorted(state["nodes"], key=lambda name: int(name.rsplit("-", 1)[1]))[:nodes]
    drift_vars = {"gpuharden_drift_fail": False}
    results = {}
    # scale-0 compliant first (not timed): the no-op harden of (c) needs a node with nothing to do
    prepare = timed_playbook("harden", inventory, names[:1], {"gpuharden_postcheck_fail_severity": "never"})
    results["prepare_harden_s"] = prepare["wall_s"]
    if prepare["rc"] != 0:
        raise SystemExit("hardening %s failed: %s" % (names[0], prepare["failures"]))

    eight = names[:8]
    if "a" not in goals:
        return dict(results, **_measure_b_c(inventory, names, runs, drift_vars, goals))
    results["a"] = {"drift": repeat(runs, timed_cli, inventory, eight),
                    "drift_tasks": timed_playbook("drift", inventory, eight, drift_vars),
                    "baseline": repeat(runs, timed_playbook, "baseline", inventory, eight)}
    results["a"]["ratio"] = round(results["a"]["baseline"]["wall_s"] / results["a"]["drift"]["wall_s"], 2)
    return dict(results, **_measure_b_c(inventory, names, runs, drift_vars, goals))


def _measure_b_c(inventory, names, runs, drift_vars, goals):
    results = {}
    if "b" not in goals and "c" not in goals:
        return results
    results["b"] = {str(count): repeat(runs, timed_cli, inventory, names[:count])
                    for count in (1, 8, len(names)) if count <= len(names)}
    results["b"]["tasks_%d" % len(names)] = timed_playbook("drift", inventory, names, drift_vars)
    results["b"]["ratio"] = round(results["b"][str(len(names))]["wall_s"] / results["b"]["1"]["wall_s"], 2)
    if "c" not in goals:
        return results

    results["c"] = {"harden_noop": repeat(runs, timed_playbook, "harden", inventory, names[:1], {"gpuharden_postcheck_fail_severity": "never"}),
                    "drift": results["b"]["1"], "drift_tasks": timed_playbook("drift", inventory, names[:1], drift_vars)}
    results["c"]["ratio"] = round(results["c"]["harden_noop"]["wall_s"] / results["c"]["drift"]["wall_s"], 2)
    return results


def cpu_line(cpu):
    return ("node side %s ms per audit, at most %s (goal <= %d ms); controller %.0f ms per node, %s ms with ssh's masters and the "
            "rest of the machine (goal <= %d ms); control plane %s s" % (
                cpu["node_ms_per_audit"], cpu["node_ms_per_audit_max"], NODE_MS_GOAL, cpu["controller_ms_per_node"],
                cpu["controller_ms_per_node_upper"], CONTROLLER_MS_GOAL, cpu["controlplane_s"]))


def report(results, nodes):
    a, b, c = results.get("a"), results.get("b"), results.get("c")
    lines = ["strategy: %s" % results.get("strategy", "linear")]
    if a:
        lines += [
            "(a) drift vs builtin-module baseline, 8 nodes: drift %.2fs, baseline %.2fs: %.1fx faster (goal >= %dx)"
            % (a["drift"]["wall_s"], a["baseline"]["wall_s"], a["ratio"], DRIFT_SPEEDUP_GOAL),
            "    drift:    " + where(a["drift_tasks"]) + "; slowest node_audit %.2fs" % a["drift"]["slowest_audit_s"],
            "    baseline: " + where(a["baseline"])]
    if b:
        lines += [
            "(b) drift on 1 / 8 / %d nodes: %s s: %d nodes take %.2fx one node (goal <= %dx)"
            % (nodes, " / ".join("%.2f" % b[key]["wall_s"] for key in ("1", "8", str(nodes)) if key in b), nodes, b["ratio"],
               SCALE_RATIO_GOAL),
            "    %d nodes: %s; slowest node_audit %.2fs" % (nodes, where(b["tasks_%d" % nodes]), b[str(nodes)]["slowest_audit_s"]),
            "    %d nodes, CPU: %s" % (nodes, cpu_line(b[str(nodes)]["cpu"])),
            "    1 node, CPU:   " + cpu_line(b["1"]["cpu"])]
    if c:
        lines += [
            "(c) no-op harden vs drift, one compliant node: harden %.2fs (%d changed), drift %.2fs: %.2fx (goal <= %.1fx)"
            % (c["harden_noop"]["wall_s"], c["harden_noop"]["changed"], c["drift"]["wall_s"], c["ratio"], NOOP_HARDEN_RATIO_GOAL),
            "    harden: " + where(c["harden_noop"]),
            "    drift:  " + where(c["drift_tasks"])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--use-running", action="store_true", help="use the lab that is up (scale scenario)")
    parser.add_argument("--mitogen", action="store_true", help="every run under Mitogen's mitogen_linear strategy (opt-in extra)")
    parser.add_argument("--goals", default="a,b,c", help="which of a, b, c to measure (comma-separated)")
    options = parser.parse_args(argv)
    goals = tuple(goal.strip() for goal in options.goals.split(",") if goal.strip())
    if not set(goals) <= {"a", "b", "c"}:
        parser.error("--goals: a, b or c, got %s" % options.goals)
    if options.mitogen:
        from mitogen_env import mitogen_env  # bench/, beside this file

        ENV.update(mitogen_env())
    if os.geteuid() != 0:
        print("root only (the lab)", file=sys.stderr)
        return 2
    if options.use_running:
        state = manager.load_state()
        results = measure(state, options.runs, options.nodes, goals)
    else:
        with lab_lock():
            manager.down()
            started = time.monotonic()
            state = manager.up("scale", options.nodes)
            up = time.monotonic() - started
            try:
                results = measure(state, options.runs, options.nodes, goals)
            finally:
                manager.down()
        results["lab_up_s"] = round(up, 1)
    results["nodes"] = options.nodes
    results["strategy"] = ENV.get("ANSIBLE_STRATEGY", "linear")
    print(report(results, options.nodes))
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
