# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/audit_node.yml's lines, made in Python (plugins/module_utils/audit/_gpu_facts_report.py, the
gpuharden.k8s.gpu_facts_report lookup) instead of Jinja (issue 45): each equal to what the playbook's Jinja printed
before (its expressions as of commit 66f93d9, below, rendered by Ansible's own templar) for the same facts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit._gpu_facts_report import gpu_facts_report

# audit_node.yml as of commit 66f93d9, before its lines moved into Python
BEFORE_PLAYBOOK = """\
- name: Audit GPU nodes (read-only)
  hosts: "{{ gpuharden_audit_hosts | default('all') }}"
  gather_facts: false
  vars_files: [vars/node_python.yml]  # gpuharden_node_python for the node tasks only
  vars:
    gpuharden_node_root: /
  tasks:
    - name: Gather GPU facts
      gpuharden.k8s.gpu_facts:
        root: "{{ gpuharden_node_root }}"

    - name: Report NVML status
      ansible.builtin.debug:
        msg: >-
          {{ 'NVML ' ~ ansible_facts.gpuharden.nvml.version ~ ', driver ' ~ ansible_facts.gpuharden.driver_version
          ~ ', CUDA ' ~ ansible_facts.gpuharden.cuda_driver_version ~ ', ' ~ ansible_facts.gpuharden.gpu_count ~ ' GPUs'
          if ansible_facts.gpuharden.nvml.available
          else 'NVML unusable: ' ~ ansible_facts.gpuharden.nvml.reason.code ~ ' - ' ~ ansible_facts.gpuharden.nvml.reason.hint }}

    - name: Show GPUs
      ansible.builtin.debug:
        msg: >-
          {{ 'GPU%d: %s (%s)' | format(item.index, item.error.code, item.error.message) if item.error else
          'GPU%d %s %s NUMA %s PCIe gen%sx%s (max gen%sx%s) MIG %s' | format(item.index, item.name,
          item.pci_bus_id, item.numa_node, item.pcie.gen_current, item.pcie.width_current, item.pcie.gen_max,
          item.pcie.width_max, item.mig.mode_current if item.mig.capable else 'n/a') }}
      loop: "{{ ansible_facts.gpuharden.gpus }}"
      loop_control:
        label: "GPU{{ item.index }}"

    - name: Report device nodes that differ from the driver's settings
      vars:
        __params: "{{ ansible_facts.gpuharden.driver_params | default({}, true) }}"
        __mode: "{{ '%04o' | format(__params.DeviceFileMode | default(438) | int) }}"
        __expected_nodes: "{{ ansible_facts.gpuharden.device_nodes | dict2items
          | selectattr('key', 'match', '^/dev/nvidia([0-9]+|ctl)$') }}"
      ansible.builtin.debug:
        msg: >-
          {%- set wrong = [] -%}
          {%- for node in __expected_nodes -%}
          {%- if node.value.mode != __mode or node.value.uid != (__params.DeviceFileUID | default(0))
                or node.value.gid != (__params.DeviceFileGID | default(0)) -%}
          {%- set _ = wrong.append(node.key ~ ' is ' ~ node.value.owner ~ ':' ~ node.value.group ~ ' ' ~ node.value.mode
                ~ ', driver wants uid ' ~ (__params.DeviceFileUID | default(0)) ~ ' gid '
                ~ (__params.DeviceFileGID | default(0)) ~ ' mode ' ~ __mode) -%}
          {%- endif -%}
          {%- endfor -%}
          {{ wrong | join('; ') if wrong else 'all /dev/nvidia* nodes match the driver settings' }}

    - name: Report PCIe links trained below their maximum
      ansible.builtin.debug:
        msg: >-
          {%- set slow = [] -%}
          {%- for gpu in ansible_facts.gpuharden.gpus if not gpu.error and gpu.pcie.gen_max -%}
          {%- if gpu.pcie.gen_current < gpu.pcie.gen_max or gpu.pcie.width_current < gpu.pcie.width_max -%}
          {%- set _ = slow.append('GPU' ~ gpu.index ~ ' ' ~ gpu.pci_bus_id ~ ': gen' ~ gpu.pcie.gen_current ~ 'x'
                ~ gpu.pcie.width_current ~ ' of gen' ~ gpu.pcie.gen_max ~ 'x' ~ gpu.pcie.width_max) -%}
          {%- endif -%}
          {%- endfor -%}
          {{ slow | join('; ') if slow else 'all PCIe links at their maximum' }}
"""
_TASKS = yaml.safe_load(BEFORE_PLAYBOOK)[0]["tasks"]
BEFORE = {"nvml": _TASKS[1]["ansible.builtin.debug"]["msg"], "gpu": _TASKS[2]["ansible.builtin.debug"]["msg"],
          "device_nodes": _TASKS[3]["ansible.builtin.debug"]["msg"], "device_nodes_vars": _TASKS[3]["vars"],
          "pcie": _TASKS[4]["ansible.builtin.debug"]["msg"]}


def _render(text, facts, **variables):
    variables = {name: trust_as_template(value) if isinstance(value, str) else value for name, value in variables.items()}
    return Templar(loader=DataLoader(), variables=dict(variables, ansible_facts={"gpuharden": facts})).template(trust_as_template(text))


A100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "00000000:07:00.0", "numa_node": 0, "error": None,
        "pcie": {"gen_current": 4, "width_current": 16, "gen_max": 4, "width_max": 16}, "mig": {"capable": True, "mode_current": "disabled"}}
