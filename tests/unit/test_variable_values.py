# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43, item 7 ("validate before touching", problem 8): gpuharden.k8s.check_variables checks every role option's
and playbook variable's value (type, choices, format) and refuses a play-keyword variable set in the inventory, on
the controller, before the first node is contacted.

The pure functions of the action plugin, the collection's own data (meta/variables.yml against the playbooks' play
keywords, the roles' defaults against their specs), then real ansible-playbook runs of the five playbooks on a
throwaway inventory whose hosts' ssh is a spy: it records any call and fails it, so "no node contacted" is proven
by the spy staying silent (a control run shows it does record a node task).
"""

from __future__ import annotations

import os
import resource
import stat
import time

import jinja2
import jinja2.meta
import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.template import trust_as_template
from ansible_collections.gpuharden.k8s.plugins.action import check_variables as cv
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _disruption
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

from tests.unit.test_check_variables import CHECK_TASK, REPO, run_playbook, throwaway_inventory

PLAYBOOKS = ["harden_gpu_nodes.yml", "drift_check.yml", "bootstrap_gpu_node.yml", "postcheck.yml", "unharden_gpu_nodes.yml"]
# The problem's own examples: each must fail the first task, naming the variable, in under this many seconds of the
# run's own work (the CPU seconds of ansible-playbook and its workers: about 1.2 s here, 1.8 s of wall time on an idle
# machine), ...
FAIL_WITHIN_SECONDS = 5
# ... and of wall time, a bound that load on a shared machine (the lab tests beside the unit tests) does not reach,
# while any wait on a node (ssh's ConnectTimeout, wait_for_connection, a lock) would.
FAIL_WITHIN_WALL_SECONDS = 15
# Play-level keys that are no play keyword: task lists and the play's vars, templated per host with its variables.
NOT_PLAY_KEYWORDS = {"tasks", "pre_tasks", "post_tasks", "handlers", "roles", "vars", "vars_files", "vars_prompt"}


@pytest.fixture(scope="module")
def collection():
    return cv.read_collection(str(REPO), cv.load_yaml)


# ---------------------------------------------------------------------------------------------------
# The decision: values against specs


def test_issue43_problem8_policy_typo_names_the_variable_and_the_choices(collection):
    errors = cv.value_errors("kubelet_topology_cpu_manager_policy", "statc", collection.option_specs["kubelet_topology_cpu_manager_policy"])
    assert errors == ["value of kubelet_topology_cpu_manager_policy must be one of: , none, static, got: statc"]
    assert cv.value_errors("kubelet_topology_cpu_manager_policy", "static", collection.option_specs["kubelet_topology_cpu_manager_policy"]) == []


@pytest.mark.parametrize("value", ["abc", "150%", True, "1.5", [1], "-1"])
def test_issue43_problem8_max_unavailable_must_be_a_count_or_a_percentage(collection, value):
    errors = cv.value_errors("gpuharden_max_unavailable", value, [collection.variable_specs["gpuharden_max_unavailable"]])
    assert errors == ["gpuharden_max_unavailable must be a number of nodes (1) or a percentage of the GPU fleet up to 100%% (25%%), got %r" % (value,)]


@pytest.mark.parametrize("value", [0, 1, "2", "25%", " 3 ", "100%", "0%"])
def test_issue43_max_unavailable_good_values_pass(collection, value):
    assert cv.value_errors("gpuharden_max_unavailable", value, [collection.variable_specs["gpuharden_max_unavailable"]]) == []


@pytest.mark.parametrize("value", [0, 1, "2", "25%", " 3 ", "100%", "0%", "abc", "150%", True, "1.5", [1], "-1", None, "", "5 %"])
def test_issue43_max_unavailable_check_reads_as_the_disruption_budget_does(value):
    """The controller's format and the budget module's own reading (cluster/_disruption.resolve_budget) agree."""
    try:
        _disruption.resolve_budget(value, 10)
        budget_accepts = True
    except GpuhardenError:
        budget_accepts = False
    assert cv.FORMATS["count_or_percent"][0](value) is budget_accepts


@pytest.mark.parametrize(("value", "valid"), [(1, True), ("50%", True), ([1, "50%"], True), ("2", True), ("abc", False),
                                              (True, False), ([], True), (["1", "x"], False), ({"a": 1}, False)])
def test_issue43_serial_format_follows_ansibles_serial(value, valid):
    """ansible-core 2.19 playbook/play.py: serial is a list of counts or "N%" (utils/helpers.py pct_to_int)."""
    assert cv.FORMATS["serial"][0](value) is valid


@pytest.mark.parametrize(("value", "valid"), [(0, True), (100, True), ("50%", True), ("12.5", True), ("abc", False),
                                              (101, False), ("-1", False), (True, False)])
def test_issue43_percentage_format_follows_max_fail_percentage(value, valid):
    assert cv.FORMATS["percentage"][0](value) is valid


def test_issue43_types_are_ansibles(collection):
    """Ansible's own ArgumentSpecValidator: its coercions (a "2" for an int, "yes" for a bool) pass, its refusals
    name the variable."""
    assert cv.value_errors("gpuharden_lock_timeout", "60", [collection.variable_specs["gpuharden_lock_timeout"]]) == []
    assert cv.value_errors("gpuharden_drift_fail", "yes", [collection.variable_specs["gpuharden_drift_fail"]]) == []
    [error] = cv.value_errors("gpuharden_lock_timeout", "soon", [collection.variable_specs["gpuharden_lock_timeout"]])
    assert error.startswith("argument 'gpuharden_lock_timeout' is of type str and we were unable to convert to int")
    [error] = cv.value_errors("mig_layout", "all-1g", collection.option_specs["mig_layout"])
    assert "'mig_layout' is of type str and we were unable to convert to dict" in error


def test_issue43_a_required_option_is_not_required_here():
    """``required`` holds for a role's own entry point (checked when the role starts); this check only looks at the
    values that are there, and keeps a sub-option's ``required``."""
    spec = {"type": "list", "elements": "dict", "required": True, "default": [], "format": "serial", "play_keyword": "serial",
            "options": {"key": {"type": "str", "required": True}}}
    assert cv.validator_spec(spec) == {"type": "list", "elements": "dict", "options": {"key": {"type": "str", "required": True}}}
    assert cv.value_errors("tolerations", [{"operator": "Exists"}], [{"type": "list", "elements": "dict", "options": spec["options"]}])


