# SPDX-License-Identifier: GPL-3.0-or-later
"""`make demo`: the seed-failures lab, its drift report, hardening, a clean report, and a second harden run with
no changes.

The lab (simulated GPU nodes over real SSH, a real control plane) stays up afterwards so it can be
explored: `ansible -i inventories/lab/hosts.yml all -m gpuharden.k8s.gpu_facts`; `gpuharden lab down`
removes it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from gpuharden_lab import REPO_ROOT, cluster, layout, manager
from gpuharden_lab.system import LabError

SCENARIO = os.environ.get("GPUHARDEN_DEMO_SCENARIO", "seed-failures")
BIN = Path(sys.executable).parent


def _section(title: str) -> None:
    print("\n=== %s %s" % (title, "=" * max(0, 70 - len(title))), flush=True)


def _run(argv: list[str]) -> int:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, check=False).returncode


def main() -> int:
    # Other lab users (the lab tests, molecule) take the same lock: wait for them instead of pulling their lab down.
    with open(layout.LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return demo()


def demo() -> int:
    try:
        if manager.load_state() is not None or manager.leftovers():
            print("demo: removing the previous lab first", flush=True)
            manager.down()
        _section("gpuharden lab up --scenario %s" % SCENARIO)
        state = manager.up(SCENARIO)
    except LabError as error:
        print("demo: %s" % error, file=sys.stderr)
        return 2
    print("lab up in %.1fs: %d nodes over SSH, kube-apiserver on 127.0.0.1:%d (timings: %s)"
          % (state["timings"]["total"], len(state["nodes"]), layout.API_PORT, state["timings"]))

    fleet(state)

    reports = REPO_ROOT / "build" / "demo"
    reports.mkdir(parents=True, exist_ok=True)
    _section("gpuharden drift -i %s (before)" % os.path.relpath(state["inventory"], REPO_ROOT))
    _run([str(BIN / "gpuharden"), "drift", "-i", state["inventory"], "--report", str(reports / "drift-before.json"),
          "--prometheus", str(reports / "gpuharden-before.prom")])

    _section("ansible-playbook playbooks/harden_gpu_nodes.yml")
    # Every node in one batch, and a failing post-check (hardware the playbook cannot fix) reported, not fatal.
    # Three operator decisions the playbook never takes alone: the fleet has MIG-enabled H100s, so the device plugin
    # runs migStrategy mixed; the RuntimeClass with the wrong (immutable) handler may be recreated; and the seeds'
    # competing plugin DaemonSets may be deleted (otherwise they block the managed plugin).
    harden = [str(BIN / "ansible-playbook"), "-i", state["inventory"], str(REPO_ROOT / "playbooks/harden_gpu_nodes.yml"),
              "-e", "gpuharden_max_fail_percentage=100", "-e", "gpuharden_postcheck_fail_severity=never",
              "-e", "gpuharden_mig_strategy=mixed", "-e", "runtime_class_force=true", "-e", "device_plugin_remove_competing=true"]
    print(" ".join(os.path.relpath(arg, REPO_ROOT) if arg.startswith("/") else arg for arg in harden[1:]), flush=True)
    first = _recap(harden)

    _section("Fleet after hardening")
    fleet(state)

    _section("gpuharden drift -i %s (after)" % os.path.relpath(state["inventory"], REPO_ROOT))
    after_rc = _run([str(BIN / "gpuharden"), "drift", "-i", state["inventory"], "--report", str(reports / "drift-after.json"),
                     "--prometheus", str(reports / "gpuharden.prom")])
    after = json.loads((reports / "drift-after.json").read_text())

    _section("ansible-playbook playbooks/harden_gpu_nodes.yml (again)")
    second = _recap(harden)
    changed = {host: counts["changed"] for host, counts in second.items() if counts["changed"]}
    failed = {host for host, counts in {**first, **second}.items() if counts["failed"] or counts["unreachable"]}

    _section("Summary")
    summary = after["summary"]
    print("drift before: %s" % _summary_line(json.loads((reports / "drift-before.json").read_text())["summary"]))
    print("drift after:  %s (exit %d)" % (_summary_line(summary), after_rc))
    for host, node in sorted(after["nodes"].items()):
        if node["status"] == "attention":
            ids = sorted({entry["id"] for entry in node["findings"] if entry["severity"] in ("warning", "error", "critical")})
            print("  %s needs attention (not fixed by running a stage): %s" % (host, ", ".join(ids)))
    print("second harden run: %s" % ("changed=0 on all %d nodes" % len(second) if not changed
                                     else "changed on %s" % ", ".join("%s (%d)" % item for item in sorted(changed.items()))))
    print("reports: %s (JSON, Prometheus textfile)" % os.path.relpath(reports, REPO_ROOT))
    print("\nThe lab is still up. Explore it with the inventory %s; remove it with `gpuharden lab down`." % state["inventory"])
    blind = summary.get("nodes_not_checked_in_part", 0) or summary.get("cluster_not_checked")
    ok = summary["drifted"] == 0 and summary["unreachable"] == 0 and summary["failed"] == 0 and not blind and not changed and not failed
    return 0 if ok else 1


def fleet(state) -> None:
    summary = cluster.node_summary(cluster.api_client(state["cluster"]["admin_kubeconfig"]))
    services = state.get("services", {})
    print("%-22s %-24s %-6s %-9s %s" % ("NODE", "FIXTURE", "READY", "KUBELET", "ALLOCATABLE (nvidia.com/*)"))
    for name in sorted(state["nodes"]):
        kubelet = manager.ssh(state["nodes"][name]["address"], "systemctl is-active kubelet k3s-agent 2>/dev/null | head -1")
        print("%-22s %-24s %-6s %-9s %s" % (
            name, state["nodes"][name]["fixture"] or "(CPU only)", summary.get(name, {}).get("ready"),
            kubelet.stdout.strip() or services.get(name), summary.get(name, {}).get("allocatable_gpu") or "-",
        ))


def _summary_line(summary) -> str:
    return "%d nodes: %d clean, %d drifted, %d need attention, %d not checked, %d unreachable, %d failed" % (
        summary["nodes"], summary["clean"], summary["drifted"], summary.get("attention", 0), summary.get("not_checked", 0),
        summary["unreachable"], summary["failed"])


RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def _recap(argv: list[str]) -> dict:
    """Run a playbook, print its PLAY RECAP (the whole output goes to build/demo/), return the counts per host."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
    started = time.monotonic()
    completed = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    log = REPO_ROOT / "build" / "demo" / ("harden-%d.log" % int(time.time()))
    log.write_text(completed.stdout + completed.stderr)
    counts = {match[1]: {"ok": int(match[2]), "changed": int(match[3]), "unreachable": int(match[4]), "failed": int(match[5])}
              for match in RECAP.finditer(completed.stdout)}
    for host, count in sorted(counts.items()):
        print("%-22s ok=%-4d changed=%-4d unreachable=%d failed=%d" % (host, count["ok"], count["changed"], count["unreachable"], count["failed"]))
    print("(%.0f s, rc %d, full output in %s)" % (time.monotonic() - started, completed.returncode, os.path.relpath(log, REPO_ROOT)))
    return counts


if __name__ == "__main__":
    sys.exit(main())
