#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_audit
short_description: Every node-side gpuharden check in one module run, for drift reports
version_added: 0.1.0
description:
  - Runs, in one process on the node, the checks of the remediation and post-check modules against the desired state
    given as options; device nodes and their persistence files (M(gpuharden.k8s.nvidia_device_nodes)), containerd's
    nvidia runtime (M(gpuharden.k8s.containerd_nvidia_runtime)), the kubelet's effective settings and stale manager
    checkpoints (M(gpuharden.k8s.kubelet_config)), the MIG layout (M(gpuharden.k8s.mig_layout)), memory.high of GPU
    pods (M(gpuharden.k8s.cgroup_memory)), NVML health (M(gpuharden.k8s.nvml_check)) and the device-cgroup isolation
    audit (M(gpuharden.k8s.device_cgroup_audit)).
  - Each check takes the options of that module, validated by the same option spec, and calls the same planner the
    module calls in check mode. A remediable finding is reported exactly when that module would change something.
  - A check whose options are omitted is skipped. Every other check ends in one of three states. Checked (C(status)
    C(ok), C(drift) or C(findings)); could not check (C(status) C(not_checked), for a bad option, an unreadable file
    or a tool prerequisite the node lacks), with the cause and the fix, never a finding, so never counted as clean or as
    drift; or refused, where what the check found is outside what gpuharden changes safely (another installer owns
    it), named with why. A check may also name a part of itself it could not run or refused beside what it did check.
    The other checks always still run.
  - Where the NVIDIA GPU Operator owns a check's part of the node (O(gpu_operator); its toolkit the containerd runtime,
    its driver container the device nodes, its MIG manager the MIG layout), the check reports it under C(refused) with
    why and the fix, and no drift, as the module of its stage refuses to change it; a stage listed in
    O(gpu_operator.takeover) is checked as usual. O(gpu_operator), when given, is what the containerd and device_nodes
    checks take as their own C(gpu_operator) option; the mig check, whose part leaves no trace on the node, is refused
    from it alone, without running. Each refused part is also given as a warning.
  - Read-only; never changes the node.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._attributes.node_root
  - gpuharden.k8s._gpu_operator
