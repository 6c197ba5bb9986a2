# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 3: every setting written once.

The settings table (plugins/module_utils/core/_settings.py) is the only place a role default is written:
tools/settings.py generates the roles' defaults/main.yml and meta/argument_specs.yml, meta/variables.yml and the
variable table of docs/uninstall.md from it, and its check fails, naming the variable and the file, where one of them
disagrees.  The defaults the modules share with the roles (the device plugin release, the RuntimeClass and containerd
runtime names) are written once in core/_defaults.py.

Replaces the hand-kept agreement checks of role defaults against argument specs: test_node_prerequisites.py::
test_role_defaults_and_spec_agree (one role) and the defaults half of test_device_plugin.py::
test_coexistence_remove_competing_defaults_to_false_in_module_and_role (two options) now hold for every option here.
"""

from __future__ import annotations

import ast
import shutil

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.action import check_variables as cv
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin, _device_plugin_reconcile, _runtime_class
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _defaults, _findings, _role_options, _stage_plan, _vocabulary
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import (
    _cgroup_memory,
    _containerd,
    _containerd_restart,
    _device_nodes,
    _gpu_operator,
    _kubelet,
    _kubelet_restart,
)
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml
from ansible_collections.gpuharden.k8s.plugins.modules import containerd_nvidia_runtime, device_plugin, runtime_class

from tests.unit.test_check_variables import REPO
from tools import settings

TABLE = settings.load_table()
ROLE_ENTRIES = [(name, entry) for name, role in TABLE.ROLES.items() for entry in role["settings"]]
# module -> its argument spec (as its AnsibleModule gets it), for the options the table says a setting feeds
MODULE_SPECS = {
    "device_plugin": device_plugin.argument_spec(),
    "runtime_class": runtime_class.argument_spec(),
    "containerd_nvidia_runtime": dict(_containerd.argument_spec(), **_containerd_restart.RESTART_SPEC),
    "cgroup_memory": _cgroup_memory.argument_spec(),
    "nvidia_device_nodes": _device_nodes.argument_spec(),
    "kubelet_config": dict(_kubelet.argument_spec(), **_kubelet_restart.RESTART_SPEC),
    "mig_layout": _mig_nvml.argument_spec(),
}


def copy_of_the_checkout(tmp_path):
    """The files the table generates and the table itself, in a scratch checkout a test may break."""
    for path in list(settings.rendered()) + [settings.TABLE] + ["plugins/module_utils/core/%s.py" % name for name in settings.SHARED]:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, target)
    return tmp_path


def edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------------------------------------------
# The files agree with the table, and a disagreement names the variable and the file


def test_the_generated_files_agree_with_the_table():
    assert settings.check() == []


def test_a_changed_role_default_is_named_with_its_file(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    assert settings.check(root) == []  # the copy is whole
    edit(root / "roles/device_plugin/defaults/main.yml", "device_plugin_version: v0.20.0\n", "device_plugin_version: v0.19.0\n")
    assert settings.check(root) == [
        'roles/device_plugin/defaults/main.yml: default device_plugin_version is "v0.19.0", the settings table says "v0.20.0"']


def test_a_removed_or_added_role_default_is_named(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    edit(root / "roles/runtime_class/defaults/main.yml", "runtime_class_force: false\n", "runtime_class_forse: false\n")
    assert settings.check(root) == [
        "roles/runtime_class/defaults/main.yml: default lacks runtime_class_force, which the settings table has",
        "roles/runtime_class/defaults/main.yml: default has runtime_class_forse, which the settings table lacks"]


def test_a_changed_argument_spec_is_named_with_its_entry_point_and_file(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    path = root / "roles/node_maintenance/meta/argument_specs.yml"
    data = yaml.safe_load(path.read_text())
    data["argument_specs"]["uncordon"]["options"]["node_maintenance_ready_timeout"]["default"] = 60
    path.write_text(yaml.safe_dump(data))
    [problem] = settings.check(root)
    assert problem.startswith("roles/node_maintenance/meta/argument_specs.yml: entry point uncordon option node_maintenance_ready_timeout is ")
    assert '"default": 60' in problem and '"default": 120' in problem


def test_a_changed_playbook_variable_is_named_with_meta_variables(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    path = root / "meta/variables.yml"
    data = yaml.safe_load(path.read_text())
    data["variables"]["gpuharden_drift_fail_severity"]["choices"].remove("info")
    path.write_text(yaml.safe_dump(data))
    [problem] = settings.check(root)
    assert problem.startswith("meta/variables.yml: variable gpuharden_drift_fail_severity is ")


def test_a_comment_edited_by_hand_is_found_and_generate_puts_it_back(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    edit(root / "roles/mig/defaults/main.yml", "# GENERATED by tools/settings.py", "# generated by tools/settings.py")
    edit(root / "docs/uninstall.md", "| `gpuharden_unharden_force` | bool |", "| `gpuharden_unharden_force` | str |")
    assert settings.check(root) == [
        "roles/mig/defaults/main.yml: differs from what the settings table generates (a comment or the layout): run python tools/settings.py generate",
        "docs/uninstall.md: differs from what the settings table generates (a comment or the layout): run python tools/settings.py generate"]
    assert settings.generate(root) == ["roles/mig/defaults/main.yml", "docs/uninstall.md"]
    assert settings.check(root) == []


def test_a_change_in_the_table_reaches_every_generated_file(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    edit(root / "plugins/module_utils/core/_defaults.py", 'DEVICE_PLUGIN_VERSION = "v0.20.0"', 'DEVICE_PLUGIN_VERSION = "v0.21.0"')
    problems = settings.check(root)
    assert 'roles/device_plugin/defaults/main.yml: default device_plugin_version is "v0.20.0", the settings table says "v0.21.0"' in problems
    assert any(line.startswith("roles/device_plugin/meta/argument_specs.yml: entry point main option device_plugin_version is ") for line in problems)
    settings.generate(root)
    assert yaml.safe_load((root / "roles/device_plugin/defaults/main.yml").read_text())["device_plugin_version"] == "v0.21.0"
    assert settings.check(root) == []


# ---------------------------------------------------------------------------------------------------
# The playbooks' inventory fallbacks (`gpuharden_x | default(...)`) are the table's defaults


def test_every_playbook_fallback_is_the_tables_default():
    written = settings.written_defaults()
    # the scan reads every playbook and role file with Jinja's parser: it finds the fallbacks (78 at 942d3bb, 52 once the
    # drift and unharden actions read theirs from the table themselves, 30 once the roles' readers followed some in Python)
    assert len(written) > 20 and {path.split("/")[0] for path, _name, _value in written} == {"playbooks", "roles"}
    # those the roles' readers follow in Python are checked with them (the table's role default against its variable's)
    followed = settings.followed_defaults(settings.load_table())
    assert ("roles/postcheck/defaults/main.yml (postcheck_fail_severity, left unset: followed in Python)", "gpuharden_postcheck_fail_severity",
            "error") in followed and len(followed) >= 10
    assert ("playbooks/harden_gpu_nodes.yml", "gpuharden_max_fail_percentage", 0) in written
    assert settings.default_disagreements() == []


def test_a_playbook_fallback_that_differs_from_the_table_is_named_with_its_file(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    for path in ("playbooks/harden_gpu_nodes.yml", "playbooks/unharden_gpu_nodes.yml"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, root / path)
    assert settings.check(root) == []
    # harden stops at the first failed host and bootstrap goes on, each on purpose (by_playbook): the other one's value is wrong
    edit(root / "playbooks/harden_gpu_nodes.yml", "gpuharden_max_fail_percentage | default(0)", "gpuharden_max_fail_percentage | default(100)")
    # unharden's first play (its steps read the other variables themselves, plugins/action/unharden_node.py)
    hosts = "restarts)\n  hosts: \"{{ gpuharden_target_hosts | default('%s') }}\""
    edit(root / "playbooks/unharden_gpu_nodes.yml", hosts % "gpu_nodes", hosts % "gpu")
    assert settings.check(root) == [
        "playbooks/harden_gpu_nodes.yml: gpuharden_max_fail_percentage | default(100), the settings table says 0",
        "playbooks/unharden_gpu_nodes.yml: gpuharden_target_hosts | default('gpu'), the settings table says 'gpu_nodes'"]


def test_a_role_fallback_of_a_variable_the_playbooks_differ_on_is_named(tmp_path):
    root = copy_of_the_checkout(tmp_path)
    task = root / "roles/mig/tasks/extra.yml"
    task.parent.mkdir(parents=True, exist_ok=True)
    # a bare conditional is a template too; a role is shared by every playbook: no one lock timeout fits it
    task.write_text("- name: x\n  ansible.builtin.debug:\n  when: gpuharden_lock_timeout | default(600) > 0\n")
    assert settings.check(root) == ["roles/mig/tasks/extra.yml: gpuharden_lock_timeout | default(600), but the settings table has no default of "
                                    "gpuharden_lock_timeout for every playbook (a role or a shared task file)"]


def test_every_generated_file_says_it_is_generated():
    for path, text in settings.rendered().items():
        assert "generated by tools/settings.py" in text.lower(), path


# ---------------------------------------------------------------------------------------------------
# The table itself


def test_each_setting_is_named_once_with_its_roles_prefix_and_a_known_type():
    names = [entry["name"] for _role, entry in ROLE_ENTRIES] + [entry["name"] for entry in TABLE.PLAYBOOK_VARIABLES if "name" in entry]
    assert len(names) == len(set(names)) > 200
    for role, entry in ROLE_ENTRIES:
        assert entry["name"].startswith(role + "_"), entry["name"]
        assert entry["type"] in TABLE.TYPES and entry["doc"], entry["name"]
        assert entry["entry_points"] is None or set(entry["entry_points"]) <= set(TABLE.ROLES[role]["entry_points"]), entry["name"]
        assert sum(map(bool, (entry["follows"], entry["template"] is not TABLE.UNSET))) <= 1, entry["name"]
    for entry in TABLE.PLAYBOOK_VARIABLES:
        if "name" in entry:
            assert entry["name"].startswith(cv.COLLECTION_PREFIX) and entry["type"] in TABLE.TYPES, entry["name"]
            assert entry["format"] is None or entry["format"] in cv.FORMATS, entry["name"]


def test_a_literal_default_fits_its_own_type_and_choices():
    wrong = {}
    for _role, entry in ROLE_ENTRIES:
        spec = settings.spec_option(entry, "main", TABLE)
        if "default" in spec:
            found = cv.value_errors(entry["name"], spec["default"], [spec])
            if found:
                wrong[entry["name"]] = found
    variables = settings.expected_variables(TABLE)
    for entry in TABLE.PLAYBOOK_VARIABLES:
        defaults = list(entry.get("by_playbook", {}).values()) + ([entry["default"]] if entry.get("default", TABLE.UNSET) is not TABLE.UNSET else [])
        for value in defaults:
            found = None if value is None else cv.value_errors(entry["name"], value, [variables[entry["name"]]])
            if found:
                wrong[entry["name"]] = found
    assert not wrong, wrong


# A role default that differs from its module's on purpose, and why.
ROLE_DEFAULT_IS_NOT_THE_MODULES = {
    # the role refuses before changing anything where other modprobe settings override ours; the module alone warns
    "device_permissions_on_conflict",
}
FEEDING = [entry for _role, entry in ROLE_ENTRIES if entry["feeds"]]


@pytest.mark.parametrize(("name", "entry"), [(entry["name"], entry) for entry in FEEDING], ids=[entry["name"] for entry in FEEDING])
def test_a_setting_feeds_an_option_its_module_has(name, entry):
    """Where the table says which module option a setting feeds, the module has that option, of a type the setting's
    value passes, and a literal role default is the module's own (46 of them; one differs on purpose)."""
    module, option = entry["feeds"]
    spec = MODULE_SPECS[module]
    assert option in spec, "%s feeds %s's %s, which the module lacks" % (name, module, option)
    assert spec[option].get("type", "str") in (entry["type"], "raw", "path" if entry["type"] == "str" else None), (name, spec[option])
    literal = entry["default"] is not TABLE.UNSET and not entry["follows"] and entry["template"] is TABLE.UNSET
    if literal and "default" in spec[option] and name not in ROLE_DEFAULT_IS_NOT_THE_MODULES:
        assert spec[option]["default"] == entry["default"], "%s: the role's default %r, module %s's %r" % (
            name, entry["default"], module, spec[option]["default"])
    if option in ("version", "runtime_class_name", "name", "runtime_name"):  # core/_defaults.py's
        assert spec[option]["default"] == entry["default"], (name, spec[option], entry["default"])


