# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' preflights (roles/*/tasks/preflight.yml: the action gpuharden.k8s.role_preflight, postcheck_step for
roles/postcheck): each names every rule a value breaks, with the variable and its value, and passes the combinations
its role accepts. One ansible-playbook run on localhost per role, one play per case; the roles' rules one by one are in
test_role_preflight_rules.py."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
UNSET = {"device_permissions_owner": None, "device_permissions_group": None, "device_permissions_mode": None}
# case -> (policy and values, None when accepted, else the pieces its message names)
DEVICE_PERMISSIONS = {
    "default": ({"device_permissions_policy": "default"}, None),
    "default with a mode": ({"device_permissions_policy": "default", "device_permissions_mode": "0660"},
                            ["policy=default", "owner/group/mode null"]),
    "restricted without a group": ({"device_permissions_policy": "restricted"}, ["needs device_permissions_group", "group=None"]),
    "restricted, others may read": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                                     "device_permissions_mode": "0664"}, ["a mode ending in 0", "mode=0664"]),
    "restricted": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                    "device_permissions_mode": "0660"}, None),
    "custom without a mode": ({"device_permissions_policy": "custom"}, ["custom needs device_permissions_mode"]),
    "custom, not octal": ({"device_permissions_policy": "custom", "device_permissions_mode": "999"},
                          ["device_permissions_mode=999 is not a quoted octal mode"]),
    "two rules broken": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                          "device_permissions_mode": "abc"}, ["a mode ending in 0", "mode=abc is not a quoted octal mode"]),
    "custom": ({"device_permissions_policy": "custom", "device_permissions_mode": "0666"}, None),
}
POSTCHECK_DEFAULTS = {"postcheck_nvml": True, "postcheck_topology": True, "postcheck_consistency": True,
                      "postcheck_expected_gpus": None, "postcheck_expected_mig_devices": None}
POSTCHECK = {
    "defaults": ({}, None),
    "topology without NVML": ({"postcheck_nvml": False, "postcheck_consistency": False}, ["set postcheck_nvml=true"]),
    "no NVML, nothing needs it": ({"postcheck_nvml": False, "postcheck_topology": False, "postcheck_consistency": False}, None),
    "counts": ({"postcheck_expected_gpus": 8, "postcheck_expected_mig_devices": "0"}, None),
    "a negative count": ({"postcheck_expected_gpus": -1}, ["postcheck_expected_gpus=-1", "whole numbers"]),
    "a fraction, and NVML off": ({"postcheck_expected_mig_devices": "1.5", "postcheck_nvml": False},
                                 ["set postcheck_nvml=true", "postcheck_expected_mig_devices=1.5"]),
}
# Through the role (include_role tasks_from preflight): what the role's defaults leave, and each case's own values.
# role -> {case: (values, None when accepted, else the pieces its message names)}
THROUGH_THE_ROLE = {
    "kubelet_topology": {
        "defaults": ({}, None),
        "a 00- drop-in": ({"kubelet_topology_dropin_name": "00-x.conf"},
                          ["kubelet_topology: kubelet_topology_dropin_name='00-x.conf': must not start with 00- (the kubeadm drop-in sorts first)"]),
        "two rules broken": ({"kubelet_topology_cpu_manager_policy": "static",
                              "kubelet_topology_topology_manager_policy_options": {"max-allowable-numa-nodes": 4}},
                             ["kubelet_topology_cpu_manager_policy='static': the static policy needs kubelet_topology_reserved_system_cpus",
                              '{"max-allowable-numa-nodes": 4}: max-allowable-numa-nodes must be an integer of at least 8']),
    },
    "container_runtime": {
        "CDI strategies, CDI on by default": ({"device_plugin_device_list_strategy": ["cdi-cri"], "container_runtime_config": "/etc/x.toml"}, None),
        "CDI strategies, CDI off": ({"device_plugin_device_list_strategy": ["envvar", "cdi-cri"], "container_runtime_enable_cdi": False,
                                     "container_runtime_config": "/etc/x.toml"},
                                    ["container_runtime_enable_cdi=false: device_plugin_device_list_strategy has cdi-cri"]),
        "a relative drop-in": ({"container_runtime_drop_in": "99-nvidia.toml", "container_runtime_config": "/etc/x.toml"},
                               ["container_runtime_drop_in='99-nvidia.toml': must be the absolute path of a .toml file"]),
    },
    "device_plugin": {
        "defaults": ({}, None),
        "a taint state": ({"device_plugin_taint": "yes"}, ["device_plugin_taint='yes': must be one of present/absent/ignore"]),
    },
    "mig": {
        "defaults, no layout": ({}, ["mig_layout={}: set exactly one of mig_layout, mig_config, mig_config_file (set: none)"]),
        "a layout": ({"mig_layout": {"all": "all-1g.10gb"}}, None),
    },
    "node_maintenance": {
        "defaults": ({}, None),
        "a state and a retry interval": ({"node_maintenance_state": "drain", "node_maintenance_retry_interval": 600},
                                         ["node_maintenance_state='drain': must be one of drained, cordoned, uncordoned",
                                          "node_maintenance_retry_interval=600: must be at most node_maintenance_timeout (300)"]),
    },
    "runtime_class": {
        "defaults": ({}, None),
        "containerd's name": ({"container_runtime_handler": "nvidia-cdi"}, None),
        "an upper-case handler": ({"runtime_class_handler": "Nvidia"}, ["runtime_class_handler='Nvidia': must be a DNS label"]),
    },
    "node_prerequisites": {
        "defaults": ({}, None),
        "a relative venv, an index without scheme": ({"node_prerequisites_venv": "venv", "node_prerequisites_index_url": "pypi.example"},
                                                     ["node_prerequisites_venv='venv'", "node_prerequisites_index_url='pypi.example'"]),
    },
}


