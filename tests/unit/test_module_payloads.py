# SPDX-License-Identifier: GPL-3.0-or-later
"""Node-side modules ship no controller-side code (issue 15, item 3).

A module that runs on the GPU node over SSH carries, in its AnsiballZ payload, every module_util it imports,
directly or not.  Controller-side code there is dead weight on every node trip, and worse, a node module that
imports the Kubernetes client adapter needs the ``kubernetes`` package on the node.  The payloads come from
ansible-core's own builder (tests/unit/ansiballz_payloads.py), run in a separate process.

Where a module runs was read off the playbooks and roles: the controller-side ones run with
``delegate_to: localhost`` (nearly always ``run_once``) and ``ansible_python_interpreter`` set to the
controller's Python; the node-side ones run on the play's hosts.  No module runs in both places.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from gpuharden_lab import REPO_ROOT

# Module -> where it runs (playbook or role task that calls it).
NODE_SIDE = {
    "cgroup_memory": "roles/cgroup_limits (immediate.yml, preflight.yml, through cgroup_limits_immediate) on each node",
    "containerd_nvidia_runtime": "roles/container_runtime on each node",
    "device_cgroup_audit": "roles/postcheck on each node (reads the node's cgroups and BPF programs)",
    "gpu_facts": "pre_tasks of bootstrap, audit_node, roles/kubelet_topology plan.yml, on each node",
    "kubelet_config": "roles/kubelet_topology, roles/postcheck on each node",
    "mig_layout": "roles/mig on each node",
    "node_audit": "drift_check and harden's plan on each node (every node-side check in one run; harden's also takes "
                  "the run lock and the GPU facts), roles/postcheck's one read of a node (NVML, device cgroups, kubelet)",
    "node_lock": "harden/bootstrap/unharden/drift on each node (the lock file lives on the node)",
    "node_venv": "roles/node_prerequisites (bootstrap's first step) on each node, with the node's system Python",
    "nvidia_device_nodes": "roles/device_permissions (through device_permissions_repair) on each node",
    "nvml_check": "roles/postcheck on each node",
    "process_cgroup_info": "roles/postcheck on each node (/proc/<pid>/cgroup of the GPU processes)",
    "unharden_files": "unharden_gpu_nodes and tasks/unharden_kubelet_drained.yml on each node",
}
CONTROLLER_SIDE = {
    "check_variables": "action plugin on the controller; the module file is documentation only, no payload",
    "cgroup_limits_immediate": "action plugin (roles/cgroup_limits immediate.yml, preflight.yml): runs cgroup_memory on the node and "
                               "gpu_pods_info delegated to localhost; documentation only",
    "device_permissions_repair": "action plugin (roles/device_permissions main.yml): runs nvidia_device_nodes on the node; documentation only",
    "kubelet_topology_plan": "action plugin (roles/kubelet_topology plan.yml, admission.yml): runs kubelet_config on the node; documentation only",
    "kubelet_topology_apply": "action plugin (roles/kubelet_topology apply.yml): runs kubelet_config and kubectl wait on the node; documentation only",
    "mig_plan": "action plugin (roles/mig plan.yml): runs mig_layout on the node; documentation only",
    "mig_stage": "action plugin (roles/mig apply.yml): runs mig_layout and the reset command on the node; documentation only",
    "node_maintenance_step": "action plugin (roles/node_maintenance task files): runs node_maintenance delegated to localhost; documentation only",
    "node_stages": "action plugin on the controller (the stage engine); the module file is documentation only, no payload",
    "bootstrap_node": "action plugin of bootstrap_gpu_node.yml: runs gpu_facts and setup on each node, the stage engine node_stages, gpu_node_labels and "
                      "node_maintenance delegated to localhost; the module file is documentation only, no payload",
    "container_runtime_stage": "action plugin (roles/container_runtime main.yml): runs stat and containerd_nvidia_runtime "
                               "on the node; documentation only",
    "container_runtime_wave": "action plugin (tasks/stage_container_runtime.yml): harden_rollout's wave step, run_once, runs "
                              "disruption_budget delegated to localhost; documentation only",
    "runtime_class_stage": "action plugin (roles/runtime_class main.yml, run_once): runs runtime_class delegated to localhost; documentation only",
    "cluster_stage_gate": "action plugin on the controller (the stage engine's play-wide gate); the module file is documentation only, no payload",
    "drift_play": "action plugin on the controller (drift_check.yml's start, cluster side and verdict: runs gpu_consistency and runtime_class "
                  "delegated to localhost); the module file is documentation only, no payload",
    "harden_rollout": "action plugin on the controller (harden_gpu_nodes, run_once, runs disruption_budget); the module file is documentation only",
    "harden_node": "action plugin of harden_gpu_nodes: runs node_lock on each node where it gives the lock back; the module file is documentation only",
    "node_plan_pods": "action plugin on the controller (tasks/node_plan_inputs.yml, run_once, runs gpu_pods_info); the module file is documentation only",
    "node_maintenance_budget": "action plugin on the controller (roles/node_maintenance budget.yml, run_once, runs disruption_budget); documentation only",
    "node_prerequisites": "action plugin (roles/node_prerequisites): copies the wheels and runs node_venv on the node; documentation only",
    "role_preflight": "action plugin on the controller (each role's tasks/preflight.yml); the module file is documentation only, no payload",
    "stage_steps": "action plugin on the controller (playbooks/tasks/stages.yml: which steps run on a host); the module file is documentation only, no payload",
    "postcheck_step": "action plugin of roles/postcheck: runs the node modules above on each node and the controller ones "
                      "delegated to localhost; the module file is documentation only, no payload",
    "device_plugin_stage": "action plugin of roles/device_plugin: runs stat on each node and device_plugin delegated to localhost "
                           "(run_once); the module file is documentation only, no payload",
    "device_plugin": "roles/device_plugin through its device_plugin_stage action (with the node labels: its node_labels option), "
                     "delegate_to localhost, run_once",
    "disruption_budget": "roles/node_maintenance budget.yml, harden/unharden, delegate_to localhost, run_once",
    "gpu_consistency": "roles/postcheck (run_once, with every node's topology check), drift_check (its drift_play action), delegate_to localhost",
    "gpu_node_labels": "bootstrap (the bootstrap taint), standalone use, delegate_to localhost (run_once)",
    "gpu_pods_info": "harden's plan (node_plan_pods), roles/cgroup_limits immediate.yml, drift_check, delegate_to localhost, run_once",
    "gpu_workloads_info": "roles/postcheck without the consistency check (run_once), roles/kubelet_topology "
                          "plan.yml (the batch's first host whose policy tightens), delegate_to localhost",
    "node_maintenance": "roles/node_maintenance (cordon, drain, uncordon), bootstrap, delegate_to localhost",
    "runtime_class": "roles/runtime_class (its runtime_class_stage action), drift_check (its drift_play action), delegate_to localhost, run_once",
    "topology_check": "roles/kubelet_topology plan.yml, roles/postcheck (without workloads), delegate_to localhost "
                      "per node: it weighs the workloads gpu_workloads_info or gpu_consistency listed on the controller",
    "unharden_cluster": "unharden_gpu_nodes, delegate_to localhost, run_once",
    "unharden_report": "action plugin on the controller (unharden_gpu_nodes' report); the module file is documentation only",
    "unharden_node": "action plugin of unharden_gpu_nodes: runs node_lock on each node and unharden_cluster delegated to localhost; "
                     "the module file is documentation only",
    "unharden_rollout": "action plugin on the controller (unharden_gpu_nodes, run_once, runs disruption_budget); the module "
                        "file is documentation only",
}
# The module files of action plugins that run no module of their own name.
DOCUMENTATION_ONLY = {"bootstrap_node", "cgroup_limits_immediate", "check_variables", "cluster_stage_gate",
                      "container_runtime_stage", "container_runtime_wave", "device_permissions_repair",
                      "device_plugin_stage", "drift_play", "harden_node", "harden_rollout", "kubelet_topology_apply",
                      "kubelet_topology_plan", "mig_plan", "mig_stage", "node_maintenance_budget",
                      "node_maintenance_step", "node_plan_pods", "node_prerequisites", "node_stages",
                      "postcheck_step", "role_preflight", "runtime_class_stage", "stage_steps", "unharden_node",
                      "unharden_report", "unharden_rollout"}

# module_utils is laid out by layer (plugins/module_utils/<layer>/), so where code runs is where it lives.  No node-side
# payload may contain a file of a controller layer; the node layers import nothing of them (test_layers_import_downwards).
CONTROLLER_LAYERS = {
    "k8s": "the Kubernetes client adapter and the one request path (LIST, apply, RBAC-aware errors)",
    "cluster": "planners over API objects of the whole play: consistency, workloads, topology admission, drain, "
               "disruption budget, labels, RuntimeClass, device plugin, uninstall",
}
NODE_LAYERS = ("core", "nvml", "bpf", "node", "audit")
# What each layer may import: a layer below it, never one beside or above.
# The node planners are pure; the nvml and bpf adapters feed them what they read (nvml/_mig_nvml -> node/_mig,
# bpf/_device_audit_node -> node/_podresources, _cgroup_paths).
MAY_IMPORT = {
    "core": {"core"},
    "node": {"core", "node"},
    "nvml": {"core", "nvml", "node"},
    "bpf": {"core", "bpf", "node"},
    "audit": {"core", "nvml", "bpf", "node", "audit"},
    "k8s": {"core", "k8s"},
    "cluster": {"core", "k8s", "node", "nvml", "cluster"},
}


def _layer(name):
    return name.split("/", 1)[0] if "/" in name else None


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    """{module: description} from ansiballz_payloads, in its own process (it installs Ansible's collection loader)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path_factory.mktemp("ansible-local")))
    completed = subprocess.run([sys.executable, "-m", "tests.unit.ansiballz_payloads"], cwd=REPO_ROOT, env=env,
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_every_module_is_classified(payloads):
    assert not set(NODE_SIDE) & set(CONTROLLER_SIDE)
    assert set(payloads) == set(NODE_SIDE) | set(CONTROLLER_SIDE)


def test_every_module_util_lives_in_a_layer():
    """A file beside the layers would drop out of the rules below unnoticed."""
    utils = REPO_ROOT / "plugins" / "module_utils"
    assert sorted(path.name for path in utils.glob("*.py")) == []
    assert sorted(path.name for path in utils.iterdir() if path.is_dir() and path.name != "__pycache__") == sorted(
        set(CONTROLLER_LAYERS) | set(NODE_LAYERS))
    for layer in list(CONTROLLER_LAYERS) + list(NODE_LAYERS):
        assert list((utils / layer).glob("_*.py")), layer


def test_layers_import_downwards():
    """Static: every module_utils import names a layer its own layer may use (MAY_IMPORT)."""
    utils = REPO_ROOT / "plugins" / "module_utils"
    prefix = "ansible_collections.gpuharden.k8s.plugins.module_utils."
    wrong = []
    for path in sorted(utils.rglob("_*.py")):
        layer = path.parent.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
                used = node.module[len(prefix):].split(".")[0]
                if used not in MAY_IMPORT[layer]:
                    wrong.append("%s/%s imports %s" % (layer, path.name, node.module))
    assert wrong == []


def test_the_payload_reader_sees_controller_code(payloads):
    """The checks below mean something only if the reader finds what a controller module does ship."""
    consistency = payloads["gpu_consistency"]
    assert {"cluster/_consistency", "k8s/_k8s", "core/_errors"} <= set(consistency["module_utils"])
    assert any(hit.startswith("ansible_collections/gpuharden/k8s/plugins/module_utils/k8s/_k8s.py:")
               for hit in consistency["kubernetes_imports"])
    assert all(payloads[name]["zip_bytes"] == 0 for name in DOCUMENTATION_ONLY)


@pytest.mark.parametrize("module", sorted(set(NODE_SIDE) | set(CONTROLLER_SIDE) - DOCUMENTATION_ONLY))
def test_payload_ships_the_module_shell(payloads, module):
    """Every module ends through _module_shell.run_module; on the node side the tests below keep it free of controller
    code."""
    assert "core/_module_shell" in payloads[module]["module_utils"]


@pytest.mark.parametrize("module", sorted(NODE_SIDE))
def test_node_payload_has_no_controller_module_utils(payloads, module):
    payload = payloads[module]
    assert payload["style"] == "new" and payload["module_utils"], payload
    shipped = sorted(name for name in payload["module_utils"] if _layer(name) in CONTROLLER_LAYERS)
    assert shipped == [], "%s (node side) ships controller-side module_utils %s" % (module, shipped)
    assert {_layer(name) for name in payload["module_utils"]} <= set(NODE_LAYERS), payload["module_utils"]


@pytest.mark.parametrize("module", sorted(NODE_SIDE))
def test_node_payload_imports_no_kubernetes(payloads, module):
    assert payloads[module]["kubernetes_imports"] == []