# ---------------------------------------------------------------------------------------------------
# The plugin release and the RuntimeClass name, written once outside tests and docs


def test_the_shared_defaults_reach_the_modules_and_the_roles():
    defaults = {name: yaml.safe_load((REPO / "roles" / name / "defaults" / "main.yml").read_text())
                for name in ("device_plugin", "runtime_class", "container_runtime")}
    assert device_plugin.argument_spec()["version"]["default"] == defaults["device_plugin"]["device_plugin_version"] == _defaults.DEVICE_PLUGIN_VERSION
    assert device_plugin.argument_spec()["runtime_class_name"]["default"] == _defaults.RUNTIME_CLASS_NAME
    assert runtime_class.argument_spec()["name"]["default"] == defaults["runtime_class"]["runtime_class_name"] == _defaults.RUNTIME_CLASS_NAME
    assert runtime_class.argument_spec()["handler"]["default"] == _defaults.NVIDIA_RUNTIME_NAME
    runtime_name = defaults["container_runtime"]["container_runtime_runtime_name"]
    assert _containerd.argument_spec()["runtime_name"]["default"] == runtime_name == _defaults.NVIDIA_RUNTIME_NAME
    # the device plugin role follows the runtime_class role's RuntimeClass, and that the container runtime's handler
    # (each left unset in the role's defaults, its readers follow it in Python: core/_role_options.py followed)
    assert "device_plugin_runtime_class_name" not in defaults["device_plugin"] and "runtime_class_handler" not in defaults["runtime_class"]
    assert _role_options.FOLLOWED["device_plugin_runtime_class_name"] == (("runtime_class_name",), _defaults.RUNTIME_CLASS_NAME)
    assert _role_options.FOLLOWED["runtime_class_handler"] == (("container_runtime_handler",), _defaults.NVIDIA_RUNTIME_NAME)
    assert _device_plugin_reconcile.OPTIONS["version"]["default"] is _defaults.DEVICE_PLUGIN_VERSION
    assert _runtime_class.OBJECT_OPTIONS["name"]["default"] is _defaults.RUNTIME_CLASS_NAME


