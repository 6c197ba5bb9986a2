# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden explain on the lab, against the real control plane (kube-apiserver, kube-scheduler) and real GPU nodes:
a pod set up with a symptom, explained by the command run as the tool's identity (deploy/rbac), which must name the
cause in its first line and the fix in its output.  Each test names only the symptom it sets up, never the cause.

TestClusterSideCauses: the causes explain reads from the cluster alone, on the `explain` lab (three GPU nodes on the
real kubelet v1.36, containerd 2.x and, once deployed by the product's device_plugin role, the real NVIDIA device
plugin; lab/src/gpuharden_lab/scenarios/explain.yaml).  Its tests run in order: the first two before any plugin runs,
then the plugin under migStrategy none, then under mixed.  Another class of causes, on a lab of its own, can follow."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from gpuharden_lab import REPO_ROOT, cluster, realnode
from kubernetes import client

from tests.integration.cluster_side import failures, module_args, run, wait_for
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NAMESPACE = "default"
ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
DGX, MIG, RUNC = "explain-dgx-0", "explain-mig-0", "explain-runc-0"
PLUGIN_NAMESPACE, PLUGIN_DAEMONSET = "kube-system", "nvidia-device-plugin-daemonset"
# What the real plugin v0.18.2 advertises for the h100-mig-enabled fixture (tests/integration/test_real_nodes*.py):
# under migStrategy none the whole GPUs its container reaches, under mixed one whole GPU and the GPU instances.
MIG_NONE = {"nvidia.com/gpu": "3"}
MIG_MIXED = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-2g.20gb": "2", "nvidia.com/mig-3g.40gb": "3"}


def _explain(state, *args):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "explain", *args, "-e", "gpuharden_kubeconfig=%s" % state["cluster"]["tool_kubeconfig"]],
                          cwd=REPO_ROOT, env=dict(os.environ, **ENV), capture_output=True, text=True, check=False, timeout=120)
    return done, time.monotonic() - started


def _explained(state, name):
    """The text output (printed, for the README: pytest -s) and the --json document of explain pod NAMESPACE/NAME."""
    done, seconds = _explain(state, "pod", "%s/%s" % (NAMESPACE, name))
    print("$ gpuharden explain pod %s/%s   (%.1f s)\n%s" % (NAMESPACE, name, seconds, done.stdout))
    assert done.returncode == 1, (done.stdout, done.stderr)
    as_json, _ = _explain(state, "pod", "%s/%s" % (NAMESPACE, name), "--json")
    return done.stdout.splitlines()[0], done.stdout, json.loads(as_json.stdout)


def _core(state):
    return client.CoreV1Api(cluster.api_client(state["cluster"]["admin_kubeconfig"]))


def _scheduler_gave_up(core, name):
    pod = core.read_namespaced_pod(name, NAMESPACE)
    return any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or [])


def _pending_pod(core, name, limits, node=None):
    """A pod the scheduler leaves Pending; ``node``: pinned there by its nodeSelector, as a workload pins a node pool."""
    spec = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    wait_for(lambda: _scheduler_gave_up(core, name), timeout=90, what="the scheduler to leave %s Pending" % name)


def _gpu_pod(state, core, name, limits, node):
    """A real GPU pod for ``node``'s real kubelet: the sandbox image the lab imported, the nvidia RuntimeClass."""
    from tests.integration.test_real_nodes import in_node  # noqa: PLC0415

    image = realnode.sandbox_image_name(in_node(state, node, ["cat", "/etc/containerd/config.toml"]).stdout)
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "runtimeClassName": "nvidia", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["/pause"],
                                 "resources": {"limits": limits}}]}})


def _delete_pod(core, name):
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


@contextlib.contextmanager
def _pending_and_explained(state, name, limits, node=None):
    """A pod the scheduler leaves Pending (``node``: pinned there), explained: (first line, text, --json document);
    the pod is deleted after the block."""
    core = _core(state)
    try:
        _pending_pod(core, name, limits, node)
        yield _explained(state, name)
    finally:
        _delete_pod(core, name)


