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
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _bpf_syscalls as bpf
from gpuharden_lab import REPO_ROOT, cluster, manager, pods, realnode, workloads
from kubernetes import client

from tests.integration import devcg_shapes as shapes
from tests.integration.cluster_side import wait_for
from tests.integration.test_real_nodes import in_node
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


# ---------------------------------------------------------------------------------------------------------------
# Node-side causes: a node hardened by gpuharden (the `healthy` scenario's DGX A100 on the real kubelet v1.36.3,
# containerd 2.x, the real toolkit and device plugin), a real pod with the symptom, and explain with the inventory:
# one drift check of the pod's node is the only trip it makes.

NODE = "gpu-a100-0"


@pytest.fixture(scope="class")
def hardened():
    with running_lab("healthy", node_count=1) as state:
        yield state


def _core(state):
    return client.CoreV1Api(cluster.api_client(state["cluster"]["admin_kubeconfig"]))


def _image(state):
    return realnode.sandbox_image_name(in_node(state, NODE, ["cat", "/etc/containerd/config.toml"]).stdout)


def _running_pod(state, name, limits=None, env=None, runtime_class="nvidia"):
    """A pod on NODE (pause), Running: (pod, its container's task pid on the node)."""
    core = _core(state)
    container = {"name": "main", "image": _image(state), "imagePullPolicy": "Never", "command": ["/pause"], "resources": {"limits": limits or {}}}
    if env:
        container["env"] = [{"name": key, "value": value} for key, value in env.items()]
    spec = {"nodeName": NODE, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0, "containers": [container]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})

    def running():
        pod = core.read_namespaced_pod(name, NAMESPACE)
        assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.reason, pod.status.message)
        statuses = pod.status.container_statuses or []
        return statuses[0] if statuses and statuses[0].state.running and statuses[0].ready else None

    status = wait_for(running, timeout=120, what="pod %s running" % name)
    container_id = status.container_id.split("//", 1)[1]
    task = next(line.split() for line in in_node(state, NODE, ["ctr", "--namespace", "k8s.io", "tasks", "list"]).stdout.splitlines()
                if line.startswith(container_id))
    return container_id, int(task[1])


def _delete(state, *names):
    core = _core(state)
    for name in names:
        try:
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        except client.ApiException as error:
            if error.status != 404:
                raise

    def gone():
        return not [p for p in core.list_namespaced_pod(NAMESPACE).items if p.metadata.name in names]

    wait_for(gone, timeout=90, what="pods %s deleted" % ", ".join(names))


def _explain_node_side(state, name):
    """explain pod NAMESPACE/NAME with the lab inventory: (first line, the text, the JSON document, seconds of the text run)."""
    done, seconds = _explain(state, "pod", "%s/%s" % (NAMESPACE, name), "-i", state["inventory"])
    print(done.stdout)  # the real output, for the README (pytest -s)
    assert done.stdout, done.stderr[-3000:]
    as_json, _ = _explain(state, "pod", "%s/%s" % (NAMESPACE, name), "-i", state["inventory"], "--json")
    document = json.loads(as_json.stdout)
    assert document["node_trips"] == 1, document
    return done.stdout.splitlines()[0], done.stdout, document, seconds


def _place(state, entry):
    """A pod the real kubelet admits on NODE (its GPUs allocated by the real plugin) whose container is a runc container
    with the device program runc makes for what the pod is given (gpuharden_lab.workloads: the real containerd's own
    containers have v1 device cgroups only the lab's wrappers see)."""
    api = cluster.api_client(state["cluster"]["admin_kubeconfig"])
    try:
        node = next(node for node in manager.nodes_from_state(state) if node.name == NODE)
        return workloads.place(api, {NODE: node}, [entry])[0]
    finally:
        api.close()


