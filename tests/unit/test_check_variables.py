# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden.k8s.check_variables (issue 12, item 3): a misspelt gpuharden variable fails the run's first task with
"did you mean ...", before anything runs on a node.

The pure functions of the action plugin against this checkout's roles and playbooks, then real
ansible-playbook runs of postcheck.yml and drift_check.yml on throwaway inventories whose hosts cannot be
reached (TEST-NET addresses): the check must fail them without contacting any, or pass a clean inventory.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS
from ansible.parsing.dataloader import DataLoader
from ansible_collections.gpuharden.k8s.plugins.action import check_variables as cv
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _bootstrap_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _postcheck_plan

REPO = Path(__file__).resolve().parents[2]
TYPO = "kubelet_topology_tppology_manager_policy"
RIGHT = "kubelet_topology_topology_manager_policy"
SPEC_KEYS = {"description", "type", "elements", "choices", "format", "play_keyword", "default"}
CHECK_TASK = "Check the gpuharden variables of the play's hosts (a misspelt variable would be ignored)"
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def collection():
    """(prefixes, known) read from this checkout the way the plugin reads the installed collection."""
    return cv.known_variables(str(REPO), DataLoader().load_from_file)


def yaml_files(*patterns):
    return sorted(path for pattern in patterns for path in REPO.glob(pattern))


# ---------------------------------------------------------------------------------------------------
# The decision


def test_item3_misspelt_role_variable_gets_a_suggestion(collection):
    prefixes, known = collection
    assert cv.unknown_variables({TYPO, RIGHT, "inventory_hostname"}, prefixes, known) == [(TYPO, RIGHT)]


def test_item3_prefixes_are_gpuharden_and_every_role(collection):
    prefixes, _known = collection
    roles = sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir())
    assert "mig" in roles and "node_maintenance" in roles
    assert sorted(prefixes) == sorted(["gpuharden_"] + [role + "_" for role in roles])


def test_item3_short_mig_prefix_knows_the_real_mig_variables(collection):
    prefixes, known = collection
    real = {"mig_config", "mig_layout", "mig_config_file", "mig_selected", "mig_strategy", "mig_result", "mig_gpus_to_reset"}
    assert real <= known
    assert cv.unknown_variables(real | {"mig_confg"}, prefixes, known) == [("mig_confg", "mig_config")]


def test_item3_clean_example_inventory_passes(collection):
    """Every variable the example inventory sets (hosts.yml, group_vars, host_vars) is known."""
    prefixes, known = collection
    names = set()
    for path in yaml_files("inventories/example/**/*.yml"):
        data = yaml.safe_load(path.read_text()) or {}
        if path.name != "hosts.yml":
            names |= set(data)
            continue
        stack = [data["all"]]
        while stack:
            group = stack.pop()
            names |= set(group.get("vars") or {})
            for host_vars in (group.get("hosts") or {}).values():
                names |= set(host_vars or {})
            stack.extend((group.get("children") or {}).values())
    assert any(name.startswith("device_permissions_") for name in names)  # the example does set role variables
    assert cv.unknown_variables(names, prefixes, known) == []


def test_item3_internal_and_ansible_names_are_ignored(collection):
    prefixes, known = collection
    names = {"__kubelet_topology_settings", "_mig_plan", "__drift_node", "ansible_host", "ansible_kubelet_topology_x",
             "ntp_servers", "docker_version", "kubeconfig", "node_name"}
    assert cv.unknown_variables(names, prefixes, known) == []


def test_item3_misspelt_prefix_is_caught_too(collection):
    prefixes, known = collection
    found = cv.unknown_variables({"kubelet_toplogy_cpu_manager_policy", "gpuhardn_kubeconfig"}, prefixes, known)
    assert found == [("gpuhardn_kubeconfig", "gpuharden_kubeconfig"), ("kubelet_toplogy_cpu_manager_policy", "kubelet_topology_cpu_manager_policy")]


def test_item3_unknown_name_far_from_everything_has_no_suggestion(collection):
    prefixes, known = collection
    assert cv.unknown_variables({"gpuharden_xyzzy_frobnicate_quux"}, prefixes, known) == [("gpuharden_xyzzy_frobnicate_quux", None)]


def test_item3_opt_out_names_and_patterns(collection):
    prefixes, known = collection
    names = {"mig_site_rack", "mig_site_row", "gpuharden_cmdb_id", TYPO}
    assert cv.unknown_variables(names, prefixes, known, ["mig_site_*", "gpuharden_cmdb_id"]) == [(TYPO, RIGHT)]
    assert cv.unknown_variables(names, prefixes, known, ["mig_site_*", "gpuharden_cmdb_id", TYPO]) == []