def _gpu_resources(core, node):
    return {key: value for key, value in core.read_node(node).status.allocatable.items() if key.startswith("nvidia.com/")}


def _see_the_node_s_pci_devices(state):
    """The lab's one departure from a real node, for the plugin's NUMA hints: a real node's sysfs shows every
    container its PCI devices, where the real plugin reads each GPU's numa_node (k8s-device-plugin v0.18.2
    internal/rm/nvml_devices.go; no file, no topology, and the kubelet aligns nothing).  A lab node's fixture devices
    are bound over /sys/bus/pci/devices in the node's mount namespace only (lab/src/gpuharden_lab/node.py), so the
    plugin's pods get that directory as a hostPath."""
    from tests.integration.cluster_side import admin  # noqa: PLC0415

    api = admin(state)
    try:
        apps = client.AppsV1Api(api)
        volumes = apps.read_namespaced_daemon_set(PLUGIN_DAEMONSET, PLUGIN_NAMESPACE).spec.template.spec.volumes or []
        if any(volume.name == "lab-pci-devices" for volume in volumes):
            return  # the role's update keeps a volume it does not own
        apps.patch_namespaced_daemon_set(PLUGIN_DAEMONSET, PLUGIN_NAMESPACE, [
            {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "lab-pci-devices", "hostPath": {"path": "/sys/bus/pci/devices"}}},
            {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "lab-pci-devices", "mountPath": "/sys/bus/pci/devices", "readOnly": True}}])
    finally:
        api.close()


def _deploy_plugin(state, strategy):
    """The real plugin v0.18.2 on every GPU node, by the product's device_plugin role, with no RuntimeClass (nvidia is
    containerd's default runtime on the DGX and the MIG node, runc on the third) and ``strategy`` as migStrategy."""
    with tempfile.TemporaryDirectory(prefix="explain-dp-") as results:
        variables = {"dp_test_results": results, "device_plugin_version": realnode.versions()["NVIDIA_DEVICE_PLUGIN_VERSION"],
                     "device_plugin_wait": False, "gpuharden_kubeconfig": state["cluster"]["admin_kubeconfig"], "dp_test_runtime_class": False,
                     "device_plugin_runtime_class_name": "", "gpuharden_mig_strategy": strategy}
        found, _stats, _seconds = run(state, playbook="device_plugin.yml", extravars=variables)
        with open(os.path.join(results, "result.json")) as handle:
            result = json.load(handle)
    assert result["ok"] and not failures(found), result
    _see_the_node_s_pci_devices(state)
    core = _core(state)
    wait_for(lambda: _rolled_out(core), timeout=180, what="the plugin pods of %s and %s replaced" % (DGX, MIG))
    wait_for(lambda: _gpu_resources(core, DGX) == {"nvidia.com/gpu": "8"}, timeout=120, what="the real plugin on %s" % DGX)
    expected = MIG_MIXED if strategy == "mixed" else MIG_NONE
    wait_for(lambda: _gpu_resources(core, MIG) == expected, timeout=120, what="%s from the real plugin on %s" % (expected, MIG))


def _rolled_out(core):
    """The plugin pods of the DGX and the MIG node are the patched template's, one each, and Ready."""
    pods = [pod for pod in core.list_namespaced_pod(PLUGIN_NAMESPACE).items if pod.spec.node_name in (DGX, MIG) and not pod.metadata.deletion_timestamp
            and any(container.name == "nvidia-device-plugin-ctr" for container in pod.spec.containers)]
    patched = [pod for pod in pods if any(volume.name == "lab-pci-devices" for volume in pod.spec.volumes or [])]
    return len(pods) == 2 and len(patched) == 2 and all(
        any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []) for pod in patched)


