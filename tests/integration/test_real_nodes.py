# SPDX-License-Identifier: GPL-3.0-or-later
"""The real-nodes lab: the real kubelet v1.36 and the real containerd 2.x / 1.7 judge what the product writes.

Both nodes start as fresh installs leave them (`containerd config default`, no nvidia runtime, the kubelet's manager
defaults) and their kubelets register the Nodes themselves with node credentials.  What each test asserts comes from
the real daemons: the Node object the kubelet keeps, the runtime handlers containerd reports through the kubelet,
`ctr` answering on the socket, the kubelet refusing to start.  Skipped where `make real-components` has not built them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpuharden_lab import layout, manager, realnode
from gpuharden_lab.node import run_in
from kubernetes import client

from tests.builds import skip_unbuilt
from tests.integration.cluster_side import admin, failures, module_args, run, wait_for
from tests.labfixtures import running_lab

# real_nodes: they need `make real-components` (which `make integration` builds first); `make real-nodes` runs only these.
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

C2, C17 = "real-c2-0", "real-c17-0"
NODES = (C2, C17)


def real_nodes_lab():
    """The real-nodes lab for one test module; the module is skipped where the real binaries are not built."""
    if not realnode.available():
        skip_unbuilt("the real kubelet and containerd are not built: run `make real-lab` (or `make real-components`)")
    with running_lab("real-nodes") as state:
        yield state


@pytest.fixture(scope="module")
def lab():
    yield from real_nodes_lab()


def node_objects(state) -> dict[str, dict]:
    api = admin(state)
    try:
        items = client.CoreV1Api(api).list_node().items
        return {item.metadata.name: api.sanitize_for_serialization(item) for item in items}
    finally:
        api.close()


def handlers(node: dict) -> list[str]:
    return sorted(entry.get("name", "") for entry in (node.get("status") or {}).get("runtimeHandlers") or [])


def in_node(state, name, argv, **kwargs):
    node = next(node for node in manager.nodes_from_state(state) if node.name == name)
    return run_in(node, argv, check=False, **kwargs)


def runtime_class_check(state) -> dict:
    found, _stats, _seconds = run(state, module="gpuharden.k8s.runtime_class",
                                  args=module_args(kubeconfig=state["cluster"]["admin_kubeconfig"], handler="nvidia"), check=True)
    assert not failures(found), failures(found)
    return found[0]


def test_real_kubelets_register_their_nodes_with_node_identity(lab):
    nodes = node_objects(lab)
    for name, release in ((C2, realnode.containerd_version("2")), (C17, realnode.containerd_version("1.7"))):
        node = nodes[name]
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == realnode.versions()["K8S_VERSION"]
        assert info["containerRuntimeVersion"] == "containerd://" + release.lstrip("v")
        assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", conditions
        managers = {entry["manager"] for entry in node["metadata"].get("managedFields") or []}
        assert "kubelet" in managers, managers
        # a fresh node: no device plugin ran, so no GPU resources at all
        assert not [key for key in node["status"]["allocatable"] if key.startswith("nvidia.com/")], node["status"]["allocatable"]


def test_fresh_containerd_has_no_nvidia_handler_and_the_runtime_class_check_says_so(lab):
    nodes = node_objects(lab)
    # containerd 2.x reports every configured runtime, the default one also as "" (internal/cri/server/service.go
    # introspectRuntimeHandler); containerd 1.7 reports none, so its Node carries no runtimeHandlers at all.
    assert handlers(nodes[C2]) == ["", "runc"], nodes[C2]["status"].get("runtimeHandlers")
    assert handlers(nodes[C17]) == []
    result = runtime_class_check(lab)
    missing = [f for f in result["findings"] if f["id"] == "runtime_class_handler_missing_on_node"]
    assert [f["subject"] for f in missing] == ["Node %s" % C2], result["findings"]
    assert missing[0]["found"] == ["", "runc"]
    assert C17 in result["node_runtime_handlers"]["without_runtime_handlers"], result["node_runtime_handlers"]


def test_the_plugin_is_not_rolled_out_onto_a_node_whose_containerd_lacks_the_handler(lab, tmp_path):
    """Found when the seed-failures GPU nodes ran the real kubelet and containerd: the managed DaemonSet's pod on a node
    without the nvidia runtime stays in ContainerCreating (FailedCreatePodSandBox), and the rollout wait failed after
    300 s.  The module now reads the Nodes' runtime handlers first and applies nothing; a 1.7 node, which reports none,
    is not held against it."""
    variables = {"dp_test_results": str(tmp_path), "device_plugin_version": PLUGIN_VERSION, "device_plugin_wait": False,
                 "gpuharden_kubeconfig": lab["cluster"]["admin_kubeconfig"]}
    _found, _stats, _seconds = run(lab, playbook="device_plugin.yml", extravars=variables)
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["ok"] and "device plugin" in result["task"].lower(), result
    assert "no runtime handler nvidia (RuntimeClass nvidia): %s." % C2 in result["msg"], result["msg"]
    assert C17 not in result["msg"]
    missing = [f for f in result["failed_result"]["findings"] if f["id"] == "runtime_class_handler_missing_on_node"]
    assert [f["subject"] for f in missing] == ["Node %s" % C2]
    api = admin(lab)
    try:
        names = [ds.metadata.name for ds in client.AppsV1Api(api).list_namespaced_daemon_set(NAMESPACE).items]
    finally:
        api.close()
    assert DAEMONSET not in names


def test_pods_run_on_the_real_nodes_through_containerd_and_runc(lab):
    """A pod on each real node: the kubelet asks containerd's CRI for a sandbox (the sandbox image the lab built
    locally, under the name the node's containerd config gives it, on the lab's CNI network) and a container, runc
    starts both, and the Pod's status is the kubelet's own.  Its cgroups nest under the node's in every hierarchy, so
    they go with the lab."""
    api = admin(lab)
    core = client.CoreV1Api(api)
    names = {}
    try:
        for name in NODES:
            image = realnode.sandbox_image_name(in_node(lab, name, ["cat", "/etc/containerd/config.toml"]).stdout)
            names[name] = "probe-" + name
            core.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": names[name]},
                "spec": {"nodeName": name, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5,
                         "containers": [{"name": "probe", "image": image, "imagePullPolicy": "Never", "command": ["/pause"]}]}})

        def running(pod_name):
            pod = core.read_namespaced_pod(pod_name, "default")
            statuses = pod.status.container_statuses or []
            return pod if pod.status.phase == "Running" and statuses and statuses[0].state.running else None

        for name, pod_name in names.items():
            pod = wait_for(lambda pod_name=pod_name: running(pod_name), timeout=90, what="pod %s Running" % pod_name)
            container_id = pod.status.container_statuses[0].container_id
            assert container_id.startswith("containerd://"), container_id
            assert pod.status.pod_ip.startswith("10.244.0."), pod.status.pod_ip  # host-local's range in the lab's conflist
            tasks = in_node(lab, name, ["ctr", "--namespace", "k8s.io", "tasks", "list"])
            line = next((row for row in tasks.stdout.splitlines() if row.startswith(container_id.removeprefix("containerd://"))), "")
            assert line.split()[-1:] == ["RUNNING"], tasks.stdout
            pid = int(line.split()[1])
            cgroups = Path("/proc/%d/cgroup" % pid).read_text()
            node_cgroup = "/%s/nodes/%s/" % (layout.CGROUP_ROOT_NAME, name)
            assert all(node_cgroup in row for row in cgroups.splitlines() if ":memory:" in row or ":devices:" in row or row.startswith("0::")), cgroups
    finally:
        for pod_name in names.values():
            core.delete_namespaced_pod(pod_name, "default")
        try:
            wait_for(lambda: not [pod for pod in core.list_namespaced_pod("default").items if pod.metadata.name in names.values()],
                     timeout=90, what="the probe pods gone")
        finally:
            api.close()


def test_container_runtime_role_output_is_loaded_by_the_real_daemons(lab):
    found, stats, _seconds = run(lab, playbook="container_runtime.yml")
    assert not failures(found), failures(found)
    assert all(stats["changed"].get(name, 0) >= 1 for name in NODES), stats
    for name, release in ((C2, "2"), (C17, "1.7")):
        assert in_node(lab, name, ["systemctl", "is-active", "containerd"]).stdout.strip() == "active"
        version = in_node(lab, name, ["ctr", "--address", "/run/containerd/containerd.sock", "--timeout", "5s", "version"])
        assert version.returncode == 0, version.stderr
        assert realnode.containerd_version(release).lstrip("v") in version.stdout
    # the kubelet re-reads the CRI status every 5 s and posts it with the node status (10 s by default)
    wait_for(lambda: "nvidia" in handlers(node_objects(lab)[C2]), timeout=60, what="nvidia in %s runtimeHandlers" % C2)
    result = runtime_class_check(lab)
    assert not [f for f in result["findings"] if f["id"] == "runtime_class_handler_missing_on_node"], result["findings"]
    again, stats, _seconds = run(lab, playbook="container_runtime.yml")
    assert not failures(again), failures(again)
    assert all(stats["changed"].get(name, 0) == 0 for name in NODES), stats


def test_stale_cpu_manager_checkpoint_stops_the_real_kubelet_and_the_role_brings_it_back(lab):
    # The checkpoint a static CPU Manager left, under a kubelet whose config says none: the real kubelet refuses to
    # start (pkg/kubelet/cm/cpumanager/state/state_checkpoint.go "configured policy ... differs from state checkpoint").
    checkpoint = json.dumps({"policyName": "static", "defaultCpuSet": "0-1", "checksum": 1})
    node = next(node for node in manager.nodes_from_state(lab) if node.name == C2)
    node.write_live("/var/lib/kubelet/cpu_manager_state", checkpoint)
    assert in_node(lab, C2, ["systemctl", "restart", "kubelet"]).returncode == 0

    def refused():
        log = in_node(lab, C2, ["cat", "/var/log/kubelet.log"]).stdout
        return "could not restore state from checkpoint" in log or "differs from state checkpoint" in log

    wait_for(refused, timeout=60, what="the real kubelet refusing the stale checkpoint")
    healthz = in_node(lab, C2, ["curl", "-s", "--max-time", "2", "http://127.0.0.1:10248/healthz"])
    assert healthz.stdout != "ok"

    found, stats, _seconds = run(lab, playbook="kubelet_topology.yml", extravars={"kubelet_topology_cpu_manager_policy": "none"})
    assert not failures(found), failures(found)

    def healthy():
        done = in_node(lab, C2, ["curl", "-s", "--max-time", "2", "http://127.0.0.1:10248/healthz"])
        return done.stdout == "ok"

    wait_for(healthy, timeout=90, what="the real kubelet healthy again")
    time.sleep(1)
    assert in_node(lab, C2, ["systemctl", "is-active", "kubelet"]).stdout.strip() == "active"


def test_reserved_cpus_the_real_kubelet_would_refuse_are_refused_before_the_node_is_touched(lab):
    """Measured before the planner knew: the real kubelet v1.36.3 exits with "reserved-cpus: 0-7 is not a subset of
    online-cpus: 0-1", and the role's rollback had to restore the node after up to 120 s without a kubelet."""
    config_before = in_node(lab, C2, ["cat", "/var/lib/kubelet/config.yaml"]).stdout
    pid_before = in_node(lab, C2, ["systemctl", "show", "-p", "MainPID", "--value", "kubelet"]).stdout.strip()
    assert pid_before.isdigit() and int(pid_before) > 0, pid_before
    found, _stats, _seconds = run(lab, playbook="kubelet_topology.yml", extravars={"kubelet_topology_reserved_system_cpus": "0-7"})
    refused = [r for r in found if r["_event"] == "runner_on_failed" and r["_host"] == C2]
    assert refused and "not a subset of" in refused[0]["msg"] and "0-7" in refused[0]["msg"], failures(found)
    assert in_node(lab, C2, ["cat", "/var/lib/kubelet/config.yaml"]).stdout == config_before
    assert in_node(lab, C2, ["systemctl", "show", "-p", "MainPID", "--value", "kubelet"]).stdout.strip() == pid_before
    assert in_node(lab, C2, ["curl", "-s", "--max-time", "2", "http://127.0.0.1:10248/healthz"]).stdout == "ok"


