#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_layout
short_description: Apply a declarative MIG layout to a node's GPUs through NVML
version_added: 0.1.0
description:
  - Makes the node's NVIDIA GPUs hold a MIG layout, given either in NVIDIA mig-parted's v1 file format
    (unchanged, with a selected config name) or in a short per-host form.
  - Validates the layout against each GPU's profile table as NVML reports it (names, instance limits,
    placements); an unknown profile, a layout that does not fit, or MIG asked of a GPU without MIG fails
    with the GPU and the profile named, before anything is changed.
  - Profile names follow mig-parted (go-nvlib's parser) and may carry attributes, V(1g.10gb+me), V(1g.24gb+me.all),
    V(2g.48gb+gfx), or negative ones, V(1g.24gb-me); the GPU's profile table says which exist.
  - As mig-parted, rejects (naming the config, the entry and the field, before anything is changed) an entry whose
    C(mig-devices) counts are all 0, and C(mig-enabled=true) without C(mig-devices) (V({}) is MIG enabled without
    instances).
  - As mig-parted, an entry whose C(devices) index is not on the node, or whose C(device-filter) matches none of the
    GPUs it names, is left out, not an error (one config serves nodes with different GPUs); RV(unmatched_entries) lists them.
  - Unlike mig-parted v0.15.0, which applies them wrongly, refuses two entries of the selected config that select the
    same GPU (mig-parted applies both in turn, the earlier layout is lost or the apply fails after the mode change)
    and a configuration name given twice in the file (mig-parted silently keeps the last one).
  - O(config_file) is read inside O(root) (links and V(..) never leave it), only when it is a regular UTF-8 file of at
    most 1 MiB; YAML nested more than 64 deep or with more than 50,000 nodes once aliases are expanded is refused.
    Every error is one line naming the file (and the line and column for YAML), the config and the field.
  - Plans first, then acts. Nothing happens when every GPU already holds its layout; the comparison is by
    the multiset of GPU-instance profiles per GPU, placements only count where the layout pins them
    (V(3g.40gb@4)). Otherwise, per GPU, compute instances and then GPU instances that are not wanted are
    destroyed, the MIG mode is changed, GPU instances are created with explicit placements (largest
    profiles first, with backtracking, so a fit is always found when one exists) and each gets its
    default compute instance.
  - C(nvmlDeviceSetMigMode) reports success even when the change could not be activated. The module reads
    the activation status; when the change is pending (clients hold the GPU, or a reset is required) it
    returns RV(reset_required) and the bus ids in RV(gpus_to_reset). Reset the GPUs (or reboot) and run
    the module again to finish.
  - A failing step stops the run; the error carries the step, the steps done and the state reached on
    every GPU, and a re-run continues from there.
  - Also returns what the NVIDIA device plugin will advertise for the target layout under each MIG
    strategy (resource names as the plugin builds them), and findings where the chosen strategy cannot serve it.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
attributes:
  check_mode:
    support: full
    details:
      - Returns the plan; no mutating NVML function is called.
  diff_mode:
    support: full
    details:
      - The per-GPU layout before and after, one line per GPU.
requirements:
  - nvidia-ml-py (import name C(pynvml)) on the node's Python
  - the NVIDIA driver's C(libnvidia-ml.so.1) on the node
  - PyYAML on the node when O(config_file) is used
options:
  config:
    description:
      - A mig-parted v1 configuration (the content of a C(config.yaml) used with C(nvidia-mig-parted)),
        as data. V(version) and V(mig-configs) are required and unknown fields are rejected, as mig-parted does.
      - Mutually exclusive with O(config_file) and O(layout).
    type: dict
  config_file:
    description:
      - Path (below O(root)) of a mig-parted v1 configuration file on the node.
    type: path
  selected:
    description:
      - The name of the configuration under C(mig-configs) to apply. Required with O(config) and O(config_file).
    type: str
  layout:
    description:
      - 'The short form: keys V(all), a GPU index, or comma-separated indices; values a mapping of profile to
        count (MIG enabled with those GPU instances; V({}) for MIG enabled without instances) or V(disabled)/V(false)
        (MIG disabled). Per-index keys override V(all).'
      - A profile written V(3g.40gb@4) pins the GPU instance at memory-slice start 4 (count 1).
      - A mapping whose counts are all 0 is rejected (as mig-parted does); an index the node does not have is skipped.
    type: dict
  force:
    description:
      - Act on GPUs that run processes. Without it the module refuses, naming the GPUs and the process ids.
      - A mode change on a busy GPU then stays pending and RV(reset_required) is returned.
    type: bool
    default: false
  strategy:
    description:
      - The device plugin's MIG strategy the node runs (or will run); RV(findings) flag layouts it cannot serve.
    type: str
    choices: [none, single, mixed]
    default: mixed
notes:
  - Needs root (MIG mode changes) or the mig/config capability (instance changes).
  - GPUs that no entry of the layout selects are left alone. Under V(devices=all), a mig-parted
    C(device-filter) limits an entry to GPUs with those PCI ids.
  - Drain the node first; the role M(gpuharden.k8s.mig) wraps the module in a cordon/drain and uncordon.
seealso:
  - module: gpuharden.k8s.gpu_facts
"""

EXAMPLES = r"""
- name: Apply a mig-parted config file the GPU Operator already uses
  gpuharden.k8s.mig_layout:
    config_file: /etc/nvidia-mig-manager/config.yaml
    selected: all-1g.10gb

- name: Seven 1g.10gb instances on every GPU, GPU 3 split in two halves
  gpuharden.k8s.mig_layout:
    layout:
      all: {"1g.10gb": 7}
      3: {"3g.40gb": 2}
    strategy: mixed
  register: mig

- name: Reset the GPUs whose mode change is pending
  ansible.builtin.command:
    argv: [nvidia-smi, -r, -i, "{{ mig.gpus_to_reset | join(',') }}"]
  when: mig.reset_required
  changed_when: true
"""

RETURN = r"""
plan:
  description:
    - The steps, in order. C(action) is V(destroy_ci), V(destroy_gi), V(set_mode), V(create_gi) or V(create_ci);
      C(gpu) is the NVML index; C(profile), C(start) (memory-slice placement), C(gi_id), C(ci_id), C(mode) where they apply.
    - Steps that follow a mode change are planned again from NVML's table once the mode is active.
  type: list
  elements: dict
  returned: always
  sample: [{"action": "set_mode", "gpu": 0, "mode": 1},
           {"action": "create_gi", "gpu": 0, "profile": "3g.40gb", "profile_id": 9, "start": 0, "size": 4}]
before:
  description: Per GPU index, the layout before, in the input's form.
  type: dict
  returned: always
  sample: {"0": {"mig_enabled": false, "mig_devices": {}}}
after:
  description: Per GPU index, the layout after (predicted in check mode; read back from NVML otherwise).
  type: dict
  returned: always
  sample: {"0": {"mig_enabled": true, "mig_devices": {"1g.10gb": 7}}}
reset_required:
  description: A mode change is pending on some GPU; reset the GPUs in RV(gpus_to_reset) (or reboot) and run again.
  type: bool
  returned: always
gpus_to_reset:
  description: PCI bus ids of the GPUs whose mode change waits for a reset.
  type: list
  elements: str
  returned: always
  sample: ["00000000:0F:00.0"]
advertised_resources:
  description:
    - The extended resources the NVIDIA device plugin advertises for the target layout, per MIG strategy
      (V(none), V(single), V(mixed)). V(single) is V(null) where that strategy cannot serve the layout.
    - V(mixed) names each GPU-instance profile as plugin v0.20.0 and newer do, C(nvidia.com/mig-<profile>) with
      C(+) replaced by C(.) (V(nvidia.com/mig-1g.10gb.me)); V(mixed_legacy) as v0.19.x and older do, whose unanchored
      patterns give an attribute profile the name of its plain profile (V(nvidia.com/mig-1g.10gb)).
  type: dict
  returned: always
  sample: {"none": {"nvidia.com/gpu": 8}, "single": {"nvidia.com/gpu": 56}, "mixed": {"nvidia.com/mig-1g.10gb": 56},
           "mixed_legacy": {"nvidia.com/mig-1g.10gb": 56}}
unmatched_entries:
  description:
    - Entries (by position in the selected config or the short form) that select no GPU of the node, as mig-parted
      skips them, with C(devices) (the indices the node does not have) or C(device_filter), and C(reason).
  type: list
  elements: dict
  returned: always
  sample: [{"entry": 1, "devices": [4, 5, 6, 7], "reason": "no GPU with index 4, 5, 6, 7 on the node (GPUs [0, 1, 2, 3])"}]
findings:
  description:
    - C([{id, check, stage, severity, expected, found, hint, remediable, gpu?}]); V(mig_layout_drift) per GPU whose layout differs from the target,
      V(mig_strategy_none_hides_slices) and V(mig_strategy_single_mismatch) for the chosen O(strategy),
      V(mig_custom_compute_instances) for a GPU instance that stays with compute instances smaller than itself
      (one MIG device each, C(<c>c.<profile>); plugin v0.19.x and older advertise each as one C(nvidia.com/mig-<profile>),
      v0.20.0 and newer match no resource pattern and do not start; RV(advertised_resources) assumes default ones).
  type: list
  elements: dict
  returned: always
gpus:
  description: Per GPU the state read from NVML at the end (mode current/pending, minor re-read after a mode change,
    GPU instances, process ids).
  type: list
  elements: dict
  returned: always
failed_step:
  description: On failure during apply, the step that failed with its NVML error; C(steps_done) and C(gpus) come with it.
  type: dict
  returned: failure
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml, _nvml


def build_module():
    return AnsibleModule(
        argument_spec=_mig_nvml.argument_spec(),
        **_mig_nvml.OPTION_RULES,
        supports_check_mode=True,
    )


def _keyed(layouts):
    return {str(index): layout for index, layout in sorted(layouts.items())}


def run(module):
    params = module.params
    entries = _mig_nvml.entries_from_params(params)
    with _mig_nvml.Session():
        gpus = _mig_nvml.read_node()
        decision = _mig.plan_node(gpus, entries, params["force"], params["strategy"])
        plans = decision["plans"]
        steps = [step for index in sorted(plans) for step in plans[index]["steps"]]
        by_index = {gpu["index"]: gpu for gpu in gpus}
        result = {
            "plan": steps,
            "before": _keyed(decision["before"]),
            "advertised_resources": _mig.advertised_resources(gpus, decision["target"]),
            "findings": decision["findings"],
            # not "skipped": Ansible reads a truthy skipped in a result as a skipped task (ansible-core 2.19
            # executor/task_result.py is_skipped), whatever the module changed
            "unmatched_entries": decision["unmatched_entries"],
        }
        if decision["busy"]:
            raise GpuhardenError(
                "GPU processes run on GPUs the MIG plan touches: %s; drain the node or set force=true"
                % "; ".join("GPU %s (%s) pids %s" % (b["index"], b["pci_bus_id"], ", ".join(map(str, b["pids"])))
                            for b in decision["busy"]),
                busy_gpus=decision["busy"], **result)
        pending = {index for index, outcome in plans.items() if outcome["pending"]}
        if module.check_mode:
            # a mode change on a GPU with processes (force) will stay pending
            pending |= {index for index, outcome in plans.items()
                        if outcome["mode_change"] and by_index[index]["processes"]}
            after = {index: (decision["before"][index] if index in pending else layout)
                     for index, layout in decision["target"].items()}
            final = gpus
        else:
            outcomes = _mig_nvml.apply(gpus, decision["desired"], plans) if steps else {}
            pending |= {index for index, status in outcomes.items() if status == "reset_required"}
            final = _mig_nvml.read_node()
            after = {gpu["index"]: _mig.current_layout(gpu) for gpu in final}
    reset = sorted(by_index[index]["pci_bus_id"] for index in pending)
    result.update(
        changed=bool(steps),
        after=_keyed(after),
        reset_required=bool(reset),
        gpus_to_reset=reset,
        gpus=[_mig_nvml.public_state(gpu) for gpu in final],
    )
    if module._diff:
        result["diff"] = {
            "before": _mig.diff_text(gpus, decision["before"]),
            "after": _mig.diff_text(gpus, after),
            "before_header": "MIG layout (before)",
            "after_header": "MIG layout (after)",
        }
    return result


def main():
    module = build_module()
    requires = [("nvidia-ml-py", _nvml.HAS_PYNVML, _nvml.PYNVML_IMPORT_ERROR)]
    if module.params["config_file"]:
        requires.append(("PyYAML", _mig_nvml.HAS_YAML, _mig_nvml.YAML_IMPORT_ERROR))
    _module_shell.run_module(module, run, requires=requires)


if __name__ == "__main__":
    main()
