# SPDX-License-Identifier: GPL-3.0-or-later
"""Rollout loose ends (issue 43, item 8), on the fresh-fleet lab: the real kubelet and containerd.

3 fresh nodes: each one's containerd is `containerd config default` (no nvidia runtime: the container runtime stage
restarts it) and its kubelet on the default manager policies (the lab inventory opts into the static CPU Manager: the
kubelet stage drains it).

- containerd is never restarted on two nodes before the canary's has come back: the run's own results say when each
  node's containerd was restarted and when it served again, and a watcher samples the canary's Node Ready condition.
- The kubelet_topology role run on its own, on every node at once (a playbook without serial): the drain of
  node_maintenance checks the budget where it cordons, so one node drains and the others fail with the reason.
- A harden interrupted by SIGINT in the middle of a drain (a PodDisruptionBudget holds it there) leaves the node cordoned
  and its run lock held; the next drift names the cordon and the run that left it (its lock taken over at once, the
  run being gone), and the next harden resumes the step and ends the cordon; a cordon an ended run left on a node with
  nothing left to do is released.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import ansible_runner
import pytest
from gpuharden_lab import REPO_ROOT, manager, realnode

from tests.integration.cluster_side import Sampler, admin, kubelet_config, sh, wait_for
from tests.integration.test_disruption import CordonWatcher, reset_to_defaults
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
FRESH = ["fresh-%d" % n for n in range(3)]
CORDON = "gpuharden.io/cordon"
LOCK = "/run/gpuharden/run.lock"
NS = "rollout-test"


@pytest.fixture(scope="module")
def fresh():
    with running_lab("fresh-fleet", node_count=len(FRESH)) as state:
        yield state


def _core(state):
    from kubernetes import client

    return client.CoreV1Api(admin(state))


def harden(state, *, extravars=None, tags=None, limit=None):
    """harden_gpu_nodes.yml through ansible-runner: (rc, events, output)."""
    events = []
    with tempfile.TemporaryDirectory(prefix="gpuharden-rollout-test-") as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=state["inventory"],
                                    playbook=str(REPO_ROOT / "playbooks/harden_gpu_nodes.yml"), extravars=extravars or {},
                                    cmdline="--tags %s" % ",".join(tags) if tags else None, limit=limit, quiet=True,
                                    event_handler=lambda event: events.append(event) or True)
        output = runner.stdout.read()
    return runner.rc, events, output


def drift(state, *args):
    return subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", state["inventory"], "-q", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=600, env=dict(os.environ, **ENV))


def results(events, action):
    return {event["event_data"]["host"]: event["event_data"]["res"] for event in events
            if event.get("event") == "runner_on_ok" and event["event_data"].get("task_action") == action}


def cordon_record(state, node):
    found = _core(state).read_node(node)
    value = (found.metadata.annotations or {}).get(CORDON)
    return bool(found.spec.unschedulable), json.loads(value) if value else None


class ReadyWatcher(Sampler):
    """Samples a Node's Ready condition: the (start, end) of every span it was not Ready."""

    def __init__(self, state, node):
        super().__init__()
        self.core, self.node = _core(state), node
        self.down, self._since = [], None

    def sample(self):
        conditions = {c.type: c.status for c in self.core.read_node(self.node).status.conditions or []}
        now = time.time()
        if conditions.get("Ready") != "True" and self._since is None:
            self._since = now
        elif conditions.get("Ready") == "True" and self._since is not None:
            self.down.append((self._since, now))
            self._since = None

    def finish(self):
        if self._since is not None:
            self.down.append((self._since, time.time()))