def test_issue43_play_keyword_refusals_compare_the_hosts_with_the_play():
    keywords = {"gpuharden_serial": "serial", "gpuharden_target_hosts": "hosts"}
    hosts = {"gpu-a": {"gpuharden_serial": (2, "g.yml:1:19")}, "gpu-b": {"gpuharden_serial": (2, "g.yml:1:19"), "gpuharden_target_hosts": ("gpu_nodes", None)},
             "gpu-c": {}}
    assert cv.play_keyword_refusals(hosts, set(), keywords) == [("gpuharden_serial", "serial", ["gpu-a", "gpu-b"], [2], ["g.yml:1:19"]),
                                                               ("gpuharden_target_hosts", "hosts", ["gpu-b"], ["gpu_nodes"], [])]
    # given as an extra var (or a play var), the keyword sees it, and the hosts see the same value: nothing to refuse
    assert cv.play_keyword_refusals(hosts, {"gpuharden_serial", "gpuharden_target_hosts"}, keywords) == []


def test_issue43_messages_name_variable_hosts_file_and_fix():
    message = cv.invalid_message({"gpu-a": [("gpuharden_serial", "gpuharden_serial must be x", "/inv/group_vars/all.yml:3:19")],
                                  "gpu-b": [("gpuharden_serial", "gpuharden_serial must be x", "/inv/group_vars/all.yml:3:19")],
                                  "gpu-c": [("gpuharden_serial", "gpuharden_serial must be x", None)]})
    assert message.startswith("invalid variable values, nothing was changed: gpuharden_serial must be x (on gpu-c); gpuharden_serial must be x "
                              "(on gpu-a, gpu-b; set in /inv/group_vars/all.yml:3:19).")
    message = cv.play_keyword_message([("gpuharden_serial", "serial", ["gpu-a"], [1], ["/inv/group_vars/all.yml:1:19"])])
    assert message.startswith("variables the run would ignore, nothing was changed: gpuharden_serial is set to 1 in the inventory of gpu-a "
                              "(/inv/group_vars/all.yml:1:19), but only the play keyword serial reads it.")
    assert "(-e gpuharden_serial=1, with ansible-playbook or gpuharden drift)" in message