# ---------------------------------------------------------------------------------------------
# The real NVIDIA device plugin in the DaemonSet's pods: a real container (kubelet -> containerd -> the nvidia runtime,
# i.e. the real NVIDIA container toolkit -> runc), from the image the lab imported.  It registers with the real kubelet,
# which alone decides the Node's nvidia.com/* capacity and allocatable.

PLUGIN_VERSION = realnode.versions()["NVIDIA_DEVICE_PLUGIN_VERSION"]
NAMESPACE, DAEMONSET = "kube-system", "nvidia-device-plugin-daemonset"
PLUGIN_CONTAINER, PLUGIN_LABEL = "nvidia-device-plugin-ctr", "app.kubernetes.io/name=nvidia-device-plugin"


def gpu_resources(state, name, field="allocatable") -> dict[str, str]:
    return {key: value for key, value in node_objects(state)[name]["status"][field].items() if key.startswith("nvidia.com/")}


def plugin_log(state, name) -> str:
    """The plugin containers' output on the node, as the kubelet keeps it (/var/log/pods, written by containerd)."""
    done = in_node(state, name, ["sh", "-c", "cat /var/log/pods/%s_%s-*/%s/*.log 2>/dev/null" % (NAMESPACE, DAEMONSET, PLUGIN_CONTAINER)])
    return done.stdout


