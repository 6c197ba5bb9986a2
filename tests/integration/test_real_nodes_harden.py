# SPDX-License-Identifier: GPL-3.0-or-later
"""harden_gpu_nodes.yml on the real-nodes lab: fresh kubeadm-like nodes on the real kubelet v1.36 and the real
containerd 2.x / 1.7, hardened by the product's own playbook; the real NVIDIA device plugin, in the DaemonSet's pods
(a real container that the real NVIDIA container toolkit prepares, from the image the lab imported, realnode.py), and
the real kubelet then decide what the Nodes advertise.

One setting differs from a default run, and is stated: `gpuharden_mig_strategy: mixed`, because the H100 node has MIG
enabled (under `none` the real plugin advertises whole GPUs and the post-check fails the node with
mig_not_advertised, which test_real_nodes.py covers).  The role waits for the plugin's rollout as by default: the
real kubelet reports the plugin pods Ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gpuharden_lab import manager, realnode
from gpuharden_lab.noderoot import load_fixture

from tests.integration.cluster_side import admin, recap_changed
from tests.integration.test_real_nodes import C2, C17, NODES, gpu_resources, handlers, in_node, node_objects, real_nodes_lab

# real_nodes: they need `make real-components` (which `make integration` builds first); `make real-nodes` runs only these.
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

PLUGIN_VERSION = realnode.versions()["NVIDIA_DEVICE_PLUGIN_VERSION"]
EXTRA_VARS = {"device_plugin_version": PLUGIN_VERSION, "gpuharden_mig_strategy": "mixed"}
# What the real plugin v0.18.2 advertised for the h100-mig-enabled fixture under migStrategy mixed (measured, and in
# real-components.md): one whole GPU and the GPU instances by their GPU-instance profile.
H100_MIG_MIXED = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-2g.20gb": "2", "nvidia.com/mig-3g.40gb": "3"}


@pytest.fixture(scope="module")
def lab():
    yield from real_nodes_lab()


def harden(state):
    done = manager.run_harden(state["inventory"], EXTRA_VARS, timeout=900)
    return done, recap_changed(done.stdout)


RUNTIME_CLASS_TASK = "TASK [gpuharden.k8s.runtime_class : RuntimeClass | ensure it matches containerd's runtime (once for the play)]"
DEVICE_PLUGIN_TASK = ("TASK [gpuharden.k8s.device_plugin : Device plugin | label the GPU nodes, unlabel the CPU-only ones, and install "
                      "or repair the plugin (once for the play)]")


def task_output(stdout, banner):
    """What a task printed in the run, the last time it was shown ("" when its stage was left out before it): the
    first play shows the device plugin stage too, skipped, since harden runs it in the last play."""
    start = stdout.rfind(banner)
    if start < 0:
        return ""
    end = stdout.find("\nTASK [", start + len(banner))
    return stdout[start:end if end >= 0 else None]


LOCK_RELEASE_TASK = "TASK [Give the node's run lock back]"
POSTCHECK_READ_TASK = "TASK [gpuharden.k8s.postcheck : Postcheck | read the node in one node_audit run"


def lock_released_by(stdout):
    """The hosts whose run lock the last play's node_lock task gave back (a compliant node's plan gave it back itself)."""
    output = task_output(stdout, LOCK_RELEASE_TASK)
    return sorted(name for name in NODES if ("ok: [%s]" % name) in output or ("changed: [%s]" % name) in output)


def lock_file(state, name):
    return in_node(state, name, ["cat", "/run/gpuharden/run.lock"]).returncode == 0


def runtime_class_task(stdout):
    return task_output(stdout, RUNTIME_CLASS_TASK)


def device_plugin_task(stdout):
    return task_output(stdout, DEVICE_PLUGIN_TASK)


def left_out(output):
    """The task did not run: not shown, or shown only as skipped."""
    return not output or ("skipping:" in output and "ok:" not in output and "changed:" not in output)


def runtime_class_object(state):
    from kubernetes import client

    api = admin(state)
    try:
        return client.NodeV1Api(api).read_runtime_class("nvidia")
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise
    finally:
        api.close()


def drift(state, *args):
    """`gpuharden drift` over the lab inventory, from this checkout."""
    return subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", state["inventory"], "-q", *args],
                          cwd=realnode.REPO_ROOT, capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(realnode.REPO_ROOT / "ansible.cfg")))


def test_harden_a_fresh_real_fleet_then_the_real_plugin_and_kubelet_advertise_the_nvml_inventory(lab):
    before = node_objects(lab)
    assert handlers(before[C2]) == ["", "runc"]
    assert not gpu_resources(lab, C2) and not gpu_resources(lab, C17)

    done, changed = harden(lab)
    assert done.returncode == 0, done.stdout[-6000:]
    assert changed[C2] > 0 and changed[C17] > 0, changed
    # no RuntimeClass and no plugin yet: the plan's dry runs say so, and the stages create them
    assert "changed: [" in runtime_class_task(done.stdout), runtime_class_task(done.stdout) or done.stdout[-6000:]
    assert "changed: [" in device_plugin_task(done.stdout), device_plugin_task(done.stdout) or done.stdout[-6000:]
    # every node had stages to run, so its plan kept the run lock; the post-check read each node again in one
    # node_audit run, which gave the lock back, so the last play's node_lock task had nothing left to do
    read = task_output(done.stdout, POSTCHECK_READ_TASK)
    assert all("ok: [%s]" % name in read for name in NODES), read or done.stdout[-6000:]
    assert lock_released_by(done.stdout) == [], task_output(done.stdout, LOCK_RELEASE_TASK)
    assert not any(lock_file(lab, name) for name in NODES)

    l4_gpus = len(load_fixture("l4")[1]["gpus"])
    assert gpu_resources(lab, C2) == {"nvidia.com/gpu": str(l4_gpus)}
    assert gpu_resources(lab, C17) == H100_MIG_MIXED
    assert "nvidia" in handlers(node_objects(lab)[C2])
    for name in NODES:
        # the real kubelet restarted on what kubelet_config wrote: its CPU Manager checkpoint names the new policy
        state = json.loads(in_node(lab, name, ["cat", "/var/lib/kubelet/cpu_manager_state"]).stdout)
        assert state["policyName"] == "static", state
        assert in_node(lab, name, ["curl", "-s", "--max-time", "2", "http://127.0.0.1:10248/healthz"]).stdout == "ok"


def test_a_second_harden_changes_nothing_and_drift_is_clean(lab):
    done, changed = harden(lab)
    assert done.returncode == 0, done.stdout[-6000:]
    assert changed == {"localhost": 0, C2: 0, C17: 0}, changed
    # the plan's dry run of the RuntimeClass found nothing to do, so its stage was left out (its module never ran);
    # the first run above ran it, and the repair test below shows it running again when the object drifts
    assert left_out(runtime_class_task(done.stdout)), runtime_class_task(done.stdout)
    assert runtime_class_object(lab).handler == "nvidia"
    # the same for the device plugin stage: its dry run in the plan found the DaemonSet and the labels as they should be
    assert left_out(device_plugin_task(done.stdout)), device_plugin_task(done.stdout)
    # compliant nodes, clean dry runs: each plan's audit gave its lock back (node_audit lock.release_if_compliant),
    # so the last play made no trip for it, and no lock is left behind
    assert lock_released_by(done.stdout) == [], task_output(done.stdout, LOCK_RELEASE_TASK)
    assert left_out(task_output(done.stdout, LOCK_RELEASE_TASK)), task_output(done.stdout, LOCK_RELEASE_TASK)
    assert not any(lock_file(lab, name) for name in NODES)
    report = drift(lab)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "2 clean" in report.stdout, report.stdout


def test_a_plugin_dry_run_that_only_reports_another_installer_still_gives_each_compliant_nodes_lock_back(lab):
    """Another installer's plugin DaemonSet is reported and left alone (never deleted by default), so the plan's dry
    run of the device plugin stage is not clean and the stage runs for its report; but that run changes nothing, and
    touches no node, so each compliant node's plan gives its lock back as on a clean run: no node_lock trip at the end."""
    from kubernetes import client

    namespace, name = "gpu-legacy", "legacy-nvidia-device-plugin"
    legacy = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
              "spec": {"selector": {"matchLabels": {"app": name}},
                       "template": {"metadata": {"labels": {"app": name}},
                                    # no node has the label: the DaemonSet runs no pod, and the product must not touch it
                                    "spec": {"nodeSelector": {"gpuharden.io/legacy": "yes"},
                                             "containers": [{"name": "nvidia-device-plugin-ctr",
                                                             "image": "nvcr.io/nvidia/k8s-device-plugin:v0.14.5"}]}}}}
    api = admin(lab)
    try:
        client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        created = client.AppsV1Api(api).create_namespaced_daemon_set(namespace, legacy)
        done, changed = harden(lab)
        after = client.AppsV1Api(api).read_namespaced_daemon_set(name, namespace)
    finally:
        client.CoreV1Api(api).delete_namespace(namespace)
        api.close()
    assert done.returncode == 0, done.stdout[-6000:]
    assert changed == {"localhost": 0, C2: 0, C17: 0}, changed
    # left alone: the same spec generation, metadata, and no field of it managed by the product (the DaemonSet
    # controller's status updates change its resourceVersion)
    assert after.metadata.generation == created.metadata.generation
    assert (after.metadata.labels, after.metadata.annotations) == (created.metadata.labels, created.metadata.annotations)
    assert not [entry for entry in after.metadata.managed_fields or [] if entry.manager == "gpuharden"]
    # the stage ran, for its report of the other installer
    assert "ok: [" in device_plugin_task(done.stdout), device_plugin_task(done.stdout) or done.stdout[-6000:]
    assert lock_released_by(done.stdout) == [], task_output(done.stdout, LOCK_RELEASE_TASK)
    assert left_out(task_output(done.stdout, LOCK_RELEASE_TASK)), task_output(done.stdout, LOCK_RELEASE_TASK)
    assert not any(lock_file(lab, name) for name in NODES)