def test_item3_failure_message_names_hosts_and_suggestion():
    by_host = {"gpu-a": [(TYPO, RIGHT)], "gpu-b": [(TYPO, RIGHT), ("gpuharden_xyzzy", None)]}
    message = cv.failure_message(by_host)
    assert "%s (did you mean %s?) on gpu-a, gpu-b" % (TYPO, RIGHT) in message
    assert "gpuharden_xyzzy (no gpuharden.k8s variable is close) on gpu-b" in message
    assert message.startswith("unknown variables, nothing was changed")
    many = cv.failure_message({"h%02d" % n: [(TYPO, RIGHT)] for n in range(8)})
    assert "on h00, h01, h02, h03, h04 and 3 more" in many


def test_item3_ansible_tags_in_role_files_do_not_break_the_reader(tmp_path):
    (tmp_path / "roles" / "demo" / "defaults").mkdir(parents=True)
    (tmp_path / "roles" / "demo" / "defaults" / "main.yml").write_text(
        "demo_secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6231\ndemo_raw: !unsafe '{{ x }}'\ndemo_list: !unsafe [a]\n")
    prefixes, known = cv.known_variables(str(tmp_path), cv.load_yaml)
    assert prefixes == ("gpuharden_", "demo_") and known == {"demo_secret", "demo_raw", "demo_list"}


def test_item3_plugin_reader_matches_ansibles_loader(collection):
    assert cv.known_variables(str(REPO), cv.load_yaml) == collection


# ---------------------------------------------------------------------------------------------------
# The known list stays complete


def test_item3_known_list_covers_every_role_option_and_default(collection):
    _prefixes, known = collection
    missing = []
    for spec_file in yaml_files("roles/*/meta/argument_specs.yml"):
        for entry_point, entry in yaml.safe_load(spec_file.read_text())["argument_specs"].items():
            missing += ["%s %s: %s" % (spec_file.parts[-3], entry_point, name) for name in entry.get("options") or {} if name not in known]
    for defaults in yaml_files("roles/*/defaults/main.yml", "roles/*/vars/main.yml"):
        missing += ["%s: %s" % (defaults.relative_to(REPO), name) for name in yaml.safe_load(defaults.read_text()) or {} if name not in known]
    assert not missing, missing


def test_item3_names_the_collection_sets_itself_are_known(collection):
    _prefixes, known = collection
    assert {"gpuharden_node_plan", "mig_result", "postcheck_findings", "device_plugin_result", "container_runtime_restart_required",
            "kubelet_topology_audit_options"} <= known


