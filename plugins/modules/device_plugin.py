#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: device_plugin
short_description: Install or repair the NVIDIA device plugin (0.15 or newer) on the GPU nodes only
version_added: 0.1.0
description:
  - Renders the device plugin's ConfigMap (its config file), its DaemonSet and optionally the gpu-feature-discovery
    DaemonSet, and applies them with server-side apply (field manager C(gpuharden)).
  - The DaemonSet keeps off CPU-only nodes (O(node_selector)), tolerates the C(nvidia.com/gpu) taint, runs at
    C(system-node-critical) priority without privilege escalation and with every capability dropped (C(SYS_ADMIN) added
    back for a MIG strategy or C(volume-mounts)), runs with the RuntimeClass O(runtime_class_name) so that the NVIDIA
    runtime gives it NVML, mounts C(/var/lib/kubelet/device-plugins) and reads the config file from the ConfigMap. A checksum of the config file in the
    pod template restarts the pods when the config changes (the plugin reads it only at start).
  - "Version gate: O(version) must be a release tag of 0.15.0 or newer; C(latest), digests and older releases are
    refused. Options a release does not understand are refused too: O(nvidia_dev_root) and O(device_discovery_strategy)
    need 0.16, O(shared_devices_allocation_policy) 0.20. C(failOnInitError) is always written (since 0.18 the static
    manifests no longer set it to false, so a plugin without a node selector crash-loops on CPU-only nodes)."
  - Audits every existing plugin DaemonSet (one paginated LIST of DaemonSets, one of Nodes and one of the GPU Operator's
    ClusterPolicies, one GET per ConfigMap a plugin reads, one GET of the RuntimeClass) and returns findings - releases below
    0.15 or unparseable tags, resource renames such as C(nvidia-gpu) (ignored by the plugin, which advertises
    C(nvidia.com/gpu)), a MIG strategy without C(SYS_ADMIN) and C(NVIDIA_MIG_MONITOR_DEVICES), no C(runtimeClassName)
    (C(NVIDIA_VISIBLE_DEVICES), which the image and the Helm chart always set, gives no NVML without the nvidia runtime), a
    missing config file, an initContainer gating on C(nvidia-smi) without a readiness probe, plugins landing on CPU-only
    nodes, and a second plugin DaemonSet competing for the same nodes - each with its repair. The Helm chart's
    config-manager (config copied from a ConfigMap into an emptyDir) is followed, and its C(mps-control-daemon) DaemonSet is
    not a plugin.
  - "Each config file is read as the DaemonSet's release (0.15 to 0.20) decodes it: struct keys in any case, the keys of
    C(sharing.*) and C(resources.*) entries in exact case, YAML numbers as strings where a string is due, flags and
    environment variables over the file. Every config that release refuses at start (it exits, the pod crash-loops) is an
    error finding - C(version) not v1, wrong types (a quoted C(\"false\") for a boolean), time-slicing or MPS without
    resources or with fewer than 2 replicas, bad C(devices), invalid resource names, C(deviceListStrategy) (C(none), or
    a comma list in the file), C(deviceIDStrategy), C(migStrategy), C(deviceDiscoveryStrategy) (0.16),
    C(sharedDevicesAllocationPolicy) (0.20), IMEX channel IDs (0.17), MPS with C(migStrategy) mixed or without an MPS
    root, an unparsable boolean environment variable. A key the release ignores is a warning naming the closest known key."
  - "Other installers: a DaemonSet or ConfigMap owned by the NVIDIA GPU Operator (ownerReference to its ClusterPolicy),
    by a Helm release (C(app.kubernetes.io/managed-by: Helm), C(helm.sh/chart)), by another controller or GitOps tool
    is never changed or deleted: its findings carry C(fix), the field to change in that installer. When such an installer
    already serves nodes the managed plugin would serve (or holds a managed name), nothing is applied and the finding
    C(plugin_managed_by_other_installer) names it: two plugins on one node fight over the same resource. O(adopt_installers)
    lets gpuharden take Helm-managed objects over; GPU Operator objects are never taken over (the operator reverts them)."
  - A live DaemonSet or ConfigMap with the managed name that gpuharden never applied (and no other installer owns) is
    adopted - replaced by the desired object (so nothing the previous installer set survives), then applied. Competing
    unowned plugin DaemonSets are deleted with O(remove_competing) when every node they land on is served by the managed
    plugin. Otherwise such a DaemonSet blocks the apply (two plugins would register the same resource on one node);
    nothing is applied, RV(refused) and a warning name it and the fix.
  - The RuntimeClass O(runtime_class_name) must exist before the plugin is applied (the API server rejects pods naming a
    missing one); without it the module fails before writing anything, and check mode reports it.
  - A change of the DaemonSet is not applied while a node it lands on reports C(status.runtimeHandlers) without the
    RuntimeClass's handler (containerd there has no nvidia runtime, so the pod would never start, and a rolling update
    removes the node's running plugin first). Such a node is read again for up to 30 seconds, the time the kubelet
    takes to report a runtime that the same run just added; then the module fails naming the nodes and writes
    nothing. Check mode reports them without waiting. Nodes that report no runtime handlers (kubelets before v1.30,
    containerd 1.7) are not checked.
  - The result is changed only when the server's dry-run answer differs from the live object outside C(managedFields),
    C(resourceVersion), C(generation) and C(status). In check mode every write is sent with C(dryRun=All), so nothing
    is stored and the prediction is the API server's own.
  - After a change (and on every run with O(wait)) waits until the DaemonSet's desired, updated and ready pod counts
    agree, and on timeout fails naming the nodes whose pod is not ready, and why.
  - With O(node_labels), first labels (and optionally taints) the GPU nodes exactly as M(gpuharden.k8s.gpu_node_labels)
    does, over the same LIST of Nodes, and picks the plugin's nodes from the Nodes as that leaves them - one module run
    and one LIST of Nodes for both steps.
  - Runs on the controller (C(delegate_to=localhost), C(run_once)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._k8s_auth
attributes:
  check_mode:
    support: full
    details:
      - Writes are sent with C(dryRun=All); no rollout wait.
  diff_mode:
    support: full
    details:
      - One diff per object, live against the server's dry-run answer, as YAML.
options:
  version:
    description: Plugin release, the image tag, for example V(v0.17.4). 0.15.0 or newer.
    type: str
    default: v0.20.0
  image_registry:
    description: Registry and path of the image, without the repository name; change it for an air-gapped mirror.
    type: str
    default: nvcr.io/nvidia
  image_repository:
    description: Repository name of the image.
    type: str
    default: k8s-device-plugin
  pull_policy:
    description: The container's C(imagePullPolicy).
    type: str
    default: IfNotPresent
    choices: [Always, IfNotPresent, Never]
  image_pull_secrets:
    description: Names of Secrets in O(namespace) used to pull the image.
    type: list
    elements: str
    default: []
  namespace:
    description: Namespace of the DaemonSets and the ConfigMap.
    type: str
    default: kube-system
  name:
    description:
      - Name of the plugin DaemonSet. The default is the static manifest's, so an existing static install is adopted.
    type: str
    default: nvidia-device-plugin-daemonset
  config_map_name:
    description: Name of the ConfigMap holding the plugin's config file.
    type: str
    default: nvidia-device-plugin-config
  selector_value:
    description:
      - Value of the C(name) label the DaemonSet selects its pods by (the static manifest's). C(spec.selector) is immutable.
    type: str
    default: nvidia-device-plugin-ds
  node_selector:
    description:
      - Labels a node must have to run the plugin. Must not be empty, so that the plugin stays off CPU-only nodes.
      - O(node_labels) or M(gpuharden.k8s.gpu_node_labels) sets them.
    type: dict
    default: {nvidia.com/gpu.present: "true"}
  tolerations:
    description: Tolerations of the plugin pods.
    type: list
    elements: dict
    default: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  priority_class_name:
    description: The pods' C(priorityClassName); empty for none.
    type: str
    default: system-node-critical
  mig_strategy:
    description:
      - C(flags.migStrategy), from the MIG layout of the nodes.
      - V(single) and V(mixed) give the container C(SYS_ADMIN) and C(NVIDIA_MIG_MONITOR_DEVICES=all), as the Helm chart does.
    type: str
    default: none
    choices: [none, single, mixed]
  device_list_strategy:
    description:
      - C(flags.plugin.deviceListStrategy), one or more of V(envvar), V(volume-mounts), V(cdi-annotations), V(cdi-cri).
      - V(none) is not a strategy (the plugin refuses to start) and is refused.
      - V(volume-mounts) gives the container C(CAP_SYS_ADMIN) from 0.16 on; the C(cdi-*) strategies mount C(/var/run/cdi).
    type: list
    elements: str
    default: [envvar]
  device_id_strategy:
    description: C(flags.plugin.deviceIDStrategy).
    type: str
    default: uuid
    choices: [uuid, index]
  fail_on_init_error:
    description: C(flags.failOnInitError). Written explicitly, whatever the release's default.
    type: bool
    default: true
  pass_device_specs:
    description: C(flags.plugin.passDeviceSpecs) (needed with the CPU manager's static policy on old runtimes).
    type: bool
    default: false
  nvidia_driver_root:
    description:
      - C(flags.nvidiaDriverRoot), the driver's root on the node (V(/run/nvidia/driver) with the driver container).
      - Another root than V(/), and any root with a C(cdi-*) strategy, is mounted read-only at C(/driver-root)
        (C(containerDriverRoot)).
    type: str
    default: /
  nvidia_dev_root:
    description:
      - C(flags.nvidiaDevRoot) (0.16 or newer). Unset leaves it out of the config, so that the plugin uses
        O(nvidia_driver_root) for the device nodes as well.
    type: str
  device_discovery_strategy:
    description: C(flags.deviceDiscoveryStrategy) (0.16 or newer); unset leaves the plugin's V(auto).
    type: str
    choices: [auto, nvml, tegra]
  shared_devices_allocation_policy:
    description: C(flags.plugin.sharedDevicesAllocationPolicy) (0.20 or newer).
    type: str
    choices: [distributed, packed]
  time_slicing:
    description:
      - Time-slicing, written as C(sharing.timeSlicing). Keys C(replicas) (at least 2, for every resource given by name),
        C(resources) (default V([nvidia.com/gpu]); names, or the plugin's C({name, replicas}) entries),
        C(rename_by_default) or C(renameByDefault), C(fail_requests_greater_than_one) or C(failRequestsGreaterThanOne).
      - An unknown key is refused, naming the closest known one; so are C(rename) and C(devices), which the plugin ignores,
        and resource names it refuses.
    type: dict
  gpu_feature_discovery:
    description: Also install the gpu-feature-discovery DaemonSet (same image, privileged, reads C(/sys)).
    type: bool
    default: false
  expected_resource_names:
    description:
      - Names a C(resources.gpus) entry of an existing plugin's config may give without a finding. The plugin ignores
        every rename in C(resources) and advertises C(nvidia.com/gpu), so any other name is reported.
    type: list
    elements: str
    default: [nvidia.com/gpu]
  remove_competing:
    description:
      - Delete the other plugin DaemonSets that land only on nodes the managed plugin serves. Others are only reported.
      - Never deletes a DaemonSet another installer owns (GPU Operator, Helm unless in O(adopt_installers), other
        controllers), nor anything while another installer serves the managed plugin's nodes.
    type: bool
    default: false
  runtime_class_name:
    description:
      - The pods' C(runtimeClassName), the RuntimeClass whose handler is containerd's nvidia runtime
        (M(gpuharden.k8s.runtime_class) manages it). The plugin container gets C(libnvidia-ml.so.1) only from that runtime.
      - Empty means that nvidia is containerd's default runtime on every GPU node (C(default_runtime_name)); nothing
        checks that here.
    type: str
    default: nvidia
  adopt_installers:
    description:
      - Other installers whose plugin objects gpuharden may take over (adopt by name, delete with O(remove_competing))
        instead of only reporting them. Only V(helm); the GPU Operator is refused, it reverts every change.
    type: list
    elements: str
    default: []
  force:
    description:
      - Delete and create the plugin DaemonSet when its immutable C(spec.selector) differs. Without it that is an error.
    type: bool
    default: false
  force_conflicts:
    description: Take over fields another field manager set (server-side apply C(force)); without it such a conflict fails.
    type: bool
    default: true
  wait:
    description: Wait for the rollout (not in check mode).
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for the rollout.
    type: int
    default: 300
  node_labels:
    description:
      - Label the GPU nodes before the plugin is audited and applied, with the options of
        M(gpuharden.k8s.gpu_node_labels) (same defaults, same behaviour, same identity as this module). Its result is
        RV(node_labels). Labels and taints are patched even when another installer serves the nodes (the plugin is then
        not applied), as the separate module would.
      - Omitted, no node is labelled.
    type: dict
    suboptions:
      nodes:
        description: Names of the GPU nodes (C(metadata.name) of the Node objects).
        type: list
        elements: str
        default: []
      unlabel_nodes:
        description: Names of nodes that must not carry O(node_labels.labels) (CPU-only nodes); their taints are left alone.
        type: list
        elements: str
        default: []
      labels:
        description: Labels the GPU nodes must have; O(node_selector) normally selects them.
        type: dict
        default: {nvidia.com/gpu.present: "true"}
      taint:
        description: V(present) adds the taint to O(node_labels.nodes), V(absent) removes it, V(ignore) leaves taints alone.
        type: str
        default: ignore
        choices: [present, absent, ignore]
      taint_key:
        description: Key of the dedicated-GPU taint.
        type: str
        default: nvidia.com/gpu
      taint_value:
        description: Value of the taint (empty for none).
        type: str
        default: ""
      taint_effect:
        description: Effect of the taint.
        type: str
        default: NoSchedule
        choices: [NoSchedule, PreferNoSchedule, NoExecute]
  page_limit:
    description: Objects per page of each LIST.
    type: int
    default: 500
requirements:
  - kubernetes (Python client), jinja2 and PyYAML on the controller
seealso:
  - module: gpuharden.k8s.gpu_node_labels
  - module: gpuharden.k8s.runtime_class
"""

EXAMPLES = r"""
- name: Install the device plugin on the GPU nodes, repairing an existing install
  gpuharden.k8s.device_plugin:
    kubeconfig: /etc/gpuharden/kubeconfig
    version: v0.17.4
    mig_strategy: "{{ gpuharden_mig_strategy | default('none') }}"
    remove_competing: true
  delegate_to: localhost
  run_once: true
  register: plugin

- name: Air-gapped mirror, CDI, time-slicing in 4
  gpuharden.k8s.device_plugin:
    image_registry: registry.internal:5000/nvidia
    version: v0.20.0
    device_list_strategy: [cdi-cri]
    time_slicing: {replicas: 4}
  delegate_to: localhost
  run_once: true

- name: Audit only
  gpuharden.k8s.device_plugin:
  check_mode: true
  delegate_to: localhost
  run_once: true
  register: plugin_audit
"""

RETURN = r"""
node_labels:
  description:
    - With O(node_labels), what M(gpuharden.k8s.gpu_node_labels) returns - C(changed), C(changed_nodes), and C(nodes) (per
      changed node, C(before) and C(after) of the managed labels and taints) - its requests counted in RV(api_requests).
      The module's C(changed) includes it.
  returned: when O(node_labels) is set
  type: dict
  sample: {"changed": true, "changed_nodes": ["gpu-1"], "nodes": {"gpu-1": {"before": {"labels": {}},
           "after": {"labels": {"nvidia.com/gpu.present": "true"}}}}}
findings:
  description:
    - Problems of the plugin DaemonSets found before this run, in the findings model of every check (C(id), C(check),
      C(stage), C(severity), C(expected), C(found), C(hint), C(remediable)) with C(subject) (the object) and C(repair)
      (V(replace) - fixed by applying the managed DaemonSet, V(delete) - fixed by deleting the DaemonSet with
      O(remove_competing), V(manual)). For objects another installer owns also C(installer) and C(fix) (C(installer),
      C(object) - for example C(ClusterPolicy cluster-policy) or C(Helm release ns/name) - and C(field),
      the ClusterPolicy field or chart value to change).
    - Ids are plugin_version_too_old, plugin_version_unparseable, plugin_resource_rename_ignored, plugin_resource_name_invalid,
      plugin_device_list_strategy_invalid, plugin_device_id_strategy_invalid, plugin_mig_strategy_invalid, plugin_mps_invalid,
      plugin_mig_privileges_missing, plugin_no_nvidia_runtime, plugin_dev_root_forced, plugin_cdi_driver_root_unmounted,
      plugin_config_missing, plugin_config_invalid, plugin_config_unknown_key, plugin_config_unreadable,
      plugin_init_gate_without_readiness, plugin_no_node_selector, plugin_on_cpu_nodes, plugin_competing,
      plugin_managed_by_other_installer, plugin_runtime_class_missing, plugin_operator_unknown,
      runtime_class_handler_missing_on_node.
  returned: always
  type: list
  elements: dict
repairs:
  description: One entry per DaemonSet to repair, C(action) (replace, delete, manual), C(object), C(reason).
  returned: always
  type: list
  elements: dict
deleted:
  description: The competing DaemonSets deleted (or, in check mode, that would be), as C(namespace/name).
  returned: always
  type: list
  elements: str
objects:
  description:
    - Per managed object, C(kind), C(name), C(namespace), C(action) (none, create, update, adopt, recreate, or skip when
      another plugin serves the nodes, see RV(refused)), C(changed), C(message), C(resource_version).
  returned: always
  type: list
  elements: dict
config:
  description: The plugin config file written to the ConfigMap.
  returned: always
  type: dict
  sample: {"version": "v1", "flags": {"migStrategy": "none", "failOnInitError": true, "plugin": {"deviceListStrategy": "envvar"}}}
image:
  description: The image reference of the plugin.
  returned: always
  type: str
  sample: nvcr.io/nvidia/k8s-device-plugin:v0.20.0
refused:
  description:
    - Why nothing was applied, one entry per plugin in the way - C(what) was not done, C(why), and the C(fix) - each also
      a warning; empty when the managed objects were applied (or would be, in check mode).
    - Another installer serves the managed plugin's nodes or owns a managed name (finding
      C(plugin_managed_by_other_installer); C(installers) names them), or an unowned plugin DaemonSet serves them and is
      not deleted in this run (finding C(plugin_competing); O(remove_competing) deletes one that serves no other node).
  returned: always
  type: list
  elements: dict
  sample: [{"what": "apply the managed device plugin next to DaemonSet gpu-static/nvidia-device-plugin-daemonset",
            "why": "DaemonSet gpu-static/nvidia-device-plugin-daemonset is a second device plugin on 2 node(s) ...",
            "fix": "let this run delete it: remove_competing: true (role variable device_plugin_remove_competing), or ..."}]
installers:
  description: The other installers (C(gpu-operator), C(helm), ...) that own a plugin DaemonSet, whether or not they block.
  returned: always
  type: list
  elements: str
target_nodes:
  description: The nodes the managed plugin lands on (selector, affinity and taints evaluated on the Node list).
  returned: always
  type: list
  elements: str
rollout:
  description:
    - The plugin DaemonSet's C(desired), C(current), C(updated), C(ready), C(available), C(misscheduled) pod counts,
      C(done), C(nodes_not_ready) (C(node), C(pod), C(phase), C(reason)) and C(nodes_not_updated) (C(node), C(pod),
      C(terminating), the target nodes whose pod is still of the previous template, read when the wait fails). Empty in
      check mode or without O(wait).
  returned: always
  type: dict
api_requests:
  description: Requests made to the API server.
  returned: always
  type: int
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

import copy

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_reconcile
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(copy.deepcopy(_device_plugin_reconcile.OPTIONS))
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def run(module):
    _device_plugin_reconcile.check_params(module.params)  # bad input fails before the cluster is read
    client = _k8s_objects.Client(_k8s.api_client(module.params), "device_plugin")
    try:
        return _device_plugin_reconcile.reconcile(client, module.params, module.check_mode, module._diff, module.warn)
    finally:
        client.api.close()


def main():
    _module_shell.run_module(build_module(), run, requires=[_k8s.REQUIREMENT], counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