def test_issue43_hosts_share_a_templated_value_only_when_its_inputs_are_the_same():
    """template_key: the cache that keeps the check at one Jinja compile per distinct value (64 hosts: 200 templating
    calls instead of 11 000) must never share a value between hosts whose inputs differ, even through a variable's
    own template."""
    raw = "{{ gpuharden_k8s_node_name | default(inventory_hostname) }}"
    a = {"inventory_hostname": "gpu-a", "site": "x"}
    assert cv.template_key(raw, a) == cv.template_key(raw, dict(a, site="y"))  # site is not read
    assert cv.template_key(raw, a) != cv.template_key(raw, dict(a, inventory_hostname="gpu-b"))
    assert cv.template_key(raw, a) != cv.template_key(raw, dict(a, gpuharden_k8s_node_name="n1"))
    chained = dict(a, gpuharden_k8s_node_name="{{ rack }}-{{ inventory_hostname }}", rack="r1")
    assert cv.template_key(raw, chained) != cv.template_key(raw, dict(chained, rack="r2"))  # followed through
    assert cv.template_key("static", a) == cv.template_key("static", {})  # no template: one value for all hosts
    assert cv.template_key("{{ hostvars }}", {"hostvars": object()}) is None  # no plain data: never shared
    assert cv.template_key("{{ broken", a) is None


# ---------------------------------------------------------------------------------------------------
# The collection's own data


def jinja_names(value):
    """Variable names a Jinja template string reads."""
    if not isinstance(value, str) or "{{" not in value:
        return set()
    return jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(value))


def test_issue43_play_keyword_variables_are_those_the_playbooks_use(collection):
    """meta/variables.yml's play_keyword entries are exactly the gpuharden_* variables the playbooks' play keywords
    read (every play-level key but the task lists and the play's vars), with the keyword."""
    used = {}
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            for key, value in play.items():
                if key in NOT_PLAY_KEYWORDS or "import_playbook" in key:
                    continue
                for name in jinja_names(value if isinstance(value, str) else str(value)):
                    if name.startswith(cv.COLLECTION_PREFIX):
                        used.setdefault(name, set()).add(key)
    assert {"gpuharden_serial", "gpuharden_target_hosts", "gpuharden_max_fail_percentage"} <= set(used)  # the scan works
    assert {name: ", ".join(sorted(keys)) for name, keys in used.items()} == collection.play_keywords


def test_issue43_every_option_spec_is_one_validator_understands(collection):
    """Every role option and playbook variable has a type; each spec builds an ArgumentSpecValidator."""
    untyped = [name for name, specs in collection.option_specs.items() for spec in specs if "type" not in spec]
    untyped += [name for name, spec in collection.variable_specs.items() if "type" not in spec]
    assert not untyped, untyped
    for name, specs in list(collection.option_specs.items()) + [(name, [spec]) for name, spec in collection.variable_specs.items()]:
        for spec in specs:
            assert ArgumentSpecValidator({name: cv.validator_spec(spec)}).argument_spec, name