def test_containerd_restarts_on_a_canary_first_then_in_waves_within_the_budget(fresh):
    """Budget 2: the canary alone, then the two others at once, only once the canary's containerd serves again and its
    Node is Ready; the 'has the previous wave come back' gate ran before the second wave and after it."""
    with ReadyWatcher(fresh, FRESH[0]) as watcher:
        rc, events, output = harden(fresh, tags=["container_runtime"], extravars={"gpuharden_max_unavailable": 2})
    assert rc == 0, output[-5000:]
    restarts = {host: res["readiness"] for host, res in results(events, "gpuharden.k8s.container_runtime_stage").items()
                if res.get("restarted")}
    assert set(restarts) == set(FRESH), sorted(restarts)
    canary = min(restarts, key=lambda host: restarts[host]["restarted_at"])
    assert canary == FRESH[0]  # the first available node, in the run's order
    back = restarts[canary]["restarted_at"] + restarts[canary]["seconds"]  # containerd serving again (its new socket)
    for host in FRESH[1:]:
        assert restarts[host]["restarted_at"] > back, (host, restarts)
        # and never while the canary's Node was not Ready
        assert not [span for span in watcher.down if span[0] <= restarts[host]["restarted_at"] <= span[1]], watcher.down
    assert watcher.samples > 10
    gates = [event["event_data"]["res"] for event in events if event.get("event") == "runner_on_ok"
             and event["event_data"].get("task", "").startswith("Stage | containerd restarts | has the previous wave come back")]
    assert len(gates) == 2 and all(gate["stopped"] is None for gate in gates), gates
    assert [gate["settle"]["not_ready"] for gate in gates] == [{}, {}]
    # the waves the run read once: the canary alone, then the two others
    [read] = [event["event_data"]["res"] for event in events if event.get("event") == "runner_on_ok"
              and event["event_data"].get("task", "").startswith("Rollout | read the fleet once")]
    assert read["restart_waves"] == [[FRESH[0]], FRESH[1:]]


def _blocker(state, node):
    """A pod on ``node`` (a ReplicaSet's, so a drain evicts it) under a PodDisruptionBudget that allows no disruption:
    the drain retries its eviction (HTTP 429) until node_maintenance_timeout."""
    from kubernetes import client

    api = admin(state)
    core = client.CoreV1Api(api)
    core.patch_node(node, {"metadata": {"labels": {"gpuharden.io/test-pool": "rollout"}}})
    core.create_namespace({"metadata": {"name": NS}})
    image = realnode.sandbox_image_name(sh(state, node, "cat /etc/containerd/config.toml"))
    labels = {"app": "rollout-blocker"}
    client.AppsV1Api(api).create_namespaced_deployment(NS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "blocker", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {"gpuharden.io/test-pool": "rollout"}, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "blocker", "image": image}]}}}})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "blocker", "namespace": NS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})

    def held():
        pods = core.list_namespaced_pod(NS, label_selector="app=rollout-blocker").items
        running = [pod for pod in pods if pod.status.phase == "Running" and pod.spec.node_name == node]
        budget = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("blocker", NS).status
        return running and budget.disruptions_allowed == 0 and budget.current_healthy == 1

    wait_for(held, timeout=180, what="the blocker pod running on %s under its budget" % node)


def _interrupt(process, log):
    """SIGINT to the run's process group, as Ctrl-C in a terminal sends it; a second one if it lingers."""
    for _attempt in range(2):
        os.killpg(process.pid, signal.SIGINT)
        try:
            return process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            continue
    os.killpg(process.pid, signal.SIGKILL)
    raise AssertionError("ansible-playbook did not end after two SIGINTs: %s" % log.read_text()[-3000:])


