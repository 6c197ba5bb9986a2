# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 items 1 and 3: the roles' module options are built in Python (core/_role_options.py, through the lookup
gpuharden.k8s.role_options) from the settings table's ``feeds``/``feed_as``, not in each role's vars/main.yml Jinja.

The judge is the Jinja they replaced: tests/unit/role_options_render.py renders every options map with Ansible's
Templar from the roles' defaults, once through the vars/main.yml files now and once through copies of the old ones
(tests/unit/fixtures/role_options_before/), over a matrix of values (defaults, every option set, empty, none, strings
where a cast applies, templated values), and each map must come out equal, key for key and type for type.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.gpuharden.k8s.plugins.lookup import role_options as lookup_plugin
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _role_options, _settings
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "tests" / "unit" / "role_options_render.py"
# every map the roles expose, and the name the old vars/main.yml gave the same map where it had another
MAPS = sorted(_role_options.BUILDERS)
OLD_NAMES = {"container_runtime_audit_options": ("__container_runtime_module_options",),
             "runtime_class_audit_options": ("__runtime_class_object_options",)}
PLAN = {"gpu_operator": {"driver": True, "toolkit": True, "mig_manager": False}, "checks": {"mig": {"refused": []}}}
CASES = {
    "the defaults": {},
    "every option set": {
        "cgroup_limits_cgroup_root": "/cg", "cgroup_limits_factor": 0.5, "cgroup_limits_page_size": 4096, "cgroup_limits_memory_qos_feature_gate": False,
        "cgroup_limits_kube_reserved": {"cpu": "1"}, "cgroup_limits_system_reserved": {"memory": "1Gi"},
        "cgroup_limits_kube_reserved_cgroup": "/kube.slice", "cgroup_limits_system_reserved_cgroup": "/system.slice",
        "cgroup_limits_enforce_node_allocatable": ["pods", "kube-reserved"],
        "container_runtime_config": "/etc/c.toml", "container_runtime_runtime_name": "nv", "container_runtime_runtime_binary": "/bin/nv",
        "container_runtime_base_runtime": "crun", "container_runtime_set_as_default": True, "container_runtime_enable_cdi": True,
        "container_runtime_drop_in": "/etc/d.toml", "container_runtime_on_missing_runtime_binary": "warn",
        "gpuharden_node_plan": PLAN, "gpuharden_operator_takeover": ["container_runtime", "device_permissions"],
        "device_permissions_policy": "restricted", "device_permissions_owner": "root", "device_permissions_group": "video",
        "device_permissions_mode": "0660", "device_permissions_create_missing": False, "device_permissions_char_links": False,
        "device_permissions_persist": False, "device_permissions_modprobe_file": "/etc/m.conf", "device_permissions_udev_rules_file": "/etc/u.rules",
        "device_permissions_on_conflict": "warn",
        "device_plugin_version": "v0.17.0", "device_plugin_image_registry": "mirror.example/nvidia", "device_plugin_image_repository": "dp",
        "device_plugin_pull_policy": "Always", "device_plugin_image_pull_secrets": ["pull"], "device_plugin_namespace": "gpu",
        "device_plugin_name": "dp", "device_plugin_config_map_name": "dp-config", "device_plugin_gpu_label_key": "example.com/gpu",
        "device_plugin_gpu_label_value": "yes", "device_plugin_taint": "present", "device_plugin_tolerations": [],
        "device_plugin_priority_class_name": "", "device_plugin_mig_strategy": "mixed", "device_plugin_device_list_strategy": ["cdi-cri"],
        "device_plugin_device_id_strategy": "index", "device_plugin_fail_on_init_error": False, "device_plugin_pass_device_specs": True,
        "device_plugin_nvidia_driver_root": "/run/nvidia/driver", "device_plugin_nvidia_dev_root": "/",
        "device_plugin_shared_devices_allocation_policy": "packed",
        "device_plugin_time_slicing": {"replicas": 4}, "device_plugin_gpu_feature_discovery": True, "device_plugin_remove_competing": True,
        "device_plugin_runtime_class_name": "", "device_plugin_adopt_installers": ["helm"], "device_plugin_force": True, "device_plugin_wait": False,
        "device_plugin_wait_timeout": 60,
        "kubelet_topology_topology_manager_policy": "restricted", "kubelet_topology_topology_manager_scope": "pod",
        "kubelet_topology_topology_manager_policy_options": {"prefer-closest-numa-nodes": "true"}, "kubelet_topology_numa_over_limit": "keep_policy",
        "kubelet_topology_cpu_manager_policy": "static", "kubelet_topology_reserved_system_cpus": "0-1", "kubelet_topology_memory_manager_policy": "Static",
        "kubelet_topology_reserved_memory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}],
        "kubelet_topology_extra_settings": {"kubeReserved": {"cpu": "2", "memory": "1Gi"}, "featureGates": {"Other": True}, "maxPods": 50},
        "kubelet_topology_flavor": "kubeadm", "kubelet_topology_service": "kubelet", "kubelet_topology_on_flag_conflict": "fail",
        "kubelet_topology_dropin_name": "60-x.conf", "kubelet_topology_kubeadm_config_dir": "", "kubelet_topology_require_durable": True,
        "mig_layout": {"all": {"1g.10gb": 7}}, "mig_config": {"version": "v1", "mig-configs": {}}, "mig_config_file": "/etc/mig.yaml",
        "mig_selected": "all-1g", "mig_strategy": "single", "mig_force": True, "mig_root": "/host",
        "runtime_class_name": "nv", "runtime_class_handler": "nv", "runtime_class_node_selector": {"a": "b"},
        "runtime_class_tolerations": [{"key": "k", "operator": "Exists"}], "runtime_class_overhead_pod_fixed": {"cpu": "100m"},
    },
    "empty values": {
        "cgroup_limits_page_size": 0, "cgroup_limits_kube_reserved_cgroup": "", "cgroup_limits_enforce_node_allocatable": [],
        "kubelet_topology_topology_manager_policy": "", "kubelet_topology_topology_manager_scope": "", "kubelet_topology_cpu_manager_policy": "",
        "kubelet_topology_extra_settings": {}, "device_plugin_image_pull_secrets": [], "device_plugin_gpu_label_value": "",
        "gpuharden_node_plan": {}, "gpuharden_operator_takeover": [], "mig_layout": {}, "mig_config": {}, "mig_config_file": "/etc/mig.yaml",
        "mig_selected": "", "runtime_class_node_selector": {}, "runtime_class_overhead_pod_fixed": {},
    },
    "none values": {
        "cgroup_limits_page_size": None, "cgroup_limits_kube_reserved": None, "cgroup_limits_system_reserved_cgroup": None,
        "device_permissions_owner": None, "device_permissions_group": None, "device_permissions_mode": None,
        "device_plugin_version": None, "device_plugin_nvidia_dev_root": None, "device_plugin_time_slicing": None, "device_plugin_tolerations": None,
        "device_plugin_taint": None, "kubelet_topology_cpu_manager_policy": None, "kubelet_topology_reserved_memory": None,
        "gpuharden_node_plan": None, "gpuharden_operator_takeover": None, "runtime_class_node_selector": None,
    },
    "strings where a cast applies": {
        "cgroup_limits_factor": "0.75", "cgroup_limits_page_size": "8192", "cgroup_limits_kubelet": "yes", "cgroup_limits_memory_qos_feature_gate": "no",
        "kubelet_topology_require_durable": "yes", "mig_layout": {"0": {"2g.20gb": 3}}, "mig_force": "true",
        "container_runtime_set_as_default": "yes", "device_plugin_wait_timeout": "600", "device_permissions_create_missing": "no",
    },
    "a negative page size, an unparsable factor, other spellings of true": {
        "cgroup_limits_page_size": -1, "cgroup_limits_factor": "lots", "kubelet_topology_require_durable": "y", "cgroup_limits_kubelet": "On",
        "cgroup_limits_memory_qos_feature_gate": 1, "mig_layout": {"all": {"1g.10gb": 7}}, "mig_force": 1.0,
    },
    "the durable fix off, extra kubelet settings": {
        "cgroup_limits_kubelet": False, "kubelet_topology_extra_settings": {"memoryThrottlingFactor": 0.7, "featureGates": {"MemoryQoS": False}},
    },
    "extra kubelet settings under the durable fix": {
        "kubelet_topology_extra_settings": {"memoryThrottlingFactor": 0.7, "featureGates": {"MemoryQoS": False, "Other": True},
                                            "kubeReserved": {"cpu": "2"}},
        "cgroup_limits_kube_reserved": {"memory": "1Gi"},
    },
    "extra kubelet settings that cgroup_limits leaves empty": {
        "kubelet_topology_extra_settings": {"kubeReserved": {"cpu": "2"}, "featureGates": {"Other": True}, "enforceNodeAllocatable": ["pods"]},
    },
    "templated values": {
        "site_registry": "registry.site", "device_plugin_image_registry": "{{ site_registry }}/nvidia",
        "gpuharden_mig_strategy": "single", "gpuharden_cgroup_root": "/sys/fs/cgroup/unified", "gpuharden_mig_layout": {"all": {"1g.10gb": 7}},
        "gpuharden_kubelet_extra_settings": {"maxPods": 200}, "runtime_class_name": "nvidia-cdi",
        "device_plugin_device_list_strategy": ["envvar", "cdi-annotations"], "gpuharden_node_plan": {"gpu_operator": {}},
    },
    "a MIG configuration without a layout": {"mig_config": {"version": "v1", "mig-configs": {"x": []}}, "mig_selected": "x"},
}