def _outcomes(role, unset, cases, through_the_role=False):
    """{case: the preflight's message, or None where it passed}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        plays = [{
            "hosts": "localhost", "gather_facts": False, "vars": dict(unset, **values),
            "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s." + role, "tasks_from": "preflight"}}
                                 if through_the_role else {"ansible.builtin.include_tasks": str(REPO / "roles" / role / "tasks/preflight.yml")},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(out / ("%d.json" % index)), "content": "{{ outcome | to_json }}"}}],
        } for index, (values, _expected) in enumerate(cases.values())]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
        return {case: json.loads((out / ("%d.json" % index)).read_text()) for index, case in enumerate(cases)}


@pytest.mark.parametrize(("role", "unset", "cases"), [("device_permissions", UNSET, DEVICE_PERMISSIONS),
                                                      ("postcheck", POSTCHECK_DEFAULTS, POSTCHECK)])
def test_preflight_names_every_broken_rule_and_passes_the_rest(role, unset, cases):
    outcomes = _outcomes(role, unset, cases)
    for case, (_values, expected) in cases.items():
        message = outcomes[case]
        if expected is None:
            assert message is None, (case, message)
        else:
            assert message is not None, case
            for piece in expected:
                assert piece in message, (case, piece, message)


@pytest.mark.parametrize("role", sorted(THROUGH_THE_ROLE))
def test_role_preflight_names_the_variable_and_value_of_each_broken_rule(role):
    cases = THROUGH_THE_ROLE[role]
    outcomes = _outcomes(role, {}, cases, through_the_role=True)
    for case, (_values, expected) in cases.items():
        message = outcomes[case]
        if expected is None:
            assert message is None, (case, message)
        else:
            assert message is not None and message.startswith(role + ": "), (case, message)
            for piece in expected:
                assert piece in message, (case, piece, message)


def test_runtime_class_preflight_refuses_hosts_that_disagree_on_containerd_s_runtime_name():
    """Once for the play (run_once): every host's container_runtime_handler, not only the first host's."""
    with tempfile.TemporaryDirectory() as tmp:
        plays = [{
            "hosts": "all", "gather_facts": False,
            "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.runtime_class", "tasks_from": "preflight"}},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       # a run_once task's failure fails every host; the first host's result holds the message
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ (ansible_failed_result | default({})).msg | default('') }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(Path(tmp) / "{{ inventory_hostname }}.json"), "content": "{{ outcome | to_json }}"}}],
        }]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        inventory = "\n".join("%s ansible_connection=local ansible_python_interpreter=%s container_runtime_handler=%s" % (host, sys.executable, handler)
                              for host, handler in (("gpu-a", "nvidia"), ("gpu-b", "nvidia-cdi")))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True, inventory=inventory)
        assert run.rc == 0, run.stdout.read()[-3000:]
        first = json.loads((Path(tmp) / "gpu-a.json").read_text())
    assert "they report nvidia, nvidia-cdi" in first, first
