# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' preflight rules (roles/<role>/tasks/preflight.yml, through the action gpuharden.k8s.role_preflight).

One pure function per role takes the role's variables (a mapping, templated as the role's tasks see them) and returns
each rule they break as one line that names the variable, its value and the rule ([] when none).  They accept and
refuse exactly what the roles' assert tasks accepted and refused before (issue 45): the Jinja tests they used are
mirrored by the helpers below (``| int``, ``| float``, ``| bool``, ``is match``, ``is sequence``, ``| length``).

``ROLES`` maps a role to the variables its rules read (with the value an undefined one takes) and its function.  It lives
in the controller's cluster layer because the kubelet rules take the kubelet's own vocabulary from node/_kubelet.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import TAINT_STATES, check_dns_label, check_dns_subdomain, passes
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _jinja_filters
from ansible_collections.gpuharden.k8s.plugins.module_utils.node._kubelet import DEFAULT_MAX_NUMA_NODES, ENFORCE_VALUES, GO_BOOLS, TOPOLOGY_OPTIONS

MIG_STRATEGIES = ("none", "single", "mixed")
MIG_RESET_METHODS = ("command", "reboot", "none")
MAINTENANCE_STATES = ("drained", "cordoned", "uncordoned")
ADOPTABLE_INSTALLERS = ("helm",)
# The Jinja filters the roles' asserts applied (core/_jinja_filters.py, which core/_role_options.py shares).
_int, _float, _bool = _jinja_filters.as_int, _jinja_filters.as_float, _jinja_filters.as_bool


def _matches(value, pattern):
    """Ansible's ``is match`` test: re.match on the value as text."""
    return re.match(pattern, "%s" % (value,)) is not None


def _length(value):
    """Jinja's ``| length`` (None, which the argument specs let through for a few variables, as empty)."""
    return 0 if value is None else len(value)


def _sequence(value):
    """Jinja's ``is sequence and is not string``: a list (or a mapping: Jinja counts it as a sequence too)."""
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, bytes))


def _shown(value):
    """A value as a line shows it: a string quoted, anything else as YAML/JSON writes it (true, null, [], {"a": 1})."""
    return repr("%s" % (value,)) if isinstance(value, str) else json.dumps(value, default=str)


def _broken(value_of, rules):
    """The lines of the rules that fire: rules is [(fires, variable name, what the rule wants)]."""
    return ["%s=%s: %s" % (name, _shown(value_of(name)), wants) for fires, name, wants in rules if fires]


