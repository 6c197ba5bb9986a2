# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Every setting of the collection, written once (issue 45 item 3): the one table of the roles' options and of the
playbooks' gpuharden_* variables, with name, type, default, choices, doc, stage and the module option each feeds.

tools/settings.py generates from it the roles' defaults/main.yml, their meta/argument_specs.yml and meta/variables.yml
(each says so in its first lines), and the variable table of docs/uninstall.md; ``python tools/settings.py check``
and tests/unit/test_settings_table.py fail, naming the variable and the file, where one of them disagrees with it.
Edit this file, then run ``python tools/settings.py generate``.

Python, not a data file: the defaults the modules share (core/_defaults.py: the device plugin release, the
RuntimeClass and runtime names) are imported here, so each is spelt once for the modules' argument specs and the
roles alike.  No module imports this file; it never reaches a node.

A role setting:
- ``default``: the value, written as it is into defaults/main.yml and into argument_specs.yml (UNSET: none);
- ``follows``: variables the role default reads first, in order (``{{ a | default(b) | default(<default>) }}`` in
  defaults/main.yml: an inventory's gpuharden_* variable, another role's variable, an Ansible magic variable); the
  argument spec then has no default, since its value is the first of them that is set;
- ``template``: a default that is a Jinja expression of its own (written as it is; no argument spec default);
- ``follow_in_python``: the follows are resolved where the setting is read, in Python (core/_role_options.py
  ``followed``: the role_options lookup, the stage actions, role_preflight, postcheck_step, drift_play), not in Jinja:
  defaults/main.yml leaves the setting unset (a comment says so), so that a value set anywhere, even one equal to the
  default, still wins over the followed variables.  Only for a setting no Jinja reads (issue 45 item 1);