def not_variables(data):
    """gpuharden_* names that are no variables: custom stats (set_stats data keys) and group_by group names."""
    names, stack = set(), [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stats = item.get("ansible.builtin.set_stats") or item.get("set_stats")
            if isinstance(stats, dict) and isinstance(stats.get("data"), dict):
                names |= set(stats["data"])
            group_by = item.get("ansible.builtin.group_by") or item.get("group_by")
            if isinstance(group_by, dict):
                names |= set(re.findall(r"""['"](gpuharden_[a-z0-9_]+)['"]""", str(group_by.get("key", ""))))
            stack.extend(value for value in item.values() if isinstance(value, list | dict))
    return names


def test_item3_every_gpuharden_name_the_playbooks_and_roles_use_is_known(collection):
    """grep: a gpuharden_* name in a playbook or role file is a known variable, unless it names a custom stat or a
    group (group_by, groups['...'])."""
    _prefixes, known = collection
    files = yaml_files("playbooks/**/*.yml", "roles/*/*/*.yml", "roles/*/templates/*")
    # the post-check's action adds that one (plugins/action/postcheck_step.py), the bootstrap's action these (plugins/action/bootstrap_node.py)
    stats, used = {_postcheck_plan.FINDINGS_STAT, _bootstrap_plan.READY_STAT, _bootstrap_plan.FAILED_STAT}, {}
    for path in files:
        text = path.read_text()
        if path.suffix == ".yml":
            stats |= not_variables(yaml.safe_load(text))
        stats |= set(re.findall(r"""groups\[\s*['"](gpuharden_[a-z0-9_]+)['"]""", text))
        for name in re.findall(r"\bgpuharden_[a-z0-9_]+\b", text):
            used.setdefault(name, path.relative_to(REPO))
    assert {"gpuharden_kubeconfig", "gpuharden_serial", "gpuharden_target_hosts"} <= set(used)  # the grep works
    missing = {name: str(path) for name, path in used.items() if name not in known and name not in stats}
    assert not missing, "add these to meta/variables.yml: %s" % missing


def test_item3_every_gpuharden_name_the_tools_pass_is_known(collection):
    """Extra vars and inventory keys the CLI, the lab, the demo, the bench, the lab tests and the deploy files give a run."""
    _prefixes, known = collection
    used = {}
    for path in yaml_files("src/gpuharden/**/*.py", "lab/src/gpuharden_lab/**/*.py", "bench/*.py", "tools/*.py", "tests/integration/*.py", "tests/lab/*.py"):
        # "gpuharden_x": value / gpuharden_x=value: a variable handed to a playbook (not an attribute: obj.gpuharden_x = ...)
        for name in re.findall(r"""(?<![.\w])(gpuharden_[a-z0-9_]+)["']?\s*(?::\s|=[^=])""", path.read_text()):
            used.setdefault(name, path.relative_to(REPO))
    for path in yaml_files("deploy/**/*.yaml", "deploy/**/*.yml", "inventories/**/*.yml", "molecule/**/*.yml"):
        for name in re.findall(r"^\s*(gpuharden_[a-z0-9_]+):", path.read_text(), re.M):
            used.setdefault(name, path.relative_to(REPO))
    assert {"gpuharden_drift_fail", "gpuharden_lab_scenario", "gpuharden_kubeconfig"} <= set(used)  # the grep works
    missing = {name: str(path) for name, path in used.items() if name not in known}
    assert not missing, "add these to meta/variables.yml: %s" % missing


def test_item3_variables_file_is_documented():
    """Each meta/variables.yml entry has a description and a type (issue 43 item 7: every play variable's type), its
    choices and format are ones the check knows."""
    data = yaml.safe_load((REPO / "meta" / "variables.yml").read_text())
    assert {cv.ALLOW_VARIABLE, cv.EXTRA_VARIABLE} <= set(data["variables"])
    wrong = {}
    for name, entry in data["variables"].items():
        problems = [] if name.startswith("gpuharden_") else ["not gpuharden_"]
        if not isinstance(entry, dict) or not isinstance(entry.get("description"), str) or not entry["description"]:
            wrong[name] = ["no description mapping"]
            continue
        problems += ["type %r" % entry.get("type")] if entry.get("type") not in DEFAULT_TYPE_VALIDATORS else []
        problems += ["format %r" % entry["format"]] if "format" in entry and entry["format"] not in cv.FORMATS else []
        problems += ["keys %s" % sorted(set(entry) - SPEC_KEYS)] if set(entry) - SPEC_KEYS else []
        problems += ["choices"] if "choices" in entry and not isinstance(entry["choices"], list) else []
        if problems:
            wrong[name] = problems
    assert not wrong, wrong


# ---------------------------------------------------------------------------------------------------
# Real runs: the check is the play's first task and fails before any node is contacted


def throwaway_inventory(tmp_path, host_vars=None, group_vars=None):
    """Two GPU nodes on TEST-NET-1 (unreachable: any task that tried them would report them unreachable)."""
    (tmp_path / "inventory" / "host_vars").mkdir(parents=True)
    (tmp_path / "inventory" / "group_vars").mkdir()
    (tmp_path / "inventory" / "hosts.yml").write_text(yaml.safe_dump(
        {"gpu_nodes": {"hosts": {"gpu-a": {"ansible_host": "192.0.2.10"}, "gpu-b": {"ansible_host": "192.0.2.11"}},
                       "vars": {"ansible_connection": "ssh", "ansible_ssh_common_args": "-o ConnectTimeout=1"}}}))
    for host, variables in (host_vars or {}).items():
        (tmp_path / "inventory" / "host_vars" / ("%s.yml" % host)).write_text(yaml.safe_dump(variables))
    if group_vars:
        (tmp_path / "inventory" / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(group_vars))
    return str(tmp_path / "inventory")


def run_playbook(tmp_path, playbook, inventory, extravars=None, tags=None):
    events = []
    private = tempfile.mkdtemp(prefix="runner-", dir=tmp_path)
    runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=inventory,
                                # an absolute playbook path stays as it is
                                playbook=str(REPO / "playbooks" / playbook), extravars=extravars or {},
                                cmdline="--tags %s" % tags if tags else None, quiet=True,
                                event_handler=lambda event: events.append(event) or True)
    tasks = [event["event_data"]["task"] for event in events if event["event"] == "playbook_on_task_start"]
    results = [(event["event"], event["event_data"].get("host"), event["event_data"].get("res") or {})
               for event in events if event["event"].startswith("runner_on_") and event["event"] != "runner_on_start"]
    return runner, tasks, results