def test_issue43_the_roles_literal_defaults_fit_their_specs(collection):
    """The runtime check validates the defaults as the role sees them; the literal ones are pinned here (a templated
    default is checked in the real runs below)."""
    errors = {}
    for name, default in collection.option_defaults.items():
        found = cv.value_errors(name, default, collection.option_specs[name]) if name in collection.option_specs and not jinja_names(str(default)) else []
        if found:
            errors[name] = found
    assert len([name for name in collection.option_defaults if name in collection.option_specs]) > 80  # the scan works
    assert not errors, errors


def test_issue43_role_defaults_are_trusted_as_templates():
    """ansible-core 2.19 renders only trusted templates: the defaults this plugin reads itself are made so, as Ansible
    trusts the role's own files."""
    value = cv._trusted({"a": ["{{ x }}"], "b": "{{ y }}", "c": 1})
    assert value == {"a": ["{{ x }}"], "b": "{{ y }}", "c": 1}
    assert type(value["b"]) is type(trust_as_template("{{ y }}"))  # noqa: E721 (the tagged type itself)


# ---------------------------------------------------------------------------------------------------
# Real runs: bad values fail the first task, in under 5 s, with the variable named, and ssh is never called


@pytest.fixture
def spy(tmp_path):
    """An ssh that records each call and fails it (as an unreachable host would): any node contact leaves a line."""
    log = tmp_path / "ssh-calls.log"
    script = tmp_path / "ssh-spy"
    script.write_text('#!/bin/sh\necho "$@" >> %s\necho "spy: no ssh here" >&2\nexit 255\n' % log)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def spied_inventory(tmp_path, spy, **kwargs):
    inventory = throwaway_inventory(tmp_path, **kwargs)
    group_vars = os.path.join(inventory, "group_vars", "all.yml")
    with open(group_vars, "w", encoding="utf-8") as handle:
        yaml.safe_dump({"ansible_ssh_executable": str(spy[0])}, handle)
    return inventory


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(tmp_path, playbook, inventory, **kwargs):
    """(CPU seconds, wall seconds) of the ansible-playbook run, the runner and its events."""
    started, cpu = time.monotonic(), cpu_seconds()
    runner, tasks, results = run_playbook(tmp_path, playbook, inventory, **kwargs)
    return (cpu_seconds() - cpu, time.monotonic() - started), runner, tasks, results


def assert_refused_first(seconds, runner, tasks, results, spy, *texts):
    assert runner.rc != 0
    assert tasks == [CHECK_TASK], tasks  # no task after it started
    assert [event for event, _host, _res in results] == ["runner_on_failed"], results  # no runner_on_unreachable
    assert not spy[1].exists(), spy[1].read_text()  # ssh never ran
    for text in texts:
        assert text in results[0][2]["msg"], results[0][2]["msg"]
    cpu, wall = seconds
    assert cpu < FAIL_WITHIN_SECONDS and wall < FAIL_WITHIN_WALL_SECONDS, seconds


def test_issue43_the_spy_sees_a_node_task(tmp_path, spy):
    """Control: a play whose check passes goes on to a node task, which calls the spy and is unreachable."""
    playbook = tmp_path / "ping.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Ping", "hosts": "gpu_nodes", "gather_facts": False,
        "pre_tasks": [{"name": "Check", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/check_variables.yml")}],
        "tasks": [{"name": "A node-side task", "ansible.builtin.ping": None}],
    }]))
    _seconds, runner, tasks, results = timed_run(tmp_path, str(playbook), spied_inventory(tmp_path, spy))
    assert runner.rc != 0 and tasks == [CHECK_TASK, "A node-side task"]
    assert sorted((event, host) for event, host, _res in results) == [
        ("runner_on_ok", "gpu-a"), ("runner_on_unreachable", "gpu-a"), ("runner_on_unreachable", "gpu-b")]
    assert len(spy[1].read_text().splitlines()) >= 2


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_issue43_problem8_policy_typo_fails_every_playbook_before_any_node(tmp_path, spy, playbook):
    seconds, runner, tasks, results = timed_run(tmp_path, playbook, spied_inventory(tmp_path, spy),
                                                extravars={"kubelet_topology_cpu_manager_policy": "statc"})
    assert_refused_first(seconds, runner, tasks, results, spy, "value of kubelet_topology_cpu_manager_policy must be one of: , none, static, got: statc "
                         "(on gpu-a, gpu-b; set in ")
    [entry] = results[0][2]["invalid"]["gpu-b"]
    assert entry["name"] == "kubelet_topology_cpu_manager_policy"
    assert entry["error"] == "value of kubelet_topology_cpu_manager_policy must be one of: , none, static, got: statc"
    assert entry["origin"].split(":")[0].endswith("/env/extravars")  # ansible-runner hands extra vars as -e @env/extravars


