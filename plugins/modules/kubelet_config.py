#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: kubelet_config
short_description: Enforce kubelet topology, CPU and memory manager settings where the kubelet really reads them
version_added: 0.1.0
description:
  - Sets KubeletConfiguration fields (Topology Manager, CPU Manager, Memory Manager, and any further fields given
    in O(settings), for example MemoryQoS) so that the running kubelet actually gets them.
  - Finds where the kubelet reads its settings. The service unit and its drop-ins are parsed the way systemd
    does (ExecStart= with C($VAR) expansion, Environment=, EnvironmentFile=; an EnvironmentFile beats
    Environment=), which gives the C(--config) file (kubeadm C(/var/lib/kubelet/config.yaml)), the
    C(--config-dir) drop-in directory, and the command-line flags from C(kubeadm-flags.env)
    (C(KUBELET_KUBEADM_ARGS)), C(/etc/default/kubelet) or C(/etc/sysconfig/kubelet) (C(KUBELET_EXTRA_ARGS)).
    On k3s and rke2 the kubelet flags are the C(kubelet-arg) lists of C(/etc/rancher/<k3s|rke2>/config.yaml) and
    its C(config.yaml.d/*.yaml), and the drop-in directory is C(/var/lib/rancher/<k3s|rke2>/agent/etc/kubelet.conf.d).
  - Where the kubelet reads a drop-in directory, the values go into an own drop-in (O(dropin_name)), which sorts
    after the distribution's C(00-*-defaults.conf) (never edited); otherwise into the C(--config) file.
  - k3s and rke2 before v1.32 read no kubelet drop-in directory correctly (the kubelet fixed its drop-in merge in
    v1.32), so there the values become C(kubelet-arg) entries of the config file whose list the distribution uses
    last; fields the kubelet has no flag for (for example C(memoryThrottlingFactor)) are refused there. The version
    comes from O(distribution_version), else from C(<ExecStart program> --version) (C(k3s version v1.31.4+k3s1));
    when neither tells it, the module fails instead of guessing.
  - B(Persistence) (RV(persistence)). kubeadm's C(kubeadm upgrade node) rewrites C(/var/lib/kubelet/config.yaml)
    whole, from the C(kube-system/kubelet-config) ConfigMap (with its C(--patches) and C(instance-config.yaml)); it
    never touches a C(--config-dir) drop-in directory nor C(/etc/default/kubelet) / C(/etc/sysconfig/kubelet), and
    rewrites C(kubeadm-flags.env) only from that file's own content (kubernetes v1.36.3 C(cmd/kubeadm/app/phases/upgrade/postupgrade.go)).
  - B(The durable route) on kubeadm. Where the kubelet reads no C(--config-dir), is v1.32 or later (C(<ExecStart program>
    --version), or O(distribution_version)) and O(kubeadm_config_dir) names a directory that holds no other drop-in, the
    module adds C(--config-dir=<kubeadm_config_dir>) to C(KUBELET_EXTRA_ARGS) in the environment file that sets it (or the
    unit's last C(EnvironmentFile=) besides C(kubeadm-flags.env), created when missing) and writes its drop-in there
    (V(durable)); RV(config_dir_route) says where. Otherwise the values go to C(/var/lib/kubelet/config.yaml) and
    RV(persistence) is V(reverts_on_kubeadm_upgrade), with the reason and the fix in RV(persistence_reason) and a warning.
    O(require_durable=true) refuses such a write instead (nothing written, RV(refused), a warning). k3s and rke2 never
    rewrite the drop-in or their config files (V(durable)).
  - Refuses, as the kubelet does, a configuration file or drop-in that is empty or lacks C(apiVersion)
    (C(kubelet.config.k8s.io/v1beta1), the only version with C(KubeletConfiguration)) or C(kind); the error names
    the file and what is missing.
  - With C(memoryManagerPolicy=Static) in effect after the change, checks before writing that the C(reservedMemory)
    limits over all NUMA nodes add up, per memory type, to C(kubeReserved) + C(systemReserved) (+ the
    C(evictionHard) C(memory.available) threshold, 100Mi by default, a percentage taken of C(MemTotal)), using the
    values the kubelet would read (files merged, flags included); otherwise it fails and writes nothing, since the
    kubelet would refuse to start.
  - B(NUMA limit) (RV(numa_limit)). With a C(topologyManagerPolicy) other than V(none), the kubelet does not start
    on a node with more NUMA nodes than C(max-allowable-numa-nodes) (default 8). The module counts them as the
    kubelet's cadvisor does (every C(/sys/devices/system/node/node<N>) directory, CPU-less ones included, such as the
    GPU memory nodes of Grace Hopper and Grace Blackwell systems) before writing. Over the limit,
    O(numa_over_limit=raise) sets C(max-allowable-numa-nodes) to the node's count and warns (the kubelet logs a
    warning above 8); O(numa_over_limit=keep_policy), or where raising is not safe (C(memoryManagerPolicy=Static),
    whose hints span every subset of all NUMA nodes; a NUMA node id above 63), leaves the Topology Manager policy as
    it is and reports it in RV(refused) with a warning. A C(max-allowable-numa-nodes) given below the node's count
    fails the module, writing nothing.
  - Flags are matched under the kubelet's own names, including the irregular ones (C(contentType) is
    C(--kube-api-content-type), C(registryPullQPS) C(--registry-qps), C(eventRecordQPS) C(--event-qps),
    C(makeIPTablesUtilChains) C(--make-iptables-util-chains), C(serverTLSBootstrap) C(--rotate-server-certificates));
    C(--eviction-hard)/C(--eviction-soft) are read as C(signal<quantity) pairs, map flags accumulate over their
    occurrences.
  - A command-line flag beats the files. A flag that sets a managed field to another value is fixed where it
    lives (removed from that environment file variable or C(kubelet-arg) list; for C(--feature-gates) only the
    managed gates are removed) with O(on_flag_conflict=fix), or named in a failure with O(on_flag_conflict=fail).
    A later drop-in that overrides a managed field is treated the same way. Flags written directly in the unit's
    ExecStart= or in an Environment= line are never edited; the module fails and names them.
  - Before returning, the planned files are read again as the kubelet would read them; the module never writes a
    value that something else would silently override.
  - Reports the CPU and Memory Manager checkpoints (C(cpu_manager_state), C(memory_manager_state) in the kubelet's
    root directory) that name a policy other than the one configured after the change; the kubelet refuses to
    start with them. O(remove_stale_state=true) removes them, which is only safe while the kubelet is stopped
    (the M(gpuharden.k8s.kubelet_config) caller, role C(gpuharden.k8s.kubelet_topology), drains the node and stops
    the kubelet first).
  - Restarts the kubelet only with O(restart); otherwise RV(restart_required) and RV(service) tell the caller what to
    restart. RV(restart_required) is false when the files change but nothing the kubelet reads does (for example a
    flag already carries the wanted value and the module only writes the same value into the file underneath it).
  - With O(restart), after writing, the module restarts RV(service) with C(systemctl restart) and polls O(health_url)
    every quarter second until it answers HTTP 200 or O(health_timeout) seconds pass, all in the same run. A kubelet
    that does not come back fails nothing here - RV(health) says so - unless O(rollback); then the module reads the
    kubelet's reason (C(systemctl show), its log or journal), puts the files back as they were (but a removed stale
    checkpoint), restarts the kubelet on them, waits for it again, and fails with that reason. Nothing restarts in check
    mode.
  - With O(stop_first) the module stops the kubelet after planning and before writing (a CPU or Memory Manager policy
    change, a stale checkpoint), and a write that fails starts it again; O(restart=always) starts it after the write.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
  - gpuharden.k8s._files
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  topology_manager_policy:
    description: C(topologyManagerPolicy). Left unmanaged when not set.
    type: str
    choices: [none, best-effort, restricted, single-numa-node]
  topology_manager_scope:
    description: C(topologyManagerScope). Left unmanaged when not set.
    type: str
    choices: [container, pod]
  topology_manager_policy_options:
    description:
      - C(topologyManagerPolicyOptions); the keys given are set, other keys already there are kept.
      - Known options are V(prefer-closest-numa-nodes) (true/false, as Go's C(strconv.ParseBool) reads it) and
        V(max-allowable-numa-nodes) (an integer, at least 8; the kubelet refuses a smaller value and does not start).
        Other names, and values the kubelet would refuse, fail the module before anything is written.
    type: dict
  numa_over_limit:
    description:
      - What to do where the Topology Manager policy in effect after the change is not V(none) and the node has more
        NUMA nodes than C(max-allowable-numa-nodes) allows (see RV(numa_limit)).
      - V(raise) - set C(topologyManagerPolicyOptions.max-allowable-numa-nodes) to the node's count (the kubelet
        logs a warning above 8; kubelets before v1.31 do not know the option).
      - V(keep_policy) - leave the Topology Manager policy as the node has it and report it in RV(refused).
    type: str
    choices: [raise, keep_policy]
    default: raise
  cpu_manager_policy:
    description:
      - C(cpuManagerPolicy). V(static) needs reserved CPUs (O(reserved_system_cpus), or C(kubeReserved.cpu) /
        C(systemReserved.cpu)), else the kubelet refuses to start and the module fails first.
    type: str
    choices: [none, static]
  reserved_system_cpus:
    description: C(reservedSystemCPUs), a CPU list such as V(0-1) or V(0,64).
    type: str
  memory_manager_policy:
    description: C(memoryManagerPolicy). V(Static) needs O(reserved_memory).
    type: str
    choices: [None, Static]
  reserved_memory:
    description: C(reservedMemory), one entry per NUMA node.
    type: list
    elements: dict
    suboptions:
      numaNode:
        description: NUMA node number.
        type: int
        required: true
      limits:
        description: "Resource name to quantity, for example C({memory: 1Gi})."
        type: dict
        required: true
  settings:
    description:
      - Further KubeletConfiguration fields to enforce, deep-merged (mappings key by key; lists and scalars as a
        whole), for example C(featureGates), C(memoryThrottlingFactor), C(kubeReserved), C(systemReserved),
        C(enforceNodeAllocatable).
      - On a node whose memory controller is on cgroup v1 (or a hybrid hierarchy), C(featureGates.MemoryQoS=true) (and a
        C(memoryReservationPolicy) other than V(None), which needs it) is left out and named in RV(refused), with a
        warning; every other setting is still written (C(memoryThrottlingFactor) too, which the kubelet only
        range-checks without MemoryQoS). The kubelet applies MemoryQoS only on cgroup v2.
    type: dict
    default: {}
  flavor:
    description: How the kubelet is installed; V(auto) detects it from the service.
    type: str
    choices: [auto, kubeadm, k3s, rke2]
    default: auto
  service:
    description:
      - The kubelet's systemd service. V(auto) looks for C(kubelet), C(k3s-agent), C(k3s), C(rke2-agent) and
        C(rke2-server) unit files (only those of O(flavor) when it is set) and fails when none or several exist.
    type: str
    default: auto
  on_flag_conflict:
    description: What to do about a command-line flag (or later drop-in) that overrides a managed field.
    type: str
    choices: [fix, fail]
    default: fix
  dropin_name:
    description: The drop-in written where the kubelet reads a C(--config-dir).
    type: str
    default: 50-gpuharden.conf
  remove_stale_state:
    description:
      - Also remove the stale checkpoints listed in RV(stale_state_files). Only while the kubelet is stopped.
    type: bool
    default: false
  distribution_version:
    description:
      - The k3s or rke2 version (for example V(v1.31.4+k3s1), the node's C(status.nodeInfo.kubeletVersion)); decides
        whether the kubelet drop-in directory is used (v1.32 and later) or C(kubelet-arg) (before).
      - When not set on a k3s/rke2 node, the module runs the unit's ExecStart program with C(--version); when that
        does not tell the version, it fails.
      - On a kubeadm node, the kubelet's version (for example V(v1.36.3)); when not set, the module asks the unit's
        ExecStart program (C(--version)). It decides whether O(kubeadm_config_dir) may be added; an unknown version
        keeps the values in C(/var/lib/kubelet/config.yaml).
    type: str
  require_durable:
    description:
      - Refuse to write (nothing written nor restarted, RV(refused) and a warning say why) when the settings would not
        outlast the distribution's own rewrites (RV(persistence) would be V(reverts_on_kubeadm_upgrade)).
    type: bool
    default: false
  kubeadm_config_dir:
    description:
      - kubeadm nodes whose kubelet reads no C(--config-dir) - the drop-in directory the module gives the kubelet
        (C(--config-dir) in C(KUBELET_EXTRA_ARGS)) so that the values outlast C(kubeadm upgrade node).
      - Empty never adds it; the values then go to C(/var/lib/kubelet/config.yaml).
    type: str
    default: /etc/kubernetes/kubelet.conf.d
  restart:
    description:
      - V(never) - write only. V(if_required) - restart the kubelet when this run changed a file and what the kubelet
        reads (RV(restart_required)). V(always) - start or restart it even when nothing changed (the caller stopped it
        before a disruptive change).
    type: str
    choices: [never, if_required, always]
    default: never
  health_url:
    description: The kubelet's healthz URL, polled after a restart (no proxy).
    type: str
    default: http://127.0.0.1:10248/healthz
  health_timeout:
    description: Seconds from the restart for the kubelet to answer O(health_url) with HTTP 200.
    type: int
    default: 120
  stop_first:
    description:
      - Stop RV(service) (C(systemctl stop)) before writing, outside check mode; a write that fails starts it again.
      - Use with O(restart=always), which starts it after the write.
    type: bool
    default: false
  rollback:
    description:
      - When the kubelet is not healthy after the restart, put the changed files back (not a removed checkpoint,
        C(*_manager_state)), restart it on them, wait for O(health_url) again, and fail with the kubelet's reason.
    type: bool
    default: false
  log_file:
    description: The kubelet's log file the rollback's reason is read from; empty means C(/var/log/<service>.log), else the journal.
    type: str
    default: ""
  log_lines:
    description: How many of the log's last lines the rollback reads for the kubelet's reason.
    type: int
    default: 15
requirements:
  - ruamel.yaml on the node's Python
notes:
  - A flag removed from C(kubeadm-flags.env) stays removed through C(kubeadm upgrade node), but C(kubeadm join) writes that
    file anew from the cluster's C(nodeRegistration.kubeletExtraArgs); RV(persistence_reason) says so.
  - Upstream behaviour followed - kubernetes/kubernetes C(cmd/kubelet/app/server.go) (C(--config-dir) drop-ins,
    C(*.conf) in lexical order, JSON merge patch after the C(--config) file, then flags; drop-ins need apiVersion/kind),
    C(cmd/kubelet/app/options/options.go) (flag names),
    C(pkg/kubelet/kubeletconfig/configfiles/configfiles.go) (empty file refused),
    C(pkg/kubelet/cm/memorymanager/memory_manager.go) (reserved memory check); k3s-io/docs#433 (drop-ins from v1.32);
    kubeadm C(cmd/kubeadm/app/phases/kubelet/config.go), C(phases/upgrade/postupgrade.go) (what C(kubeadm upgrade node)
    rewrites); C(cmd/kubelet/app/server.go), C(pkg/kubelet/cm/pod_container_manager_linux.go) (MemoryQoS only on cgroup v2).
  - NUMA limit - kubernetes v1.36.3 C(pkg/kubelet/cm/topologymanager/topology_manager.go) (NewManager) and
    C(policy_options.go); google/cadvisor v0.56.2 C(utils/sysinfo/sysinfo.go) (GetNodesInfo, the NUMA nodes counted).
seealso:
  - name: Kubelet configuration file and drop-in directory
    description: Merge order of the config file, drop-ins and flags.
    link: https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/
"""

EXAMPLES = r"""
- name: Single NUMA node alignment with exclusive CPUs
  gpuharden.k8s.kubelet_config:
    topology_manager_policy: single-numa-node
    topology_manager_scope: container
    cpu_manager_policy: static
    reserved_system_cpus: "0-1"
    backup: true
  register: kubelet

- name: Memory Manager and MemoryQoS
  gpuharden.k8s.kubelet_config:
    memory_manager_policy: Static
    reserved_memory:  # kubeReserved 1Gi + the default 100Mi eviction threshold, over all NUMA nodes
      - {numaNode: 0, limits: {memory: 562Mi}}
      - {numaNode: 1, limits: {memory: 562Mi}}
    settings:
      featureGates: {MemoryQoS: true}
      memoryThrottlingFactor: 0.9
      kubeReserved: {memory: 1Gi}

- name: Only report where the kubelet reads its topology policy
  gpuharden.k8s.kubelet_config:
    topology_manager_policy: single-numa-node
    on_flag_conflict: fail
  check_mode: true
  register: where
"""

RETURN = r"""
changed:
  description: Whether a file changed (or would change in check mode).
  type: bool
  returned: always
backup_files:
  description: Backup copy of each changed file, keyed by the file's path; empty without O(backup).
  type: dict
  returned: always
  sample: {"/var/lib/kubelet/config.yaml": "/var/lib/kubelet/config.yaml.12345.2026-01-01@10:00:00~"}
files:
  description: Each file the plan touches, with C(path), C(action) (create, update, remove), C(changed) and C(reason).
  type: list
  elements: dict
  returned: always
  sample: [{"path": "/etc/default/kubelet", "action": "update", "changed": true,
            "reason": "removed --topology-manager-policy=none from KUBELET_EXTRA_ARGS: it overrode topologyManagerPolicy"}]
sources:
  description:
    - For each managed field (dotted path), the effective value before and after and where it comes from.
    - C(kind) is V(file), V(dropin), V(flag) (with C(flag), C(where) and C(path)/C(variable)) or V(default).
  type: dict
  returned: always
  sample: {"topologyManagerPolicy": {"before": "none", "after": "single-numa-node",
           "source_before": {"kind": "flag", "flag": "--topology-manager-policy=none", "where": "envfile",
                             "path": "/etc/default/kubelet", "variable": "KUBELET_EXTRA_ARGS"},
           "source_after": {"kind": "file", "path": "/var/lib/kubelet/config.yaml"}}}
policies_set:
  description:
    - The topology, CPU and memory manager policies and the topology scope the configuration sets before the change
      (flags, drop-ins and file together, as the kubelet reads them); V(null) where the kubelet's default applies.
  type: dict
  returned: always
  sample: {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": null, "cpuManagerPolicy": "static",
           "memoryManagerPolicy": null}
cpu_manager_policy_changed:
  description: The effective CPU Manager policy changes.
  type: bool
  returned: always
memory_manager_policy_changed:
  description: The effective Memory Manager policy changes.
  type: bool
  returned: always
stale_state_files:
  description:
    - Checkpoints that name another policy than the one configured after the change (or cannot be read); the
      kubelet refuses to start until they are removed. Each has C(path), C(policy), C(configured_policy), C(reason).
  type: list
  elements: dict
  returned: always
numa_limit:
  description:
    - The node's NUMA nodes against the kubelet's C(max-allowable-numa-nodes), for the Topology Manager policy in
      effect after the change - C(policy), C(nodes) (V(null) where sysfs could not be read), C(cpu_less_nodes),
      C(source), C(limit_before), C(limit_after), C(warning) and C(action) - V(policy_none), V(within_limit),
      V(raised) (the option set to the node's count), V(kept) (the policy left as it is, see RV(refused)) or
      V(unknown) (the NUMA nodes could not be counted).
  type: dict
  returned: always
  sample: {"policy": "single-numa-node", "nodes": 34, "cpu_less_nodes": 32, "source": "/sys/devices/system/node/node*",
           "limit_before": 8, "limit_after": 34, "action": "raised", "warning": "this node has 34 NUMA nodes ..."}
restart_required:
  description:
    - The kubelet must be restarted - what it reads changes (RV(effective_changed)), or a stale checkpoint must go.
    - False when files change but no managed field's effective value does.
  type: bool
  returned: always
effective_changed:
  description: A managed field's effective value (what the kubelet reads after flags and drop-ins) changes.
  type: bool
  returned: always
persistence:
  description:
    - V(durable) when the managed values live where the distribution never rewrites them; V(reverts_on_kubeadm_upgrade)
      when C(kubeadm upgrade node) can undo them (values in C(/var/lib/kubelet/config.yaml)). RV(persistence_reason) says
      why. Not V(durable) also gives a warning.
  type: str
  returned: always
  sample: reverts_on_kubeadm_upgrade
config_dir_route:
  description:
    - Where this plan gives a kubeadm node's kubelet its C(--config-dir) (O(kubeadm_config_dir)) - C(config_dir),
      C(file) (the environment file), C(variable) (C(KUBELET_EXTRA_ARGS)) and C(kubelet_version); V(null) when it does not.
  type: dict
  returned: always
  sample: {"config_dir": "/etc/kubernetes/kubelet.conf.d", "file": "/etc/default/kubelet", "variable": "KUBELET_EXTRA_ARGS",
           "kubelet_version": "v1.36.3"}
refused:
  description:
    - What the module leaves as it is because changing it is not safe or would not last, each with C(what), C(why) and
      C(fix) (also given as a warning) - a Topology Manager policy on a node with more NUMA nodes than the kubelet
      allows (O(numa_over_limit)), MemoryQoS on a cgroup v1 node (the rest is written), or everything under
      O(require_durable) when it would not last.
  type: list
  elements: dict
  returned: always
  sample: [{"what": "featureGates.MemoryQoS=true", "why": "this node's memory controller is on cgroup v1 ...",
            "fix": "set cgroup_limits_memory_qos_feature_gate=false for this node ..."}]
persistence_reason:
  description: Why RV(persistence) is what it is, and how to make it durable.
  type: str
  returned: always
  sample: "topologyManagerPolicy come from /var/lib/kubelet/config.yaml, which `kubeadm upgrade node` rewrites ..."
distribution_version:
  description: The k3s/rke2 version the plan is based on (V(null) on kubeadm nodes).
  type: str
  returned: always
  sample: v1.31.4+k3s1
kubelet_args_only:
  description: The settings are kept as C(kubelet-arg) entries (k3s/rke2 before v1.32) instead of a drop-in.
  type: bool
  returned: always
service:
  description: The kubelet's systemd service.
  type: str
  returned: always
  sample: kubelet
flavor:
  description: V(kubeadm), V(k3s) or V(rke2).
  type: str
  returned: always
config_file:
  description: The kubelet's C(--config) file, or V(null).
  type: str
  returned: always
config_dir:
  description: The kubelet's C(--config-dir), or V(null).
  type: str
  returned: always
restarted:
  description: This run restarted the kubelet (O(restart)).
  type: bool
  returned: always
health:
  description:
    - After a restart, C(status) (the last HTTP status of O(health_url), V(null) when it did not answer), C(seconds)
      from the restart, C(attempts), C(error) (why it is not healthy, V(null) when it is) and C(restarted_at) (the
      node's clock just before the restart, in seconds since the epoch; a Node status the kubelet posted before then is
      the old kubelet's); V(null) without a restart.
  type: dict
  returned: always
  sample: {"status": 200, "seconds": 1.8, "attempts": 6, "error": null}
diff:
  description: Before and after of each changed file, in diff mode.
  type: list
  elements: dict
  returned: when diff mode is on
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _command, _files, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet, _kubelet_restart


def build_module():
    return AnsibleModule(argument_spec=dict(_kubelet.argument_spec(), **_kubelet_restart.RESTART_SPEC), supports_check_mode=True)


def run(module):
    root = module.params["root"]
    # every command bounded (AnsibleModule.run_command has no timeout): a k3s binary that hangs ends its --version
    plan = _kubelet.decide(module.params, run_command=_command.runner())
    changes = plan.pop("changes")
    changed = any(change.changed for change in changes)
    _warn_numa_limit(module, plan)
    for entry in plan["refused"]:
        module.warn("kubelet_config: not written: %s: %s; fix: %s" % (entry["what"], entry["why"], entry["fix"]))
    if plan["persistence"] != "durable" and not module.params["require_durable"]:  # else the refusal said it
        module.warn("kubelet_config: persistence %s: %s" % (plan["persistence"], plan["persistence_reason"]))
    backups, undos = {}, {}
    params = module.params
    run_command = _command.runner(params["health_timeout"])
    stopped = params["stop_first"] and not module.check_mode
    if stopped:  # after the plan: a plan that fails leaves the kubelet running
        _kubelet_restart.stop(run_command, plan["service"])
    if changed and not module.check_mode:
        try:
            backups = _files.apply_changes(module, changes, backup=params["backup"], undos_out=undos)
        except GpuhardenError:
            if stopped:
                _kubelet_restart.start(run_command, plan["service"])
            raise
    files = []
    for change in changes:
        entry = change.as_dict()
        entry["path"] = change.node_path
        files.append(entry)
    result = dict(plan, changed=changed, files=files,
                  backup_files={_node_path(root, path): backup for path, backup in backups.items()},
                  restarted=False, health=None)
    if _kubelet_restart.wanted(params, changed, plan["restart_required"], module.check_mode):
        result["restarted"] = True
        result["health"] = _kubelet_restart.restart_and_wait(run_command, plan["service"], params["health_url"], params["health_timeout"])
        if params["rollback"] and result["health"]["status"] != 200:
            _roll_back(params, plan["service"], run_command, undos, root, result)
    if module._diff:
        result["diff"] = _files.diffs(changes)
    return result


def _roll_back(params, service, run_command, undos, root, result):
    """The kubelet did not come back on the new files: read its reason, put the files back (not the checkpoints),
    restart it on them and wait, then fail with the reason (the failure carries the result)."""
    unit = _kubelet_restart.unit_result(run_command, service)
    reason = _kubelet_restart.log_reason(run_command, service, params["log_file"], params["log_lines"])
    restored = _kubelet_restart.rollback_paths(list(undos))
    for path in reversed(restored):
        undos[path]()
    health_after = _kubelet_restart.restart_and_wait(run_command, service, params["health_url"], params["health_timeout"])
    shown = [_node_path(root, path) for path in restored]
    raise GpuhardenError(_kubelet_restart.rollback_failure(service, params["health_timeout"], unit, shown, reason, health_after),
                         **dict(result, rolled_back=shown, health_after_rollback=health_after))


def _warn_numa_limit(module, plan):
    """The NUMA limit's decision is said on the output, not only in the result."""
    if plan["numa_limit"]["warning"]:
        module.warn(plan["numa_limit"]["warning"])


def _node_path(root, path):
    if root in ("/", ""):
        return path
    return "/" + os.path.relpath(path, root)


def main():
    _module_shell.run_module(build_module(), run, requires=[("ruamel.yaml", _kubelet.HAS_RUAMEL, str(_kubelet.RUAMEL_IMPORT_ERROR))])


if __name__ == "__main__":
    main()
