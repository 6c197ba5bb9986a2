#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_consistency
short_description: Compare declared, allocated and used GPUs per node (device plugin, pods, NVML)
version_added: 0.1.0
description:
  - Read-only, controller side. For each node compares three states -
    declared (the Node's allocatable C(nvidia.com/gpu) and C(nvidia.com/mig-*)),
    allocated (the GPU requests of the non-terminated pods bound to it, and where given the exact device IDs per
    container from the kubelet's pod-resources API),
    used (GPUs, MIG devices and GPU processes as NVML sees them on the node, from O(node_reports)).
  - "Findings: declared differs from physical (C(gpu_not_advertised): allocatable 0 with GPUs present, the device plugin
    missing or failing; C(gpu_partially_advertised); C(gpu_over_advertised); C(mig_not_advertised); C(unknown_gpu_resource),
    C(nvidia.com) names the NVIDIA device plugin does not advertise, such as C(nvidia.com/nvidia-gpu): it discards renames
    in its config, so another plugin advertises them), C(requested_resource_not_advertised) (pods, pending or bound,
    requesting a GPU-like resource no node advertises, such as C(nvidia.com/gpus) or C(nvidia-gpu), with the closest
    advertised name; C(node) is V(null) for pending pods), C(allocated_exceeds_declared), a GPU process whose cgroup
    belongs to a pod that was allocated no GPU (C(gpu_process_without_allocation), the memory cross-sharing of
    C(NVIDIA_VISIBLE_DEVICES=all) without a request) or fewer GPUs than it uses (C(gpu_process_exceeds_allocation)),
    devices used by a container other than the one they were allocated to (C(device_used_by_other_container),
    C(gpu_process_on_unallocated_device); needs O(pod_resources)), C(visible_devices_without_request) from the pod spec,
    and C(gpu_process_outside_pods), C(gpu_process_unknown_pod), C(gpu_process_unattributed), C(node_not_found),
    C(pod_unreadable), and C(node_left_cordoned) (a node still cordoned by a gpuharden run that has ended, interrupted or
    failed: the record C(gpuharden.io/cordon) of M(gpuharden.k8s.node_maintenance) names the run, when and for what)."
  - "MIG devices are expected under the names the NVIDIA device plugin gives them (mixed strategy): one resource per
    MIG device, C(nvidia.com/mig-<profile>) with C(+) replaced by C(.) (V(nvidia.com/mig-1g.10gb.me)) from plugin v0.20.0;
    v0.19.x and older name a device by the first GPU-instance profile it contains (a 3g.40gb GPU instance split into
    three C(1c.3g.40gb) compute instances is V(nvidia.com/mig-3g.40gb) x3, V(1g.10gb+me) is V(nvidia.com/mig-1g.10gb)).
    Either naming is consistent; C(expected.resources) of C(mig_not_advertised) gives both."
  - One paginated LIST of nodes and one of the non-terminated pods (bound or pending) for the whole cluster, whatever the
    number of nodes, made at the same time (with O(pods_snapshot), the pods an earlier module of the play listed);
    memory and time grow linearly with the number of nodes plus pods. Both are ordinary (consistent) LISTs, as
    up to date as the API server's storage, not possibly stale reads from its watch cache (C(resourceVersion=0)).
  - With O(topology), the same run also weighs the cluster's GPU workloads against those nodes' GPUs and Topology
    Manager policies, as M(gpuharden.k8s.gpu_workloads_info) with its C(topology) option does, from the same LIST of
    Nodes and pods plus one LIST per workload controller kind (Deployments, StatefulSets, DaemonSets, Jobs, CronJobs),
    made at the same time. The post-check does both in this one module run.
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)); needs C(list) on C(nodes) and on C(pods) in
    all namespaces, and with O(topology) on C(deployments), C(statefulsets), C(daemonsets) (API group C(apps)),
    C(jobs) and C(cronjobs) (C(batch)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._k8s_auth
options:
  nodes:
    description:
      - Node names to check. Default is every GPU node (labelled with O(gpu_node_label)=true or with C(nvidia.com/*)
        capacity) and every node in O(node_reports).
      - Pending pods (bound to no node) are checked for C(requested_resource_not_advertised) whatever this lists.
    type: list
    elements: str
    default: []
  node_reports:
    description:
      - "What NVML sees per node, keyed by node name: C({gpu_count, gpus: [{index, uuid, minor, mig, processes}],
        mig_devices: [{uuid, gpu, profile}], processes: [{gpu, gpu_uuid, pid, used_memory_mib, mig_device_uuid, cgroup}],
        process_cgroups: {pid: cgroup}, missing_pids: [pid]})."
      - The result of M(gpuharden.k8s.nvml_check) (C(gpu_count), C(gpus) with C(mig), C(processes)) fits as it is; add
        C(process_cgroups) from M(gpuharden.k8s.process_cgroup_info) (or a C(cgroup) per process) so processes are tied to pods.
      - A C(cgroup) is the process's cgroup path or the text of C(/proc/<pid>/cgroup).
      - C(missing_pids) (C(missing) of M(gpuharden.k8s.process_cgroup_info)) are processes that exited between the two
        reads; they are left out.
      - A C(pod_resources) key (the C(node_report) of M(gpuharden.k8s.node_audit) has one where the kubelet's
        pod-resources API answered on the node) is used as the node's O(pod_resources) when that option has no entry
        for the node.
    type: dict
    default: {}
  pod_resources:
    description:
      - "Optional, per node, the kubelet pod-resources API's C(List) answer as
        C([{namespace, name, containers: [{name, devices: [{resource_name, device_ids}]}]}])."
      - With it, a process is checked against the exact devices its container was allocated.
    type: dict
    default: {}
  gpu_node_label:
    description:
      - A node with this label set to C(true) is a GPU node; without a node report it must still advertise GPUs.
    type: str
    default: nvidia.com/gpu.present
  sharing_replicas:
    description:
      - Time-slicing or MPS replicas per GPU the device plugin is configured with (advertised = GPUs x replicas).
    type: int
    default: 1
  page_limit:
    description:
      - Objects per page of each LIST (C(limit)); the module follows C(continue) to the end.
    type: int
    default: 500
  settle_seconds:
    description:
      - Right after a run changed the device plugin, restarted the kubelet or changed MIG, what a node advertises lags
        behind. The plugin registers some seconds after its container starts and the kubelet posts the new capacity
        with its next node status update (every 10 s by default).
      - While any node has C(gpu_not_advertised), C(gpu_partially_advertised) or C(mig_not_advertised), read the
        Nodes and pods again every 3 seconds, for at most this many seconds; the findings of the last read are
        returned (C(settle) says how long it waited). V(0) reads once.
    type: int
    default: 0
  restarted_at:
    description:
      - "The nodes whose kubelet this run restarted, each with the node's clock just before the restart (seconds since
        the epoch; M(gpuharden.k8s.kubelet_config) returns it as C(health.restarted_at)): such a node is judged only
        from a status its new kubelet posted, one whose Ready condition's C(lastHeartbeatTime) is after the restart."
      - A restarted kubelet advertises no device until the device plugin registers again, while the Node keeps the old
        kubelet's allocatable until the new kubelet's first status, so a read in between would see the old count. Such
        a node is read again, within O(settle_seconds), like a node that does not advertise what it has; one still
        without a new status at the end gets C(kubelet_status_not_posted).
    type: dict
    default: {}
  settle_nodes:
    description:
      - The nodes whose advertised resources may still be changing (those the run just changed); O(settle_seconds)
        waits only for them. Omitted, it waits for every checked node; V([]) waits for none.
      - A node that was broken before the run (a lost GPU, no plugin at all) is then reported at once.
    type: list
    elements: str
  fail_on:
    description:
      - Fail the task when a finding has this severity or a higher one; V(never) only reports.
    type: str
    choices: [never, info, warning, error, critical]
    default: never
  topology:
    description:
      - Also weigh the GPU workloads against these nodes, as M(gpuharden.k8s.topology_check) does for one node (the
        same check, with each node's labels and taints from the LIST); the result is RV(topology).
      - A dictionary by node name; each value has C(gpus) (required), C(topology_manager_policy),
        C(topology_manager_scope) (default V(container)) and C(cpu_manager_policy), as the options of
        M(gpuharden.k8s.topology_check). A malformed entry fails the module before any request.
      - When the workloads cannot be read (a workload kind's LIST refused, a workload's GPU request malformed), the
        consistency check still runs; the nodes are weighed without workloads and RV(workloads_error) says why.
    type: dict
    default: {}
  admission:
    description:
      - "The drift check's prediction of harden's admission check: per node, its kubelet plan (C(checks.kubelet.details.plan)
        of M(gpuharden.k8s.node_audit)). Where the plan switches the node to a Topology Manager policy that can refuse
        GPU pods (V(restricted), V(single-numa-node)), the GPU workloads are weighed against the node's GPUs (from
        O(node_reports)) under that policy, as harden weighs them before it switches; a node where one could no longer
        be admitted, or where the workloads could not be listed, is one harden keeps on its policy: RV(kept)."
      - Leave it out where harden would switch anyway (C(kubelet_topology_ignore_unadmittable_workloads)) or checks
        nothing (C(kubelet_topology_admission_check=false)).
    type: dict
    default: {}
  workload_resources:
    description: Extended resources that count as GPUs in the workloads weighed for O(topology) and O(admission).
    type: list
    elements: str
    default: [nvidia.com/gpu]
  pods_snapshot:
    description:
      - "The RV(gpuharden.k8s.gpu_pods_info#module:pods_snapshot) path of an earlier M(gpuharden.k8s.gpu_pods_info) run
        of the same play (with its O(gpuharden.k8s.gpu_pods_info#module:pods_snapshot) option): the first read takes its
        pods instead of listing them again (only the Nodes are listed); a read while settling lists them."
      - The snapshot is read once and removed, before any request. The read-only drift check passes it; harden does
        not, since its drains and restarts change the pods between its plan and its post-check.
    type: path
  runtime_class:
    description:
      - Also check the NVIDIA RuntimeClass as M(gpuharden.k8s.runtime_class) does in check mode, with the same code (every
        RuntimeClass audited, the target Nodes' C(status.runtimeHandlers) from this module's LIST of Nodes, the write
        decided by a server-side dry run); the result is RV(runtime_class_check). The read-only drift check does it here
        rather than in a module run of its own.
      - A dictionary of M(gpuharden.k8s.runtime_class)'s options C(name), C(handler), C(node_selector), C(tolerations),
        C(overhead_pod_fixed) and C(nodes), with the same defaults. A malformed value fails the module before any
        request.
      - When that check fails (a handler only a recreate can change, a refused request), the consistency check is not
        affected; RV(runtime_class_check) then holds C(failed), C(msg) and the findings so far.
    type: dict
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.runtime_class
  - module: gpuharden.k8s.nvml_check
  - module: gpuharden.k8s.process_cgroup_info
"""

EXAMPLES = r"""
- name: NVML view of each node
  gpuharden.k8s.nvml_check:
    check_unprivileged: false
  become: true
  register: nvml

- name: Cgroups of the GPU processes
  gpuharden.k8s.process_cgroup_info:
    pids: "{{ nvml.processes | map(attribute='pid') | list }}"
  register: cgroups

- name: This node's report
  ansible.builtin.set_fact:
    gpu_node_report: "{{ nvml | combine({'process_cgroups': cgroups.cgroups, 'missing_pids': cgroups.missing}) }}"

- name: Declared vs allocated vs used, whole cluster in two LISTs
  gpuharden.k8s.gpu_consistency:
    kubeconfig: /etc/gpuharden/kubeconfig
    nodes: "{{ ansible_play_hosts }}"
    node_reports: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'gpu_node_report'))) }}"
    fail_on: critical
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
findings:
  description:
    - Like every gpuharden check's findings, each also has C(check), C(stage) (the harden stage it belongs to, or
      V(postcheck)) and C(remediable).
    - One entry per problem, with C(id), C(severity) (V(info), V(warning), V(error), V(critical)), C(node), C(gpu)
      (C(index), C(minor), C(uuid), C(mig_device_uuid)) or V(null), C(pod) (C(namespace), C(name), C(uid)) or V(null),
      C(expected), C(found) and C(hint).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "gpu_process_without_allocation", "severity": "critical", "node": "gpu-1", "gpu": null,
            "pod": {"namespace": "ml", "name": "sneaky", "uid": "0f3c..."}, "expected": {"gpu_requests": {"nvidia.com/gpu": 0}},
            "found": {"devices": 8, "pids": [4242], "used_memory_mib": 16384}, "hint": "the pod requested no GPU ..."}]
max_severity:
  description: The highest severity among the findings, or V(null) without findings.
  returned: always
  type: str
nodes:
  description:
    - Per checked node, C(declared) and C(allocated) (resource to count), C(physical) (C(gpus), C(mig_devices),
      C(mig_profiles)) and C(used) (C(gpus), C(processes), C(used_memory_mib)), the last two V(null) without a node
      report, C(pod_resources) (whether exact allocations were given) and C(allocation_source) (V(pod-resources), the
      device IDs per container from the kubelet, or V(api-server), only the pods' requests).
  returned: always
  type: dict
settle:
  description:
    - C(seconds) waited for the nodes' advertised resources and C(reads) of the cluster (see O(settle_seconds) and
      O(settle_nodes)), C(awaiting), the nodes still not advertising what they have after it, and C(stale_status), the
      nodes of O(restarted_at) still without a status from their new kubelet.
  returned: always
  type: dict
  sample: {"seconds": 6.1, "reads": 3, "awaiting": [], "stale_status": []}
topology:
  description:
    - Per node of O(topology), what M(gpuharden.k8s.topology_check) returns for it (C(findings), C(max_severity),
      C(workloads_landing), ...), weighed against the workloads of the last read; V({}) without O(topology).
  returned: always
  type: dict
kept:
  description:
    - Per node of O(admission) that harden's admission check would keep on its policy, C(policy) and C(scope) (the
      ones it would not switch to), C(fields) (the kubelet fields it leaves as they are), C(workloads) (those it could
      no longer admit) and C(reason). The drift check reports those fields' C(kubelet_setting) findings as kept, not
      remediable.
  returned: always
  type: dict
workloads_error:
  description: Why the workloads could not be read for O(topology) (the nodes were weighed without them), else V(null).
  returned: always
  type: str
runtime_class_check:
  description:
    - With O(runtime_class), what M(gpuharden.k8s.runtime_class) returns in check mode (C(changed), C(action),
      C(findings), C(runtime_class), C(node_runtime_handlers), C(message), C(api_requests)), or C(failed), C(msg),
      C(findings) and C(api_requests) when that check failed; else V(null).
  returned: always
  type: dict
api_requests:
  description: LIST requests (pages) per kind (C(nodes), C(pods), and with O(topology) each workload kind), over all reads.
  returned: always
  type: dict
  sample: {"nodes": 1, "pods": 1}
ran_in:
  description:
    - Where the check ran - V(module) in this module run; C(gpuharden drift) runs the same function in its own process
      and reports V(controller process) (its report's C(cluster.ran_in)).
  returned: always
  type: str
  sample: module
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency_run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s

MODULE = _consistency_run.MODULE


def build_module():
    return AnsibleModule(argument_spec=_consistency_run.argument_spec(), supports_check_mode=True)


def fail_on_message(params, result):
    if not _findings.should_fail(result["findings"], params["fail_on"]):
        return None
    return "%s: %d finding(s), the worst %s (fail_on=%s)" % (MODULE, len(result["findings"]), result["max_severity"], params["fail_on"])


def main():
    _module_shell.run_module(build_module(), lambda module: _consistency_run.consistency_check(module.params, _consistency_run.RAN_IN_MODULE),
                             requires=[_k8s.REQUIREMENT], never_changed=True,
                             counters=_k8s.RESULT_COUNTERS, fail_when=fail_on_message)


if __name__ == "__main__":
    main()