def plugin_log_says(state, name, *texts, timeout=60):
    """The plugin's log on the node once it holds one of ``texts``.  The container's exit (the kubelet's status, from the
    API) and its log (a file on the node) are read apart: a fresh-clone run under load saw the exit with the log still
    empty, so the log gets its own wait; a log that never says it fails with its tail."""
    log = ""

    def says():
        nonlocal log
        log = plugin_log(state, name)
        return any(text in log for text in texts)

    try:
        wait_for(says, timeout=timeout, interval=2, what="the plugin's log on %s to say %s" % (name, " or ".join(map(repr, texts))))
    except AssertionError as error:
        raise AssertionError("%s; its log ends: %s" % (error, log[-2000:])) from None
    return log


def plugin_statuses(state, node_name) -> list:
    """The plugin container's statuses, as the real kubelet reports them, in the node's live (not terminating) pods."""
    api = admin(state)
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, field_selector="spec.nodeName=%s" % node_name,
                                                         label_selector=PLUGIN_LABEL).items
    finally:
        api.close()
    return [status for pod in pods if pod.metadata.deletion_timestamp is None
            for status in pod.status.container_statuses or [] if status.name == PLUGIN_CONTAINER]


def plugin_exited(state, node_name) -> bool:
    return any(status.restart_count > 0 or status.state.terminated is not None or status.last_state.terminated is not None
               for status in plugin_statuses(state, node_name))