@pytest.mark.parametrize("module", [device_plugin, runtime_class, containerd_nvidia_runtime], ids=lambda module: module.__name__.rsplit(".", 1)[-1])
def test_a_modules_documented_defaults_are_its_argument_specs(module):
    """The DOCUMENTATION repeats each default as docs (ansible-test sanity's validate-modules compares them too, in
    minutes; this in milliseconds)."""
    documented = yaml.safe_load(module.DOCUMENTATION)["options"]
    spec = module.argument_spec() if hasattr(module, "argument_spec") else dict(_containerd.argument_spec())
    for option in ("version", "runtime_class_name", "name", "handler", "runtime_name"):
        if option in spec:
            assert documented[option].get("default") == spec[option].get("default"), (module.__name__, option)


# Constants equal to a shared value by coincidence: another fact, which stays when the default changes.
ANOTHER_FACT = {
    "PLUGIN_ANCHORED_SINCE",  # node/_mig.py: the first plugin release whose MIG resource patterns are anchored
}


def _shared_literals(path):
    """line numbers of argument-spec defaults and parameter defaults in ``path`` spelt as one of the shared values."""
    shared = {_defaults.DEVICE_PLUGIN_VERSION, _defaults.RUNTIME_CLASS_NAME, _defaults.NVIDIA_RUNTIME_NAME}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            found += [value.lineno for key, value in zip(node.keys, node.values, strict=True)
                      if isinstance(key, ast.Constant) and key.value == "default" and isinstance(value, ast.Constant) and value.value in shared]
        elif isinstance(node, ast.arguments):
            found += [value.lineno for value in node.defaults + [d for d in node.kw_defaults if d is not None]
                      if isinstance(value, ast.Constant) and value.value in shared]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in shared:
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            found += [node.lineno] if not set(names) <= ANOTHER_FACT else []
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found += [value.lineno for value in node.values[1:] if isinstance(value, ast.Constant) and value.value in shared]
    return found