FACTS = {"nvml": {"available": True, "version": "12.535.104.05", "reason": None}, "driver_version": "535.104.05",
         "cuda_driver_version": "12.2", "gpu_count": 2, "gpus": [A100, dict(A100, index=1, pci_bus_id="00000000:0F:00.0")],
         "device_nodes": {"/dev/nvidiactl": {"mode": "0666", "uid": 0, "gid": 0, "owner": "root", "group": "root"},
                          "/dev/nvidia0": {"mode": "0666", "uid": 0, "gid": 0, "owner": "root", "group": "root"},
                          "/dev/nvidia1": {"mode": "0666", "uid": 0, "gid": 0, "owner": "root", "group": "root"},
                          "/dev/nvidia-uvm": {"mode": "0600", "uid": 0, "gid": 0, "owner": "root", "group": "root"}},
         "driver_params": {}}


def _variant(name):
    facts = copy.deepcopy(FACTS)
    if name == "trained down, lost, no MIG":
        facts["gpus"][0]["pcie"].update(gen_current=3, width_current=8)
        facts["gpus"][1] = {"index": 1, "error": {"code": "gpu_is_lost", "message": "the GPU has fallen off the bus"}}
        facts["gpus"].append(dict(A100, index=2, mig={"capable": False, "mode_current": None}, pcie=dict(A100["pcie"], gen_max=None)))
    elif name == "nodes off the driver's settings":
        facts["driver_params"] = {"DeviceFileMode": 432, "DeviceFileGID": 44}
        facts["device_nodes"]["/dev/nvidia0"].update(gid=44, group="video", mode="0660")
    elif name == "driver params unreadable":
        facts["driver_params"] = None
        facts["device_nodes"]["/dev/nvidia1"].update(uid=1000, owner="ml")
    elif name == "NVML unusable":
        facts.update(nvml={"available": False, "version": None, "reason": {"code": "driver_not_loaded", "hint": "modprobe nvidia"}},
                     gpus=[], gpu_count=0)
    return facts


@pytest.mark.parametrize("name", ["clean", "trained down, lost, no MIG", "nodes off the driver's settings", "driver params unreadable",
                                  "NVML unusable"])
def test_the_lines_are_what_the_playbook_s_jinja_printed(name):
    facts = _variant(name)
    report = gpu_facts_report(facts)
    assert report["nvml"] == _render(BEFORE["nvml"], facts)
    assert report["gpus"] == [_render(BEFORE["gpu"], facts, item=gpu) for gpu in facts["gpus"]]
    assert report["device_nodes"] == _render(BEFORE["device_nodes"], facts, **BEFORE["device_nodes_vars"])
    assert report["pcie"] == _render(BEFORE["pcie"], facts)


def test_the_lines_name_what_differs():
    report = gpu_facts_report(_variant("nodes off the driver's settings"))
    # /dev/nvidia0 is as the driver's settings want it; /dev/nvidia-uvm is not one the settings govern
    assert report["device_nodes"] == ("/dev/nvidiactl is root:root 0666, driver wants uid 0 gid 44 mode 0660; "
                                      "/dev/nvidia1 is root:root 0666, driver wants uid 0 gid 44 mode 0660")
    report = gpu_facts_report(_variant("trained down, lost, no MIG"))
    assert report["pcie"] == "GPU0 00000000:07:00.0: gen3x8 of gen4x16"
    assert report["gpus"][1] == "GPU1: gpu_is_lost (the GPU has fallen off the bus)" and report["gpus"][2].endswith("MIG n/a")
    assert gpu_facts_report(FACTS)["device_nodes"] == "all /dev/nvidia* nodes match the driver settings"


def test_audit_node_prints_the_lines_in_one_task_in_the_order_of_its_former_four():
    """playbooks/audit_node.yml's one debug task: query(..., lines=true) gives NVML, each GPU, the device nodes, the PCIe links."""
    from ansible.parsing.dataloader import DataLoader
    from ansible_collections.gpuharden.k8s.plugins.lookup import gpu_facts_report as lookup

    facts = _variant("trained down, lost, no MIG")
    report = gpu_facts_report(facts)
    plugin = lookup.LookupModule(loader=DataLoader())
    assert plugin.run([facts], {}, lines=True) == [report["nvml"], *report["gpus"], report["device_nodes"], report["pcie"]]
    assert plugin.run([facts], {}) == [report]
    playbook = (Path(__file__).resolve().parents[2] / "playbooks" / "audit_node.yml").read_text()
    assert "query('gpuharden.k8s.gpu_facts_report', ansible_facts.gpuharden, lines=true)" in playbook