def test_item3_postcheck_with_misspelt_extra_var_fails_first_and_contacts_no_node(tmp_path):
    runner, tasks, results = run_playbook(tmp_path, "postcheck.yml", throwaway_inventory(tmp_path), extravars={TYPO: "none"})
    assert runner.rc != 0
    assert tasks == [CHECK_TASK]  # nothing after it started, not even the role's argument validation
    # one check for the play, which names every host; no runner_on_unreachable: no node was contacted
    assert [(event, host) for event, host, _res in results] == [("runner_on_failed", "gpu-a")]
    assert "unknown variables, nothing was changed: %s (did you mean %s?) on gpu-a, gpu-b." % (TYPO, RIGHT) in results[0][2]["msg"]
    assert results[0][2]["checked_hosts"] == ["gpu-a", "gpu-b"]


def test_item3_drift_check_catches_a_typo_in_one_hosts_host_vars(tmp_path):
    """gpu-b's host_vars has the typo: the play's one check (on gpu-a) names it on gpu-b, and any_errors_fatal stops
    the play on every host."""
    inventory = throwaway_inventory(tmp_path, host_vars={"gpu-b": {"mig_confg": {"version": "v1"}}})
    runner, tasks, results = run_playbook(tmp_path, "drift_check.yml", inventory)
    assert runner.rc != 0
    assert tasks == [CHECK_TASK]
    assert [(event, host) for event, host, _res in results] == [("runner_on_failed", "gpu-a")]
    assert results[0][2]["unknown"] == {"gpu-b": [{"name": "mig_confg", "suggestion": "mig_config"}]}
    assert "mig_confg (did you mean mig_config?) on gpu-b." in results[0][2]["msg"]


def test_item3_typo_in_a_later_serial_batch_stops_the_first_batch(tmp_path):
    """serial: 1 and the typo in the second host's host_vars: the first batch fails before its next task."""
    playbook = tmp_path / "serial.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Serial play", "hosts": "gpu_nodes", "gather_facts": False, "serial": 1,
        "pre_tasks": [{"name": "Check", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/check_variables.yml")}],
        "tasks": [{"name": "A node-side task", "ansible.builtin.ping": None}],
    }]))
    inventory = throwaway_inventory(tmp_path, host_vars={"gpu-b": {TYPO: "none"}})
    runner, tasks, results = run_playbook(tmp_path, str(playbook), inventory)
    assert runner.rc != 0
    assert tasks == [CHECK_TASK]
    assert [(event, host) for event, host, _res in results] == [("runner_on_failed", "gpu-a")]
    assert "%s (did you mean %s?) on gpu-b." % (TYPO, RIGHT) in results[0][2]["msg"]


def test_item3_clean_and_opted_out_inventories_pass_the_check(tmp_path):
    """Only the tasks tagged always run (the check, and postcheck's argument validation): nothing on a node."""
    inventory = throwaway_inventory(tmp_path, host_vars={"gpu-b": {"mig_site_rack": "r1", RIGHT: "single-numa-node"}},
                                    group_vars={"gpuharden_known_extra_variables": ["mig_site_*"]})
    runner, tasks, results = run_playbook(tmp_path, "postcheck.yml", inventory, tags="only_always")
    assert runner.rc == 0, [res for _event, _host, res in results]
    assert tasks[0] == CHECK_TASK
    checks = {host: res for _event, host, res in results if "checked_hosts" in res}
    assert list(checks) == ["gpu-a"] and checks["gpu-a"]["checked_hosts"] == ["gpu-a", "gpu-b"]
    assert checks["gpu-a"]["unknown"] == {}
    # allowed: reported as a warning, not a failure
    runner, tasks, results = run_playbook(tmp_path, "postcheck.yml", inventory, tags="only_always",
                                          extravars={TYPO: "none", "gpuharden_allow_unknown_variables": True})
    assert runner.rc == 0
    check = next(res for _event, host, res in results if "checked_hosts" in res and host == "gpu-a")
    assert [entry["suggestion"] for entry in check["unknown"]["gpu-a"]] == [RIGHT]
    assert any(TYPO in warning for warning in check["warnings"])