options:
  node_name:
    description:
      - The Kubernetes node name, passed to the checks that report it (NVML, device cgroups). Defaults to the host name.
    type: str
  device_nodes:
    description:
      - Options of M(gpuharden.k8s.nvidia_device_nodes) (O(root) excluded). Omit to skip the check.
      - Drift is a node with the wrong type, numbers, owner, group or mode, a missing C(/dev/char) link, or missing or
        different persistence files (modprobe options; udev rules of earlier versions, which never fire, are reported for removal).
    type: dict
  containerd:
    description:
      - Options of M(gpuharden.k8s.containerd_nvidia_runtime) (O(root) excluded). Omit to skip the check.
    type: dict
  kubelet:
    description:
      - Options of M(gpuharden.k8s.kubelet_config) (O(root) excluded). Omit to skip the check.
      - The check always plans with O(gpuharden.k8s.kubelet_config#module:remove_stale_state=true), as the
        C(kubelet_topology) role does, so a stale CPU or memory manager checkpoint is drift.
      - On a node whose memory controller is on cgroup v1, the check still runs; MemoryQoS alone is listed under
        C(not_checked). With O(gpuharden.k8s.kubelet_config#module:require_durable=true), a write the stage would
        refuse is listed under C(refused) and the findings still say what differs.
      - C(kubelet_reverts_on_kubeadm_upgrade) names the managed settings C(kubeadm upgrade node) would revert (an error
        where the revert would stop the kubelet on its CPU or Memory Manager checkpoint).
    type: dict
  mig:
    description:
      - Options of M(gpuharden.k8s.mig_layout) (O(root) excluded). Omit to skip the check. Needs nvidia-ml-py.
    type: dict
  cgroup_memory:
    description:
      - Options of M(gpuharden.k8s.cgroup_memory) (O(root) excluded), with the GPU pods' UIDs from the cluster side
        (M(gpuharden.k8s.gpu_pods_info)). Omit to skip the check.
    type: dict
  nvml:
    description:
      - Options of M(gpuharden.k8s.nvml_check) (O(root) excluded); its O(gpuharden.k8s.nvml_check#module:fail_on) is
        ignored. Omit to skip the check.
    type: dict
  device_cgroups:
    description:
      - Options of M(gpuharden.k8s.device_cgroup_audit) (O(root) excluded). Omit to skip the check.
    type: dict
  facts:
    description:
      - Also return what M(gpuharden.k8s.gpu_facts) returns, as C(ansible_facts.gpuharden), read in this module run
        (C(harden_gpu_nodes.yml) plans with it, so it needs no second trip to the node for the facts).
    type: bool
    default: false
  lock:
    description:
      - Hold the node's gpuharden run lock (see M(gpuharden.k8s.node_lock)) while the checks run, so that the audit
        never reads a node a harden run is changing. Taken and given back inside this module run, unless O(lock.hold).
      - The module fails, naming the holder, when another run holds the lock longer than O(lock.timeout).
      - The lock is a file on the node, and it is taken also in check mode; leave this option out of a check-mode run
        that cannot give the lock back (M(gpuharden.k8s.node_lock) does nothing in check mode).
    type: dict
    suboptions:
      hold:
        description:
          - Keep the lock after the checks (it is given back when the module fails), for a run that goes on to change
            the node and gives it back itself with M(gpuharden.k8s.node_lock) O(gpuharden.k8s.node_lock#module:state=released).
        type: bool
        default: false
      release_if_compliant:
        description:
          - With O(lock.hold), give the lock back in this module run all the same where the node is compliant, that
            is where no node-side stage of C(harden_gpu_nodes.yml) would run (every value of C(summary.node_stages) is
            false) and the node shows the NVIDIA driver's GPUs. RV(lock.held) says which happened.
          - For a run that, on such a node, changes nothing more on it (C(harden_gpu_nodes.yml) sets it only where the
            plan's cluster-side dry runs are clean too), so it needs no further trip to give the lock back.
        type: bool
        default: false
      owner:
        description: Who holds the lock (unique per run).
        type: str
        required: true
      path:
        description: The lock file on the node.
        type: path
        default: /run/gpuharden/run.lock
      timeout:
        description: Seconds to wait for another run's lock.
        type: int
        default: 0
      stale_after:
        description: Seconds after which a lock counts as abandoned.
        type: int
        default: 7200
      controller:
        description:
          - This run's controller process, as the lookup C(gpuharden.k8s.controller_run) returns it (see
            M(gpuharden.k8s.node_lock) O(gpuharden.k8s.node_lock#module:controller)). A lock whose run is provably gone
            is taken over at once, with a warning that names its holder.
        type: dict
notes:
  - Needs root for the device-cgroup check (bpf(2)) and the unprivileged NVML check (it forks and drops privileges).
  - Playbook C(gpuharden.k8s.drift_check) and the C(gpuharden drift) command build these options from the same role
    variables that C(harden_gpu_nodes.yml) uses.
seealso:
  - module: gpuharden.k8s.nvidia_device_nodes
  - module: gpuharden.k8s.containerd_nvidia_runtime
  - module: gpuharden.k8s.kubelet_config
  - module: gpuharden.k8s.mig_layout
  - module: gpuharden.k8s.cgroup_memory
  - module: gpuharden.k8s.nvml_check
  - module: gpuharden.k8s.device_cgroup_audit
"""

EXAMPLES = r"""
- name: Audit a GPU node against the desired state in one module run
  gpuharden.k8s.node_audit:
    node_name: "{{ inventory_hostname }}"
    device_nodes:
      policy: default
    containerd:
      runtime_name: nvidia
    kubelet:
      topology_manager_policy: single-numa-node
      cpu_manager_policy: static
      reserved_system_cpus: "0-1"
    nvml:
      check_unprivileged: true
    device_cgroups: {}
  register: audit

- name: Show the stages that would change
  ansible.builtin.debug:
    var: audit.summary.stages
"""

RETURN = r"""
findings:
  description:
    - Every finding, in check order.
    - C(remediable) is true when running C(stage) of C(harden_gpu_nodes.yml) changes something about it.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: What is wrong, for example C(device_node_permissions), C(containerd_nvidia_runtime), C(kubelet_setting).
      type: str
    check:
      description: The check that found it (C(device_nodes), C(containerd), C(kubelet), C(mig), C(cgroup_memory), C(nvml), C(device_cgroups)).
      type: str
    stage:
      description: The harden_gpu_nodes.yml tag that fixes it; null when no stage does.
      type: str
    severity:
      description: One of C(info), C(warning), C(error), C(critical).
      type: str
    expected:
      description: The desired state.
      type: raw
    found:
      description: What the node shows.
      type: raw
    hint:
      description: Why it matters or what to do.
      type: str
    remediable:
      description: Whether the stage would change something for it.
      type: bool
checks:
  description:
    - Per check, C(status), C(would_change), C(findings) (a count), C(seconds), C(details).
    - The C(details) of C(device_cgroups) carry the audit's C(summary), C(allocation_source) and C(pod_resources)
      (see M(gpuharden.k8s.device_cgroup_audit)).
    - The C(details) of C(kubelet) carry C(persistence) (C(durable) or C(reverts_on_kubeadm_upgrade)) and
      C(persistence_reason), as M(gpuharden.k8s.kubelet_config) returns them for the stage's plan.
    - C(status) is C(drift) when the check's stage would change something, C(findings) when there are only findings
      running the stage does not change (hardware, workloads), C(ok), C(not_checked) (the check could not run) or
      C(skipped) (its options were left out).
    - C(not_checked), where the check or a part of it could not run, lists C({what, cause, fix}); C(refused), where it
      refused to judge a part (another installer owns it), lists C({what, why, fix}).
  returned: always
  type: dict
summary:
  description:
    - C(findings), C(by_severity), C(max_severity), C(stages) (the stages to run to fix the remediable findings),
      C(would_change).
    - C(not_checked) and C(refused), the names of the checks with such entries in RV(checks).
    - C(node_stages), per node-side stage of C(harden_gpu_nodes.yml) (C(device_permissions), C(container_runtime),
      C(kubelet_topology), C(mig), C(cgroup_limits)), whether harden runs it on this node, which it does where its
      check's C(status) is not C(ok) (a check that could not run or was left out runs it too), and for C(mig) only where its check
      ran.
  returned: always
  type: dict
lock:
  description: With O(lock), what became of the node's run lock.
  returned: when O(lock) is given
  type: dict
  contains:
    held:
      description: Whether this run kept the lock (see O(lock.hold) and O(lock.release_if_compliant)).
      type: bool
    taken_over:
      description: Why this run took another run's lock over (its run is gone, it is stale, unreadable), else null.
      type: str
node_report:
  description:
    - When the NVML check ran, what M(gpuharden.k8s.gpu_consistency) takes in O(gpuharden.k8s.gpu_consistency#module:node_reports)
      for this node (the NVML check's result and the GPU processes' cgroups); else null.
    - When the device_cgroups check also read the kubelet's pod-resources API, C(pod_resources) is its answer cut to the
      C(nvidia.com/*) devices per container, the exact allocation gpu_consistency compares the processes with.
  returned: always
  type: dict
gpu_operator:
  description: The O(gpu_operator) option the checks took, as validated, or V(null) when it was not given.
  returned: always
  type: dict
seconds:
  description: Time spent in the checks.
  returned: always
  type: float
cpu_seconds:
  description:
    - CPU time (user and system) the module's process on the node used, from the Python interpreter's start (Ansible's
      wrapper and the imports included) to its result, that is what one audit costs the node. C(gpuharden drift)
      reports it per node.
  returned: always
  type: float
ansible_facts:
  description: With O(facts), C(gpuharden), as M(gpuharden.k8s.gpu_facts) returns it.
  returned: when O(facts) is true
  type: dict
"""

import resource

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _gpu_operator


def argument_spec():
    spec = {
        "root": {"type": "path", "default": "/"},
        "node_name": {"type": "str"},
        "facts": {"type": "bool", "default": False},
    }
    spec.update((name, {"type": "dict"}) for name in _node_audit.CHECK_NAMES)
    spec["lock"] = {"type": "dict", "options": _node_audit.LOCK_SPEC}
    # given or not (no defaults applied): the controller's reading replaces the checks' own only when given
    spec["gpu_operator"] = dict(_gpu_operator.argument(), apply_defaults=False)
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def execute(module):
    result = _node_audit.audit(module.params)
    # what the checks refused to judge (the GPU Operator owns it) shows in the run's output, not only in its data
    for name, check in sorted(result["checks"].items()):
        for warning in _gpu_operator.warnings(check.get("refused") or [], []):
            module.warn("%s check: %s" % (name, warning))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 4)
    return result


def main():
    _module_shell.run_module(build_module(), execute, never_changed=True)


if __name__ == "__main__":
    main()