def test_no_python_default_spells_the_shared_values_again():
    """grep for Python: no argument spec default, parameter default, constant or ``x or "..."`` fallback in plugins/ or
    src/ spells the device plugin release or the RuntimeClass/runtime name; they import core/_defaults.py."""
    spelt = {}
    for path in sorted(list((REPO / "plugins").rglob("*.py")) + list((REPO / "src").rglob("*.py"))):
        if path.name != "_defaults.py" and _shared_literals(path):
            spelt[str(path.relative_to(REPO))] = _shared_literals(path)
    assert not spelt, spelt
    assert len(_shared_literals(REPO / "plugins/module_utils/core/_defaults.py")) == 3  # the one place they are written
    assert _device_plugin.inspect_daemonset.__defaults__[-1] == _defaults.RUNTIME_CLASS_NAME


def test_no_yaml_outside_the_generated_files_spells_the_plugin_release():
    """grep for YAML: the release appears in the playbooks and roles only in the generated role defaults and specs."""
    generated = set(settings.rendered())
    spelt = [str(path.relative_to(REPO)) for path in sorted(list((REPO / "playbooks").rglob("*.yml")) + list((REPO / "roles").rglob("*.yml")))
             if _defaults.DEVICE_PLUGIN_VERSION in path.read_text() and str(path.relative_to(REPO)) not in generated]
    assert spelt == []