def test_the_plugin_without_the_mig_monitor_settings_fails_as_on_a_real_node_and_harden_repairs_it(lab):
    """Under a MIG strategy the product's DaemonSet sets NVIDIA_MIG_MONITOR_DEVICES=all and adds CAP_SYS_ADMIN, as the
    Helm chart does (templates/_helpers.tpl addMigMonitorDevices, requiresCapSysAdmin).  Each one missing fails on a
    real node, and the lab shows both through the real toolkit and the real plugin:
    - without the variable the toolkit gives no mig/monitor capability, and the real plugin gets Insufficient
      Permissions on the MIG node (k8s-device-plugin#399); the L4 node has no MIG and keeps working;
    - with the variable but without CAP_SYS_ADMIN the real toolkit refuses to create the container on every node
      (nvidia-container-toolkit internal/modifier/cdi.go migCapsDevices.Validate: "cannot set
      NVIDIA_MIG_CONFIG_DEVICES or NVIDIA_MIG_MONITOR_DEVICES in a non-privileged container").
    A harden run puts both back."""
    from kubernetes import client

    from tests.integration.cluster_side import admin, wait_for
    from tests.integration.test_real_nodes import DAEMONSET, NAMESPACE, plugin_exited, plugin_log_says, plugin_running, plugin_statuses, restart_plugin_pods

    def patch_container(operations):
        api = admin(lab)
        try:
            apps = client.AppsV1Api(api)
            container = apps.read_namespaced_daemon_set(DAEMONSET, NAMESPACE).spec.template.spec.containers[0]
            apps.patch_namespaced_daemon_set(DAEMONSET, NAMESPACE, operations)
        finally:
            api.close()
        for name in NODES:
            restart_plugin_pods(lab, name)
        return container

    container = patch_container([{"op": "remove", "path": "/spec/template/spec/containers/0/env"}])
    assert container.security_context.capabilities.add == ["SYS_ADMIN"], container.security_context
    assert [(e.name, e.value) for e in container.env] == [("NVIDIA_MIG_MONITOR_DEVICES", "all")], container.env
    wait_for(lambda: plugin_exited(lab, C17), timeout=90, what="the real plugin failing on the MIG node")
    plugin_log_says(lab, C17, "Insufficient Permissions")
    wait_for(lambda: plugin_running(lab, C2), timeout=90, what="the real plugin running on the L4 node")

    patch_container([{"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]},
                     {"op": "remove", "path": "/spec/template/spec/containers/0/securityContext/capabilities/add"}])

    def refused(name):
        return any("non-privileged container" in ((status.state.waiting and status.state.waiting.message) or "")
                   for status in plugin_statuses(lab, name))

    for name in NODES:
        wait_for(lambda name=name: refused(name), timeout=90, what="the real toolkit refusing the plugin's container on %s" % name)

    # the RuntimeClass drifts too (gone): the plan's dry run sees it, and the same run's RuntimeClass stage puts it back
    api = admin(lab)
    try:
        client.NodeV1Api(api).delete_runtime_class("nvidia")
    finally:
        api.close()
    assert runtime_class_object(lab) is None

    done, _changed = harden(lab)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "changed: [" in runtime_class_task(done.stdout), runtime_class_task(done.stdout) or done.stdout[-6000:]
    assert runtime_class_object(lab).handler == "nvidia"
    # the patched DaemonSet: the plan's dry run of the device plugin saw it, and the stage put it back
    assert "changed: [" in device_plugin_task(done.stdout), device_plugin_task(done.stdout) or done.stdout[-6000:]
    # the nodes are compliant, but the plugin's DaemonSet is not: its rollout reaches every node, so each plan kept
    # its node's lock until the last play (the post-check took the plan's audit: no read of its own gave it back)
    assert left_out(task_output(done.stdout, POSTCHECK_READ_TASK)), task_output(done.stdout, POSTCHECK_READ_TASK)
    assert lock_released_by(done.stdout) == sorted(NODES), task_output(done.stdout, LOCK_RELEASE_TASK)
    wait_for(lambda: plugin_running(lab, C17) and gpu_resources(lab, C17) == H100_MIG_MIXED, timeout=120,
             what="the repaired plugin advertising the MIG devices again")


def test_default_drift_reports_an_isolation_breach_from_the_real_kubelets_pod_resources(lab):
    """A 1-GPU pod the real kubelet admitted (its device manager allocated one GPU through the real plugin) whose
    container can open every GPU (NVIDIA_VISIBLE_DEVICES=all: the toolkit injects them all): the default drift run reads
    the allocation from the kubelet's pod-resources API and reports isolation_breach."""
    from gpuharden_lab import workloads
    from kubernetes import client

    from tests.integration.cluster_side import admin

    nodes = {node.name: node for node in manager.nodes_from_state(lab)}
    api = admin(lab)
    try:
        placed = workloads.place(api, {C2: nodes[C2]}, [{"name": "greedy", "node": C2, "gpus": 1, "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}])
        pod = client.CoreV1Api(api).read_namespaced_pod("greedy", "default")
    finally:
        api.close()
    assert len(placed[0].gpu_minors) == 1 and len(placed[0].visible_minors) == 2, placed
    assert pod.spec.node_name == C2
    report = drift(lab, "--json")
    assert report.returncode == 1, report.stdout[-3000:] + report.stderr[-3000:]
    findings = json.loads(report.stdout)["nodes"][C2]["findings"]
    breaches = [f for f in findings if f["id"] == "isolation_breach"]
    assert breaches, json.dumps(findings, indent=1)[-4000:]
    audit = next(f for f in findings if f["id"] == "isolation_breach")
    assert "greedy" in json.dumps(audit), audit


def test_a_pod_that_asks_the_nvidia_runtime_for_every_gpu_gets_them_and_drift_reports_it(lab):
    """The isolation bypass the mission names, with real software: a pod on RuntimeClass nvidia that requests no GPU
    but sets NVIDIA_VISIBLE_DEVICES=all.  The real toolkit honours the variable in an unprivileged container (its
    default accept-nvidia-visible-devices-envvar-when-unprivileged = true), so the container gets every GPU's device
    node; the default drift run reports the pod as visible_devices_without_request.  (The kernel's view of the
    container, its v1 devices cgroup, is mounted only in the lab's kubelet and containerd wrappers here, so this test
    reads the container's /dev.)"""
    from kubernetes import client

    from tests.integration.cluster_side import admin, wait_for
    from tests.integration.test_real_nodes import gpus_in_the_toolkits_all_device

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky", "namespace": "default"},
           "spec": {"nodeName": C2, "runtimeClassName": "nvidia", "containers": [{
               "name": "sneaky", "image": realnode.sandbox_image_name(in_node(lab, C2, ["cat", "/etc/containerd/config.toml"]).stdout),
               "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    api = admin(lab)
    try:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", pod)

        def running():
            statuses = core.read_namespaced_pod("sneaky", "default").status.container_statuses or []
            return statuses[0] if statuses and statuses[0].state.running else None

        status = wait_for(running, timeout=90, what="the sneaky pod running")
        task = next(line.split() for line in in_node(lab, C2, ["ctr", "--namespace", "k8s.io", "tasks", "list"]).stdout.splitlines()
                    if line.startswith(status.container_id.split("//", 1)[1]))
        devices = sorted("/dev/" + name for name in in_node(lab, C2, ["ls", "/proc/%s/root/dev" % task[1]]).stdout.split()
                         if name.startswith("nvidia") and name[len("nvidia"):].isdigit())
        assert devices == gpus_in_the_toolkits_all_device(lab, C2) and len(devices) == len(load_fixture("l4")[1]["gpus"]), devices

        report = drift(lab, "--json")
        assert report.returncode == 1, report.stdout[-3000:] + report.stderr[-3000:]
        findings = json.loads(report.stdout)["nodes"][C2]["findings"]
        sneaky = [f for f in findings if f["id"] == "visible_devices_without_request" and (f.get("pod") or {}).get("name") == "sneaky"]
        assert sneaky and sneaky[0]["found"] == {"containers": {"sneaky": "all"}}, json.dumps(findings, indent=1)[-4000:]
    finally:
        try:
            client.CoreV1Api(api).delete_namespaced_pod("sneaky", "default", grace_period_seconds=0)
        finally:
            api.close()