def test_issue43_problem8_max_unavailable_abc_fails_harden_before_any_node(tmp_path, spy):
    seconds, runner, tasks, results = timed_run(tmp_path, "harden_gpu_nodes.yml", spied_inventory(tmp_path, spy),
                                                extravars={"gpuharden_max_unavailable": "abc"})
    assert_refused_first(seconds, runner, tasks, results, spy, "gpuharden_max_unavailable must be a number of nodes (1) or a percentage of the "
                         "GPU fleet up to 100% (25%), got 'abc' (on gpu-a, gpu-b; set in ")


def test_issue43_problem8_serial_in_group_vars_is_refused_with_where_to_set_it(tmp_path, spy):
    inventory = spied_inventory(tmp_path, spy, group_vars={"gpuharden_serial": 1})
    seconds, runner, tasks, results = timed_run(tmp_path, "harden_gpu_nodes.yml", inventory)
    group_vars = os.path.join(inventory, "group_vars", "gpu_nodes.yml")
    assert_refused_first(seconds, runner, tasks, results, spy, "gpuharden_serial is set to 1 in the inventory of gpu-a, gpu-b (%s:1:19), but only the "
                         "play keyword serial reads it" % group_vars, "(-e gpuharden_serial=1, with ansible-playbook or gpuharden drift)")
    assert results[0][2]["play_keyword_in_inventory"] == [{"name": "gpuharden_serial", "keyword": "serial", "hosts": ["gpu-a", "gpu-b"], "values": [1],
                                                           "origins": ["%s:1:19" % group_vars]}]


def test_issue43_a_later_batchs_bad_value_in_host_vars_stops_the_first(tmp_path, spy):
    """gpu-b's host_vars has a bad value, the play runs one host at a time: the check on gpu-a names gpu-b."""
    inventory = spied_inventory(tmp_path, spy, host_vars={"gpu-b": {"mig_strategy": "mixd"}})
    seconds, runner, tasks, results = timed_run(tmp_path, "harden_gpu_nodes.yml", inventory, extravars={"gpuharden_serial": 1})
    host_vars = os.path.join(inventory, "host_vars", "gpu-b.yml")
    assert_refused_first(seconds, runner, tasks, results, spy, "value of mig_strategy must be one of: none, single, mixed, got: mixd (on gpu-b; set in "
                         "%s:1:15)" % host_vars)  # the value, line and column
    assert list(results[0][2]["invalid"]) == ["gpu-b"]


