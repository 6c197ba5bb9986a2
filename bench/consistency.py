# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: gpu_consistency over 5,000 kwok-only GPU Nodes (8 GPUs each) and 20,000 pods bound to them.

Brings up the scale lab with ``--nodes 1 --kwok-nodes N`` under the shared lab lock (or, with ``--use-running``,
uses the lab that is up), creates the pods straight through the API (bound by ``nodeName``, 2 GPUs each, in
parallel threads), waits until kwok has made them all Running (a settled cluster), then times:

- the module as Ansible runs it, ``--runs`` times: a fresh Python process, args in a file.  Its median wall time
  is THE figure, against the goal of 5 s;
- where that time goes, in this process (median of ``--runs``): the module's process start (Python, Ansible and
  kubernetes imports, argument parsing: a run that fails on its first option check), the client's setup, each
  LIST (waiting for the first byte of each page, reading the bodies, decoding them), the pure check, and the two
  LISTs made at the same time as the module makes them.

The background load of the lab itself (API server, etcd, kwok: CPU seconds per second while idle) is reported:
on a small machine it competes with the benchmark.  The module's result is checked against the in-process check.

    python bench/consistency.py [--nodes 5000] [--pods 20000] [--runs 3] [--page-limit N] [--json FILE]

The last line is the figure for the README table::

    consistency: 5000 nodes / 40000 GPUs / 20000 pods: 4.20 s (goal 5 s, ratio 0.84)

``run(args) -> dict`` does all of it (``parse_args()`` builds ``args``), for a caller that aggregates benchmarks.
Root only; the lab is torn down at the end unless ``--use-running``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "build/collections"))
sys.path.insert(0, str(REPO / "src"))

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency  # noqa: E402
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access, _resources  # noqa: E402
from gpuharden_lab import manager  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from tests.labfixtures import lab_lock  # noqa: E402

NAME = "consistency"
GOAL_S = 5.0
NAMESPACE = "bench"
GPU = "nvidia.com/gpu"
MODULE_PATH = REPO / "plugins/modules/gpu_consistency.py"
COLLECTIONS = REPO / "build/collections"
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"  # as the module lists them
LAB_PROCESSES = ("kube-apiserver", "etcd", "kwok")


def create_pods(kubeconfig, nodes, count, threads):
    """``count`` pods bound round-robin to ``nodes``, 2 GPUs each; returns (seconds, requests)."""
    local = threading.local()
    counter = {"requests": 0}
    lock = threading.Lock()

    def core():
        if not hasattr(local, "core"):
            local.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        return local.core

    def create(number):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-%d" % number, "labels": {"app": "bench"}},
                "spec": {"nodeName": nodes[number % len(nodes)], "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "main", "image": "registry.example/bench:1",
                                         "resources": {"limits": {GPU: "2"}}}]}}
        for _attempt in range(50):
            with lock:
                counter["requests"] += 1
            try:
                core().create_namespaced_pod(NAMESPACE, body, _preload_content=False)
                return
            except ApiException as error:
                if error.status == 409:
                    return
                if error.status in (403, 429, 500, 503, 504):  # default ServiceAccount not there yet, or apiserver overloaded
                    time.sleep(0.5)
                    continue
                raise

    admin = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    try:
        admin.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(count)))
    return time.monotonic() - started, counter["requests"]


def wait_settled(core, timeout):
    """Wait until kwok has made every bench pod Running; returns (seconds, pods still not Running)."""
    started = time.monotonic()
    while True:
        page = json.loads(core.list_namespaced_pod(NAMESPACE, field_selector="status.phase!=Running", limit=500,
                                                   _preload_content=False).data)
        pending = len(page.get("items") or []) + ((page.get("metadata") or {}).get("remainingItemCount") or 0)
        if not pending or time.monotonic() - started > timeout:
            return round(time.monotonic() - started, 1), pending
        time.sleep(2)


def _pids(name):
    completed = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(pid) for pid in completed.stdout.split()]


def _cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def background_load(seconds=5.0):
    """CPU seconds per second each lab process uses while nothing is asked of it, and the machine's load."""
    pids = {name: _pids(name) for name in LAB_PROCESSES}
    before = {name: _cpu_seconds(pids[name]) for name in LAB_PROCESSES}
    time.sleep(seconds)
    load = {name: round((_cpu_seconds(pids[name]) - before[name]) / seconds, 2) for name in LAB_PROCESSES}
    load["loadavg_1m"] = os.getloadavg()[0]
    load["cpus"] = os.cpu_count()
    return load


class _Body:
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _timed(method, totals):
    """``method`` with the time to the response headers (``wait``) and to the end of the body (``read``) added up."""

    def call(*args, **kwargs):
        started = time.perf_counter()
        response = method(*args, **kwargs)
        answered = time.perf_counter()
        data = response.data
        totals["wait"] += answered - started
        totals["read"] += time.perf_counter() - answered
        totals["mb"] += len(data) / 1e6
        return _Body(data)

    return call