class TestNodeSideCauses:
    def test_a_pod_without_a_gpu_request_that_sets_nvidia_visible_devices(self, hardened):
        try:
            _running_pod(hardened, "sneaky", env={"NVIDIA_VISIBLE_DEVICES": "all"})
            first, text, document, _seconds = _explain_node_side(hardened, "sneaky")
            assert first.startswith("%s/sneaky: requests no GPU, yet its container main can open" % NAMESPACE), text
            assert document["verdict"]["cause"] == "gpu_access_without_request" and "remove NVIDIA_VISIBLE_DEVICES" in text
        finally:
            _delete(hardened, "sneaky")

    def test_a_gpu_pod_that_also_sets_nvidia_visible_devices_all(self, hardened):
        """The real kubelet allocates one GPU through the real plugin; the container (runc, with the device program the
        NVIDIA hook leaves for NVIDIA_VISIBLE_DEVICES=all) can open every GPU of the node."""
        try:
            _place(hardened, {"name": "greedy", "node": NODE, "gpus": 1, "env": {"NVIDIA_VISIBLE_DEVICES": "all"}})
            first, text, document, _seconds = _explain_node_side(hardened, "greedy")
            assert first.startswith("%s/greedy: its container main can open GPU" % NAMESPACE), text
            assert "it was not allocated" in first or "allocated to" in first, text
            assert document["verdict"]["cause"] == "another_pods_gpu" and "the device plugin's allocation must be its only source" in text
        finally:
            _delete(hardened, "greedy")

    def test_a_gpu_pod_whose_device_program_was_replaced(self, hardened):
        """As systemd does on a daemon-reload where it cannot resolve the GPUs' device nodes (cgroup v2, no /dev/char
        links): the container's device program is replaced by one that allows only the unit's own devices."""
        try:
            placed = _place(hardened, {"name": "revoked", "node": NODE, "gpus": 1})
            node = next(node for node in manager.nodes_from_state(hardened) if node.name == NODE)
            # the node's cgroup2 mount is its cgroup namespace's root: the node's cgroup on the host
            cgroup = node.cgroup / pods.kubelet_cgroup_path(placed.uid, placed.container_id, "besteffort", "cgroupfs").lstrip("/")
            before = pods.attached_device_programs(cgroup)
            assert before, cgroup
            systemd = shapes.systemd_like([("c", 1, 3, "rwm"), ("c", 1, 5, "rwm"), ("c", 1, 8, "rwm"), ("c", 1, 9, "rwm"), ("c", 136, None, "rwm")])
            new = bpf.load_program(systemd.bytes(), name="systemd_reload")
            try:
                bpf.attach_program(str(cgroup), new, bpf.BPF_F_ALLOW_MULTI)
            finally:
                os.close(new)
            for prog_id in before:
                old = bpf.prog_fd_by_id(prog_id)
                try:
                    bpf.detach_program(str(cgroup), old)
                finally:
                    os.close(old)
            first, text, document, _seconds = _explain_node_side(hardened, "revoked")
            assert first.startswith("%s/revoked: its container main can no longer open" % NAMESPACE), text
            assert document["verdict"]["cause"] == "device_program_revoked" and "recreate the pod" in text
        finally:
            _delete(hardened, "revoked")

    def test_a_gpu_pod_on_a_gpu_with_uncorrectable_ecc_errors(self, hardened):
        fixture = "/etc/nvml-double/fixture.json"
        before = in_node(hardened, NODE, ["cat", fixture]).stdout
        try:
            placed = _place(hardened, {"name": "ecc", "node": NODE, "gpus": 1})
            data = json.loads(before)
            gpu = next(entry for entry in data["gpus"] if entry["minor"] == placed.gpu_minors[0])
            uuid = gpu["uuid"]
            gpu["ecc"] = {"volatile": {"corrected": 0, "uncorrected": 3}, "aggregate": {"corrected": 0, "uncorrected": 3}}
            done = in_node(hardened, NODE, ["sh", "-c", "cat > %s" % fixture], input=json.dumps(data))
            assert done.returncode == 0, done.stderr
            first, text, document, _seconds = _explain_node_side(hardened, "ecc")
            assert first.startswith("%s/ecc: GPU %d (%s) on %s, allocated to the pod, is unhealthy: ecc_uncorrectable"
                                    % (NAMESPACE, gpu["minor"], uuid, NODE)), text
            assert document["verdict"]["cause"] == "allocated_gpu_unhealthy" and uuid in text
        finally:
            in_node(hardened, NODE, ["sh", "-c", "cat > %s" % fixture], input=before)
            _delete(hardened, "ecc")

    def test_a_gpu_pod_on_a_node_whose_device_nodes_lost_their_mode(self, hardened):
        try:
            _running_pod(hardened, "perms", limits={"nvidia.com/gpu": "1"})
            assert in_node(hardened, NODE, ["chmod", "0600", "/dev/nvidia0"]).returncode == 0
            first, text, document, _seconds = _explain_node_side(hardened, "perms")
            assert first.startswith("%s/perms: the GPU device nodes on %s do not let the container open them" % (NAMESPACE, NODE)), text
            assert document["verdict"]["cause"] == "device_permissions" and "--tags device_permissions -l %s" % NODE in text
        finally:
            in_node(hardened, NODE, ["chmod", "0666", "/dev/nvidia0"])
            _delete(hardened, "perms")

    def test_a_gpu_pod_bound_to_a_node_whose_kubelet_does_not_start(self, hardened):
        """Last: the kubelet stays down.  A CPU Manager checkpoint from the other policy, and a kubelet restart."""
        configz = json.loads(in_node(hardened, NODE, ["sh", "-c", "cat /var/lib/kubelet/cpu_manager_state"]).stdout or "{}")
        other = "none" if configz.get("policyName") == "static" else "static"
        state = json.dumps({"policyName": other, "defaultCpuSet": "", "checksum": 0})
        assert in_node(hardened, NODE, ["sh", "-c", "cat > /var/lib/kubelet/cpu_manager_state"], input=state).returncode == 0
        in_node(hardened, NODE, ["systemctl", "restart", "kubelet"])
        # the symptom: the real kubelet does not start ("could not restore state from checkpoint")
        wait_for(lambda: in_node(hardened, NODE, ["systemctl", "is-active", "kubelet"]).stdout.strip() != "active", timeout=60,
                 what="the kubelet to stop on the checkpoint")
        assert "could not restore state from checkpoint" in in_node(hardened, NODE, ["cat", "/var/log/kubelet.log"]).stdout
        core = _core(hardened)
        core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stuck"}, "spec": {
            "nodeName": NODE, "containers": [{"name": "main", "image": _image(hardened), "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        first, text, document, _seconds = _explain_node_side(hardened, "stuck")
        assert document["verdict"]["cause"] == "stale_checkpoint" and "/var/lib/kubelet/cpu_manager_state" in first, text
        assert "--tags kubelet_topology -l %s" % NODE in text
