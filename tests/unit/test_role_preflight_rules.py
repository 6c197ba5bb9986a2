# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' preflight rules (plugins/module_utils/cluster/_role_preflight.py, issue 45): for each rule of each role,
one value that breaks it (its one line names the variable and the value) and one next to it that must pass."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _role_preflight as rules

# role -> variables every rule of the role accepts (the role defaults, templated, with a layout source for mig)
BASE = {
    "kubelet_topology": {"kubelet_topology_cpu_manager_policy": "", "kubelet_topology_reserved_system_cpus": "",
                         "kubelet_topology_extra_settings": {}, "kubelet_topology_memory_manager_policy": "",
                         "kubelet_topology_reserved_memory": [], "kubelet_topology_health_timeout": 120, "kubelet_topology_health_delay": 2,
                         "kubelet_topology_dropin_name": "50-gpuharden.conf", "kubelet_topology_kubeadm_config_dir": "/etc/kubernetes/kubelet.conf.d",
                         "kubelet_topology_topology_manager_policy_options": {}},
    "container_runtime": {"container_runtime_runtime_name": "nvidia", "container_runtime_runtime_binary": "/usr/bin/nvidia-container-runtime",
                          "container_runtime_config": "/etc/containerd/config.toml", "container_runtime_drop_in": "/etc/containerd/conf.d/99-nvidia.toml",
                          "container_runtime_ready_timeout": 30, "container_runtime_enable_cdi": False,
                          "device_plugin_device_list_strategy": ["envvar"]},
    "cgroup_limits": {"cgroup_limits_factor": 0.9, "cgroup_limits_enforce_node_allocatable": [], "cgroup_limits_kube_reserved": {},
                      "cgroup_limits_kube_reserved_cgroup": "", "cgroup_limits_system_reserved": {}, "cgroup_limits_system_reserved_cgroup": ""},
    "device_permissions": {"device_permissions_policy": "default", "device_permissions_owner": None, "device_permissions_group": None,
                           "device_permissions_mode": None},
    "device_plugin": {"device_plugin_version": "v0.18.2", "device_plugin_gpu_label_key": "nvidia.com/gpu.present",
                      "device_plugin_gpu_label_value": "true", "device_plugin_taint": "ignore", "device_plugin_mig_strategy": "none",
                      "device_plugin_device_list_strategy": ["envvar"], "device_plugin_wait_timeout": 300, "device_plugin_gpu_node": None,
                      "device_plugin_node_name": "gpu-1", "device_plugin_runtime_class_name": "nvidia", "device_plugin_adopt_installers": []},
    "mig": {"mig_layout": {"all": "all-1g.10gb"}, "mig_config": {}, "mig_config_file": "", "mig_selected": "", "mig_strategy": "mixed",
            "mig_reset_method": "command", "mig_reset_command": ["nvidia-smi", "-r"], "mig_drain": True, "mig_node_name": "gpu-1"},
    "node_maintenance": {"node_maintenance_node_name": "gpu-1", "node_maintenance_state": "drained", "node_maintenance_timeout": 300,
                         "node_maintenance_retry_interval": 5, "node_maintenance_ready_timeout": 120},
    "runtime_class": {"runtime_class_handler": "nvidia", "runtime_class_name": "nvidia", "runtime_class_play_handlers": ["nvidia", "nvidia"]},
    "node_prerequisites": {"node_prerequisites_venv": "/opt/gpuharden/venv", "node_prerequisites_wheels_dest": "/opt/gpuharden/wheels",
                           "node_prerequisites_packages": ["PyYAML>=6,<7"], "node_prerequisites_system_python": "",
                           "node_prerequisites_index_url": "", "node_prerequisites_wheels": ""},
}
STATIC_CPU = {"kubelet_topology_cpu_manager_policy": "static"}
OPTIONS = "kubelet_topology_topology_manager_policy_options"
# (role, rule): (values that break it, the pieces its line names, values next to them that pass)
RULES = {
    ("kubelet_topology", "static cpu needs a reservation"): (
        STATIC_CPU, ["kubelet_topology_cpu_manager_policy='static'", "kubelet_topology_reserved_system_cpus"],
        dict(STATIC_CPU, kubelet_topology_extra_settings={"systemReserved": {"cpu": "1"}})),
    ("kubelet_topology", "static cpu, kubeReserved without cpu"): (
        dict(STATIC_CPU, kubelet_topology_extra_settings={"kubeReserved": {"memory": "1Gi"}}), ["needs kubelet_topology_reserved_system_cpus"],
        dict(STATIC_CPU, kubelet_topology_reserved_system_cpus="0-1")),
    ("kubelet_topology", "Static memory needs reservedMemory"): (
        {"kubelet_topology_memory_manager_policy": "Static"}, ["kubelet_topology_memory_manager_policy='Static'", "kubelet_topology_reserved_memory"],
        {"kubelet_topology_memory_manager_policy": "Static", "kubelet_topology_reserved_memory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}),
    ("kubelet_topology", "health timeout positive"): (
        {"kubelet_topology_health_timeout": "0"}, ["kubelet_topology_health_timeout='0': must be a positive"],
        {"kubelet_topology_health_timeout": "1", "kubelet_topology_health_delay": 1}),
    ("kubelet_topology", "health delay positive"): (
        {"kubelet_topology_health_delay": "soon"}, ["kubelet_topology_health_delay='soon': must be a positive"], {"kubelet_topology_health_delay": "1.5"}),
    ("kubelet_topology", "health delay within the timeout"): (
        {"kubelet_topology_health_delay": 121}, ["kubelet_topology_health_delay=121: must be at most kubelet_topology_health_timeout (120)"],
        {"kubelet_topology_health_delay": 120}),
    ("kubelet_topology", "drop-in ends in .conf"): (
        {"kubelet_topology_dropin_name": "50-gpuharden.yaml"}, ["kubelet_topology_dropin_name='50-gpuharden.yaml': must be a file name ending in .conf"],
        {"kubelet_topology_dropin_name": "a.conf"}),
    ("kubelet_topology", "drop-in not 00-"): (
        {"kubelet_topology_dropin_name": "00-x.conf"}, ["kubelet_topology_dropin_name='00-x.conf': must not start with 00-"],
        {"kubelet_topology_dropin_name": "01-x.conf"}),
    ("kubelet_topology", "kubeadm directory absolute"): (
        {"kubelet_topology_kubeadm_config_dir": "etc/kubernetes"}, ["kubelet_topology_kubeadm_config_dir='etc/kubernetes'"],
        {"kubelet_topology_kubeadm_config_dir": ""}),
    ("kubelet_topology", "options a mapping"): ({OPTIONS: ["prefer-closest-numa-nodes"]}, ["must be a mapping"], {OPTIONS: {}}),
    ("kubelet_topology", "known options only"): (
        {OPTIONS: {"prefer-far": "true"}}, ["the kubelet knows prefer-closest-numa-nodes and max-allowable-numa-nodes only (not prefer-far)"],
        {OPTIONS: {"prefer-closest-numa-nodes": "true"}}),
    ("kubelet_topology", "max numa an integer"): ({OPTIONS: {"max-allowable-numa-nodes": "8.0"}}, ["an integer of at least 8"],
                                                  {OPTIONS: {"max-allowable-numa-nodes": "+8"}}),
    ("kubelet_topology", "max numa not a boolean"): ({OPTIONS: {"max-allowable-numa-nodes": True}}, ["an integer of at least 8"],
                                                     {OPTIONS: {"max-allowable-numa-nodes": 16}}),
    ("kubelet_topology", "max numa at least 8"): ({OPTIONS: {"max-allowable-numa-nodes": 7}}, ['"max-allowable-numa-nodes": 7', "at least 8"],
                                                  {OPTIONS: {"max-allowable-numa-nodes": 8}}),
    ("kubelet_topology", "prefer closest a Go bool"): ({OPTIONS: {"prefer-closest-numa-nodes": "yes"}}, ["strconv.ParseBool"],
                                                       {OPTIONS: {"prefer-closest-numa-nodes": True}}),
    ("container_runtime", "runtime name a DNS label"): (
        {"container_runtime_runtime_name": "Nvidia"}, ["container_runtime_runtime_name='Nvidia': must be a DNS label"],
        {"container_runtime_runtime_name": "nvidia-cdi"}),
    ("container_runtime", "binary absolute"): ({"container_runtime_runtime_binary": "nvidia-container-runtime"}, ["container_runtime_runtime_binary="],
                                               {"container_runtime_runtime_binary": "/opt/nvidia-container-runtime"}),
    ("container_runtime", "config absolute"): ({"container_runtime_config": "config.toml"}, ["container_runtime_config='config.toml'"],
                                               {"container_runtime_config": "/etc/c.toml"}),
    ("container_runtime", "drop-in absolute"): ({"container_runtime_drop_in": "conf.d/99-nvidia.toml"}, ["container_runtime_drop_in="],
                                                {"container_runtime_drop_in": "/conf.d/99-nvidia.toml"}),
    ("container_runtime", "drop-in .toml"): ({"container_runtime_drop_in": "/etc/containerd/conf.d/99-nvidia.conf"}, ["a .toml file"],
                                             {"container_runtime_drop_in": "/etc/containerd/conf.d/x.toml"}),
    ("container_runtime", "ready timeout positive"): ({"container_runtime_ready_timeout": -1}, ["container_runtime_ready_timeout=-1"],
                                                      {"container_runtime_ready_timeout": "1"}),
    ("container_runtime", "CDI on with CDI strategies"): (
        {"device_plugin_device_list_strategy": ["envvar", "cdi-cri"], "container_runtime_enable_cdi": "false"},
        ["container_runtime_enable_cdi='false'", "device_plugin_device_list_strategy has cdi-cri"],
        {"device_plugin_device_list_strategy": ["envvar", "cdi-cri"], "container_runtime_enable_cdi": "yes"}),
    ("cgroup_limits", "factor above 0"): ({"cgroup_limits_factor": 0}, ["cgroup_limits_factor=0: out of range"], {"cgroup_limits_factor": "0.01"}),
    ("cgroup_limits", "factor at most 1"): ({"cgroup_limits_factor": 1.01}, ["cgroup_limits_factor=1.01"], {"cgroup_limits_factor": 1}),
    ("cgroup_limits", "known entries"): ({"cgroup_limits_enforce_node_allocatable": ["pods", "kube"]}, ["each entry must be one of", "(not kube)"],
                                         {"cgroup_limits_enforce_node_allocatable": ["pods"]}),
    ("cgroup_limits", "none alone"): ({"cgroup_limits_enforce_node_allocatable": ["none", "pods"]}, ["none must stand alone"],
                                      {"cgroup_limits_enforce_node_allocatable": ["none"]}),
    ("cgroup_limits", "kube-reserved with its amount and cgroup"): (
        {"cgroup_limits_enforce_node_allocatable": ["kube-reserved"], "cgroup_limits_kube_reserved": {"cpu": "1"}},
        ["enforces kube-reserved without its amount or cgroup", "cgroup_limits_kube_reserved_cgroup (is '')"],
        {"cgroup_limits_enforce_node_allocatable": ["kube-reserved"], "cgroup_limits_kube_reserved": {"cpu": "1"},
         "cgroup_limits_kube_reserved_cgroup": "/kube.slice"}),
    ("cgroup_limits", "system-reserved with its amount and cgroup"): (
        {"cgroup_limits_enforce_node_allocatable": ["system-reserved"], "cgroup_limits_system_reserved_cgroup": "/system.slice"},
        ["enforces system-reserved", "cgroup_limits_system_reserved (is {})"],
        {"cgroup_limits_enforce_node_allocatable": ["system-reserved"], "cgroup_limits_system_reserved": {"memory": "1Gi"},
         "cgroup_limits_system_reserved_cgroup": "/system.slice"}),
    ("device_permissions", "default takes no owner, group or mode"): (
        {"device_permissions_owner": "root"}, ["device_permissions_policy=default keeps the driver default"], {"device_permissions_owner": None}),
    ("device_permissions", "restricted needs a group"): (
        {"device_permissions_policy": "restricted"}, ["restricted needs device_permissions_group", "group=None"],
        {"device_permissions_policy": "restricted", "device_permissions_group": "video"}),
    ("device_permissions", "restricted, a mode ending in 0"): (
        {"device_permissions_policy": "restricted", "device_permissions_group": "video", "device_permissions_mode": "0661"}, ["mode=0661"],
        {"device_permissions_policy": "restricted", "device_permissions_group": "video", "device_permissions_mode": "660"}),
    ("device_permissions", "custom needs a mode"): ({"device_permissions_policy": "custom"}, ["custom needs device_permissions_mode"],
                                                    {"device_permissions_policy": "custom", "device_permissions_mode": "0666"}),
    ("device_permissions", "an octal mode"): ({"device_permissions_policy": "custom", "device_permissions_mode": "0668"},
                                              ["device_permissions_mode=0668 is not a quoted octal mode"],
                                              {"device_permissions_policy": "custom", "device_permissions_mode": "0600"}),
    ("device_plugin", "version a tag"): ({"device_plugin_version": ""}, ["device_plugin_version='': must be a release tag"], {"device_plugin_version": "v1"}),
    ("device_plugin", "label key a string"): ({"device_plugin_gpu_label_key": ""}, ["device_plugin_gpu_label_key=''"], {"device_plugin_gpu_label_key": "k"}),
    ("device_plugin", "label value a string"): ({"device_plugin_gpu_label_value": True}, ["device_plugin_gpu_label_value=true"],
                                                {"device_plugin_gpu_label_value": ""}),
    ("device_plugin", "taint"): ({"device_plugin_taint": "yes"}, ["device_plugin_taint='yes': must be one of present/absent/ignore"],
                                 {"device_plugin_taint": "present"}),
    ("device_plugin", "MIG strategy"): ({"device_plugin_mig_strategy": "all"}, ["device_plugin_mig_strategy='all'"],
                                        {"device_plugin_mig_strategy": "mixed"}),
    ("device_plugin", "strategies a list"): ({"device_plugin_device_list_strategy": "envvar"}, ["device_plugin_device_list_strategy='envvar': must be a list"],
                                             {"device_plugin_device_list_strategy": ["cdi-cri"]}),
    ("device_plugin", "wait positive"): ({"device_plugin_wait_timeout": 0}, ["device_plugin_wait_timeout=0"], {"device_plugin_wait_timeout": 1}),
    ("device_plugin", "gpu node null or boolean"): ({"device_plugin_gpu_node": "true"}, ["device_plugin_gpu_node='true': must be null or a boolean"],
                                                    {"device_plugin_gpu_node": False}),
    ("device_plugin", "node name"): ({"device_plugin_node_name": ""}, ["device_plugin_node_name=''"], {"device_plugin_node_name": "n"}),
    ("device_plugin", "RuntimeClass name a string"): ({"device_plugin_runtime_class_name": None}, ["device_plugin_runtime_class_name=null"],
                                                      {"device_plugin_runtime_class_name": ""}),
    ("device_plugin", "installers a list"): ({"device_plugin_adopt_installers": "helm"}, ["device_plugin_adopt_installers='helm'"],
                                             {"device_plugin_adopt_installers": ["helm"]}),
    ("device_plugin", "helm only"): ({"device_plugin_adopt_installers": ["helm", "gpu-operator"]}, ["the GPU Operator cannot be adopted"],
                                     {"device_plugin_adopt_installers": ["helm", "helm"]}),
    ("mig", "one layout source"): ({"mig_config_file": "/etc/mig.yaml", "mig_selected": "all-1g"},
                                   ["set exactly one of mig_layout, mig_config, mig_config_file (set: mig_layout, mig_config_file)"],
                                   {"mig_layout": {}, "mig_config_file": "/etc/mig.yaml", "mig_selected": "all-1g"}),
    ("mig", "no layout source"): ({"mig_layout": {}, "mig_selected": "all-1g"}, ["(set: none)"],
                                  {"mig_layout": {}, "mig_config": {"version": "v1"}, "mig_selected": "all-1g"}),
    ("mig", "selected with a file"): ({"mig_layout": {}, "mig_config_file": "/etc/mig.yaml"}, ["mig_selected='': is required"],
                                      {"mig_layout": {}, "mig_config_file": "/etc/mig.yaml", "mig_selected": "x"}),
    ("mig", "strategy"): ({"mig_strategy": "both"}, ["mig_strategy='both': must be one of none|single|mixed"], {"mig_strategy": "single"}),
    ("mig", "reset method"): ({"mig_reset_method": "power"}, ["mig_reset_method='power'"], {"mig_reset_method": "reboot", "mig_reset_command": []}),
    ("mig", "reset command with method command"): ({"mig_reset_command": []}, ["mig_reset_command=[]: must be non-empty"],
                                                   {"mig_reset_command": "nvidia-smi -r"}),
    ("mig", "node name when draining"): ({"mig_node_name": ""}, ["mig_node_name='': is required when draining"],
                                         {"mig_node_name": "", "mig_drain": "no"}),
    ("node_maintenance", "node name not empty"): ({"node_maintenance_node_name": ""}, ["node_maintenance_node_name='': must be a Node's metadata.name"],
                                                  {"node_maintenance_node_name": "gpu-1.example"}),
    ("node_maintenance", "node name without , = space /"): ({"node_maintenance_node_name": "a,b"}, ["node_maintenance_node_name='a,b'"],
                                                            {"node_maintenance_node_name": "a-b"}),
    ("node_maintenance", "state"): ({"node_maintenance_state": "drain"}, ["node_maintenance_state='drain': must be one of drained, cordoned, uncordoned"],
                                    {"node_maintenance_state": "uncordoned"}),
    ("node_maintenance", "timeout positive"): ({"node_maintenance_timeout": 0, "node_maintenance_retry_interval": 5},
                                               ["node_maintenance_timeout=0: must be a positive"], {"node_maintenance_timeout": "5"}),
    ("node_maintenance", "retry interval positive"): ({"node_maintenance_retry_interval": "0"}, ["node_maintenance_retry_interval='0': must be a positive"],
                                                      {"node_maintenance_retry_interval": "1"}),
    ("node_maintenance", "retry interval within the timeout"): ({"node_maintenance_retry_interval": 301},
                                                                ["node_maintenance_retry_interval=301: must be at most node_maintenance_timeout (300)"],
                                                                {"node_maintenance_retry_interval": 300}),
    ("node_maintenance", "Ready wait not negative"): ({"node_maintenance_ready_timeout": -1}, ["node_maintenance_ready_timeout=-1: must be 0 or more"],
                                                      {"node_maintenance_ready_timeout": 0}),
    ("runtime_class", "handler a DNS label"): ({"runtime_class_handler": "nvidia.cdi"}, ["runtime_class_handler='nvidia.cdi': must be a DNS label"],
                                               {"runtime_class_handler": "nvidia-cdi"}),
    ("runtime_class", "name a DNS subdomain"): ({"runtime_class_name": "Nvidia"}, ["runtime_class_name='Nvidia': must be a DNS subdomain"],
                                                {"runtime_class_name": "nvidia.cdi"}),
    ("runtime_class", "one runtime name"): ({"runtime_class_play_handlers": ["nvidia", "nvidia-cdi"]}, ["they report nvidia, nvidia-cdi"],
                                            {"runtime_class_play_handlers": []}),
    ("node_prerequisites", "venv absolute"): ({"node_prerequisites_venv": "/opt/venv/"}, ["node_prerequisites_venv='/opt/venv/'"],
                                              {"node_prerequisites_venv": "/v"}),
    ("node_prerequisites", "wheels destination absolute"): ({"node_prerequisites_wheels_dest": "wheels"}, ["node_prerequisites_wheels_dest='wheels'"],
                                                            {"node_prerequisites_wheels_dest": "/w"}),
    ("node_prerequisites", "packages"): ({"node_prerequisites_packages": []}, ["node_prerequisites_packages=[]: must be a non-empty list"],
                                         {"node_prerequisites_packages": ["tomlkit"]}),
    ("node_prerequisites", "system python"): ({"node_prerequisites_system_python": "python3"}, ["node_prerequisites_system_python='python3'"],
                                              {"node_prerequisites_system_python": "/usr/bin/python3"}),
    ("node_prerequisites", "index URL"): ({"node_prerequisites_index_url": "pypi.example/simple"}, ["node_prerequisites_index_url='pypi.example/simple'"],
                                          {"node_prerequisites_index_url": "file:///srv/simple"}),
    ("node_prerequisites", "wheels"): ({"node_prerequisites_wheels": "wheels"}, ["node_prerequisites_wheels='wheels'"],
                                       {"node_prerequisites_wheels": "/srv/wheels"}),
}

# A positive delay is above a timeout that is not: that rule fires too.
LINES = {("kubelet_topology", "health timeout positive"): 2}


@pytest.mark.parametrize("role", sorted(BASE))
def test_the_base_values_pass(role):
    assert rules.problems(role, BASE[role]) == []


@pytest.mark.parametrize(("role", "rule"), sorted(RULES))
def test_each_rule_fires_with_its_variable_and_value_and_passes_next_to_it(role, rule):
    broken, pieces, fine = RULES[role, rule]
    lines = rules.problems(role, dict(BASE[role], **broken))
    assert len(lines) == LINES.get((role, rule), 1), lines
    for piece in pieces:
        assert piece in lines[0], (piece, lines[0])
    assert rules.problems(role, dict(BASE[role], **fine)) == []


def test_every_role_has_its_rules_tested():
    assert {role for role, _rule in RULES} == set(rules.ROLES) == set(BASE)


def test_several_broken_rules_give_one_line_each():
    lines = rules.problems("node_prerequisites", dict(BASE["node_prerequisites"], node_prerequisites_venv="v", node_prerequisites_wheels="w"))
    assert [line.split("=")[0] for line in lines] == ["node_prerequisites_venv", "node_prerequisites_wheels"]


@pytest.mark.parametrize("name", ["nvidia..cdi", "nvidia.-cdi", "a" * 254])
def test_a_name_the_api_server_refuses_is_refused_before_any_change(name):
    """The names are checked as the cluster-side modules check them (_node_labels, after apimachinery v0.36.3
    pkg/api/validate/content/dns.go IsDNS1123Subdomain: dot-separated labels, at most 253): the looser pattern the
    preflight had let these through, and the RuntimeClass stage failed at the API after the node stages had run."""
    assert rules.problems("runtime_class", dict(BASE["runtime_class"], runtime_class_name=name)) == [
        "runtime_class_name=%r: must be a DNS subdomain" % name]