@pytest.fixture(scope="class")
def lab():
    # running_lab skips where the real kubelet and containerd are not built (make real-components)
    with running_lab("explain") as state:
        state["plugin"] = None
        yield state


def _plugin(state, strategy):
    """The plugin deployed under ``strategy`` (once per strategy, in the class's order)."""
    if state["plugin"] != strategy:
        _deploy_plugin(state, strategy)
        state["plugin"] = strategy


class TestClusterSideCauses:
    """One test per cluster-side cause of issue 44, on the real components; the pods are deleted after each."""

    def test_a_gpu_pod_on_a_fleet_without_a_device_plugin(self, lab):
        with _pending_and_explained(lab, "explain-no-plugin", {"nvidia.com/gpu": "1"}) as (first, output, document):
            assert "requests nvidia.com/gpu, but no device plugin runs on any node: nothing advertises it" in first, output
            assert document["verdict"]["cause"] == "no_device_plugin" and document["verdict"]["stage"] == "device_plugin", document
            assert "--tags device_plugin" in output

    def test_a_pod_asking_for_nvidia_com_gpus_stays_pending_and_explain_names_the_advertised_name(self, lab):
        core, name = _core(lab), "explain-typo"
        try:
            _pending_pod(core, name, {"nvidia.com/gpus": "1"})
            done, seconds = _explain(lab, "pod", "%s/%s" % (NAMESPACE, name))
            print(done.stdout)  # the real output, for the README (pytest -s)
            first = done.stdout.splitlines()[0] if done.stdout else ""
            assert done.returncode == 1, (done.stdout, done.stderr)
            # no device plugin runs yet: nvidia.com/gpu is the plugin's name, advertised by no node
            assert "requests nvidia.com/gpus, which no node advertises; did you mean nvidia.com/gpu?" in first, done.stdout
            assert "request nvidia.com/gpu instead" in done.stdout
            as_json, _ = _explain(lab, "pod", "%s/%s" % (NAMESPACE, name), "--json")
            document = json.loads(as_json.stdout)
            assert document["verdict"]["cause"] == "resource_not_advertised" and document["api_requests"] == 2, document
            assert seconds < 30, seconds
            failing, _ = _explain(lab, "--failing")
            print(failing.stdout)
            assert failing.returncode == 1 and "%s/%s: requests nvidia.com/gpus" % (NAMESPACE, name) in failing.stdout, failing.stdout
        finally:
            _delete_pod(core, name)

    def test_a_gpu_pod_pinned_to_a_node_whose_plugin_keeps_restarting(self, lab):
        """The real plugin without the NVIDIA runtime: containerd's default runtime on the node is runc, and the
        plugin pod names no RuntimeClass; the real plugin exits ("Incompatible strategy detected auto") and the
        kubelet restarts it."""
        _plugin(lab, "none")
        with _pending_and_explained(lab, "explain-plugin-restarting", {"nvidia.com/gpu": "1"}, node=RUNC) as (first, output, document):
            assert "requests nvidia.com/gpu, but the device plugin on %s is " % RUNC in first, output
            assert "%s's containerd has no nvidia runtime (runtime handlers '', 'runc') and the plugin pod names no RuntimeClass" % RUNC in first
            assert document["verdict"]["cause"] == "device_plugin_failing", document
            assert "--tags container_runtime,runtime_class,device_plugin -l %s" % RUNC in output

    def test_a_pod_asking_for_a_mig_device_while_the_mig_node_s_plugin_advertises_whole_gpus(self, lab):
        _plugin(lab, "none")
        with _pending_and_explained(lab, "explain-mig-name", {"nvidia.com/mig-1g.10gb": "1"}) as (first, output, document):
            assert ("requests nvidia.com/mig-1g.10gb, not advertised on any node: they advertise nvidia.com/gpu only: the device plugin "
                    "runs migStrategy none or single, not mixed") in first, output
            assert document["verdict"]["cause"] == "mig_strategy_mismatch", document
            assert "-e gpuharden_mig_strategy=mixed" in output and "request nvidia.com/gpu" in output

    def test_a_five_gpu_pod_on_a_dgx_whose_kubelet_runs_single_numa_node(self, lab):
        """The real kubelet rejects it at admission: 4 GPUs per NUMA node, the plugin's NUMA hints, single-numa-node."""
        _plugin(lab, "none")
        core, name = _core(lab), "explain-five-gpus"
        try:
            _gpu_pod(lab, core, name, {"nvidia.com/gpu": "5"}, DGX)
            wait_for(lambda: core.read_namespaced_pod(name, NAMESPACE).status.phase == "Failed", timeout=90, what="the kubelet's verdict on %s" % name)
            first, output, document = _explained(lab, name)
            assert first.startswith("%s/%s: the kubelet on %s rejected the pod at admission: TopologyAffinityError" % (NAMESPACE, name, DGX)), output
            assert first.endswith("container main asks for 5 GPUs, which its Topology Manager (restricted or single-numa-node, the policies that "
                                  "refuse) could not align: topologyManagerPolicy: restricted or topologyManagerPolicy: best-effort admits it"), first
            assert document["verdict"]["cause"] == "admission_rejected", document
            assert "--tags kubelet_topology -l %s -e kubelet_topology_topology_manager_policy=restricted" % DGX in output
        finally:
            _delete_pod(core, name)

    def test_a_pod_asking_for_a_mig_profile_the_mig_node_s_layout_does_not_have(self, lab):
        _plugin(lab, "mixed")
        with _pending_and_explained(lab, "explain-mig-profile", {"nvidia.com/mig-7g.80gb": "1"}) as (first, output, document):
            assert ("requests nvidia.com/mig-7g.80gb, not advertised on any node: the profile is not in the MIG layout, which has "
                    "nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb") in first, output
            assert document["verdict"]["cause"] == "mig_strategy_mismatch", document
            assert "--tags mig" in output

    def test_a_gpu_pod_while_one_gpu_node_is_cordoned_by_a_harden_run_and_the_other_joins(self, lab):
        """The DGX cordoned by node_maintenance as a harden run does (its gpuharden.io/cordon record), the MIG node
        under the taint gpuharden's bootstrap registers a joining node with; the third advertises no GPU."""
        _plugin(lab, "mixed")
        core, name = _core(lab), "explain-cordoned"
        kubeconfig = lab["cluster"]["admin_kubeconfig"]
        taint = {"key": "gpuharden.io/bootstrap", "value": "pending", "effect": "NoSchedule"}
        try:
            found, _stats, _seconds = run(lab, module="gpuharden.k8s.node_maintenance", args=module_args(
                kubeconfig=kubeconfig, nodes=[DGX], state="cordoned", owner="harden-run-7", purpose="kubelet_topology"))
            assert not failures(found), failures(found)
            core.patch_node(MIG, {"spec": {"taints": [taint]}})
            _pending_pod(core, name, {"nvidia.com/gpu": "1"})
            first, output, document = _explained(lab, name)
            assert "every node that offers its GPUs (2) refuses new pods: " in first, output
            assert "%s cordoned by gpuharden, run harden-run-7 at " % DGX in first and "(for kubelet_topology)" in first
            assert "%s tainted gpuharden.io/bootstrap=pending:NoSchedule by gpuharden's bootstrap" % MIG in first
            assert document["verdict"]["cause"] == "gpu_nodes_unschedulable", document
            assert "gpuharden.k8s.bootstrap_gpu_node -l %s" % MIG in output and "gpuharden.k8s.harden_gpu_nodes -l %s" % DGX in output
        finally:
            _delete_pod(core, name)
            core.patch_node(MIG, {"spec": {"taints": None}})
            run(lab, module="gpuharden.k8s.node_maintenance", args=module_args(kubeconfig=kubeconfig, nodes=[DGX], state="uncordoned",
                                                                                 owner="harden-run-7"))
