# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden explain on the lab, against the real control plane (kube-apiserver, kube-scheduler) and a real kubelet
node: a pod set up with a symptom, explained by the command run as the tool's identity (deploy/rbac), which must name
the cause in its first line.  The test names only the symptom it sets up, never the cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from gpuharden_lab import REPO_ROOT, cluster
from kubernetes import client

from tests.integration.cluster_side import wait_for
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab]

NAMESPACE = "default"
ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def lab():
    # running_lab skips where the real kubelet and containerd are not built (make real-components)
    with running_lab("fresh-fleet", node_count=1) as state:
        yield state


def _explain(state, *args):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "explain", *args, "-e", "gpuharden_kubeconfig=%s" % state["cluster"]["tool_kubeconfig"]],
                          cwd=REPO_ROOT, env=dict(os.environ, **ENV), capture_output=True, text=True, check=False, timeout=120)
    return done, time.monotonic() - started


def _scheduler_gave_up(core, name):
    pod = core.read_namespaced_pod(name, NAMESPACE)
    return any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or [])


def _pending_pod(core, name, limits):
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}]}})
    wait_for(lambda: _scheduler_gave_up(core, name), timeout=90, what="the scheduler to leave %s Pending" % name)


def test_a_gpu_pod_on_a_fleet_without_a_device_plugin(lab):
    core = client.CoreV1Api(cluster.api_client(lab["cluster"]["admin_kubeconfig"]))
    name = "explain-no-plugin"
    try:
        _pending_pod(core, name, {"nvidia.com/gpu": "1"})
        done, _seconds = _explain(lab, "pod", "%s/%s" % (NAMESPACE, name), "--json")
        document = json.loads(done.stdout)
        assert done.returncode == 1 and document["verdict"]["cause"] == "no_device_plugin", document
        assert document["verdict"]["stage"] == "device_plugin" and any("--tags device_plugin" in line for line in document["fix"])
    finally:
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_a_pod_asking_for_nvidia_com_gpus_stays_pending_and_explain_names_the_advertised_name(lab):
    core = client.CoreV1Api(cluster.api_client(lab["cluster"]["admin_kubeconfig"]))
    name = "explain-typo"
    try:
        _pending_pod(core, name, {"nvidia.com/gpus": "1"})
        done, seconds = _explain(lab, "pod", "%s/%s" % (NAMESPACE, name))
        print(done.stdout)  # the real output, for the README (pytest -s)
        first = done.stdout.splitlines()[0] if done.stdout else ""
        assert done.returncode == 1, (done.stdout, done.stderr)
        # the fresh node runs no device plugin yet: nvidia.com/gpu is the plugin's name, advertised by no node
        assert "requests nvidia.com/gpus, which no node advertises; did you mean nvidia.com/gpu?" in first, done.stdout
        as_json, _ = _explain(lab, "pod", "%s/%s" % (NAMESPACE, name), "--json")
        document = json.loads(as_json.stdout)
        assert document["verdict"]["cause"] == "resource_not_advertised" and document["api_requests"] == 2, document
        assert seconds < 30, seconds
        failing, _ = _explain(lab, "--failing")
        print(failing.stdout)
        assert failing.returncode == 1 and "%s/%s: requests nvidia.com/gpus" % (NAMESPACE, name) in failing.stdout, failing.stdout
    finally:
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
