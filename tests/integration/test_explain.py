# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden explain on the lab, against the real control plane (kube-apiserver, kube-scheduler) and real GPU nodes:
a pod set up with a symptom, explained by the command run as the tool's identity (deploy/rbac), which must name the
cause in its first line and the fix in its output.  Each test names only the symptom it sets up, never the cause.

TestClusterSideCauses: the causes explain reads from the cluster alone, on the `explain` lab (three GPU nodes on the
real kubelet v1.36, containerd 2.x and, once deployed by the product's device_plugin role, the real NVIDIA device
plugin; lab/src/gpuharden_lab/scenarios/explain.yaml).  Its tests run in order: the first two before any plugin runs,
then the plugin under migStrategy none, then under mixed.

TestNodeSideCauses: the causes explain reads on the pod's node (one drift check of that node), on the `healthy`
lab's hardened DGX A100."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _bpf_syscalls as bpf
from gpuharden_lab import REPO_ROOT, cluster, manager, pods, realnode, workloads
from kubernetes import client

from tests.integration import cluster_side
from tests.integration import devcg_shapes as shapes
from tests.integration.cluster_side import failures, module_args, run, wait_for
from tests.integration.test_real_nodes import in_node
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
    cluster_side.plugin_sees_the_node_s_pci_devices(state, PLUGIN_NAMESPACE, PLUGIN_DAEMONSET)
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


# ---------------------------------------------------------------------------------------------------------------
# Node-side causes: a node hardened by gpuharden (the `healthy` scenario's DGX A100 on the real kubelet v1.36.3,
# containerd 2.x, the real toolkit and device plugin), a real pod with the symptom, and explain with the inventory:
# one drift check of the pod's node is the only trip it makes.

NODE = "gpu-a100-0"


@pytest.fixture(scope="class")
def hardened():
    with running_lab("healthy", node_count=1) as state:
        yield state


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