# ---------------------------------------------------------------------------------------------------
# The stage list and the severity scale, written once (core/_vocabulary.py)


def test_every_stage_list_is_the_vocabularys():
    stages = _vocabulary.STAGES
    assert len(set(stages)) == len(stages) == 7
    catalogue = {stage for _check, stage, _remediable in _findings.CATALOGUE.values()} - {None}
    assert catalogue <= set(stages) | {_vocabulary.POSTCHECK}, catalogue - set(stages)
    node_stages = [stage for stage, _check in _node_audit.NODE_STAGES]
    assert node_stages == [stage for stage in stages if stage in node_stages], "node_audit's NODE_STAGES leave the stage order"
    assert set(_gpu_operator.STAGES) <= set(stages)
    assert stages == _stage_plan.STAGE_NAMES, "the stage engine's registry leaves the stage order"
    by_stage = {entry["stage"] for entry in TABLE.role_settings()}
    assert set(stages) | {_vocabulary.POSTCHECK} <= by_stage == set(TABLE.ROLES)


def test_the_cli_reads_the_collections_own_vocabulary():
    """src/gpuharden/vocabulary.py is a link to the collection's file, not a copy; the CLI's scale is that one."""
    from gpuharden import severity, vocabulary  # noqa: PLC0415 (the CLI's side)

    link = REPO / "src" / "gpuharden" / "vocabulary.py"
    assert link.is_symlink() and link.resolve() == (REPO / "plugins/module_utils/core/_vocabulary.py").resolve()
    assert severity.SEVERITIES == vocabulary.SEVERITIES == _findings.SEVERITIES
    assert _findings.SEVERITIES is _vocabulary.SEVERITIES
    assert [entry["id"] for entry in severity.counted([{"id": "a", "severity": "info"}, {"id": "b", "severity": "error"}], "warning")] == ["b"]