def kubelet_topology(settings):
    """roles/kubelet_topology: the policies and their reservations, the health wait, the drop-in, the policy options."""
    get = settings.get
    timeout, delay = _int(get("kubelet_topology_health_timeout")), _int(get("kubelet_topology_health_delay"))
    dropin, kubeadm_dir = get("kubelet_topology_dropin_name"), get("kubelet_topology_kubeadm_config_dir")
    problems = _broken(get, [
        # kubernetes v1.36.3 pkg/kubelet/cm/cpumanager/cpu_manager.go NewManager: the static policy needs a CPU reservation
        (get("kubelet_topology_cpu_manager_policy") == "static" and not _length(get("kubelet_topology_reserved_system_cpus"))
         and not _cpu_key(get("kubelet_topology_extra_settings")),
         "kubelet_topology_cpu_manager_policy",
         "the static policy needs kubelet_topology_reserved_system_cpus (or kubeReserved/systemReserved cpu in kubelet_topology_extra_settings)"),
        # pkg/kubelet/cm/memorymanager/policy_static.go NewPolicyStatic: the Static policy needs reservedMemory
        (get("kubelet_topology_memory_manager_policy") == "Static" and not _length(get("kubelet_topology_reserved_memory")),
         "kubelet_topology_memory_manager_policy", "the Static policy needs kubelet_topology_reserved_memory"),
        (timeout <= 0, "kubelet_topology_health_timeout", "must be a positive number of seconds"),
        (delay <= 0, "kubelet_topology_health_delay", "must be a positive number of seconds"),
        (delay > timeout, "kubelet_topology_health_delay",
         "must be at most kubelet_topology_health_timeout (%s)" % _shown(get("kubelet_topology_health_timeout"))),
        (not _matches(dropin, r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.conf$"), "kubelet_topology_dropin_name",
         "must be a file name ending in .conf (the kubelet reads only *.conf from its drop-in directory)"),
        (_matches(dropin, r"^00-"), "kubelet_topology_dropin_name", "must not start with 00- (the kubeadm drop-in sorts first)"),
        (kubeadm_dir != "" and not _matches(kubeadm_dir, r"^/"), "kubelet_topology_kubeadm_config_dir",
         "must be an absolute directory, or empty"),
    ])
    return problems + _topology_options(get("kubelet_topology_topology_manager_policy_options"))


def _cpu_key(extra):
    """kubeReserved/systemReserved with a cpu key (any value, as Jinja's ``.cpu is defined``)."""
    extra = extra if isinstance(extra, Mapping) else {}
    return any(isinstance(extra.get(key), Mapping) and "cpu" in extra[key] for key in ("kubeReserved", "systemReserved"))


def _topology_options(options):
    """What the kubelet v1.36.3 accepts as topologyManagerPolicyOptions (pkg/kubelet/cm/topologymanager/policy_options.go):
    an unknown option, a value Go's strconv refuses or a max-allowable-numa-nodes below 8 stops it at start.  The module
    refuses the same before writing (node/_kubelet.py topology_option_value); this stops the role before its plan reads
    the node."""
    name = "kubelet_topology_topology_manager_policy_options"
    if not isinstance(options, Mapping):
        return ["%s=%s: must be a mapping of option to value" % (name, _shown(options))]
    problems, shown = [], "%s=%s" % (name, _shown(dict(options)))
    unknown = [key for key in options if key not in TOPOLOGY_OPTIONS]
    if unknown:
        problems.append("%s: the kubelet knows %s only (not %s)" % (shown, " and ".join(TOPOLOGY_OPTIONS), ", ".join(map(str, unknown))))
    max_numa = options.get("max-allowable-numa-nodes", DEFAULT_MAX_NUMA_NODES)
    if isinstance(max_numa, bool) or not _matches(max_numa, r"^[+-]?[0-9]+$") or _int(max_numa) < DEFAULT_MAX_NUMA_NODES:
        problems.append("%s: max-allowable-numa-nodes must be an integer of at least %d (below %d the kubelet does not start: "
                        "kubernetes v1.36.3 pkg/kubelet/cm/topologymanager/policy_options.go)" % (shown, DEFAULT_MAX_NUMA_NODES, DEFAULT_MAX_NUMA_NODES))
    if "%s" % (options.get("prefer-closest-numa-nodes", "false"),) not in GO_BOOLS:
        problems.append("%s: prefer-closest-numa-nodes must be true or false as Go's strconv.ParseBool reads it (%s)" % (shown, ", ".join(GO_BOOLS)))
    return problems


def container_runtime(settings):
    """roles/container_runtime: the runtime's name and paths, the readiness wait, and CDI where the device plugin needs it."""
    get = settings.get
    cdi_strategies = [strategy for strategy in get("device_plugin_device_list_strategy") or [] if _matches(strategy, r"^cdi-")]
    return _broken(get, [
        (not passes(check_dns_label, "%s" % (get("container_runtime_runtime_name"),)), "container_runtime_runtime_name",
         "must be a DNS label (it is the RuntimeClass handler)"),
        (not os.path.isabs("%s" % (get("container_runtime_runtime_binary"),)), "container_runtime_runtime_binary", "must be an absolute path"),
        (not os.path.isabs("%s" % (get("container_runtime_config"),)), "container_runtime_config", "must be an absolute path"),
        (not os.path.isabs("%s" % (get("container_runtime_drop_in"),)) or not _matches(get("container_runtime_drop_in"), r".*[.]toml$"),
         "container_runtime_drop_in", "must be the absolute path of a .toml file"),
        (_int(get("container_runtime_ready_timeout")) <= 0, "container_runtime_ready_timeout", "must be a positive number of seconds"),
        # The device plugin's CDI strategies reach a container only through containerd's CDI support, which containerd 1.7
        # has off by default: its CRI plugin then ignores the CDI annotations and CDIDevices of every container (containerd
        # v1.7 pkg/cri/server/container_create_linux.go: WithCDI only with EnableCDI), without an error.
        (not _bool(get("container_runtime_enable_cdi")) and cdi_strategies, "container_runtime_enable_cdi",
         "device_plugin_device_list_strategy has %s: containerd 1.7 (a version-2 config) would drop the GPUs of every container "
         "without an error; set container_runtime_enable_cdi=true (its default with these strategies), or use "
         "device_plugin_device_list_strategy [envvar]" % ", ".join(cdi_strategies)),
    ])


def cgroup_limits(settings):
    """roles/cgroup_limits: the memory throttling factor and what enforceNodeAllocatable enforces.

    The kubelet refuses to start otherwise: kubernetes v1.36.3 pkg/kubelet/apis/config/validation/validation.go (the
    entries, none alone, no entry twice, a reservation's plain and -compressible entries not together, each with its
    cgroup) and pkg/kubelet/cm/node_container_manager_linux.go enforceExistingCgroup (an enforced reservation without
    an amount: "cgroup is not configured properly").  tests/unit/test_role_preflight_kubelet.py holds each rule against
    the kubelet's own validation (kubelet-validate)."""
    get = settings.get
    enforced = get("cgroup_limits_enforce_node_allocatable") or []
    unknown = [value for value in enforced if value not in ENFORCE_VALUES]
    twice = sorted({str(value) for value in enforced if enforced.count(value) > 1})
    return _broken(get, [
        (not 0 < _float(get("cgroup_limits_factor")) <= 1, "cgroup_limits_factor",
         "out of range: the kubelet's memoryThrottlingFactor must be greater than 0 and at most 1"),
        (unknown, "cgroup_limits_enforce_node_allocatable",
         "each entry must be one of %s (not %s)" % (", ".join(ENFORCE_VALUES), ", ".join(map(str, unknown)))),
        ("none" in enforced and len(enforced) != 1, "cgroup_limits_enforce_node_allocatable", "none must stand alone"),
        (twice, "cgroup_limits_enforce_node_allocatable", "names %s more than once" % ", ".join(twice)),
    ] + [
        (reserved in enforced and reserved + "-compressible" in enforced, "cgroup_limits_enforce_node_allocatable",
         "takes %s or %s-compressible, not both" % (reserved, reserved))
        for reserved in ("kube-reserved", "system-reserved")
    ] + [
        (entry in enforced and not (_length(get("cgroup_limits_%s" % name)) and _length(get("cgroup_limits_%s_cgroup" % name))),
         "cgroup_limits_enforce_node_allocatable",
         "enforces %s without its amount or cgroup: set cgroup_limits_%s (is %s) and cgroup_limits_%s_cgroup (is %s)"
         % (entry, name, _shown(get("cgroup_limits_%s" % name)), name, _shown(get("cgroup_limits_%s_cgroup" % name))))
        for reserved, name in (("kube-reserved", "kube_reserved"), ("system-reserved", "system_reserved"))
        for entry in (reserved, reserved + "-compressible")
    ])


def device_permissions(settings):
    """roles/device_permissions: the policy and the owner, group and mode it takes."""
    policy, owner, group, mode = (settings.get("device_permissions_%s" % key) for key in ("policy", "owner", "group", "mode"))
    problems = []
    if policy == "default" and any(value is not None for value in (owner, group, mode)):
        problems.append("device_permissions_policy=default keeps the driver default (root:root 0666): leave "
                        "device_permissions_owner/group/mode null, or use policy restricted or custom.")
    if policy == "restricted" and (group is None or (mode is not None and not _matches(mode, r"^0?[0-7][0-7]0$"))):
        problems.append("device_permissions_policy=restricted needs device_permissions_group (pods then need its GID in "
                        'securityContext.supplementalGroups) and a mode ending in 0, e.g. "0660" (got group=%s, mode=%s).' % (group, mode))
    if policy == "custom" and mode is None:
        problems.append('device_permissions_policy=custom needs device_permissions_mode, e.g. "0666".')
    if mode is not None and not _matches(mode, r"^0?[0-7]{3}$"):
        problems.append('device_permissions_mode=%s is not a quoted octal mode such as "0660".' % (mode,))
    return problems


def device_plugin(settings):
    """roles/device_plugin: the release, the node's label and taint, the strategies, the wait and what may be adopted."""
    get = settings.get
    installers = get("device_plugin_adopt_installers")
    return _broken(get, [
        (not isinstance(get("device_plugin_version"), str) or not get("device_plugin_version"), "device_plugin_version", "must be a release tag"),
        (not isinstance(get("device_plugin_gpu_label_key"), str) or not get("device_plugin_gpu_label_key"), "device_plugin_gpu_label_key",
         "must be a non-empty string"),
        (not isinstance(get("device_plugin_gpu_label_value"), str), "device_plugin_gpu_label_value", "must be a (quoted) string"),
        (get("device_plugin_taint") not in TAINT_STATES, "device_plugin_taint", "must be one of %s" % "/".join(TAINT_STATES)),
        (get("device_plugin_mig_strategy") not in MIG_STRATEGIES, "device_plugin_mig_strategy", "must be one of %s" % "/".join(MIG_STRATEGIES)),
        (not _sequence(get("device_plugin_device_list_strategy")), "device_plugin_device_list_strategy", "must be a list"),
        (_int(get("device_plugin_wait_timeout")) <= 0, "device_plugin_wait_timeout", "must be a positive number of seconds"),
        (get("device_plugin_gpu_node") is not None and not isinstance(get("device_plugin_gpu_node"), bool), "device_plugin_gpu_node",
         "must be null or a boolean"),
        (not isinstance(get("device_plugin_node_name"), str) or not get("device_plugin_node_name"), "device_plugin_node_name",
         "must be a non-empty string"),
        (not isinstance(get("device_plugin_runtime_class_name"), str), "device_plugin_runtime_class_name",
         'must be a string ("" for nvidia as containerd\'s default runtime)'),
        (not _sequence(installers) or any(installer not in ADOPTABLE_INSTALLERS for installer in installers), "device_plugin_adopt_installers",
         "must be a list of at most [%s] (the GPU Operator cannot be adopted: it reverts every change)" % ", ".join(ADOPTABLE_INSTALLERS)),
    ])


def mig(settings):
    """roles/mig: exactly one layout source, and the settings that go with it."""
    get = settings.get
    sources = [name for name in ("mig_layout", "mig_config", "mig_config_file") if _length(get(name))]
    return _broken(get, [
        (len(sources) != 1, "mig_layout", "set exactly one of mig_layout, mig_config, mig_config_file (set: %s)" % (", ".join(sources) or "none")),
        (not _length(get("mig_layout")) and not _length(get("mig_selected")), "mig_selected",
         "is required with mig_config or mig_config_file (the configuration to apply)"),
        (get("mig_strategy") not in MIG_STRATEGIES, "mig_strategy", "must be one of %s" % "|".join(MIG_STRATEGIES)),
        (get("mig_reset_method") not in MIG_RESET_METHODS, "mig_reset_method", "must be one of %s" % "|".join(MIG_RESET_METHODS)),
        (get("mig_reset_method") == "command" and not _length(get("mig_reset_command")), "mig_reset_command",
         "must be non-empty with mig_reset_method command"),
        (_bool(get("mig_drain")) and not _length(get("mig_node_name")), "mig_node_name", "is required when draining (mig_drain)"),
    ])


def node_maintenance(settings):
    """roles/node_maintenance: the Node's name, the state, the drain's timeout and retry interval, the Ready wait."""
    get = settings.get
    name = get("node_maintenance_node_name")
    timeout, interval = _int(get("node_maintenance_timeout")), _int(get("node_maintenance_retry_interval"))
    return _broken(get, [
        (not _length(name) or re.search(r"[,= /]", "%s" % (name,)) is not None, "node_maintenance_node_name",
         "must be a Node's metadata.name (not empty; no comma, equals sign, space or slash)"),
        (get("node_maintenance_state") not in MAINTENANCE_STATES, "node_maintenance_state", "must be one of %s" % ", ".join(MAINTENANCE_STATES)),
        (timeout <= 0, "node_maintenance_timeout", "must be a positive number of seconds"),
        (interval <= 0, "node_maintenance_retry_interval", "must be a positive number of seconds"),
        (interval > timeout > 0, "node_maintenance_retry_interval",
         "must be at most node_maintenance_timeout (%s)" % _shown(get("node_maintenance_timeout"))),
        (_int(get("node_maintenance_ready_timeout")) < 0, "node_maintenance_ready_timeout", "must be 0 or more seconds"),
    ])


def runtime_class(settings):
    """roles/runtime_class: the handler and the name, and one containerd runtime name across the play's hosts
    (``runtime_class_play_handlers``: each host's container_runtime_handler, where set)."""
    get = settings.get
    handlers = sorted({"%s" % (handler,) for handler in get("runtime_class_play_handlers") or []})
    return _broken(get, [
        (not passes(check_dns_label, "%s" % (get("runtime_class_handler"),)), "runtime_class_handler", "must be a DNS label"),
        (not passes(check_dns_subdomain, "%s" % (get("runtime_class_name"),)), "runtime_class_name", "must be a DNS subdomain"),
        (len(handlers) > 1, "runtime_class_play_handlers",
         "the hosts of the play must agree on containerd's runtime name (container_runtime_handler); they report %s" % ", ".join(handlers)),
    ])


def node_prerequisites(settings):
    """roles/node_prerequisites: the venv and wheel directories, the packages, the Python, the index and the wheels."""
    get = settings.get
    return _broken(get, [
        (not _matches(get("node_prerequisites_venv"), r"^/.*[^/]$"), "node_prerequisites_venv", "must be an absolute directory (no trailing /)"),
        (not _matches(get("node_prerequisites_wheels_dest"), r"^/.*[^/]$"), "node_prerequisites_wheels_dest",
         "must be an absolute directory (no trailing /)"),
        (not _length(get("node_prerequisites_packages")), "node_prerequisites_packages", "must be a non-empty list"),
        (_length(get("node_prerequisites_system_python")) and not _matches(get("node_prerequisites_system_python"), r"^/"),
         "node_prerequisites_system_python", 'must be an absolute path, or ""'),
        (_length(get("node_prerequisites_index_url")) and not _matches(get("node_prerequisites_index_url"), r"^(https?|file)://"),
         "node_prerequisites_index_url", 'must be an http(s):// or file:// URL, or ""'),
        (_length(get("node_prerequisites_wheels")) and not _matches(get("node_prerequisites_wheels"), r"^/"),
         "node_prerequisites_wheels", 'must be an absolute path, or ""'),
    ])


def _names(role, *names):
    return tuple("%s_%s" % (role, name) for name in names)


# role -> (the variables its rules read, the value an undefined one takes, the rules)
ROLES = {
    "kubelet_topology": (_names("kubelet_topology", "cpu_manager_policy", "reserved_system_cpus", "extra_settings", "memory_manager_policy",
                                "reserved_memory", "health_timeout", "health_delay", "dropin_name", "kubeadm_config_dir",
                                "topology_manager_policy_options"), {}, kubelet_topology),
    "container_runtime": (_names("container_runtime", "runtime_name", "runtime_binary", "config", "drop_in", "ready_timeout", "enable_cdi")
                          + ("device_plugin_device_list_strategy",), {"device_plugin_device_list_strategy": ["envvar"]}, container_runtime),
    "cgroup_limits": (_names("cgroup_limits", "factor", "enforce_node_allocatable", "kube_reserved", "kube_reserved_cgroup", "system_reserved",
                             "system_reserved_cgroup"), {}, cgroup_limits),
    "device_permissions": (_names("device_permissions", "policy", "owner", "group", "mode"), {}, device_permissions),
    "device_plugin": (_names("device_plugin", "version", "gpu_label_key", "gpu_label_value", "taint", "mig_strategy", "device_list_strategy",
                             "wait_timeout", "gpu_node", "node_name", "runtime_class_name", "adopt_installers"), {}, device_plugin),
    "mig": (_names("mig", "layout", "config", "config_file", "selected", "strategy", "reset_method", "reset_command", "drain", "node_name"),
            {}, mig),
    "node_maintenance": (_names("node_maintenance", "node_name", "state", "timeout", "retry_interval", "ready_timeout"), {}, node_maintenance),
    "runtime_class": (_names("runtime_class", "handler", "name"), {}, runtime_class),
    "node_prerequisites": (_names("node_prerequisites", "venv", "wheels_dest", "packages", "system_python", "index_url", "wheels"), {},
                           node_prerequisites),
}


def problems(role, settings):
    """Every rule of the role that its variables break, one line each ([] when none)."""
    return ROLES[role][2](settings)
