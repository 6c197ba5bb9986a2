# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The roles' module options, built from the roles' variables (issue 45 items 1 and 3), in Python rather than in each
role's vars/main.yml Jinja.

Each role's vars/main.yml exposes its options maps (``<role>_audit_options``, the ``__<role>_..._options`` its tasks
pass their module) as one lookup each, ``lookup('gpuharden.k8s.role_options', '<name>')``; the lookup templates the
variables ``inputs(name)`` names and hands them to ``options(name, values)``.

Where a setting goes is written once, in the settings table (core/_settings.py): ``feeds`` is the (module, option) a
setting is passed to, ``feed_as`` how (as it is, cast, or left out when empty or none, as the Jinja's ``or omit`` did).
What is not one setting to one option is built here: the GPU Operator's view (from the plan), the device plugin's node
selector and labels (from the label key and value), cgroup_limits' kubelet settings, and their merge into
kubelet_topology's.  Pure: plain values in and out; controller side only (the lookup), never on a node.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _errors
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._jinja_filters import as_bool, as_float, as_int
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import ROLES, UNSET, playbook_default


class _Omit:
    """An option left out, as the Jinja's ``omit`` left it out of the map."""


OMIT = _Omit()


# How a setting is passed to the option it feeds (the table's feed_as).
FEED_AS = {
    None: lambda value: value,
    "float": as_float,
    "bool": as_bool,
    "omit_empty": lambda value: value if value else OMIT,
    "omit_none": lambda value: OMIT if value is None else value,
    "omit_unless_positive": lambda value: value if as_int(value) > 0 else OMIT,
}

# cgroup_limits' durable fix: the KubeletConfiguration field each setting gives, left out where the setting is empty
# (the kubelet's own default then applies).
CGROUP_LIMITS_KUBELET_FIELDS = {
    "cgroup_limits_kube_reserved": "kubeReserved",
    "cgroup_limits_system_reserved": "systemReserved",
    "cgroup_limits_kube_reserved_cgroup": "kubeReservedCgroup",
    "cgroup_limits_system_reserved_cgroup": "systemReservedCgroup",
    "cgroup_limits_enforce_node_allocatable": "enforceNodeAllocatable",
}
# Variables read where set, with the value the Jinja's default() gave where not: the plan of harden/drift's node_audit
# (none when the role runs alone), the stages taken over from the GPU Operator, cgroup_limits' kubelet settings (a play
# without role cgroup_limits merges none).
OPTIONAL = {"gpuharden_node_plan": {}, "gpuharden_operator_takeover": playbook_default("gpuharden_operator_takeover"),
            "cgroup_limits_audit_kubelet_settings": {}}


class _Undefined:
    """A variable the calling task does not have (what ``followed``'s ``read`` returns for one)."""


UNDEFINED = _Undefined()
# The settings whose role default is left unset, their follows resolved here rather than by a Jinja default (the
# table's follow_in_python): name -> (the variables read first, in order; the value where none is set, UNDEFINED for none).
FOLLOWED = {entry["name"]: (entry["follows"], UNDEFINED if entry["default"] is UNSET else entry["default"])
            for role in ROLES.values() for entry in role["settings"] if entry["follow_in_python"]}


def followed(name, read):
    """The variable ``name`` as the role reads it: ``read(name)`` where set; for one of FOLLOWED left unset, the first
    of its follows that is set, else its default (as ``{{ a | default(b) | default(<default>) }}`` gave it); else
    UNDEFINED.  ``read(variable)`` is the variable's templated value, or UNDEFINED where the calling task lacks it."""
    value = read(name)
    if value is not UNDEFINED or name not in FOLLOWED:
        return value
    follows, default = FOLLOWED[name]
    for variable in follows:
        value = read(variable)
        if value is not UNDEFINED:
            return value
    return default


def _settings_feeding(role, module):
    return [entry for entry in ROLES[role]["settings"] if entry["feeds"] and entry["feeds"][0] == module]


def fed(role, module, values):
    """{option: value} of every setting of ``role`` the table says feeds ``module``, passed as its feed_as says."""
    options = {}
    for entry in _settings_feeding(role, module):
        value = FEED_AS[entry.get("feed_as")](values[entry["name"]])
        if value is not OMIT:
            options[entry["feeds"][1]] = value
    return options


def _gpu_operator(values):
    """What the GPU Operator runs on this node, as the plan's node_audit read it from the ClusterPolicy (none without a
    plan: the module then reads the node's layout), with the stages gpuharden takes over from it."""
    plan = values.get("gpuharden_node_plan", OPTIONAL["gpuharden_node_plan"])
    operator = plan.get("gpu_operator") if isinstance(plan, dict) else None
    return dict(operator or {}, takeover=values.get("gpuharden_operator_takeover", list(OPTIONAL["gpuharden_operator_takeover"])))


def merge_recursive(base, extra):
    """``base | combine(extra, recursive=true)``: mappings merged key by key, anything else replaced by ``extra``'s."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = merge_recursive(merged[key], value) if isinstance(merged.get(key), dict) and isinstance(value, dict) else value
    return merged


def _label(values):
    return {values["device_plugin_gpu_label_key"]: values["device_plugin_gpu_label_value"]}


def _cgroup_limits_kubelet_settings(values):
    if not as_bool(values["cgroup_limits_kubelet"]):
        return {}
    settings = {"memoryThrottlingFactor": as_float(values["cgroup_limits_factor"])}
    if as_bool(values["cgroup_limits_memory_qos_feature_gate"]):
        settings["featureGates"] = {"MemoryQoS": True}
    settings.update((field, values[name]) for name, field in CGROUP_LIMITS_KUBELET_FIELDS.items() if values[name])
    return settings


def _kubelet_topology(values):
    options = fed("kubelet_topology", "kubelet_config", values)
    options["settings"] = merge_recursive(values["kubelet_topology_extra_settings"],
                                          values.get("cgroup_limits_audit_kubelet_settings", OPTIONAL["cgroup_limits_audit_kubelet_settings"]))
    options["backup"] = True
    return options


def _mig_audit(values):
    return fed("mig", "mig_layout", values) if (values["mig_layout"] or values["mig_config"] or values["mig_config_file"]) else {}


def _mig_refused(values):
    """The plan's refusal of the mig check (harden's node_audit; [] without a plan, or where it refused nothing)."""
    plan = values.get("gpuharden_node_plan", OPTIONAL["gpuharden_node_plan"])
    checks = plan.get("checks") if isinstance(plan, dict) else None
    mig = checks.get("mig") if isinstance(checks, dict) else None
    return mig.get("refused", []) if isinstance(mig, dict) else []


def _device_plugin(values):
    options = dict(fed("device_plugin", "device_plugin", values), node_selector=_label(values))
    # an option that is none is left out: the module takes an option given as null as given, and refuses it where it has choices
    return {option: value for option, value in options.items() if value is not None}


# exposed name -> (role, the module whose options it is, how it is built, variables it reads besides the role's feeding
# settings)
BUILDERS = {
    "cgroup_limits_audit_options": ("cgroup_limits", "cgroup_memory", None, ()),
    "__cgroup_limits_memory_options": ("cgroup_limits", "cgroup_memory", None, ()),
    "cgroup_limits_audit_kubelet_settings": ("cgroup_limits", None, _cgroup_limits_kubelet_settings,
                                             ("cgroup_limits_kubelet", "cgroup_limits_factor", "cgroup_limits_memory_qos_feature_gate",
                                              *CGROUP_LIMITS_KUBELET_FIELDS)),
    "container_runtime_audit_options": ("container_runtime", "containerd_nvidia_runtime",
                                        lambda values: dict(fed("container_runtime", "containerd_nvidia_runtime", values), gpu_operator=_gpu_operator(values)),
                                        ("gpuharden_node_plan", "gpuharden_operator_takeover")),
    "device_permissions_audit_options": ("device_permissions", "nvidia_device_nodes",
                                         lambda values: dict(fed("device_permissions", "nvidia_device_nodes", values), gpu_operator=_gpu_operator(values)),
                                         ("gpuharden_node_plan", "gpuharden_operator_takeover")),
    "device_plugin_audit_options": ("device_plugin", "device_plugin", _device_plugin, ("device_plugin_gpu_label_key", "device_plugin_gpu_label_value")),
    "__device_plugin_label_options": ("device_plugin", None, lambda values: {"labels": _label(values), "taint": values["device_plugin_taint"]},
                                      ("device_plugin_gpu_label_key", "device_plugin_gpu_label_value", "device_plugin_taint")),
    "kubelet_topology_audit_options": ("kubelet_topology", "kubelet_config", _kubelet_topology,
                                       ("kubelet_topology_extra_settings", "cgroup_limits_audit_kubelet_settings")),
    "mig_audit_options": ("mig", "mig_layout", _mig_audit, ()),
    "__mig_module_options": ("mig", "mig_layout", None, ()),
    "runtime_class_audit_options": ("runtime_class", "runtime_class", None, ()),
    "__mig_operator_refused": ("mig", None, _mig_refused, ("gpuharden_node_plan",)),
}
# The maps no vars/main.yml exposes: only the stage actions read them (mig_plan, mig_stage, kubelet_topology_plan,
# device_permissions_repair, cgroup_limits_immediate, device_plugin_stage), which build them where they read them
# (plugins/plugin_utils/_stage_action.py role_setting).
BUILT_WHERE_READ = ("__mig_module_options", "__mig_operator_refused", "__kubelet_topology_module_options",
                    "__device_permissions_module_options", "__cgroup_limits_memory_options", "__device_plugin_label_options")
# The same map under the name the role's own tasks pass their module (their module call and the audit take one map).
BUILDERS["__device_permissions_module_options"] = BUILDERS["device_permissions_audit_options"]
BUILDERS["__kubelet_topology_module_options"] = BUILDERS["kubelet_topology_audit_options"]


def inputs(name):
    """The variables ``options(name, ...)`` reads, in order; those in OPTIONAL may be left out."""
    role, module, _build, extra = _builder(name)
    names = [entry["name"] for entry in _settings_feeding(role, module)] if module else []
    if name == "mig_audit_options":
        names += ["mig_layout", "mig_config", "mig_config_file"]
    return tuple(dict.fromkeys(names + list(extra)))


def _builder(name):
    if name not in BUILDERS:
        raise _errors.GpuhardenError("role options %r: unknown; one of %s" % (name, ", ".join(sorted(BUILDERS))),
                                     fix="name one of the roles' options maps (plugins/module_utils/core/_role_options.py BUILDERS)")
    return BUILDERS[name]


def built(name, read):
    """The map ``name`` from the variables ``read`` gives (followed: as the calling task sees them), as the lookup
    builds it; GpuhardenError naming the variables it needs and cannot read."""
    values = {variable: followed(variable, read) for variable in inputs(name)}
    missing = [variable for variable, value in values.items() if value is UNDEFINED and variable not in OPTIONAL]
    if missing:
        raise _errors.GpuhardenError("role options %s: %s undefined" % (name, ", ".join(missing)),
                                     fix="run the task in role gpuharden.k8s.%s, whose defaults set them" % BUILDERS[name][0])
    return options(name, {variable: value for variable, value in values.items() if value is not UNDEFINED})


def options(name, values):
    """The options map ``name`` (a key of BUILDERS) from the role's variables ``values`` (templated; those of
    ``inputs(name)``, where OPTIONAL ones may be missing)."""
    role, module, build, _extra = _builder(name)
    return build(values) if build else fed(role, module, values)