def _list_phase(api, method, target, page_limit, **selectors):
    totals = {"wait": 0.0, "read": 0.0, "mb": 0.0}
    started = time.perf_counter()
    items, pages = _k8s_access.list_all(NAME, api, _timed(method, totals), target, page_limit, **selectors)
    elapsed = time.perf_counter() - started
    totals["decode"] = elapsed - totals["wait"] - totals["read"]  # json.loads, and the helper's own bookkeeping
    return items, dict({key: round(value, 3) for key, value in totals.items()}, s=round(elapsed, 3), pages=pages)


def time_phases(kubeconfig, page_limit):
    """One gpu_consistency run in this process, phase by phase; plus the two LISTs at once as the module makes them."""
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    params.update(kubeconfig=kubeconfig, request_timeout=120)
    started = time.perf_counter()
    api = _k8s.api_client(params)
    client_s = time.perf_counter() - started
    try:
        # the module's own requests (_resources.template, as _k8s_access.list_kind makes them), each phase timed
        list_nodes = _k8s.endpoint(api, "GET", *_resources.template("Node", all_namespaces=True))
        list_pods = _k8s.endpoint(api, "GET", *_resources.template("Pod", all_namespaces=True))
        with _k8s.gc_paused():
            nodes, node_phase = _list_phase(api, list_nodes, _k8s_access.Target.of("list", "Node"), page_limit)
            pods, pod_phase = _list_phase(api, list_pods, _k8s_access.Target.of("list", "Pod"), page_limit,
                                          field_selector=POD_SELECTOR)
            checked = time.perf_counter()
            findings, summary = _consistency.check(nodes, pods, {})
            check_s = time.perf_counter() - checked
        del nodes, pods
        from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency_run

        concurrent = time.perf_counter()
        with _k8s.gc_paused():
            nodes, pods, _controllers, requests = _consistency_run.read_cluster(api, page_limit)
        concurrent_s = time.perf_counter() - concurrent
    finally:
        api.close()
    return {
        "client_s": round(client_s, 3), "nodes": node_phase, "pods": pod_phase, "check_s": round(check_s, 3),
        "sequential_s": round(client_s + node_phase["s"] + pod_phase["s"] + check_s, 3),
        "lists_concurrent_s": round(concurrent_s, 3), "concurrent_pages": requests,
        "counts": {"nodes": len(nodes), "gpus": sum(_gpus(node) for node in nodes), "pods": len(pods)},
        "result": {"findings": findings, "nodes": summary},
    }


def _gpus(node):
    try:
        return int(((node.get("status") or {}).get("allocatable") or {}).get(GPU) or 0)
    except ValueError:
        return 0


def time_module(kubeconfig, page_limit=None, module_path=MODULE_PATH, collections=COLLECTIONS, extra_args=None):
    """The module as Ansible runs it: a fresh Python, args in a JSON file; (wall seconds, its result)."""
    module_args = {"kubeconfig": kubeconfig}
    if page_limit:
        module_args["page_limit"] = page_limit
    module_args.update(extra_args or {})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": module_args}, handle)
    try:
        started = time.perf_counter()
        completed = subprocess.run([sys.executable, str(module_path), handle.name], env=dict(os.environ, PYTHONPATH=str(collections)),
                                   capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
    finally:
        os.unlink(handle.name)
    try:
        result = json.loads(completed.stdout)
    except ValueError:
        raise RuntimeError("gpu_consistency printed no JSON (rc %d): %s" % (completed.returncode, completed.stderr[-2000:])) from None
    return round(elapsed, 3), result


def process_start():
    """The module's fixed cost: a fresh process that imports everything and fails on its first option check."""
    seconds, result = time_module(None, extra_args={"page_limit": 0})
    assert result.get("failed") and "page_limit=0" in result["msg"], result
    return seconds


def _median(values):
    return round(statistics.median(values), 3)


def _median_phases(runs):
    def pick(path):
        values = []
        for run in runs:
            value = run
            for key in path:
                value = value[key]
            values.append(value)
        return _median(values)

    phases = {"client_s": pick(["client_s"]), "check_s": pick(["check_s"]), "sequential_s": pick(["sequential_s"]),
              "lists_concurrent_s": pick(["lists_concurrent_s"])}
    for kind in ("nodes", "pods"):
        phases[kind] = {key: pick([kind, key]) for key in ("s", "wait", "read", "decode", "mb")}
        phases[kind]["pages"] = runs[0][kind]["pages"]
    return phases


def measure(args, state):
    """Every figure, on the lab described by ``state`` (pods created when missing)."""
    kubeconfig = state["cluster"]["admin_kubeconfig"]
    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    kwok = sorted(item["metadata"]["name"] for item in json.loads(core.list_node(label_selector="gpuharden.io/kwok-only=true",
                                                                                     _preload_content=False).data)["items"])
    report = {"name": NAME, "goal_s": GOAL_S, "kwok_nodes": len(kwok), "lab_timings": state.get("timings")}
    existing = len(json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data).get("items") or []) if kwok else 0
    if existing < args.pods:
        seconds, requests = create_pods(kubeconfig, kwok, args.pods, args.threads)
        report["create_pods"] = {"pods": args.pods, "seconds": round(seconds, 1), "requests": requests,
                                 "per_second": round(args.pods / seconds, 1)}
    report["settle_s"], report["not_running"] = wait_settled(core, args.settle_timeout)
    report["background_cpu_per_s"] = background_load()

    page_limit = args.page_limit or _module_default_page_limit()
    report["page_limit"] = page_limit
    runs = [time_phases(kubeconfig, page_limit) for _ in range(args.runs)]
    reference = json.loads(json.dumps(runs[-1].pop("result")))  # as the module's JSON answer has it
    for run in runs:
        run.pop("result", None)
    report["phase_runs"] = runs
    report["phases"] = _median_phases(runs)
    report["phases"]["process_start_s"] = _median([process_start() for _ in range(args.runs)])
    counts = runs[-1]["counts"]
    report.update(nodes=counts["nodes"], gpus=counts["gpus"], pods=counts["pods"])

    module_runs = []
    for _ in range(args.runs):
        seconds, result = time_module(kubeconfig, args.page_limit)
        assert not result.get("failed"), result.get("msg")
        module_runs.append({"wall_s": seconds, "api_requests": result["api_requests"], "findings": len(result["findings"]),
                            "nodes": len(result["nodes"])})
    report["module_runs"] = module_runs
    # Same answer as the in-process check over the same cluster (the lab is settled: nothing changes in between).
    report["results_match"] = result["findings"] == reference["findings"] and result["nodes"] == reference["nodes"]
    report["seconds"] = _median([run["wall_s"] for run in module_runs])
    report["best_s"] = min(run["wall_s"] for run in module_runs)
    report["ratio"] = round(report["seconds"] / GOAL_S, 2)
    report["goal_met"] = report["seconds"] <= GOAL_S
    report["line"] = summary_line(report)
    return report