def plugin_mounts(state, node_name) -> str:
    """The mount table of each running plugin container's process, found through containerd (ctr) by the container
    ID the kubelet reports."""
    tables = []
    for status in plugin_statuses(state, node_name):
        if status.state.running is None or not (status.container_id or "").startswith("containerd://"):
            continue
        tasks = in_node(state, node_name, ["ctr", "--namespace", "k8s.io", "tasks", "list"]).stdout.splitlines()
        pid = next((line.split()[1] for line in tasks if line.split()[:1] == [status.container_id.split("//", 1)[1]]), None)
        if pid is not None:
            tables.append(in_node(state, node_name, ["cat", "/proc/%s/mountinfo" % pid]).stdout)
    return "\n".join(tables)


def plugin_running(state, node_name) -> bool:
    statuses = plugin_statuses(state, node_name)
    return bool(statuses) and all(status.state.running is not None and status.restart_count == 0 for status in statuses)


def nvml_gpu_count(fixture: str) -> int:
    from gpuharden_lab.noderoot import load_fixture

    return len(load_fixture(fixture)[1]["gpus"])


def gpus_in_the_toolkits_all_device(state, name) -> list[str]:
    """The GPU device nodes the real toolkit injects for NVIDIA_VISIBLE_DEVICES=all on the node: its CDI spec's `all`
    device, generated by the node's nvidia-ctk from the node's NVML, as jit-cdi does for each container."""
    done = in_node(state, name, ["nvidia-ctk", "cdi", "generate", "--format=json"])
    assert done.returncode == 0, done.stderr[-2000:]
    device = next(entry for entry in json.loads(done.stdout)["devices"] if entry["name"] == "all")
    return sorted({node["path"] for node in device["containerEdits"]["deviceNodes"] if node["path"][len("/dev/nvidia"):].isdigit()})