- ``stage``: the role (the harden stage tag where the role is a stage, see STAGES);
- ``feeds``: (module, option) the role passes the setting to (core/_role_options.py builds the roles' options maps from it);
- ``feed_as``: how it is passed, where not as it is: ``float``/``bool`` (cast), ``omit_empty``/``omit_none`` (left out where
  empty/none), ``omit_unless_positive`` (left out unless a positive number), core/_role_options.py FEED_AS;
- ``entry_points``: the role's entry points that take it (None: all), ``entry_docs``: a doc of its own for an entry
  point that uses it otherwise.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import (
    DEVICE_PLUGIN_VERSION,
    ENFORCE_NODE_ALLOCATABLE,
    NVIDIA_RUNTIME_NAME,
    RUNTIME_CLASS_NAME,
)
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._vocabulary import SEVERITIES


class _Unset:
    """No default: the setting is left out of defaults/main.yml's values and argument_specs.yml's default."""

    def __repr__(self):
        return "UNSET"


UNSET = _Unset()
# The device plugin's deviceListStrategy, which role container_runtime reads too (CDI strategies need CDI in containerd).
DEVICE_LIST_STRATEGY = ["envvar"]
# A fail-severity option's choices: a severity, or never (only report).
FAIL_CHOICES = ("never",) + SEVERITIES
TYPES = ("str", "bool", "int", "float", "list", "dict", "raw", "path")
FORMATS = ("count_or_percent", "serial", "percentage")


def setting(name, type, doc, default=UNSET, follows=(), template=UNSET, elements=None, choices=None, entry_points=None, entry_docs=None, feeds=None,  # noqa: A002
            feed_as=None, follow_in_python=False):
    """One role option (see the module's docstring)."""
    return {"name": name, "type": type, "doc": doc, "default": default, "follows": tuple(follows), "template": template,
            "elements": elements, "choices": choices, "entry_points": entry_points, "entry_docs": entry_docs or {}, "feeds": feeds,
            "feed_as": feed_as, "follow_in_python": follow_in_python}


def entry(short_description, description):
    """A role entry point (meta/argument_specs.yml)."""
    return {"short_description": short_description, "description": description}


def role(header, entry_points, settings):
    """A role: its defaults file's opening comment, its entry points and its options, in the defaults file's order."""
    return {"header": header, "entry_points": entry_points, "settings": settings}


def variable(name, type, doc, elements=None, choices=None, format=None, play_keyword=None, default=UNSET, by_playbook=None):  # noqa: A002
    """A gpuharden_* variable of the playbooks (meta/variables.yml: the check_variables action plugin reads it).

    ``default``: its value where the inventory sets none, the one value every ``| default(...)`` of it in the playbooks
    and roles writes (tests/unit/test_settings_table.py reads them all); ``by_playbook``: {playbook file stem: value}
    where playbooks differ on purpose (a drift check waits less for a lock than harden does)."""
    return {"name": name, "type": type, "doc": doc, "elements": elements, "choices": choices, "format": format, "play_keyword": play_keyword,
            "default": default, "by_playbook": dict(by_playbook or {})}


def node_name(role):
    """The host's Node name, which every role that names the node has."""
    return setting(role + "_node_name", "str", "This host's Kubernetes node name; default C(gpuharden_k8s_node_name), else the inventory name.",
                   follows=("gpuharden_k8s_node_name", "inventory_hostname"))


def controller_python(role):
    """The controller's Python for a role's API steps."""
    return setting(role + "_controller_python", "str",
                   "Python on the controller with the kubernetes client; default the one running ansible-playbook.",
                   follows=("ansible_playbook_python",))


def api_access(role, follow_in_python=False):
    """The settings every role that calls the Kubernetes API from the controller has, in this order; ``follow_in_python``:
    every reader of the role's kubeconfig is Python (see setting's follow_in_python)."""
    return (
        setting(role + "_kubeconfig", "str",
                "kubeconfig on the controller; default C(gpuharden_kubeconfig). Empty uses the default kubeconfig or the in-cluster "
                "service account.",
                follows=("gpuharden_kubeconfig",), default="", follow_in_python=follow_in_python),
        setting(role + "_kube_context", "str", "kubeconfig context; empty uses the current one.", default=""),
        controller_python(role),
    )


def section(title):
    """A heading of meta/variables.yml: the variables after it, up to the next one, belong to it."""
    return {"section": title}


ROLES = {
    "cgroup_limits": role(
        header='',
        entry_points={
            'main': entry('Memory limits that hold on GPU nodes (kubelet MemoryQoS, memory.high on GPU pods)',
                          [
                              'Refuses nodes without cgroup v2 and its memory controller (MemoryQoS and memory.high exist only there).',
                              (
                                  'Durable fix, through role C(gpuharden.k8s.kubelet_topology) - kubelet C(featureGates.MemoryQoS), an explicit '
                                  'C(memoryThrottlingFactor), and optionally C(kubeReserved), C(systemReserved) and C(enforceNodeAllocatable).'
                              ),
                              (
                                  "Immediate fix - lists the play's GPU pods with one API call on the controller, then sets C(memory.high) on their "
                                  'cgroups on each node with module C(gpuharden.k8s.cgroup_memory), and reports pods without any memory limit.'
                              ),
                          ]),
        },
        settings=(
            setting('cgroup_limits_cgroup_root', 'str',
                    "Where the node's cgroup v2 hierarchy is mounted; default C(gpuharden_cgroup_root), else /sys/fs/cgroup.",
                    follows=('gpuharden_cgroup_root',), follow_in_python=True,
                    default='/sys/fs/cgroup',
                    feeds=('cgroup_memory', 'cgroup_root'),
                    ),
            setting('cgroup_limits_factor', 'float',
                    "The kubelet's memoryThrottlingFactor, greater than 0 and at most 1; also used for the immediate fix.",
                    default=0.9,
                    feeds=('cgroup_memory', 'factor'),
                    feed_as='float',
                    ),
            setting('cgroup_limits_page_size', 'int',
                    "Page size in bytes for rounding memory.high; 0 means the node's own.",
                    default=0,
                    feeds=('cgroup_memory', 'page_size'),
                    feed_as='omit_unless_positive',
                    ),
            setting('cgroup_limits_kubelet', 'bool',
                    'Apply the durable fix (kubelet configuration through role gpuharden.k8s.kubelet_topology).',
                    default=True,
                    ),
            setting('cgroup_limits_memory_qos_feature_gate', 'bool',
                    'Also set featureGates.MemoryQoS to true (needed up to Kubernetes 1.36).',
                    default=True,
                    ),
            setting('cgroup_limits_kube_reserved', 'dict',
                    "The kubelet's kubeReserved; empty leaves it as it is.",
                    default={},
                    ),
            setting('cgroup_limits_system_reserved', 'dict',
                    "The kubelet's systemReserved; empty leaves it as it is.",
                    default={},
                    ),
            setting('cgroup_limits_kube_reserved_cgroup', 'str',
                    "The kubelet's kubeReservedCgroup; required when enforcing kube-reserved.",
                    default='',
                    ),
            setting('cgroup_limits_system_reserved_cgroup', 'str',
                    "The kubelet's systemReservedCgroup; required when enforcing system-reserved.",
                    default='',
                    ),
            setting('cgroup_limits_enforce_node_allocatable', 'list',
                    "The kubelet's enforceNodeAllocatable; empty leaves it as it is.",
                    elements='str',
                    choices=list(ENFORCE_NODE_ALLOCATABLE),
                    default=[],
                    ),
            setting('cgroup_limits_immediate', 'bool',
                    'Set memory.high on the cgroups of the GPU pods running now.',
                    default=True,
                    ),
            node_name('cgroup_limits'),
            *api_access('cgroup_limits'),
            setting('cgroup_limits_gpu_pods', 'dict',
                    [
                        (
                            "The GPU pods of the batch's nodes, as M(gpuharden.k8s.gpu_pods_info) returned them earlier in the same run "
                            '(C(harden_gpu_nodes.yml) lists them once for its plan). Null lists them here, once for the batch.'
                        ),
                    ],
                    default=None,
                    ),
            setting('cgroup_limits_resource_prefixes', 'list',
                    'A pod is a GPU pod when it requests a resource whose name starts with one of these.',
                    elements='str',
                    default=['nvidia.com/'],
                    ),
        ),
    ),
    "container_runtime": role(
        header='',
        entry_points={
            'main': entry('Ensure containerd has the NVIDIA container runtime.',
                          [
                              (
                                  "Adds or corrects containerd's C(nvidia) runtime with gpuharden.k8s.containerd_nvidia_runtime (config version 2 or 3, "
                                  'single file or the conf.d drop-in layout), then restarts containerd and waits until it is active and serving again, '
                                  'in the same module run; a containerd that does not come back gets its files back as they were, is restarted with '
                                  'them, and the host fails.'
                              ),
                              'Sets the fact C(container_runtime_handler) to the runtime name, for the RuntimeClass check.',
                              (
                                  "Where the NVIDIA GPU Operator's container toolkit owns the runtime (its ClusterPolicy, as the plan of "
                                  'C(harden_gpu_nodes.yml) and C(drift_check.yml) reads it, or its layout on the node, C(/usr/local/nvidia/toolkit) and '
                                  "its drop-in), the role changes nothing and reports why (the module's C(refused), and a warning), unless the "
                                  'collection variable C(gpuharden_operator_takeover) (a list of stages, default C([])) names C(container_runtime).'
                              ),
                          ]),
        },
        settings=(
            setting('container_runtime_config', 'path',
                    "containerd's main configuration file on the node.",
                    default='/etc/containerd/config.toml',
                    feeds=('containerd_nvidia_runtime', 'path'),
                    ),
            setting('container_runtime_runtime_name', 'str',
                    'Name of the runtime; the RuntimeClass handler must equal it (a DNS label).',
                    default=NVIDIA_RUNTIME_NAME,
                    feeds=('containerd_nvidia_runtime', 'runtime_name'),
                    ),
            setting('container_runtime_runtime_binary', 'path',
                    'The OCI runtime binary the runc shim runs for it (C(options.BinaryName)).',
                    default='/usr/bin/nvidia-container-runtime',
                    feeds=('containerd_nvidia_runtime', 'binary_name'),
                    ),
            setting('container_runtime_base_runtime', 'str',
                    'The existing runtime whose table and options (C(SystemdCgroup), ...) are copied.',
                    default='runc',
                    feeds=('containerd_nvidia_runtime', 'base_runtime'),
                    ),
            setting('container_runtime_set_as_default', 'bool',
                    "Make the runtime containerd's C(default_runtime_name); V(false) leaves that key alone.",
                    default=False,
                    feeds=('containerd_nvidia_runtime', 'set_as_default'),
                    ),
            setting('container_runtime_enable_cdi', 'bool',
                    [
                        (
                            'Set C(enable_cdi = true) in the CRI plugin where containerd 1.x may read the config (version 2); config versions 3 and '
                            '4 are read only by containerd 2.x, which enables CDI by default (2.4 removed the key), so only an explicit false is '
                            'corrected there. V(false) leaves that key alone.'
                        ),
                        (
                            'Default true where C(device_plugin_device_list_strategy) holds C(cdi-annotations) or C(cdi-cri), else false. containerd '
                            '1.7 drops CDI devices silently without it; V(false) with such a strategy is refused.'
                        ),
                    ],
                    template="{{ device_plugin_device_list_strategy | default(%r) | select('match', '^cdi-') | list | length > 0 }}" % (
                        DEVICE_LIST_STRATEGY,),
                    feeds=('containerd_nvidia_runtime', 'enable_cdi'),
                    ),
            setting('container_runtime_drop_in', 'path',
                    "Drop-in used for config version 3 when the config's C(imports) load it.",
                    default='/etc/containerd/conf.d/99-nvidia.toml',
                    feeds=('containerd_nvidia_runtime', 'drop_in'),
                    ),
            setting('container_runtime_on_missing_runtime_binary', 'str',
                    [
                        'What to do when the runtime binary is missing or not executable on the node.',
                        'C(fail) changes nothing and fails ("install the NVIDIA container toolkit"); C(warn) configures anyway.',
                    ],
                    choices=['fail', 'warn'],
                    default='fail',
                    feeds=('containerd_nvidia_runtime', 'on_missing_runtime_binary'),
                    ),
            setting('container_runtime_backup', 'bool',
                    'Keep a timestamped copy of every existing file that is changed.',
                    default=True,
                    ),
            setting('container_runtime_service', 'str',
                    'The systemd unit restarted after a change.',
                    default='containerd',
                    ),
            setting('container_runtime_restart', 'bool',
                    'Restart containerd when the configuration changed; V(false) only reports C(restart_required).',
                    default=True,
                    ),
            setting('container_runtime_ready_timeout', 'int',
                    [
                        (
                            'Seconds from a restart for containerd to be active and serving on its gRPC socket again; then the host fails. Polled '
                            'every quarter second in the module run that wrote the change.'
                        ),
                    ],
                    default=30,
                    ),
        ),
    ),
    "device_permissions": role(
        header='',
        entry_points={
            'main': entry('Repair NVIDIA device nodes and make their permissions stick',
                          [
                              (
                                  'Runs M(gpuharden.k8s.nvidia_device_nodes) on the node and records which hosts still run the driver with other '
                                  'NVreg_DeviceFile* values (they need a driver reload or a reboot).'
                              ),
                              (
                                  'The policy sticks on /dev/nvidia<N>, /dev/nvidiactl and /dev/nvidia-modeset (NVreg_DeviceFile* options). '
                                  "/dev/nvidia-uvm* stay root:root 0666 and /dev/nvidia-caps/* root:root with the driver's mode under every policy, "
                                  'because nvidia-modprobe resets them to that; a policy asking for more is reported, not applied.'
                              ),
                              (
                                  "Where the NVIDIA GPU Operator's driver container serves the driver (its ClusterPolicy, as the plan of "
                                  'C(harden_gpu_nodes.yml) and C(drift_check.yml) reads it, or a non-empty C(/run/nvidia/driver) on the node), the role '
                                  "changes nothing and reports why (the module's C(refused), and a warning), unless the collection variable "
                                  'C(gpuharden_operator_takeover) (a list of stages, default C([])) names C(device_permissions).'
                              ),
                          ]),
        },
        settings=(
            setting('device_permissions_policy', 'str',
                    [
                        (
                            "V(default) (root:root 0666, the driver's default), V(restricted) (one group, no access for others; pods need the GID in "
                            'securityContext.supplementalGroups) or V(custom), for /dev/nvidia<N>, /dev/nvidiactl and /dev/nvidia-modeset.'
                        ),
                    ],
                    choices=['default', 'restricted', 'custom'],
                    default='default',
                    feeds=('nvidia_device_nodes', 'policy'),
                    ),
            setting('device_permissions_owner', 'raw',
                    'Owner, a user name or uid (restricted/custom only; null = root).',
                    default=None,
                    feeds=('nvidia_device_nodes', 'owner'),
                    feed_as='omit_none',
                    ),
            setting('device_permissions_group', 'raw',
                    'Group, a group name or gid (required for restricted).',
                    default=None,
                    feeds=('nvidia_device_nodes', 'group'),
                    feed_as='omit_none',
                    ),
            setting('device_permissions_mode', 'str',
                    'Mode as a quoted octal string such as "0660" (restricted default "0660"; required for custom).',
                    default=None,
                    feeds=('nvidia_device_nodes', 'mode'),
                    feed_as='omit_none',
                    ),
            setting('device_permissions_create_missing', 'bool',
                    "Create missing device nodes the driver's state calls for.",
                    default=True,
                    feeds=('nvidia_device_nodes', 'create_missing'),
                    ),
            setting('device_permissions_char_links', 'bool',
                    'Create /dev/char/<major>:<minor> links for every managed node.',
                    default=True,
                    feeds=('nvidia_device_nodes', 'char_links'),
                    ),
            setting('device_permissions_persist', 'bool',
                    'Write the modprobe.d options file, and remove the ineffective udev rules earlier versions wrote.',
                    default=True,
                    feeds=('nvidia_device_nodes', 'persist'),
                    ),
            setting('device_permissions_modprobe_file', 'path',
                    'The modprobe.d file for the NVreg_DeviceFile* options.',
                    default='/etc/modprobe.d/zz-gpuharden-nvidia.conf',
                    feeds=('nvidia_device_nodes', 'modprobe_file'),
                    ),
            setting('device_permissions_udev_rules_file', 'path',
                    'The udev rules file earlier versions wrote for nvidia-uvm* and nvidia-caps (its rules never fired; they are removed).',
                    default='/etc/udev/rules.d/70-gpuharden-nvidia.rules',
                    feeds=('nvidia_device_nodes', 'udev_rules_file'),
                    ),
            setting('device_permissions_on_conflict', 'str',
                    'V(warn) or V(fail) (before changing anything) when other settings override ours.',
                    choices=['warn', 'fail'],
                    default='fail',
                    feeds=('nvidia_device_nodes', 'on_conflict'),
                    ),
            setting('device_permissions_backup', 'bool',
                    'Keep a timestamped copy of every changed file.',
                    default=False,
                    ),
        ),
    ),
    "device_plugin": role(
        header=(
            "The API steps run once for the play on the controller; the only node-side step is a stat of the driver's GPU list, to tell GPU hosts "
            'from CPU-only hosts.'
        ),
        entry_points={
            'main': entry('Install or repair the NVIDIA device plugin on the GPU nodes only.',
                          [
                              (
                                  "Labels the play's GPU hosts (a host is one when C(/proc/driver/nvidia/gpus) exists on it, or as C(gpuharden_gpu_node) "
                                  'says) with the GPU label and removes it from its CPU-only hosts, then installs or repairs the device plugin - '
                                  'selecting that label - and waits for its rollout. Both steps are one gpuharden.k8s.device_plugin call (its '
                                  'node_labels option, the options of gpuharden.k8s.gpu_node_labels), with one LIST of Nodes.'
                              ),
                              (
                                  'It runs once for the play on the controller. Registers C(device_plugin_result) (findings, repairs, objects, rollout, '
                                  'refused, and the labelling in C(device_plugin_result.node_labels)).'
                              ),
                          ]),
        },
        settings=(
            *api_access('device_plugin'),
            node_name('device_plugin'),
            setting('device_plugin_gpu_node', 'raw',
                    'Whether this host is a GPU node; null looks for C(/proc/driver/nvidia/gpus) on it.',
                    follows=('gpuharden_gpu_node',),
                    default=None,
                    ),
            setting('device_plugin_version', 'str',
                    'Plugin release (image tag), 0.15.0 or newer.',
                    default=DEVICE_PLUGIN_VERSION,
                    feeds=('device_plugin', 'version'),
                    ),
            setting('device_plugin_image_registry', 'str',
                    'Registry (and path) of the image; change it for an air-gapped mirror.',
                    default='nvcr.io/nvidia',
                    feeds=('device_plugin', 'image_registry'),
                    ),
            setting('device_plugin_image_repository', 'str',
                    'Repository name of the image.',
                    default='k8s-device-plugin',
                    feeds=('device_plugin', 'image_repository'),
                    ),
            setting('device_plugin_pull_policy', 'str',
                    "The container's imagePullPolicy.",
                    choices=['Always', 'IfNotPresent', 'Never'],
                    default='IfNotPresent',
                    feeds=('device_plugin', 'pull_policy'),
                    ),
            setting('device_plugin_image_pull_secrets', 'list',
                    "Secrets in the plugin's namespace to pull the image with.",
                    elements='str',
                    default=[],
                    feeds=('device_plugin', 'image_pull_secrets'),
                    ),
            setting('device_plugin_namespace', 'str',
                    'Namespace of the plugin.',
                    default='kube-system',
                    feeds=('device_plugin', 'namespace'),
                    ),
            setting('device_plugin_name', 'str',
                    "Name of the plugin DaemonSet (the static manifest's, so a static install is adopted).",
                    default='nvidia-device-plugin-daemonset',
                    feeds=('device_plugin', 'name'),
                    ),
            setting('device_plugin_config_map_name', 'str',
                    "Name of the ConfigMap with the plugin's config file.",
                    default='nvidia-device-plugin-config',
                    feeds=('device_plugin', 'config_map_name'),
                    ),
            setting('device_plugin_gpu_label_key', 'str',
                    "The label that marks GPU nodes, and the plugin's nodeSelector.",
                    default='nvidia.com/gpu.present',
                    ),
            setting('device_plugin_gpu_label_value', 'str',
                    'Its value.',
                    default='true',
                    ),
            setting('device_plugin_label_nodes', 'bool',
                    "Label the play's GPU hosts.",
                    default=True,
                    ),
            setting('device_plugin_unlabel_cpu_nodes', 'bool',
                    "Remove the GPU label from the play's CPU-only hosts.",
                    default=True,
                    ),
            setting('device_plugin_taint', 'str',
                    'The C(nvidia.com/gpu:NoSchedule) taint on the GPU hosts - present, absent, or ignore.',
                    choices=['present', 'absent', 'ignore'],
                    default='ignore',
                    ),
            setting('device_plugin_tolerations', 'list',
                    'Tolerations of the plugin pods.',
                    elements='dict',
                    default=[{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}],
                    feeds=('device_plugin', 'tolerations'),
                    ),
            setting('device_plugin_priority_class_name', 'str',
                    'priorityClassName of the plugin pods.',
                    default='system-node-critical',
                    feeds=('device_plugin', 'priority_class_name'),
                    ),
            setting('device_plugin_mig_strategy', 'str',
                    'migStrategy; default C(gpuharden_mig_strategy), else none.',
                    follows=('gpuharden_mig_strategy',), follow_in_python=True,
                    default='none',
                    feeds=('device_plugin', 'mig_strategy'),
                    ),
            setting('device_plugin_device_list_strategy', 'list',
                    'One or more of envvar, volume-mounts, cdi-annotations, cdi-cri.',
                    elements='str',
                    default=DEVICE_LIST_STRATEGY,
                    feeds=('device_plugin', 'device_list_strategy'),
                    ),
            setting('device_plugin_device_id_strategy', 'str',
                    'deviceIDStrategy.',
                    choices=['uuid', 'index'],
                    default='uuid',
                    feeds=('device_plugin', 'device_id_strategy'),
                    ),
            setting('device_plugin_fail_on_init_error', 'bool',
                    'failOnInitError.',
                    default=True,
                    feeds=('device_plugin', 'fail_on_init_error'),
                    ),
            setting('device_plugin_pass_device_specs', 'bool',
                    'passDeviceSpecs.',
                    default=False,
                    feeds=('device_plugin', 'pass_device_specs'),
                    ),
            setting('device_plugin_nvidia_driver_root', 'str',
                    "nvidiaDriverRoot (the driver's root on the node).",
                    default='/',
                    feeds=('device_plugin', 'nvidia_driver_root'),
                    ),
            setting('device_plugin_nvidia_dev_root', 'str',
                    "nvidiaDevRoot (0.16+); null for the plugin's default.",
                    default=None,
                    feeds=('device_plugin', 'nvidia_dev_root'),
                    ),
            setting('device_plugin_shared_devices_allocation_policy', 'str',
                    'sharedDevicesAllocationPolicy (0.20+), distributed or packed; null for the default.',
                    default=None,
                    feeds=('device_plugin', 'shared_devices_allocation_policy'),
                    ),
            setting('device_plugin_time_slicing', 'dict',
                    [
                        (
                            'Time-slicing, for example C({replicas = 4}); null for none. Keys C(replicas) (at least 2), C(resources) (names, or the '
                            "plugin's C({name, replicas}) entries), C(rename_by_default) or C(renameByDefault), C(fail_requests_greater_than_one) or "
                            'C(failRequestsGreaterThanOne).'
                        ),
                        'An unknown key is refused, naming the closest known one; nothing is applied.',
                    ],
                    default=None,
                    feeds=('device_plugin', 'time_slicing'),
                    ),
            setting('device_plugin_gpu_feature_discovery', 'bool',
                    'Also install gpu-feature-discovery.',
                    default=False,
                    feeds=('device_plugin', 'gpu_feature_discovery'),
                    ),
            setting('device_plugin_runtime_class_name', 'str',
                    [
                        "The plugin pods' RuntimeClass (handler = containerd's nvidia runtime); default C(runtime_class_name), else nvidia.",
                        "Empty means nvidia is containerd's default runtime on every GPU node.",
                    ],
                    follows=('runtime_class_name',), follow_in_python=True,
                    default=RUNTIME_CLASS_NAME,
                    feeds=('device_plugin', 'runtime_class_name'),
                    ),
            setting('device_plugin_remove_competing', 'bool',
                    [
                        'Delete the other unowned plugin DaemonSets that only serve nodes the managed plugin serves.',
                        (
                            'Without it such a DaemonSet (the upstream static manifest in another namespace, for example) blocks the apply; nothing '
                            'is applied, and C(device_plugin_result.refused) and a warning name it and the fix.'
                        ),
                        'Objects another installer owns (GPU Operator, Helm, other controllers) are never deleted.',
                    ],
                    default=False,
                    feeds=('device_plugin', 'remove_competing'),
                    ),
            setting('device_plugin_adopt_installers', 'list',
                    'Other installers whose plugin objects may be taken over instead of only reported - [] or [helm].',
                    elements='str',
                    default=[],
                    feeds=('device_plugin', 'adopt_installers'),
                    ),
            setting('device_plugin_force', 'bool',
                    'Delete and create the plugin DaemonSet when its immutable selector differs.',
                    default=False,
                    feeds=('device_plugin', 'force'),
                    ),
            setting('device_plugin_wait', 'bool',
                    'Wait for the rollout.',
                    default=True,
                    feeds=('device_plugin', 'wait'),
                    ),
            setting('device_plugin_wait_timeout', 'int',
                    'Seconds to wait for the rollout.',
                    default=300,
                    feeds=('device_plugin', 'wait_timeout'),
                    ),
        ),
    ),
    "kubelet_topology": role(
        header='',
        entry_points={
            'main': entry('Kubelet Topology, CPU and Memory Manager settings with safe restarts',
                          [
                              (
                                  "Sets the kubelet's Topology, CPU and Memory Manager settings (and any further fields) through "
                                  'M(gpuharden.k8s.kubelet_config), wherever the kubelet really reads them, fixing overriding flags where they live.'
                              ),
                              (
                                  'When a CPU or Memory Manager policy changes, or a checkpoint is already stale, it runs the drain hook, stops the '
                                  'kubelet, removes the stale checkpoints, writes the configuration and starts the kubelet; otherwise it writes the '
                                  'configuration and restarts the kubelet.'
                              ),
                              (
                                  'After any restart it waits for healthz (and Node Ready with a kubeconfig). If the kubelet does not come back it '
                                  "restores the backups, restarts the kubelet again, waits for it and fails the host with the kubelet's reason."
                              ),
                          ]),
            'plan': entry('Kubelet Topology, CPU and Memory Manager settings with safe restarts',
                          [
                              (
                                  "Sets the kubelet's Topology, CPU and Memory Manager settings (and any further fields) through "
                                  'M(gpuharden.k8s.kubelet_config), wherever the kubelet really reads them, fixing overriding flags where they live.'
                              ),
                              (
                                  'When a CPU or Memory Manager policy changes, or a checkpoint is already stale, it runs the drain hook, stops the '
                                  'kubelet, removes the stale checkpoints, writes the configuration and starts the kubelet; otherwise it writes the '
                                  'configuration and restarts the kubelet.'
                              ),
                              (
                                  'After any restart it waits for healthz (and Node Ready with a kubeconfig). If the kubelet does not come back it '
                                  "restores the backups, restarts the kubelet again, waits for it and fails the host with the kubelet's reason."
                              ),
                          ]),
            'apply': entry('Kubelet Topology, CPU and Memory Manager settings with safe restarts',
                           [
                               (
                                   "Sets the kubelet's Topology, CPU and Memory Manager settings (and any further fields) through "
                                   'M(gpuharden.k8s.kubelet_config), wherever the kubelet really reads them, fixing overriding flags where they live.'
                               ),
                               (
                                   'When a CPU or Memory Manager policy changes, or a checkpoint is already stale, it runs the drain hook, stops the '
                                   'kubelet, removes the stale checkpoints, writes the configuration and starts the kubelet; otherwise it writes the '
                                   'configuration and restarts the kubelet.'
                               ),
                               (
                                   'After any restart it waits for healthz (and Node Ready with a kubeconfig). If the kubelet does not come back it '
                                   "restores the backups, restarts the kubelet again, waits for it and fails the host with the kubelet's reason."
                               ),
                           ]),
        },
        settings=(
            setting('kubelet_topology_topology_manager_policy', 'str',
                    'Topology Manager policy; empty leaves it unmanaged.',
                    choices=['', 'none', 'best-effort', 'restricted', 'single-numa-node'],
                    default='single-numa-node',
                    feeds=('kubelet_config', 'topology_manager_policy'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_topology_manager_scope', 'str',
                    'Topology Manager scope; empty leaves it unmanaged.',
                    choices=['', 'container', 'pod'],
                    default='container',
                    feeds=('kubelet_config', 'topology_manager_scope'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_topology_manager_policy_options', 'dict',
                    [
                        (
                            'topologyManagerPolicyOptions to set - prefer-closest-numa-nodes (true/false) and max-allowable-numa-nodes (an integer '
                            'of at least 8; the kubelet does not start with a smaller one). Anything else is refused.'
                        ),
                    ],
                    default={},
                    feeds=('kubelet_config', 'topology_manager_policy_options'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_numa_over_limit', 'str',
                    [
                        (
                            'Where the Topology Manager policy is not none and the node has more NUMA nodes than max-allowable-numa-nodes allows (8 '
                            'unless set; Grace Hopper and Grace Blackwell GPU memory counts), the kubelet would not start. V(raise) sets '
                            "max-allowable-numa-nodes to the node's count and warns (the kubelet logs a warning above 8); V(keep_policy) keeps the "
                            "node's policy and reports it as refused."
                        ),
                        'Raising is refused anyway with memoryManagerPolicy Static (its hints span every subset of all NUMA nodes).',
                    ],
                    choices=['raise', 'keep_policy'],
                    default='raise',
                    feeds=('kubelet_config', 'numa_over_limit'),
                    ),
            setting('kubelet_topology_cpu_manager_policy', 'str',
                    [
                        'CPU Manager policy; empty (the default) leaves it unmanaged. static needs reserved CPUs.',
                        "A change drains the node and stops the kubelet, within the run's disruption budget.",
                    ],
                    choices=['', 'none', 'static'],
                    default='',
                    feeds=('kubelet_config', 'cpu_manager_policy'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_reserved_system_cpus', 'str',
                    'reservedSystemCPUs as a CPU list; empty (the default) leaves it unmanaged.',
                    default='',
                    feeds=('kubelet_config', 'reserved_system_cpus'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_memory_manager_policy', 'str',
                    'Memory Manager policy; empty leaves it unmanaged. Static needs reserved memory.',
                    choices=['', 'None', 'Static'],
                    default='',
                    feeds=('kubelet_config', 'memory_manager_policy'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_reserved_memory', 'list',
                    'reservedMemory entries, {numaNode, limits}.',
                    elements='dict',
                    default=[],
                    feeds=('kubelet_config', 'reserved_memory'),
                    feed_as='omit_empty',
                    ),
            setting('kubelet_topology_extra_settings', 'dict',
                    [
                        'Further KubeletConfiguration fields, deep-merged (MemoryQoS from the cgroup_limits role).',
                        'Defaults to C(gpuharden_kubelet_extra_settings), the name other roles pass.',
                    ],
                    follows=('gpuharden_kubelet_extra_settings',), follow_in_python=True,
                    default={},
                    ),
            setting('kubelet_topology_flavor', 'str',
                    'How the kubelet is installed.',
                    choices=['auto', 'kubeadm', 'k3s', 'rke2'],
                    default='auto',
                    feeds=('kubelet_config', 'flavor'),
                    ),
            setting('kubelet_topology_service', 'str',
                    "The kubelet's systemd service, or auto.",
                    default='auto',
                    feeds=('kubelet_config', 'service'),
                    ),
            setting('kubelet_topology_on_flag_conflict', 'str',
                    'What to do about a flag that overrides a managed field.',
                    choices=['fix', 'fail'],
                    default='fix',
                    feeds=('kubelet_config', 'on_flag_conflict'),
                    ),
            setting('kubelet_topology_dropin_name', 'str',
                    'Drop-in written where the kubelet reads a --config-dir.',
                    default='50-gpuharden.conf',
                    feeds=('kubelet_config', 'dropin_name'),
                    ),
            setting('kubelet_topology_kubeadm_config_dir', 'str',
                    [
                        (
                            'kubeadm nodes whose kubelet (v1.32 or later) reads no --config-dir - the drop-in directory the role gives it through '
                            'KUBELET_EXTRA_ARGS (/etc/default/kubelet or /etc/sysconfig/kubelet), so the settings outlast C(kubeadm upgrade node). '
                            'Empty keeps them in /var/lib/kubelet/config.yaml, which that upgrade rewrites.'
                        ),
                    ],
                    default='/etc/kubernetes/kubelet.conf.d',
                    feeds=('kubelet_config', 'kubeadm_config_dir'),
                    ),
            setting('kubelet_topology_require_durable', 'bool',
                    [
                        (
                            'Refuse to write settings that C(kubeadm upgrade node) would revert; nothing is written nor restarted on such a node, '
                            'and a warning says why.'
                        ),
                    ],
                    default=False,
                    feeds=('kubelet_config', 'require_durable'),
                    feed_as='bool',
                    ),
            setting('kubelet_topology_drain_tasks', 'str',
                    'Task file included before the kubelet is stopped for a manager policy change (drain there).',
                    default='',
                    ),
            setting('kubelet_topology_drain', 'bool',
                    [
                        (
                            'Without kubelet_topology_drain_tasks, cordon and drain with role gpuharden.k8s.node_maintenance before a manager policy '
                            'change, and uncordon after the kubelet is healthy again.'
                        ),
                    ],
                    default=True,
                    ),
            setting('kubelet_topology_uncordon_tasks', 'str',
                    'Task file included after the kubelet came back from such a change (uncordon there).',
                    default='',
                    ),
            setting('kubelet_topology_healthz_url', 'str',
                    "The kubelet's healthz endpoint, polled on the node.",
                    default='http://127.0.0.1:10248/healthz',
                    ),
            setting('kubelet_topology_health_timeout', 'int',
                    'Seconds to wait for the kubelet to become healthy before rolling back.',
                    default=120,
                    ),
            setting('kubelet_topology_health_delay', 'int',
                    [
                        (
                            'Deprecated, no effect: the kubelet write, its restart, the health wait and the rollback run in one kubelet_config run, '
                            'which polls healthz every quarter second. Still accepted (and checked to be at most kubelet_topology_health_timeout) '
                            'so that inventories that set it keep working.'
                        ),
                    ],
                    default=2,
                    ),
            setting('kubelet_topology_kubeconfig', 'str',
                    'Kubeconfig on the node for a Node Ready wait with kubectl; empty skips it.',
                    default='',
                    ),
            setting('kubelet_topology_node_name', 'str',
                    'Node name for the Ready wait.',
                    follows=('inventory_hostname',),
                    ),
            setting('kubelet_topology_log_file', 'str',
                    'Kubelet log file reported on failure; empty means /var/log/<service>.log, else the journal.',
                    default='',
                    ),
            setting('kubelet_topology_log_lines', 'int',
                    "Lines of the kubelet's log reported on failure.",
                    default=15,
                    ),
            setting('kubelet_topology_admission_check', 'bool',
                    [
                        (
                            'Before a switch to restricted or single-numa-node, check that the GPU workloads that can land on the node could still '
                            "be admitted; where one could not, keep the node's manager settings and report it."
                        ),
                    ],
                    default=True,
                    ),
            setting('kubelet_topology_ignore_unadmittable_workloads', 'bool',
                    'Switch anyway where workloads could no longer be admitted.',
                    default=False,
                    ),
            setting('kubelet_topology_gpu_resources', 'list',
                    'Extended resources that count as GPUs for the admission check.',
                    elements='str',
                    default=['nvidia.com/gpu'],
                    ),
            setting('kubelet_topology_controller_kubeconfig', 'str',
                    'kubeconfig on the controller for listing the workloads; empty uses the default or in-cluster account.',
                    follows=('gpuharden_kubeconfig',),
                    default='',
                    ),
            controller_python('kubelet_topology'),
        ),
    ),
    "mig": role(
        header='',
        entry_points={
            'main': entry("Apply a MIG layout to this host's GPUs, with drain, reset and re-apply",
                          [
                              (
                                  'Plans with module C(gpuharden.k8s.mig_layout) in check mode; when something must change, cordons and drains the node '
                                  '(role C(gpuharden.k8s.node_maintenance)), applies, resets the GPUs whose mode change is pending (or reboots), applies '
                                  'again, and uncordons.'
                              ),
                              'Sets C(mig_result) (the last module result, with C(advertised_resources) and C(findings)).',
                              (
                                  "Where the NVIDIA GPU Operator's MIG manager owns the node's layout (its ClusterPolicy's C(spec.migManager) and the "
                                  'node label C(nvidia.com/gpu.deploy.mig-manager), as the plan of C(harden_gpu_nodes.yml) reads them, so that the '
                                  "plan's C(node_audit) refuses its mig check), nothing is planned, drained or applied, and C(mig_result) holds the "
                                  'C(refused) entries, unless the collection variable C(gpuharden_operator_takeover) names C(mig). Run alone, without '
                                  'that plan, the role cannot see the MIG manager, which leaves nothing on the node.'
                              ),
                          ]),
            'plan': entry("Apply a MIG layout to this host's GPUs, with drain, reset and re-apply",
                          [
                              (
                                  'Plans with module C(gpuharden.k8s.mig_layout) in check mode; when something must change, cordons and drains the node '
                                  '(role C(gpuharden.k8s.node_maintenance)), applies, resets the GPUs whose mode change is pending (or reboots), applies '
                                  'again, and uncordons.'
                              ),
                              'Sets C(mig_result) (the last module result, with C(advertised_resources) and C(findings)).',
                              (
                                  "Where the NVIDIA GPU Operator's MIG manager owns the node's layout (its ClusterPolicy's C(spec.migManager) and the "
                                  'node label C(nvidia.com/gpu.deploy.mig-manager), as the plan of C(harden_gpu_nodes.yml) reads them, so that the '
                                  "plan's C(node_audit) refuses its mig check), nothing is planned, drained or applied, and C(mig_result) holds the "
                                  'C(refused) entries, unless the collection variable C(gpuharden_operator_takeover) names C(mig). Run alone, without '
                                  'that plan, the role cannot see the MIG manager, which leaves nothing on the node.'
                              ),
                          ]),
            'apply': entry("Apply a MIG layout to this host's GPUs, with drain, reset and re-apply",
                           [
                               (
                                   'Plans with module C(gpuharden.k8s.mig_layout) in check mode; when something must change, cordons and drains the node '
                                   '(role C(gpuharden.k8s.node_maintenance)), applies, resets the GPUs whose mode change is pending (or reboots), applies '
                                   'again, and uncordons.'
                               ),
                               'Sets C(mig_result) (the last module result, with C(advertised_resources) and C(findings)).',
                               (
                                   "Where the NVIDIA GPU Operator's MIG manager owns the node's layout (its ClusterPolicy's C(spec.migManager) and the "
                                   'node label C(nvidia.com/gpu.deploy.mig-manager), as the plan of C(harden_gpu_nodes.yml) reads them, so that the '
                                   "plan's C(node_audit) refuses its mig check), nothing is planned, drained or applied, and C(mig_result) holds the "
                                   'C(refused) entries, unless the collection variable C(gpuharden_operator_takeover) names C(mig). Run alone, without '
                                   'that plan, the role cannot see the MIG manager, which leaves nothing on the node.'
                               ),
                           ]),
        },
        settings=(
            setting('mig_layout', 'dict',
                    'Short form, for example C({all: {"1g.10gb": 7}}); default C(gpuharden_mig_layout).',
                    follows=('gpuharden_mig_layout',), follow_in_python=True,
                    default={},
                    feeds=('mig_layout', 'layout'),
                    feed_as='omit_empty',
                    ),
            setting('mig_config', 'dict',
                    'A mig-parted v1 configuration as data.',
                    default={},
                    feeds=('mig_layout', 'config'),
                    feed_as='omit_empty',
                    ),
            setting('mig_config_file', 'str',
                    'Path of a mig-parted v1 file on the node.',
                    default='',
                    feeds=('mig_layout', 'config_file'),
                    feed_as='omit_empty',
                    ),
            setting('mig_selected', 'str',
                    'The mig-configs entry to apply with C(mig_config) or C(mig_config_file).',
                    default='',
                    feeds=('mig_layout', 'selected'),
                    feed_as='omit_empty',
                    ),
            setting('mig_strategy', 'str',
                    "The device plugin's MIG strategy; layouts it cannot serve are reported.",
                    choices=['none', 'single', 'mixed'],
                    default='mixed',
                    feeds=('mig_layout', 'strategy'),
                    ),
            setting('mig_force', 'bool',
                    'Act on GPUs that still run processes.',
                    default=False,
                    feeds=('mig_layout', 'force'),
                    feed_as='bool',
                    ),
            setting('mig_drain', 'bool',
                    'Cordon and drain before a change, uncordon after success.',
                    default=True,
                    ),
            setting('mig_restart_device_plugin', 'bool',
                    [
                        (
                            "After a layout change, evict the node's NVIDIA device plugin pods (any installer's) before the node is uncordoned, so "
                            'that their DaemonSets start them again; the plugin enumerates the MIG devices only when it starts.'
                        ),
                    ],
                    default=True,
                    ),
            node_name('mig'),
            setting('mig_reset_method', 'str',
                    'How a pending mode change is completed.',
                    choices=['command', 'reboot', 'none'],
                    default='command',
                    ),
            setting('mig_reset_command', 'list',
                    'GPU reset argv; C(mig_gpus_to_reset) holds the bus ids. Default C(nvidia-smi -r -i <bus ids>).',
                    elements='str',
                    template=['nvidia-smi', '-r', '-i', "{{ mig_gpus_to_reset | default([]) | join(',') }}"],
                    ),
            setting('mig_reboot_timeout', 'int',
                    'Seconds to wait for the node after a reboot.',
                    default=900,
                    ),
            setting('mig_root', 'str',
                    "Root under which the node's filesystem is visible to the module.",
                    default='/',
                    feeds=('mig_layout', 'root'),
                    ),
        ),
    ),
    "node_maintenance": role(
        header='',
        entry_points={
            'main': entry("Cordon and drain, or uncordon, this host's Kubernetes node",
                          [
                              (
                                  "Runs on the controller (delegate_to localhost) with module C(gpuharden.k8s.node_maintenance); honours the play's "
                                  'C(serial) batches, one node per host.'
                              ),
                              (
                                  'Evictions go through the Eviction API, so PodDisruptionBudgets hold; a blocked eviction fails the host after '
                                  'C(node_maintenance_timeout) and is never forced. DaemonSet and mirror pods stay.'
                              ),
                          ]),
            'cordon_drain': entry("Cordon and drain this host's node before a disruptive change",
                                  [
                                      (
                                          'Include with C(tasks_from=cordon_drain) before restarting the kubelet or changing MIG; remembers '
                                          'whether the node was already cordoned, for C(uncordon).'
                                      ),
                                  ]),
            'uncordon': entry("Make this host's node schedulable again after the change",
                              ['Include with C(tasks_from=uncordon); leaves a node cordoned that was cordoned before C(cordon_drain) ran.']),
            'restart_device_plugin': entry("Restart the NVIDIA device plugin's pods of this host's node (after a MIG layout change)",
                                           [
                                               (
                                                   "Include with C(tasks_from=restart_device_plugin); evicts the device plugin's pods of the node "
                                                   "(any installer's) so that their DaemonSets start them again and the plugin enumerates the GPUs "
                                                   "anew, and waits until they are gone. Leaves the node's cordon as it is."
                                               ),
                                           ]),
            'budget': entry('The fleet-wide disruption budget, checked at the start of a batch of disruptive steps',
                            [
                                (
                                    'Include with C(tasks_from=budget) in a play whose C(serial) batches run disruptive steps; the hosts of the batch that '
                                    'may not start theirs fail with the reason before anything is cordoned.'
                                ),
                                'Runs M(gpuharden.k8s.disruption_budget) once per batch on the controller.',
                            ]),
        },
        settings=(
            setting('node_maintenance_state', 'str',
                    'V(drained) cordons and evicts, V(cordoned) only cordons, V(uncordoned) makes the node schedulable.',
                    choices=['drained', 'cordoned', 'uncordoned'],
                    default='drained',
                    entry_points=('main',),
                    ),
            node_name('node_maintenance'),
            *api_access('node_maintenance', follow_in_python=True),
            setting('node_maintenance_force', 'bool',
                    'Also evict pods without a controller. Never overrides a PodDisruptionBudget.',
                    default=False,
                    entry_points=('main', 'cordon_drain'),
                    ),
            setting('node_maintenance_delete_emptydir_data', 'bool',
                    'Also evict pods with emptyDir volumes (their data is lost).',
                    default=False,
                    entry_points=('main', 'cordon_drain'),
                    ),
            setting('node_maintenance_grace_period', 'int',
                    "Seconds each pod gets to terminate; 0 or less uses the pod's own.",
                    default=-1,
                    entry_points=('main', 'cordon_drain'),
                    ),
            setting('node_maintenance_timeout', 'int',
                    'Seconds for the whole drain; blocked evictions are retried until then, then the host fails.',
                    default=300,
                    entry_points=('main', 'cordon_drain', 'restart_device_plugin'),
                    entry_docs={'restart_device_plugin': 'Seconds for the evictions and for the old plugin pods to be gone.'},
                    ),
            setting('node_maintenance_retry_interval', 'int',
                    'Seconds between retries of an eviction a PodDisruptionBudget refused.',
                    default=5,
                    entry_points=('main', 'cordon_drain'),
                    ),
            setting('node_maintenance_keep_preexisting_cordon', 'bool',
                    'Leave a node cordoned that was already cordoned before cordon_drain ran in this play.',
                    default=True,
                    entry_points=('main', 'uncordon'),
                    ),
            setting('node_maintenance_ready_timeout', 'int',
                    [
                        (
                            "Seconds uncordon waits for the Node's Ready condition to be True before it clears C(spec.unschedulable); a node not "
                            'Ready by then stays cordoned and the host fails. 0 uncordons at once.'
                        ),
                        (
                            "After a kubelet restart, healthz answers before the kubelet has posted its status; until then the next batch's "
                            'disruption budget would count the node as unavailable.'
                        ),
                    ],
                    default=120,
                    entry_points=('main', 'uncordon'),
                    ),
            setting('node_maintenance_max_unavailable', 'raw',
                    [
                        'The most GPU nodes unavailable at once, a count or a percentage of the GPU fleet (rounded down, at least one).',
                        'Default C(gpuharden_max_unavailable), else 1.',
                    ],
                    follows=('gpuharden_max_unavailable',), follow_in_python=True,
                    default=1,
                    entry_points=('main', 'cordon_drain', 'budget'),
                    ),
            setting('node_maintenance_fleet', 'list',
                    "The run's target nodes; every GPU node of the cluster is added to them.",
                    elements='str',
                    default=[],
                    entry_points=('main', 'cordon_drain', 'budget'),
                    ),
            setting('node_maintenance_budget_wanted', 'bool',
                    'Whether this host wants a disruptive step in this batch.',
                    default=True,
                    entry_points=('budget',),
                    ),
            setting('node_maintenance_out_of_service_taints', 'list',
                    'Taint keys of nodes that serve no workloads yet (they neither count nor need a slot).',
                    elements='str',
                    default=[],
                    entry_points=('main', 'cordon_drain', 'budget'),
                    ),
            setting('node_maintenance_stop_on_failure', 'bool',
                    'A host that failed earlier in the play stops every later disruptive step.',
                    default=True,
                    entry_points=('budget',),
                    ),
            setting('node_maintenance_stopped_by', 'list',
                    'Nodes whose disruptive step failed earlier in the rollout without failing their host; they stop it too.',
                    elements='str',
                    default=[],
                    entry_points=('budget',),
                    ),
            setting('node_maintenance_owner', 'str',
                    [
                        (
                            'The run that cordons, recorded with each cordon (annotation C(gpuharden.io/cordon)); default C(gpuharden_run_owner), '
                            'else C(node_maintenance@<controller host name>).'
                        ),
                        (
                            'A cordon whose run ended without uncordoning it is reported by the drift check (C(node_left_cordoned)) and released or '
                            "resumed by the next harden; a cordon without the record (someone else's) is left as it is."
                        ),
                    ],
                    follows=('gpuharden_run_owner',), follow_in_python=True,
                    default='',
                    entry_points=('main', 'cordon_drain', 'uncordon'),
                    ),
            setting('node_maintenance_purpose', 'str',
                    'What the cordon is for, recorded with it (the stage, for example V(kubelet_topology) or V(mig)).',
                    default='',
                    entry_points=('main', 'cordon_drain'),
                    ),
            setting('node_maintenance_budget_check', 'bool',
                    [
                        (
                            "Check the fleet's disruption budget (entry point C(budget)) before the cordon, once per batch, so that no more nodes "
                            "are cordoned at once than the budget allows whatever the play's C(serial); the hosts over it fail with the reason "
                            'before anything changes. A host that C(budget) already allowed in this play and batch is not checked again.'
                        ),
                    ],
                    default=True,
                    entry_points=('main', 'cordon_drain'),
                    ),
        ),
    ),
    "node_prerequisites": role(
        header="Runs on each node: a venv for gpuharden's node-side modules, outside the distribution's Python (PEP 668).",
        entry_points={
            'main': entry("Give each node a Python venv with the packages gpuharden's node-side modules import.",
                          [
                              (
                                  'Creates the venv C(node_prerequisites_venv) on the node and installs C(node_prerequisites_packages) into it with '
                                  'gpuharden.k8s.node_venv, from the index or from wheels copied from the controller (C(node_prerequisites_wheels)). A '
                                  "venv is outside PEP 668, so this works where C(pip install) into the distribution's Python fails with "
                                  'C(externally-managed-environment).'
                              ),
                              (
                                  "Sets the fact C(node_prerequisites_venv_python) to the venv's Python once the venv holds every package (not in check "
                                  'mode before the venv exists); the playbooks run their node tasks with it. Registers C(node_prerequisites_result).'
                              ),
                          ]),
        },
        settings=(
            setting('node_prerequisites_venv', 'str',
                    "The venv's directory on the node (absolute).",
                    default='/opt/gpuharden/venv',
                    ),
            setting('node_prerequisites_packages', 'list',
                    'pip requirements of the node-side modules (the C(node) extra of the gpuharden distribution).',
                    elements='str',
                    default=['nvidia-ml-py>=12.535,<14', 'ruamel.yaml>=0.18,<0.20', 'tomlkit>=0.13,<0.16', 'PyYAML>=6,<7'],
                    ),
            setting('node_prerequisites_system_python', 'str',
                    'The Python that creates the venv; empty uses the Python Ansible runs on the node.',
                    default='',
                    ),
            setting('node_prerequisites_index_url', 'str',
                    "The package index; empty uses pip's default or the node's pip.conf. Not used with wheels.",
                    default='',
                    ),
            setting('node_prerequisites_wheels', 'str',
                    [
                        (
                            'A directory on the controller with wheels of every package and its dependencies, for air-gapped nodes; they are copied '
                            'to C(node_prerequisites_wheels_dest) and installed from there alone (pip C(--no-index)). Empty installs from the index.'
                        ),
                    ],
                    default='',
                    ),
            setting('node_prerequisites_wheels_dest', 'str',
                    'Where the wheels go on the node (absolute).',
                    default='/opt/gpuharden/wheels',
                    ),
        ),
    ),
    "postcheck": role(
        header=(
            'The role is read-only. Run it as root on the nodes (the unprivileged NVML check forks and drops to postcheck_unprivileged_user); the '
            'Kubernetes and topology steps run on the controller.'
        ),
        entry_points={
            'main': entry('Prove a GPU node is fixed, with structured findings',
                          [
                              (
                                  'Read-only. Runs M(gpuharden.k8s.nvml_check) on the node (NVML as root and as an unprivileged user, GPU and MIG '
                                  "counts, ECC, row remapping, lost GPUs, PCIe link training, NVLink, GPU processes), reads the kubelet's effective "
                                  "topology and CPU policies, lists the cluster's GPU workloads once on the controller and weighs them against every "
                                  'node of the batch in the same module run (the check M(gpuharden.k8s.topology_check) makes for one node); optionally '
                                  'the eBPF device-cgroup audit (M(gpuharden.k8s.device_cgroup_audit)) and the three-state consistency check '
                                  '(M(gpuharden.k8s.gpu_consistency)). With the consistency check, that one run (M(gpuharden.k8s.gpu_consistency) with '
                                  'its C(topology) option) does both from one LIST of Nodes and pods; without it, M(gpuharden.k8s.gpu_workloads_info) '
                                  'with its C(topology) option weighs the workloads.'
                              ),
                              (
                                  'Every finding (C(id), C(severity), C(node), C(gpu), C(pod), C(expected), C(found), C(hint)) goes into the fact '
                                  'C(postcheck_findings) and, for the whole run, into the custom stat C(gpuharden_postcheck_findings). The host fails '
                                  'when a finding is at or above O(postcheck_fail_severity).'
                              ),
                              'Run as root on the nodes.',
                          ]),
        },
        settings=(
            setting('postcheck_fail_severity', 'str',
                    [
                        'Fail the host on a finding of this severity or higher; V(never) only reports.',
                        'Default C(gpuharden_postcheck_fail_severity), else V(error).',
                    ],
                    choices=FAIL_CHOICES,
                    follows=('gpuharden_postcheck_fail_severity',), follow_in_python=True,
                    default='error',
                    ),
            setting('postcheck_fail_in_check_mode', 'bool',
                    [
                        'In check mode, fail the host as a real run would (V(true)), or only report the findings (V(false)).',
                        'C(harden_gpu_nodes) sets V(false) - in check mode it made none of the changes the post-check would verify.',
                    ],
                    default=True,
                    ),
            setting('postcheck_node_name', 'str',
                    "The node's Kubernetes name (default C(inventory_hostname)).",
                    follows=('inventory_hostname',), follow_in_python=True,
                    ),
            setting('postcheck_nvml', 'bool',
                    'Run the NVML post-check.',
                    default=True,
                    ),
            setting('postcheck_unprivileged_user', 'str',
                    'User (name or uid) of the unprivileged NVML check.',
                    default='nobody',
                    ),
            setting('postcheck_unprivileged_groups', 'list',
                    'Supplementary groups the unprivileged check keeps (names or gids).',
                    elements='str',
                    default=[],
                    ),
            setting('postcheck_expected_gpus', 'int',
                    'GPUs the node should have; null does not compare.',
                    default=None,
                    ),
            setting('postcheck_expected_mig_devices', 'int',
                    'MIG devices the node should have; null does not compare.',
                    default=None,
                    ),
            setting('postcheck_topology', 'bool',
                    'Run the topology feasibility check (needs O(postcheck_nvml) for the GPU layout).',
                    default=True,
                    ),
            setting('postcheck_topology_manager_policy', 'str',
                    "The kubelet's topologyManagerPolicy; empty reads the effective value on the node.",
                    choices=['', 'none', 'best-effort', 'restricted', 'single-numa-node'],
                    default='',
                    ),
            setting('postcheck_topology_manager_scope', 'str',
                    "The kubelet's topologyManagerScope; empty reads the effective value on the node.",
                    choices=['', 'container', 'pod'],
                    default='',
                    ),
            setting('postcheck_cpu_manager_policy', 'str',
                    "The kubelet's cpuManagerPolicy; empty reads the effective value on the node.",
                    choices=['', 'none', 'static'],
                    default='',
                    ),
            setting('postcheck_collect_workloads', 'bool',
                    "List the cluster's GPU workloads on the controller (one LIST per kind) for the topology check.",
                    default=True,
                    ),
            setting('postcheck_gpu_resources', 'list',
                    'Extended resources that count as GPUs in workloads.',
                    elements='str',
                    default=['nvidia.com/gpu'],
                    ),
            *api_access('postcheck', follow_in_python=True),
            setting('postcheck_device_audit', 'bool',
                    ['Run the eBPF device-cgroup isolation audit on the node. Default C(gpuharden_postcheck_device_audit), else true.'],
                    follows=('gpuharden_postcheck_device_audit',), follow_in_python=True,
                    default=True,
                    ),
            setting('postcheck_cgroup_root', 'str',
                    "The node's cgroup2 mount that holds the device programs (default /sys/fs/cgroup).",
                    default='/sys/fs/cgroup',
                    ),
            setting('postcheck_audit_devices', 'list',
                    'Device nodes (node paths) the audit evaluates; empty = every NVIDIA device node on the node.',
                    elements='str',
                    default=[],
                    ),
            setting('postcheck_audit_accesses', 'list',
                    'Accesses the audit decides (V(r), V(w), V(m), V(rw)).',
                    elements='str',
                    default=['r', 'w', 'm'],
                    ),
            setting('postcheck_audit_allocations', 'list',
                    [
                        (
                            "The device plugin's allocations for the audit (see M(gpuharden.k8s.device_cgroup_audit) option C(allocations)); null "
                            "takes them from the kubelet's pod-resources API where it answers on the node, else only reports which container can "
                            'open which GPU.'
                        ),
                    ],
                    elements='dict',
                    default=None,
                    ),
            setting('postcheck_consistency', 'bool',
                    [
                        (
                            'Run the three-state (declared, allocated, used) consistency check once for the play, on the controller. Default '
                            'C(gpuharden_postcheck_consistency), else true.'
                        ),
                    ],
                    follows=('gpuharden_postcheck_consistency',), follow_in_python=True,
                    default=True,
                    ),
            setting('postcheck_advertise_settle_seconds', 'int',
                    [
                        (
                            'Seconds the consistency check waits, re-reading every 3 s, while a node does not advertise what it has '
                            '(C(gpu_not_advertised), C(gpu_partially_advertised), C(mig_not_advertised)). Right after a change to the device plugin, '
                            "the kubelet or MIG this is the plugin registering and the kubelet's next node status update. V(0) reads once."
                        ),
                    ],
                    default=0,
                    ),
            setting('postcheck_advertise_settle_this_node', 'bool',
                    [
                        (
                            "Whether this node's advertised resources may still be changing because the run changed its device plugin, kubelet or "
                            'MIG layout. The wait of O(postcheck_advertise_settle_seconds) covers only such nodes, so a node that was already broken '
                            'is reported at once.'
                        ),
                    ],
                    default=True,
                    ),
            setting('postcheck_kubelet_restarted_at', 'float',
                    [
                        (
                            "When this run restarted the node's kubelet, on the node's clock (seconds since the epoch, the C(health.restarted_at) of "
                            'M(gpuharden.k8s.kubelet_config)); null when it did not.'
                        ),
                        (
                            'The consistency check then judges the node only from a Node status the new kubelet posted (its Ready heartbeat after '
                            'the restart), and waits for one within O(postcheck_advertise_settle_seconds); a node whose new kubelet posted none by '
                            "then gets C(kubelet_status_not_posted). Until its first status the Node still shows the old kubelet's allocatable, "
                            'while the new kubelet advertises no GPU until the device plugin registers again.'
                        ),
                    ],
                    default=None,
                    ),
            setting('postcheck_node_audit', 'dict',
                    [
                        (
                            'A M(gpuharden.k8s.node_audit) result of this node from earlier in the same run, with nothing changed on the node since, '
                            "run with this role's audit options (C(postcheck_audit_nvml_options), C(postcheck_audit_device_cgroup_options)); the "
                            'post-check takes the NVML, GPU-process, device-cgroup and kubelet-policy results from it instead of reading the node '
                            "again (C(harden_gpu_nodes.yml) passes its plan's audit for a node none of its stages touched). Null reads the node."
                        ),
                    ],
                    default=None,
                    ),
            setting('postcheck_lock', 'dict',
                    [
                        (
                            'Where C(postcheck_node_audit) is null, the post-check reads the node in one M(gpuharden.k8s.node_audit) run; this is '
                            "that run's O(gpuharden.k8s.node_audit#module:lock) option (C(owner), C(path), C(timeout)). That run takes the node's "
                            'run lock, or keeps it where this owner holds it already, and gives it back after its reads.'
                        ),
                        (
                            "C(harden_gpu_nodes.yml) passes its run lock, so the post-check's read gives it back and no further trip is needed. Null "
                            'takes no lock.'
                        ),
                    ],
                    default=None,
                    ),
        ),
    ),
    "runtime_class": role(
        header='Runs once for the play on the controller.',
        entry_points={
            'main': entry("Ensure the NVIDIA RuntimeClass matches containerd's runtime.",
                          [
                              (
                                  'Applies the RuntimeClass with gpuharden.k8s.runtime_class once for the play, on the controller. Its handler is the '
                                  'C(container_runtime_handler) fact of role container_runtime (every host of the play must report the same), else '
                                  'C(nvidia). Reports RuntimeClasses with C(nvidia.com/*) in C(overhead.podFixed), and target Nodes whose '
                                  'C(status.runtimeHandlers) lacks the handler. Registers C(runtime_class_result).'
                              ),
                          ]),
        },
        settings=(
            *api_access('runtime_class'),
            setting('runtime_class_name', 'str',
                    'Name of the RuntimeClass.',
                    default=RUNTIME_CLASS_NAME,
                    feeds=('runtime_class', 'name'),
                    ),
            setting('runtime_class_handler', 'str',
                    "containerd's runtime name; default the C(container_runtime_handler) fact, else nvidia.",
                    follows=('container_runtime_handler',), follow_in_python=True,
                    default=NVIDIA_RUNTIME_NAME,
                    feeds=('runtime_class', 'handler'),
                    ),
            setting('runtime_class_node_selector', 'dict',
                    'scheduling.nodeSelector.',
                    default={},
                    feeds=('runtime_class', 'node_selector'),
                    ),
            setting('runtime_class_tolerations', 'list',
                    'scheduling.tolerations.',
                    elements='dict',
                    default=[],
                    feeds=('runtime_class', 'tolerations'),
                    ),
            setting('runtime_class_overhead_pod_fixed', 'dict',
                    'overhead.podFixed, cpu/memory only.',
                    default={},
                    feeds=('runtime_class', 'overhead_pod_fixed'),
                    ),
            setting('runtime_class_force', 'bool',
                    'Delete and create the RuntimeClass when its immutable handler differs.',
                    default=False,
                    ),
            setting('runtime_class_nodes', 'list',
                    [
                        (
                            'Node names whose C(status.runtimeHandlers) must list the handler; empty checks every Node matching the nodeSelector, '
                            'else every GPU node. A Node lacking it is finding C(runtime_class_handler_missing_on_node), fixed by role '
                            'container_runtime on that node.'
                        ),
                    ],
                    elements='str',
                    default=[],
                    ),
        ),
    ),
}


PLAYBOOK_VARIABLES = (
    section('Every playbook'),
    variable('gpuharden_target_hosts', 'raw',
             'Inventory group or host pattern the playbook runs on (gpu_nodes).',
             play_keyword='hosts',
             default='gpu_nodes',
             ),
    variable('gpuharden_serial', 'raw',
             'Batch size of harden and bootstrap runs (100%).',
             format='serial',
             play_keyword='serial',
             default='100%',
             ),
    variable('gpuharden_max_fail_percentage', 'raw',
             'Share of failed hosts that stops a harden (0) or bootstrap (100) run.',
             format='percentage',
             play_keyword='max_fail_percentage',
             by_playbook={'harden_gpu_nodes': 0, 'bootstrap_gpu_node': 100},
             ),
    variable('gpuharden_k8s_node_name', 'str',
             "The host's Kubernetes Node name (inventory_hostname); every role's *_node_name follows it.",
             ),
    variable('gpuharden_kubeconfig', 'str',
             'kubeconfig on the controller for every API call ("" = default kubeconfig or in-cluster account).',
             default='',
             ),
    variable('gpuharden_run_owner', 'str',
             (
                 "Name of this run in the nodes' run locks and cordon records (unset: each playbook makes one up from the time and a random "
                 'number; a role run alone records none, "").'
             ),
             default='',
             ),
    variable('gpuharden_lock_path', 'str',
             "The node's run lock file (/run/gpuharden/run.lock).",
             default='/run/gpuharden/run.lock',
             ),
    variable('gpuharden_lock_timeout', 'int',
             "Seconds to wait for another run's lock (harden and bootstrap 600, drift check 60).",
             by_playbook={'harden_gpu_nodes': 600, 'bootstrap_gpu_node': 600, 'unharden_gpu_nodes': 600, 'drift_check': 60},
             ),
    variable('gpuharden_allow_non_gpu_nodes', 'bool',
             'Run harden and bootstrap on hosts that show no NVIDIA GPU (false).',
             default=False,
             ),
    variable('gpuharden_skip_compliant_stages', 'bool',
             (
                 "Harden runs a node-side stage only where its node_audit check is not ok (true); false runs every stage's module, as the drift test "
                 'does to prove the audit right.'
             ),
             default=True,
             ),
    variable('gpuharden_max_unavailable', 'raw',
             (
                 'Most GPU nodes harden disrupts (drains) at a time, a count or a percentage of the GPU fleet; nodes already cordoned or NotReady '
                 'count against it (1).'
             ),
             format='count_or_percent',
             default=1,
             ),
    variable('gpuharden_restart_settle_seconds', 'int',
             (
                 "Most seconds harden's budget read waits for the nodes whose containerd or kubelet the run has just restarted to be Ready again "
                 'before counting them as unavailable (60; the wait ends as soon as they are).'
             ),
             default=60,
             ),
    variable('gpuharden_known_extra_variables', 'list',
             (
                 "Names (or shell patterns such as site_mig_*) of your own variables that share one of the collection's prefixes; check_variables "
                 'treats them as known. Read per host.'
             ),
             elements='str',
             default=[],
             ),
    variable('gpuharden_allow_unknown_variables', 'bool',
             'Report unknown variables as warnings instead of failing the run (false). Read per host.',
             default=False,
             ),
    section('Shared defaults of several roles'),
    variable('gpuharden_mig_layout', 'dict',
             'MIG layout in short form, the default of mig_layout ({}).',
             default={},
             ),
    variable('gpuharden_mig_strategy', 'str',
             "The device plugin's MIG strategy (none, single, mixed), the default of device_plugin_mig_strategy.",
             choices=['none', 'single', 'mixed'],
             default='none',
             ),
    variable('gpuharden_kubelet_extra_settings', 'dict',
             'Further KubeletConfiguration fields, the default of kubelet_topology_extra_settings.',
             default={},
             ),
    variable('gpuharden_cgroup_root', 'str',
             "Where the node's cgroup v2 hierarchy is mounted, the default of cgroup_limits_cgroup_root.",
             default='/sys/fs/cgroup',
             ),
    variable('gpuharden_operator_takeover', 'list',
             (
                 "The node stages gpuharden takes over from the NVIDIA GPU Operator ([]: none), any of container_runtime (its container toolkit's "
                 "containerd runtime), device_permissions (its driver container's device nodes) and mig (its MIG manager's layout). Where the "
                 "operator owns a stage's part of a node and the stage is not named, the stage changes nothing there and reports why (refused); a "
                 'stage named acts, with a warning (disable that component in the ClusterPolicy first, or the operator puts its own back). Read by '
                 'roles container_runtime, device_permissions and mig, and by the plan of harden and the drift check.'
             ),
             elements='str',
             choices=['container_runtime', 'device_permissions', 'mig'],
             default=[],
             ),
    variable('gpuharden_gpu_node', 'bool',
             'Whether the host is a GPU node (null = look at /proc/driver/nvidia/gpus), for device_plugin_gpu_node.',
             default=None,
             ),
    variable('gpuharden_postcheck_fail_severity', 'str',
             "Lowest finding severity that fails a host's post-check (error; never only reports).",
             choices=FAIL_CHOICES,
             default='error',
             ),
    variable('gpuharden_postcheck_device_audit', 'bool',
             'Run the eBPF device-cgroup isolation audit in the post-check (true).',
             default=True,
             ),
    variable('gpuharden_postcheck_consistency', 'bool',
             'Compare declared, allocated and used GPUs in the post-check (true).',
             default=True,
             ),
    variable('gpuharden_postcheck_settle_seconds', 'int',
             (
                 'Most seconds the post-check of a harden or bootstrap run waits for the nodes whose plugin, kubelet or MIG layout the run changed '
                 'to advertise what NVML has (60; the wait ends as soon as they do).'
             ),
             default=60,
             ),
    section('playbooks/drift_check.yml'),
    variable('gpuharden_drift_fail', 'bool',
             'Fail hosts with drift, so the playbook exits non-zero (true; gpuharden drift sets false).',
             default=True,
             ),
    variable('gpuharden_drift_run_data', 'bool',
             (
                 'Record the findings with set_stats and fail the drifted hosts, in a second play (true; gpuharden drift, which reads the module '
                 'results itself, sets false).'
             ),
             play_keyword='hosts',
             default=True,
             ),
    variable('gpuharden_drift_cluster_in_process', 'bool',
             (
                 "Hand the consistency check's options to the caller instead of running the gpu_consistency module (false; gpuharden drift sets true "
                 'and runs that check in its own Python).'
             ),
             default=False,
             ),
    variable('gpuharden_gpu_pods_given', 'dict',
             (
                 "The GPU pods and the GPU Operator's reading of the plan's nodes, as gpu_pods_info returns them (unset; gpuharden explain sets it, "
                 "having made that reading in its own Python with the module's code, for the one node it reads)."
             ),
             ),
    variable('gpuharden_drift_fail_severity', 'str',
             'Lowest finding severity that counts as drift (warning).',
             choices=SEVERITIES,
             default='warning',
             ),
    variable('gpuharden_drift_cluster_objects', 'bool',
             'Also dry-run the RuntimeClass once for the play (true).',
             default=True,
             ),
    section('playbooks/audit_node.yml'),
    variable('gpuharden_audit_hosts', 'raw',
             'Host pattern of the read-only audit (all).',
             play_keyword='hosts',
             default='all',
             ),
    variable('gpuharden_node_root', 'str',
             "Root under which the audited node's filesystem is visible (/).",
             default='/',
             ),
    section('playbooks/bootstrap_gpu_node.yml'),
    variable('gpuharden_bootstrap_connect_timeout', 'int',
             'Seconds to wait for SSH on a first boot (600).',
             default=600,
             ),
    variable('gpuharden_bootstrap_connect_delay', 'int',
             'Seconds to wait before the first SSH attempt (0).',
             default=0,
             ),
    variable('gpuharden_bootstrap_node_venv', 'bool',
             "Give the node a venv with the node packages (role node_prerequisites) and run the play's node tasks with its Python (true).",
             default=True,
             ),
    variable('gpuharden_node_python', 'str',
             (
                 "The Python of gpuharden's node tasks in every playbook (playbooks/vars/node_python.yml), e.g. /opt/gpuharden/venv/bin/python3, the "
                 "venv role node_prerequisites makes; default the host's own ansible_python_interpreter. The host's interpreter stays for other "
                 'plays; the controller-side tasks keep theirs. In a bootstrap run, the venv the run made wins.'
             ),
             ),
    variable('gpuharden_bootstrap_ship_pynvml', 'bool',
             "Copy nvidia-ml-py's pynvml.py to a node whose Python cannot import pynvml (true).",
             default=True,
             ),
    variable('gpuharden_bootstrap_pynvml_source', 'str',
             'pynvml.py on the controller ("" = the one the controller\'s Python imports).',
             default='',
             ),
    variable('gpuharden_bootstrap_pynvml_dest', 'str',
             'Directory on the node\'s Python path for it ("" = that Python\'s site-packages).',
             default='',
             ),
    variable('gpuharden_bootstrap_taint_key', 'str',
             'Key of the bootstrap taint (gpuharden.io/bootstrap).',
             default='gpuharden.io/bootstrap',
             ),
    variable('gpuharden_bootstrap_taint_effect', 'str',
             'Effect of the bootstrap taint (NoSchedule).',
             choices=['NoSchedule', 'PreferNoSchedule', 'NoExecute'],
             default='NoSchedule',
             ),
    variable('gpuharden_bootstrap_labels', 'dict',
             "Labels a node gets when it passed the post-check ({gpuharden.io/hardened: 'true'}).",
             default={'gpuharden.io/hardened': 'true'},
             ),
    variable('gpuharden_bootstrap_uncordon', 'bool',
             'Uncordon and untaint a node that passed (true; false only labels it).',
             default=True,
             ),
    variable('gpuharden_device_plugin_tolerations', 'list',
             "The device plugin's tolerations besides the bootstrap taint.",
             elements='dict',
             default=[{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}],
             ),
    section('playbooks/unharden_gpu_nodes.yml (docs/uninstall.md)'),
    variable('gpuharden_unharden_force', 'bool',
             (
                 'Also put back files, labels and taints changed since gpuharden wrote them (false: they are left and reported, and the host fails '
                 "at the end); a forced file's current content is kept next to it."
             ),
             default=False,
             ),
    variable('gpuharden_unharden_kubelet', 'bool',
             (
                 "Put back the kubelet's files too, with a restart, or a drain within the disruption budget where gpuharden changed a CPU or Memory "
                 'Manager policy (true; false leaves every kubelet file as gpuharden wrote it).'
             ),
             default=True,
             ),
    variable('gpuharden_unharden_keep_backups', 'bool',
             "Keep the backups gpuharden's modules made of the files that are put back (false).",
             default=False,
             ),
    variable('gpuharden_unharden_cluster', 'bool',
             "Put back Node labels and taints and remove gpuharden's cluster objects (true).",
             default=True,
             ),
    variable('gpuharden_unharden_cluster_objects', 'bool',
             (
                 "Remove gpuharden's device plugin DaemonSets, ConfigMap and RuntimeClass (true; kept anyway while Nodes outside the run still carry "
                 "gpuharden's labels)."
             ),
             default=True,
             ),
    section('Written into its inventory by `gpuharden lab up` (the test lab)'),
    variable('gpuharden_lab_scenario', 'str',
             'Name of the lab scenario the inventory was made for.',
             ),
    variable('gpuharden_lab_admin_kubeconfig', 'str',
             "The lab cluster's admin kubeconfig (tests use it for set-up the tool may not do).",
             ),
)


def playbook_variable(name):
    """The table's entry of playbook variable ``name``; KeyError for a name not in the table."""
    for entry in PLAYBOOK_VARIABLES:
        if entry.get("name") == name:
            return entry
    raise KeyError(name)


def playbook_default(name, playbook=None):
    """The default of playbook variable ``name`` in ``playbook`` (a file stem such as drift_check; None: any playbook,
    for a role or a task file several import), or UNSET where it has none.  KeyError for a name not in the table; a
    variable whose playbooks differ has no default for ``playbook=None``."""
    entry = playbook_variable(name)
    if entry["by_playbook"]:
        return entry["by_playbook"].get(playbook, UNSET)
    return entry["default"]


def role_settings():
    """Each role setting with its ``stage``: the role it belongs to (a harden stage where core/_vocabulary.STAGES has
    it; node_maintenance and node_prerequisites serve the stages, postcheck checks them)."""
    return [dict(entry, stage=name) for name, role in ROLES.items() for entry in role["settings"]]