def test_issue43_a_later_batch_relies_on_the_first_batchs_check(tmp_path, spy):
    """serial: 1 and a clean inventory: the first batch's run checks both hosts, the second's only says so (a run per
    batch that checked every host again was quadratic: 64 one-host batches, 64 checks of 64 hosts)."""
    playbook = tmp_path / "serial.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Serial", "hosts": "gpu_nodes", "gather_facts": False, "serial": 1,
        "pre_tasks": [{"name": "Check", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/check_variables.yml")}],
        "tasks": [{"name": "A controller-side task", "ansible.builtin.debug": {"msg": "batch"}}],
    }]))
    _seconds, runner, _tasks, results = timed_run(tmp_path, str(playbook), spied_inventory(tmp_path, spy))
    assert runner.rc == 0, results
    checks = [(host, res) for _event, host, res in results if "checked_hosts" in res]
    assert [(host, res["checked_hosts"]) for host, res in checks] == [("gpu-a", ["gpu-a", "gpu-b"]), ("gpu-b", [])]
    assert checks[1][1]["msg"] == "every host of the play was checked with its first batch (gpu-a)"
    assert not spy[1].exists()


def test_issue43_a_value_flowing_through_a_role_default_is_checked_as_the_role_sees_it(tmp_path, spy):
    """gpuharden_kubelet_extra_settings feeds kubelet_topology_extra_settings's default: both are named."""
    seconds, runner, tasks, results = timed_run(tmp_path, "drift_check.yml", spied_inventory(tmp_path, spy),
                                                extravars={"gpuharden_kubelet_extra_settings": "memoryThrottlingFactor=0.9,x"})
    assert_refused_first(seconds, runner, tasks, results, spy, "argument 'kubelet_topology_extra_settings' is of type str and we were unable to "
                         "convert to dict")
    assert {entry["name"] for entry in results[0][2]["invalid"]["gpu-a"]} == {"gpuharden_kubelet_extra_settings", "kubelet_topology_extra_settings"}


def test_issue43_clean_runs_pass_and_a_value_set_later_is_said_not_validated(tmp_path, spy):
    """Extra vars for the play keywords, good values in the inventory, and a value that uses a variable the run sets
    later: the check passes, says what it could not validate, and nothing contacts a node (only tasks tagged
    always: the check and postcheck's own argument validation, both on the controller)."""
    inventory = spied_inventory(tmp_path, spy, group_vars={"gpuharden_max_unavailable": "25%", "kubelet_topology_cpu_manager_policy": "static"},
                                host_vars={"gpu-b": {"mig_strategy": "{{ site_mig_strategy_read_later }}"}})
    _seconds, runner, _tasks, results = timed_run(tmp_path, "postcheck.yml", inventory, tags="only_always",
                                                  extravars={"gpuharden_serial": 1, "gpuharden_target_hosts": "gpu_nodes"})
    assert runner.rc == 0, [res.get("msg") for _event, _host, res in results]
    check = next(res for _event, host, res in results if "checked_hosts" in res)
    assert check["invalid"] == {} and check["play_keyword_in_inventory"] == [] and check["unknown"] == {}
    [entry] = check["not_validated"]
    assert entry["name"] == "mig_strategy" and entry["hosts"] == ["gpu-b"] and "site_mig_strategy_read_later" in entry["cause"]
    assert any(warning.startswith("mig_strategy was not validated before the run on gpu-b") for warning in check["warnings"])
    assert not spy[1].exists()


def test_issue43_play_vars_of_an_import_reach_the_keyword_and_are_not_refused(tmp_path, spy):
    """import_playbook vars are play vars, which a play keyword sees (unlike the inventory): the same variable set in
    the inventory too is then not refused."""
    wrapper = tmp_path / "site.yml"
    wrapper.write_text(yaml.safe_dump([{"ansible.builtin.import_playbook": str(REPO / "playbooks" / "postcheck.yml"),
                                        "vars": {"gpuharden_target_hosts": "gpu_nodes"}}]))
    inventory = spied_inventory(tmp_path, spy, group_vars={"gpuharden_target_hosts": "gpu_nodes"})
    _seconds, runner, _tasks, results = timed_run(tmp_path, str(wrapper), inventory, tags="only_always")
    assert runner.rc == 0, [res.get("msg") for _event, _host, res in results]
    check = next(res for _event, host, res in results if "checked_hosts" in res)
    assert check["play_keyword_in_inventory"] == []
    assert not spy[1].exists()
