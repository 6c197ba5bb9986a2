# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43, problem 11 ("What to build" 10): no module returns a result key that Ansible reserves with another
meaning.  mig_layout and device_cgroup_audit returned a ``skipped`` list (and device_plugin a ``skipped`` flag, which
its ``refused`` list replaced on main): ansible-core shows any truthy ``skipped`` as a skipped task, whatever it changed.

* every module's RETURN documentation is walked for a reserved key (the list and its sources: tests/unit/result_keys.py);
* every module run of the unit suite (conftest.run_module) has its real result checked the same way;
* real ansible-playbook runs: ansible-core itself reads a truthy ``skipped`` as a skipped task (the premise, pinned), and
  a MIG config with an entry for a GPU index the node lacks, applied through a playbook against the NVML double, shows
  as changed, then ok, never skipped.  (The vanishing cgroup: tests/integration/test_vanished_cgroups.py, sandbox.)
"""

from __future__ import annotations

import ast
import os
import sys
import tempfile

import ansible_runner
import pytest
import yaml

from tests.unit import result_keys
from tests.unit.test_check_variables import ENV, REPO
from tests.unit.test_mig_layout import Node

MODULES = sorted(path for path in (REPO / "plugins" / "modules").glob("*.py") if path.name != "__init__.py")


def documented_returns(path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "RETURN" for t in node.targets):
            return yaml.safe_load(node.value.value) or {}
    raise AssertionError("%s has no RETURN" % path.name)


def test_issue43_problem11_no_module_documents_a_key_ansible_reserves():
    returns = {path.stem: documented_returns(path) for path in MODULES}
    assert len(returns) >= 20 and "mig_layout" in returns  # the walk works
    found = [collision for module, documented in returns.items() for collision in result_keys.return_collisions(module, documented)]
    assert not found, found


def test_issue43_problem11_the_renamed_keys_are_documented():
    assert "unmatched_entries" in documented_returns(REPO / "plugins/modules/mig_layout.py")
    assert "vanished_cgroups" in documented_returns(REPO / "plugins/modules/device_cgroup_audit.py")


@pytest.mark.parametrize(("documented", "found"), [
    ({"skipped": {"type": "list"}}, ["m.skipped: a key ansible-core interprets itself"]),
    ({"results": {"type": "list"}, "rc": {"type": "int"}}, ["m.results: a key ansible-core interprets itself", "m.rc: a key ansible-core interprets itself"]),
    ({"changed": {"type": "list"}}, ["m.changed: documented as list, Ansible reads it as bool"]),
    ({"_ansible_x": {"type": "str"}, "ansible_x": {"type": "str"}}, ["m._ansible_x: a key ansible-core interprets itself",
                                                                    "m.ansible_x: a key ansible-core interprets itself"]),
    ({"changed": {"type": "bool"}, "diff": {"type": "list"}, "ansible_facts": {"type": "dict"}, "skipped_pods": {"type": "list"}}, []),
])
def test_issue43_problem11_the_walk_catches_each_kind_of_collision(documented, found):
    assert result_keys.return_collisions("m", documented) == found


def test_issue43_problem11_real_results_are_checked_by_value():
    assert result_keys.collisions({"changed": True, "msg": "x", "invocation": {"module_args": {}}, "warnings": [], "skipped_pods": []}) == []
    assert result_keys.collisions({"skipped": [{"entry": 1}]}) == ["skipped: a key ansible-core interprets itself"]
    assert result_keys.collisions({"skipped": False}) == ["skipped: a key ansible-core interprets itself"]  # a later truthy one would bite
    assert result_keys.collisions({"changed": "yes"}) == ["changed: Ansible reads it as bool, got str"]


def test_issue43_problem11_every_module_run_of_the_unit_suite_is_checked():
    """conftest.run_module, which the module tests run every module through, refuses a result with a reserved key."""
    source = (REPO / "tests/unit/conftest.py").read_text()
    run_module = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "run_module")
    assert "result_keys.collisions" in ast.unparse(run_module)


# ---------------------------------------------------------------------------------------------------
# Real runs


def run_localhost(tmp_path, tasks, env=None, library=None):
    """One play on localhost (local connection, this Python); [(event, task, res)] of its tasks."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Local", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    events = []
    envvars = dict(ENV, **({"ANSIBLE_LIBRARY": str(library)} if library else {}))
    runner = ansible_runner.run(private_data_dir=tempfile.mkdtemp(prefix="runner-", dir=tmp_path), envvars=envvars, inventory=str(inventory),
                                playbook=str(playbook), quiet=True, event_handler=lambda event: events.append(event) or True)
    results = [(event["event"], event["event_data"].get("task"), event["event_data"].get("res") or {})
               for event in events if event["event"].startswith("runner_on_") and event["event"] != "runner_on_start"]
    return runner, results


def test_issue43_problem11_ansible_reads_a_truthy_skipped_as_a_skipped_task(tmp_path):
    """The premise, against the real ansible-core (2.19 executor/task_result.py is_skipped): a module that changed
    something and returns a non-empty ``skipped`` list shows as skipped; the same data under another name, as changed."""
    library = tmp_path / "library"
    library.mkdir()
    (library / "says_skipped.py").write_text(
        "from ansible.module_utils.basic import AnsibleModule\n"
        "module = AnsibleModule(argument_spec={'key': {'type': 'str'}})\n"
        "module.exit_json(changed=True, **{module.params['key']: [{'entry': 1}]})\n")
    runner, results = run_localhost(tmp_path, [{"name": "Old key", "says_skipped": {"key": "skipped"}},
                                               {"name": "New key", "says_skipped": {"key": "unmatched_entries"}}], library=library)
    assert runner.rc == 0
    assert [(event, task) for event, task, _res in results] == [("runner_on_skipped", "Old key"), ("runner_on_ok", "New key")]
    assert results[1][2]["changed"] is True


@pytest.fixture
def mig_node(world_tmp, nvml_library):
    node = Node(world_tmp / "node", "h100-mig-enabled")  # 4 GPUs: indices 0-3
    node.clear_processes()
    return node


def test_issue43_problem11_mig_config_with_an_absent_gpu_index_is_changed_then_ok_never_skipped(tmp_path, mig_node):
    config = {"version": "v1", "mig-configs": {"eight": [{"devices": [0, 1, 2, 3, 4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}}
    task = {"name": "Apply the MIG config", "gpuharden.k8s.mig_layout": {"config": config, "selected": "eight", "force": True},
            "environment": mig_node.env()}
    runner, results = run_localhost(tmp_path, [task, dict(task, name="Apply it again")])
    assert runner.rc == 0, results
    assert [(event, name) for event, name, _res in results] == [("runner_on_ok", "Apply the MIG config"), ("runner_on_ok", "Apply it again")]
    first, again = results[0][2], results[1][2]
    assert first["changed"] is True and again["changed"] is False
    for res in (first, again):
        assert res["unmatched_entries"] == [{"entry": 0, "devices": [4, 5, 6, 7], "reason": "no GPU with index 4, 5, 6, 7 on the node (GPUs [0, 1, 2, 3])"}]
        assert "skipped" not in res
    assert all(layout == {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}} for layout in first["after"].values())
    assert os.path.exists(mig_node.state)