def _module_default_page_limit():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency_run

    return _consistency_run.argument_spec()["page_limit"]["default"]


def summary_line(report):
    return "%s: %d nodes / %d GPUs / %d pods: %.2f s (goal %g s, ratio %.2f)" % (
        NAME, report["kwok_nodes"], report["gpus"], report["pods"], report["seconds"], GOAL_S, report["ratio"])


def phase_lines(report):
    """The breakdown, one phase a line (medians; the LISTs as made one after the other)."""
    phases = report["phases"]
    lines = ["  module process start (python, imports, args)  %6.2f s" % phases["process_start_s"],
             "  client setup (kubeconfig)                      %6.2f s" % phases["client_s"]]
    for kind in ("nodes", "pods"):
        phase = phases[kind]
        lines.append("  LIST %-5s %3d page(s), %5.1f MB: %6.2f s = first bytes %.2f + body %.2f + decode %.2f"
                     % (kind, phase["pages"], phase["mb"], phase["s"], phase["wait"], phase["read"], phase["decode"]))
    lines.append("  check (pure)                                   %6.2f s" % phases["check_s"])
    lines.append("  both LISTs at once, as the module makes them   %6.2f s" % phases["lists_concurrent_s"])
    load = report["background_cpu_per_s"]
    lines.append("  lab background CPU/s: apiserver %.2f, kwok %.2f, etcd %.2f on %d CPUs (load %.1f)"
                 % (load["kube-apiserver"], load["kwok"], load["etcd"], load["cpus"], load["loadavg_1m"]))
    lines.append("  module runs (wall s): %s; results match the in-process check: %s"
                 % (", ".join("%.2f" % run["wall_s"] for run in report["module_runs"]), report["results_match"]))
    return lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000, help="kwok-only GPU nodes (8 GPUs each)")
    parser.add_argument("--pods", type=int, default=20000, help="pods bound to them, 2 GPUs each")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--page-limit", type=int, default=None, help="LIST page size (default: the module's default)")
    parser.add_argument("--threads", type=int, default=16, help="threads creating the pods")
    parser.add_argument("--settle-timeout", type=float, default=300, help="seconds to wait for kwok to run every pod")
    parser.add_argument("--use-running", action="store_true", help="use the lab that is up (scale with kwok nodes)")
    parser.add_argument("--json", metavar="FILE", help="write the figures there")
    return parser.parse_args(argv)


def run(args):
    """The whole benchmark: lab up under the lab lock (unless ``args.use_running``), measure, lab down; the report."""
    if args.use_running:
        return measure(args, manager.load_state())
    with lab_lock():
        manager.down()
        try:
            state = manager.up("scale", node_count=1, kwok_nodes=args.nodes)
            return measure(args, state)
        finally:
            manager.down()


def main(argv=None):
    args = parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: value for key, value in report.items() if key not in ("phase_runs", "line")}, indent=2))
    print("\n".join(phase_lines(report)))
    print(report["line"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