def test_an_interrupted_rollout_leaves_a_named_cordon_that_the_next_harden_clears(fresh, tmp_path):
    canary, other = FRESH[0], FRESH[1]
    _blocker(fresh, canary)
    log = tmp_path / "interrupted.log"
    with log.open("w") as stream:
        process = subprocess.Popen(
            ["ansible-playbook", "-i", fresh["inventory"], str(REPO_ROOT / "playbooks/harden_gpu_nodes.yml"), "--tags", "kubelet_topology",
             "-l", "%s,%s" % (canary, other), "-e", "gpuharden_run_owner=harden@interrupted"],
            cwd=REPO_ROOT, env=dict(os.environ, **ENV), stdout=stream, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # mid-rollout: the canary cordoned by this run, its drain held by the budget
            wait_for(lambda: cordon_record(fresh, canary)[1] is not None or process.poll() is not None, timeout=420,
                     what="the canary cordoned by the run")
            assert process.poll() is None, log.read_text()[-4000:]
            time.sleep(5)
            rc = _interrupt(process, log)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert rc != 0, log.read_text()[-3000:]
    cordoned, record = cordon_record(fresh, canary)
    assert cordoned and record["owner"] == "harden@interrupted" and record["for"] == "kubelet_topology", record
    assert "harden@interrupted" in sh(fresh, canary, "cat %s" % LOCK)  # the run lock, held from its plan, left behind
    assert "harden@interrupted" in sh(fresh, other, "cat %s" % LOCK)

    # The next drift names the cordon and the run that left it; it takes that run's lock over at once (the run is gone),
    # where it would have waited out gpuharden_lock_timeout and failed the node.
    started = time.monotonic()
    report = drift(fresh, "-l", canary, "--json")
    assert time.monotonic() - started < 180
    assert report.returncode == 1, report.stdout[-3000:] + report.stderr[-3000:]
    data = json.loads(report.stdout)
    assert not data["failed"] and not data["unreachable"], data["failed"]
    left = [finding for finding in data["nodes"][canary]["findings"] if finding["id"] == "node_left_cordoned"]
    assert len(left) == 1 and left[0]["found"]["cordoned_by"] == "harden@interrupted" and left[0]["remediable"], left
    assert data["nodes"][canary]["status"] == "drift"
    assert manager.ssh(fresh["nodes"][canary]["address"], "test -e %s" % LOCK).returncode != 0  # taken over and given back

    # The next harden: the budget lets the drain finish now; the run resumes the canary's step (it takes the cordon on)
    # and ends it, and takes the other node's stale lock over, naming the run that held it.
    from kubernetes import client

    client.PolicyV1Api(admin(fresh)).delete_namespaced_pod_disruption_budget("blocker", NS)
    rc, events, output = harden(fresh, tags=["kubelet_topology"], limit="%s,%s" % (canary, other))
    assert rc == 0, output[-5000:]
    assert "took over the run lock %s from harden@interrupted" % LOCK in output and "its run is gone" in output, output[-5000:]
    # the node_maintenance role's drain (its task files run the module through node_maintenance_step)
    drains = [res for host, res in results(events, "gpuharden.k8s.node_maintenance_step").items() if host == canary]
    for node in (canary, other):
        assert cordon_record(fresh, node) == (False, None), node
        assert manager.ssh(fresh["nodes"][node]["address"], "test -e %s" % LOCK).returncode != 0, node
        assert kubelet_config(fresh, node).get("cpuManagerPolicy") == "static", node
    assert drains, "the canary's step ran again"
    again = json.loads(drift(fresh, "-l", canary, "--json").stdout)
    assert not [finding for finding in again["nodes"][canary]["findings"] if finding["id"] == "node_left_cordoned"]

    # A cordon an ended run left on a node this run has nothing to drain for: released once the node is Ready.
    left_record = json.dumps({"owner": "harden@gone", "at": "2026-07-01T12:00:03Z", "for": "kubelet_topology"})
    _core(fresh).patch_node(other, {"spec": {"unschedulable": True}, "metadata": {"annotations": {CORDON: left_record}}})
    rc, events, output = harden(fresh, tags=["kubelet_topology"], limit=other)
    assert rc == 0, output[-5000:]
    [released] = [event["event_data"]["res"] for event in events if event.get("event") == "runner_on_ok"
                  and event["event_data"].get("task", "").startswith("Rollout | release the cordon")]
    assert released["changed"] and released["released"] == [other], released
    assert cordon_record(fresh, other) == (False, None)


def test_a_role_run_on_its_own_drains_within_the_budget_not_its_plays_serial(fresh):
    """kubelet_topology in a playbook of the adopter's, no serial: before, every node of the play was drained at once."""
    reset_to_defaults(fresh, FRESH)
    with tempfile.TemporaryDirectory(prefix="gpuharden-rollout-test-") as private, CordonWatcher(fresh, FRESH) as watcher:
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=fresh["inventory"], quiet=True,
                                    playbook=str(REPO_ROOT / "tests/integration/playbooks/kubelet_topology_alone.yml"))
        events = list(runner.events)
    failed = {event["event_data"]["host"]: event["event_data"]["res"].get("msg", "") for event in events
              if event.get("event") == "runner_on_failed" and not event["event_data"].get("ignore_errors")}
    assert runner.rc != 0 and watcher.samples > 10
    assert watcher.most == 1 and len(watcher.ever) == 1, (watcher.most, watcher.ever)
    [drained] = sorted(watcher.ever)
    assert sorted(failed) == sorted(set(FRESH) - {drained}), failed
    for host, message in failed.items():
        assert "disruptive step not started: disruption budget exhausted" in message and "serial 1" in message, message
        assert kubelet_config(fresh, host).get("cpuManagerPolicy") != "static", host
        assert cordon_record(fresh, host) == (False, None), host
    assert kubelet_config(fresh, drained).get("cpuManagerPolicy") == "static", drained
    assert cordon_record(fresh, drained) == (False, None)