def install_plugin(state, tmp_path, **extra):
    variables = {"dp_test_results": str(tmp_path), "device_plugin_version": PLUGIN_VERSION, "device_plugin_wait": False,
                 "gpuharden_kubeconfig": state["cluster"]["admin_kubeconfig"], **extra}
    found, _stats, _seconds = run(state, playbook="device_plugin.yml", extravars=variables)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"], result
    return found


def test_the_plugin_daemonset_registers_the_real_plugin_with_the_real_kubelet(lab, tmp_path):
    """After the container_runtime test: containerd has the nvidia runtime, the DaemonSet names RuntimeClass nvidia."""
    install_plugin(lab, tmp_path)
    l4 = nvml_gpu_count("l4")
    wait_for(lambda: gpu_resources(lab, C2) == {"nvidia.com/gpu": str(l4)}, timeout=90,
             what="nvidia.com/gpu %d on %s from the real plugin" % (l4, C2))
    # MIG enabled under migStrategy none: the real plugin advertises whole GPUs, no MIG devices, and only those the
    # real toolkit gave its container.  The toolkit's CDI `all` device leaves out the full-GPU spec of every
    # MIG-enabled GPU (nvidia-container-toolkit pkg/nvcdi/lib-nvml.go getDeviceSpecGeneratorsForAllDevices) and
    # reaches GPUs 0 and 1 only through their MIG devices, so GPU 2 (MIG on, no instances) is not in the container.
    visible = gpus_in_the_toolkits_all_device(lab, C17)
    assert visible == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"], visible
    assert nvml_gpu_count("h100-mig-enabled") == 4
    wait_for(lambda: gpu_resources(lab, C17) == {"nvidia.com/gpu": str(len(visible))}, timeout=90,
             what="nvidia.com/gpu %d and no mig-* on %s" % (len(visible), C17))
    for name in NODES:
        log = plugin_log(lab, name)
        assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log[-3000:]
        assert plugin_running(lab, name), plugin_statuses(lab, name)
        # the container the kubelet runs is containerd's, through the nvidia runtime: the real toolkit mounted the
        # driver's NVML library into it
        assert "libnvidia-ml.so." in plugin_mounts(lab, name), plugin_mounts(lab, name)[-2000:]


def test_an_xid_on_one_gpu_takes_it_out_of_the_real_kubelets_allocatable_and_drift_reports_it(lab, tmp_path):
    l4 = nvml_gpu_count("l4")
    wait_for(lambda: gpu_resources(lab, C2) == {"nvidia.com/gpu": str(l4)}, timeout=60, what="the plugin registered")
    ctl = str(realnode.REPO_ROOT / "tests/fakes/nvml/nvml_double_ctl.py")
    done = in_node(lab, C2, ["python3", ctl, "inject-xid", "--gpu", "0", "--xid", "79"])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: gpu_resources(lab, C2) == {"nvidia.com/gpu": str(l4 - 1)}, timeout=90, what="allocatable down by one")
    assert gpu_resources(lab, C2, "capacity") == {"nvidia.com/gpu": str(l4)}
    plugin_log_says(lab, C2, "XidCriticalError", "Xid")
    # and a default drift run reports it: NVML has l4 GPUs, the kubelet allocates one fewer
    report_path = tmp_path / "drift.json"
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", lab["inventory"], "-q", "--report", str(report_path)],
                          cwd=realnode.REPO_ROOT, capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(realnode.REPO_ROOT / "ansible.cfg")))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    ids = {f["id"] for f in report["nodes"][C2]["findings"]}
    assert "gpu_partially_advertised" in ids, json.dumps(report["nodes"][C2], indent=1)[-3000:]


def restart_plugin_pods(state, node_name):
    api = admin(state)
    try:
        client.CoreV1Api(api).delete_collection_namespaced_pod(NAMESPACE, field_selector="spec.nodeName=%s" % node_name,
                                                               label_selector="app.kubernetes.io/name=nvidia-device-plugin")
    finally:
        api.close()


