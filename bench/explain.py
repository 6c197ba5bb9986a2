# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: `gpuharden explain pod` on the lab (issue 44): at most 5 s of wall time and at most one trip to a node
for one pod; no trip at all for a Pending pod with a misspelt resource.

On the `healthy` scenario (real kubelet v1.36.3, containerd and device plugin, hardened by gpuharden): a Pending pod
asking for nvidia.com/gpus (the cause is in the API), and a Running pod on RuntimeClass nvidia that sets
NVIDIA_VISIBLE_DEVICES=all without a GPU request (the cause is on the node: one drift check of it, -i INVENTORY).
Each is explained --runs times as a user runs it (a new `gpuharden` process each time, with the tool's identity);
the figures are the wall times (their median) and the node trips and API requests the JSON document counts.  Root
only; the lab is brought up and taken down under the lab lock unless one of that scenario is up already.

    python bench/explain.py [--runs 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuharden_lab import cluster, manager, realnode  # noqa: E402
from kubernetes import client  # noqa: E402

from tests.integration.test_real_nodes import in_node  # noqa: E402
from tests.labfixtures import lab_lock  # noqa: E402

SCENARIO, NODE, NAMESPACE = "healthy", "gpu-a100-0", "default"
GOAL_SECONDS, GOAL_TRIPS = 5.0, 1


def _pods(state):
    core = client.CoreV1Api(cluster.api_client(state["cluster"]["admin_kubeconfig"]))
    image = realnode.sandbox_image_name(in_node(state, NODE, ["cat", "/etc/containerd/config.toml"]).stdout)
    pause = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["/pause"]}
    core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-typo"},
                                           "spec": {"containers": [dict(pause, resources={"limits": {"nvidia.com/gpus": "1"}})]}})
    core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-sneaky"}, "spec": {
        "nodeName": NODE, "runtimeClassName": "nvidia", "terminationGracePeriodSeconds": 0,
        "containers": [dict(pause, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]}})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        typo, sneaky = (core.read_namespaced_pod(name, NAMESPACE) for name in ("bench-typo", "bench-sneaky"))
        scheduled = any(c.type == "PodScheduled" and c.status == "False" for c in typo.status.conditions or [])
        if scheduled and sneaky.status.phase == "Running":
            return core
        time.sleep(1)
    raise SystemExit("the bench pods did not reach their symptoms in 120 s")


def _explain(state, name, *args):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "explain", "pod", "%s/%s" % (NAMESPACE, name), "--json",
                           "-e", "gpuharden_kubeconfig=%s" % state["cluster"]["tool_kubeconfig"], *args],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")))
    seconds = time.monotonic() - started
    document = json.loads(done.stdout)
    return seconds, document


def measure(state, runs):
    results = {}
    for key, name, args in (("typo", "bench-typo", ()), ("node_side", "bench-sneaky", ("-i", state["inventory"]))):
        walls, documents = [], []
        for _ in range(runs):
            seconds, document = _explain(state, name, *args)
            walls.append(round(seconds, 3))
            documents.append(document)
        last = documents[-1]
        results[key] = {"wall_s": walls, "median_s": statistics.median(walls), "cause": last["verdict"]["cause"],
                        "node_trips": max(d["node_trips"] for d in documents), "node_seconds": [d["node_seconds"] for d in documents],
                        "api_requests": last["api_requests"]}
        print("%s: %s, trips %d, cause %s" % (key, ", ".join("%.2f s" % w for w in walls), results[key]["node_trips"], results[key]["cause"]), flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    with lab_lock():
        state = manager.load_state()
        ours = not (state and state.get("status") == "up" and state.get("scenario") == SCENARIO)
        if ours:
            manager.down()
            state = manager.up(SCENARIO)
        core = None
        try:
            core = _pods(state)
            results = measure(state, args.runs)
        finally:
            if core is not None:
                for name in ("bench-typo", "bench-sneaky"):
                    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            if ours:
                manager.down()
    results["goal"] = {"seconds": GOAL_SECONDS, "trips": GOAL_TRIPS}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    met = all(results[key]["median_s"] <= GOAL_SECONDS for key in ("typo", "node_side")) and results["typo"]["node_trips"] == 0 \
        and results["node_side"]["node_trips"] <= GOAL_TRIPS
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