# The one difference on purpose: the old Jinja merged cgroup_limits' kubelet settings into kubelet_topology's with its
# omitted fields still in them, as Ansible's omit, which replaced the field of the user's kubelet_topology_extra_settings
# (gpuharden_kubelet_extra_settings) and was then dropped: an inventory's featureGates or kubeReserved vanished from the
# kubelet write wherever cgroup_limits left its own empty.  Now an empty cgroup_limits setting leaves the user's field.
KUBELET_MAPS = ("kubelet_topology_audit_options", "__kubelet_topology_module_options")


def _kept_extra_settings(case, old):
    """The old map, with the fields of the case's kubelet_topology_extra_settings it lost put back (the merge)."""
    extra = CASES[case].get("kubelet_topology_extra_settings") or {}
    settings = old["dict"]["settings"]["dict"]
    kept = {field: _typed(value) for field, value in extra.items() if field not in settings}
    return {"dict": dict(old["dict"], settings={"dict": dict(settings, **kept)})}


def _typed(value):
    sys.path.insert(0, str(RENDER.parent))
    try:
        from role_options_render import typed
    finally:
        sys.path.remove(str(RENDER.parent))
    return typed(value)


@cache
def _render(which):
    names = sorted(set(MAPS) | {old for olds in OLD_NAMES.values() for old in olds}) if which == "old" else MAPS
    request = json.dumps({"vars": which, "names": names, "cases": CASES, "built": _role_options.BUILT_WHERE_READ})
    run = subprocess.run([sys.executable, str(RENDER)], input=request, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_map_is_what_the_old_jinja_gave(case):
    old, new = _render("old")[case], _render("new")[case]
    compared = 0
    for name in MAPS:
        assert "error" not in new[name], (case, name, new[name])
        for old_name in (name,) + OLD_NAMES.get(name, ()):
            if old_name not in old:
                continue
            if "error" in old[old_name]:
                continue  # the old Jinja could not render this value at all (none where it took a length)
            expected = _kept_extra_settings(case, old[old_name]) if name in KUBELET_MAPS else old[old_name]
            assert new[name] == expected, "%s, %s: new %s, old %s %s" % (case, name, new[name], old_name, old[old_name])
            compared += 1
    assert compared >= len(MAPS) - 1, (case, compared)


def test_the_old_jinja_failed_only_where_it_took_a_length_of_none():
    """The one value the old vars could not render (a comparison skipped above) is none given where the Jinja took
    its length: nowhere in these cases."""
    failures = {(case, name) for case, maps in _render("old").items() for name, value in maps.items() if value and "error" in value}
    assert not failures, failures


def test_the_vars_files_only_call_the_lookup():
    """Each role's vars/main.yml exposes each of its maps as one call of the lookup under the map's own name."""
    exposed = {}
    for path in sorted((REPO / "roles").glob("*/vars/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if "gpuharden.k8s.role_options" in str(value):
                assert value == "{{ lookup('gpuharden.k8s.role_options', '%s') }}" % name, (path, name, value)
                exposed[name] = path.parts[-3]
    assert sorted(exposed) == sorted(set(MAPS) - set(_role_options.BUILT_WHERE_READ))
    assert all(exposed[name] == _role_options.BUILDERS[name][0] for name in exposed), exposed


# ---------------------------------------------------------------------------------------------------
# The transforms, one by one


@pytest.mark.parametrize(("feed_as", "value", "expected"), [
    (None, "x", "x"), (None, None, None),
    ("float", "0.5", 0.5), ("float", 1, 1.0), ("float", "lots", 0.0), ("float", None, 0.0),
    ("bool", "yes", True), ("bool", "No", False), ("bool", 1, True), ("bool", None, False), ("bool", "perhaps", False),
    ("bool", "y", False), ("bool", 1.0, True),
    ("omit_empty", "", _role_options.OMIT), ("omit_empty", {}, _role_options.OMIT), ("omit_empty", None, _role_options.OMIT), ("omit_empty", [0], [0]),
    ("omit_none", None, _role_options.OMIT), ("omit_none", "", ""), ("omit_none", 0, 0),
    ("omit_unless_positive", 0, _role_options.OMIT), ("omit_unless_positive", "-1", _role_options.OMIT), ("omit_unless_positive", None, _role_options.OMIT),
    ("omit_unless_positive", "4096", "4096"), ("omit_unless_positive", 4096, 4096), ("omit_unless_positive", "16.0", "16.0"),
])
def test_feed_as(feed_as, value, expected):
    assert _role_options.FEED_AS[feed_as](value) == expected


def test_every_feed_as_of_the_table_is_known():
    used = {entry["feed_as"] for role in _settings.ROLES.values() for entry in role["settings"]}
    assert used <= set(_role_options.FEED_AS) and used - {None}
    assert all(entry["feeds"] for role in _settings.ROLES.values() for entry in role["settings"] if entry["feed_as"])


def test_merge_recursive_is_combine_recursive():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1, "e": {"f": 1}}
    assert _role_options.merge_recursive(base, {"a": {"c": [3], "g": 2}, "d": {"x": 1}, "e": 2}) == {"a": {"b": 1, "c": [3], "g": 2}, "d": {"x": 1}, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1, "e": {"f": 1}}  # the inputs are left as they were


def test_the_gpu_operator_view_and_takeover():
    view = _role_options._gpu_operator
    assert view({}) == {"takeover": []}
    assert view({"gpuharden_node_plan": None, "gpuharden_operator_takeover": None}) == {"takeover": None}
    assert view({"gpuharden_node_plan": {"gpu_operator": {"driver": True}}, "gpuharden_operator_takeover": ["mig"]}) == {"driver": True, "takeover": ["mig"]}


# ---------------------------------------------------------------------------------------------------
# The lookup


def _defaults(*roles):
    values = {"inventory_hostname": "gpu-1"}
    for role in roles:
        values.update(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()))
    return {name: trust_as_template(value) if isinstance(value, str) else value for name, value in values.items()}


def _lookup(variables):
    return lookup_plugin.LookupModule(loader=DataLoader(), templar=Templar(loader=DataLoader(), variables=variables))


def test_the_lookup_templates_the_roles_variables_and_refuses_what_it_cannot_build():
    variables = dict(_defaults("runtime_class", "mig"), runtime_class_name=trust_as_template("{{ inventory_hostname }}-rc"))
    [runtime_class, mig] = _lookup(variables).run(["runtime_class_audit_options", "mig_audit_options"], variables)
    assert runtime_class == {"name": "gpu-1-rc", "handler": "nvidia", "node_selector": {}, "tolerations": [], "overhead_pod_fixed": {}}
    assert mig == {}
    with pytest.raises(AnsibleError, match="role options 'kubelet': unknown; one of"):
        _lookup(variables).run(["kubelet"], variables)
    with pytest.raises(AnsibleError, match="device_plugin_audit_options: device_plugin_version, .* undefined: import the role"):
        _lookup(variables).run(["device_plugin_audit_options"], variables)


def test_an_empty_cgroup_limits_setting_leaves_the_users_kubelet_field():
    """The difference from the old Jinja (KUBELET_MAPS above): gpuharden_kubelet_extra_settings's featureGates and
    kubeReserved reach the kubelet write where cgroup_limits leaves its own empty or off, merged where it sets them."""
    values = yaml.safe_load((REPO / "roles/kubelet_topology/defaults/main.yml").read_text())
    values.update({"kubelet_topology_extra_settings": {"kubeReserved": {"cpu": "2"}, "featureGates": {"Other": True}}, "cgroup_limits_kubelet": True,
              "cgroup_limits_factor": 0.9, "cgroup_limits_memory_qos_feature_gate": False, **dict.fromkeys(_role_options.CGROUP_LIMITS_KUBELET_FIELDS, "")})
    values["cgroup_limits_audit_kubelet_settings"] = _role_options.options("cgroup_limits_audit_kubelet_settings", values)
    assert values["cgroup_limits_audit_kubelet_settings"] == {"memoryThrottlingFactor": 0.9}
    settings = _role_options._kubelet_topology(values)["settings"]
    assert settings == {"kubeReserved": {"cpu": "2"}, "featureGates": {"Other": True}, "memoryThrottlingFactor": 0.9}
    values.update(cgroup_limits_memory_qos_feature_gate=True, cgroup_limits_kube_reserved={"memory": "1Gi"})
    values["cgroup_limits_audit_kubelet_settings"] = _role_options.options("cgroup_limits_audit_kubelet_settings", values)
    assert _role_options._kubelet_topology(values)["settings"] == {"kubeReserved": {"cpu": "2", "memory": "1Gi"},
                                                                   "featureGates": {"Other": True, "MemoryQoS": True}, "memoryThrottlingFactor": 0.9}


def test_kubelet_topology_takes_cgroup_limits_settings_only_where_they_are_defined():
    alone = _defaults("kubelet_topology")
    assert _lookup(alone).run(["kubelet_topology_audit_options"], alone)[0]["settings"] == {}
    both = dict(alone, cgroup_limits_audit_kubelet_settings={"memoryThrottlingFactor": 0.9})
    assert _lookup(both).run(["kubelet_topology_audit_options"], both)[0]["settings"] == {"memoryThrottlingFactor": 0.9}


# ---------------------------------------------------------------------------------------------------
# The settings the roles leave unset, their follows resolved in Python (the table's follow_in_python)


def _reader(variables):
    return lambda name: variables.get(name, _role_options.UNDEFINED)


@pytest.mark.parametrize(("variables", "expected"), [
    ({}, "error"),  # nothing set: the table's default
    ({"gpuharden_postcheck_fail_severity": "warning"}, "warning"),  # the fleet-wide variable
    ({"gpuharden_postcheck_fail_severity": "warning", "postcheck_fail_severity": "error"}, "error"),  # the role's, even equal to the default
    ({"gpuharden_postcheck_fail_severity": None}, None),  # set to null: null, as default() kept it
])
def test_an_unset_setting_follows_its_variables_then_the_default(variables, expected):
    assert _role_options.followed("postcheck_fail_severity", _reader(variables)) == expected


def test_a_follow_without_a_default_and_a_setting_not_followed():
    assert _role_options.followed("postcheck_node_name", _reader({"inventory_hostname": "gpu-1"})) == "gpu-1"
    assert _role_options.followed("postcheck_node_name", _reader({})) is _role_options.UNDEFINED
    assert _role_options.followed("postcheck_nvml", _reader({})) is _role_options.UNDEFINED
    assert _role_options.followed("postcheck_nvml", _reader({"postcheck_nvml": False})) is False


def test_the_followed_settings_are_those_the_table_marks_and_no_defaults_file_sets():
    marked = {entry["name"] for role in _settings.ROLES.values() for entry in role["settings"] if entry["follow_in_python"]}
    assert set(_role_options.FOLLOWED) == marked and len(marked) >= 10
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        written = set(yaml.safe_load(path.read_text()) or {})
        assert not written & marked, (path, written & marked)
    assert all(_role_options.FOLLOWED[name][0] for name in marked)  # each follows something


def test_the_lookup_follows_the_fleet_variable_where_the_role_leaves_it_unset():
    variables = dict(CASES["the defaults"])
    base = {"inventory_hostname": "gpu-1"}
    for role in ("mig",):
        base.update(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()))
    fleet = dict(base, **variables, gpuharden_mig_layout={"all": {"1g.10gb": 7}})
    assert _lookup(fleet).run(["mig_audit_options"], fleet)[0]["layout"] == {"all": {"1g.10gb": 7}}
    own = dict(fleet, mig_layout={"0": {"2g.20gb": 3}})
    assert _lookup(own).run(["mig_audit_options"], own)[0]["layout"] == {"0": {"2g.20gb": 3}}
    assert _lookup(base).run(["mig_audit_options"], base)[0] == {}  # neither: {} (no layout asked for)


@pytest.mark.parametrize(("plan", "expected"), [
    (None, []), ({}, []), ({"checks": {}}, []), ({"checks": {"mig": {"changed": False}}}, []),
    ({"checks": {"mig": {"refused": [{"what": "mig", "why": "the MIG manager", "fix": "takeover"}]}}},
     [{"what": "mig", "why": "the MIG manager", "fix": "takeover"}]),
])
def test_the_mig_refusal_built_where_the_action_reads_it(plan, expected):
    read = _reader({} if plan is None else {"gpuharden_node_plan": plan})
    assert _role_options.built("__mig_operator_refused", read) == expected


def test_a_map_built_where_read_needs_the_roles_variables():
    variables = _defaults("mig")
    assert _role_options.built("__mig_module_options", _reader(dict(variables, mig_layout={"all": {"1g.10gb": 7}})))["layout"] == {"all": {"1g.10gb": 7}}
    with pytest.raises(GpuhardenError, match="role options __mig_module_options: mig_config, .* undefined"):
        _role_options.built("__mig_module_options", _reader({}))