def test_device_list_strategy_none_stops_the_real_plugin_and_the_role_repairs_it(lab, tmp_path):
    api = admin(lab)
    try:
        core = client.CoreV1Api(api)
        config_map = core.read_namespaced_config_map("nvidia-device-plugin-config", NAMESPACE)
        text = config_map.data["config.yaml"]
        assert "deviceListStrategy: envvar" in text, text
        core.patch_namespaced_config_map("nvidia-device-plugin-config", NAMESPACE,
                                         {"data": {"config.yaml": text.replace("deviceListStrategy: envvar", "deviceListStrategy: none")}})
    finally:
        api.close()
    restart_plugin_pods(lab, C2)
    wait_for(lambda: plugin_exited(lab, C2), timeout=90, what="the real plugin exiting")
    plugin_log_says(lab, C2, "invalid --device-list-strategy option")
    # the role puts the ConfigMap back, and the pod template's config checksum rolls the pods
    install_plugin(lab, tmp_path)
    l4 = nvml_gpu_count("l4")
    wait_for(lambda: gpu_resources(lab, C2) == {"nvidia.com/gpu": str(l4)}, timeout=120, what="the repaired plugin registered again")


def test_a_plugin_pod_without_the_nvidia_runtime_gets_no_nvml_and_fails_as_on_a_real_node(lab):
    """The DaemonSet as the product deployed it before issue 13 (no runtimeClassName; containerd's default is runc)."""
    api = admin(lab)
    try:
        apps = client.AppsV1Api(api)
        apps.patch_namespaced_daemon_set(DAEMONSET, NAMESPACE, [{"op": "remove", "path": "/spec/template/spec/runtimeClassName"}])
    finally:
        api.close()
    restart_plugin_pods(lab, C2)
    wait_for(lambda: plugin_exited(lab, C2), timeout=90, what="the real plugin failing without NVML")
    log = plugin_log(lab, C2).lower()
    assert "incompatible strategy detected" in log or "failed to initialize nvml" in log or "could not load nvml" in log, log[-2000:]


def ready_status(state, name) -> str:
    conditions = (node_objects(state)[name].get("status") or {}).get("conditions") or []
    return next((c.get("status") for c in conditions if c.get("type") == "Ready"), "absent")


def budget(state, **options):
    args = module_args(kubeconfig=state["cluster"]["admin_kubeconfig"], max_unavailable=1, fleet=list(NODES), batch=[C17], **options)
    found, _stats, _seconds = run(state, module="gpuharden.k8s.disruption_budget", args=args)
    assert not failures(found), failures(found)
    return found[0]


def test_the_budget_gives_a_node_whose_containerd_this_run_restarted_time_to_be_ready_again(lab):
    """Found in a first harden of the seed-failures fleet: seed-no-runtime's containerd restart (the container_runtime
    stage) left its Node NotReady when the rollout read the budget, so two disruptive steps were not started and the
    plugin rollout then waited 300 s.  The real kubelet posts Ready=False once it finds its runtime down, and Ready=True
    at a later status sync once containerd is back; harden's budget read waits for the nodes it restarted."""
    assert in_node(lab, C2, ["systemctl", "stop", "containerd"]).returncode == 0
    try:
        wait_for(lambda: ready_status(lab, C2) == "False", timeout=90, interval=2, what="the real kubelet posting %s NotReady" % C2)
        # counted as it is, the stopped runtime's node takes the one slot: C17's step would not start
        now = budget(lab, settle_nodes=[C2], settle_seconds=0)
        assert now["allowed"] == [] and C17 in now["deferred"] and now["settle"]["not_ready"].keys() == {C2}, now
    finally:
        assert in_node(lab, C2, ["systemctl", "start", "containerd"]).returncode == 0
    settled = budget(lab, settle_nodes=[C2], settle_seconds=120)
    assert settled["allowed"] == [C17] and settled["unavailable"] == [] and settled["settle"]["not_ready"] == {}, settled
    assert settled["settle"]["seconds"] < 120
    assert ready_status(lab, C2) == "True"
