# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 46, item 2: the node's venv (gpuharden.k8s.node_venv, role node_prerequisites).

The plan is read from the venv itself; these tests drive the planner with a recorded command runner, and run the
read script in a real venv (this checkout's .venv) so the pip-internal parser it relies on is pinned.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.action import bootstrap_node
from ansible_collections.gpuharden.k8s.plugins.action import node_prerequisites as node_prerequisites_action
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_prerequisites_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _node_venv
from gpuharden_lab.manager import NODE_PYTHON_PACKAGES

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "node_prerequisites"
VENV = "/opt/gpuharden/venv"
PACKAGES = ["nvidia-ml-py>=12.535,<14", "PyYAML>=6,<7"]


def test_one_package_list_for_nodes():
    """The node extra, requirements-node.txt, the role's default (and its argument spec) and the lab's node Python
    agree: what the role installs is what the node-side modules import."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["node"]
    requirements = [line for line in (REPO / "requirements-node.txt").read_text().splitlines() if line and not line.startswith("#")]
    default = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["node_prerequisites_packages"]
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert extra == requirements == default == spec["node_prerequisites_packages"]["default"] == NODE_PYTHON_PACKAGES
    assert {re.split("[<>=]", line)[0] for line in extra} == {"nvidia-ml-py", "ruamel.yaml", "tomlkit", "PyYAML"}


class Recorder:
    """A node: which commands ran, with answers by the command's 4th argument (pip's subcommand) or its kind."""

    def __init__(self, read_answer="[]", rc=None):
        self.calls, self.read_answer, self.rc = [], read_answer, rc or {}

    def __call__(self, argv, timeout):
        kind = "read" if argv[1] == "-c" else "create" if argv[1:3] == ["-m", "venv"] else "install"
        self.calls.append((kind, argv))
        return self.rc.get(kind, 0), (self.read_answer if kind == "read" else ""), ("boom\nlast line" if self.rc.get(kind) else "")

    def kinds(self):
        return [kind for kind, _argv in self.calls]


def _states(*satisfied):
    return [{"requirement": package, "installed": "1" if ok else None, "satisfied": ok} for package, ok in zip(PACKAGES, satisfied, strict=True)]


def _params(**extra):
    return dict({"path": VENV, "packages": PACKAGES, "python": "/usr/bin/python3", "index_url": "", "find_links": None}, **extra)


def test_new_venv_is_created_and_filled():
    node = Recorder()
    result = _node_venv.run(_params(), check_mode=False, run_command=node, exists=lambda path: False)
    assert node.kinds() == ["create", "install"]
    assert node.calls[0][1] == ["/usr/bin/python3", "-m", "venv", VENV]
    assert node.calls[1][1][:3] == [VENV + "/bin/python3", "-m", "pip"] and node.calls[1][1][-2:] == PACKAGES
    assert result["changed"] and result["created"] and result["ready"] and result["installed"] == PACKAGES
    assert result["python"] == VENV + "/bin/python3"


def test_check_mode_changes_nothing_and_says_what_it_would_do():
    node = Recorder()
    result = _node_venv.run(_params(), check_mode=True, run_command=node, exists=lambda path: False)
    assert node.kinds() == [] and result["changed"] and not result["ready"] and result["installed"] == PACKAGES
    node = Recorder(read_answer=json.dumps(_states(True, False)))
    result = _node_venv.run(_params(), check_mode=True, run_command=node, exists=lambda path: True)
    assert node.kinds() == ["read"] and result["changed"] and result["installed"] == [PACKAGES[1]] and not result["created"]


def test_satisfied_venv_is_left_alone():
    node = Recorder(read_answer=json.dumps(_states(True, True)))
    result = _node_venv.run(_params(), check_mode=False, run_command=node, exists=lambda path: True)
    assert node.kinds() == ["read"] and not result["changed"] and result["ready"] and result["installed"] == []


def test_only_what_is_missing_is_installed_from_the_wheels_alone():
    node = Recorder(read_answer=json.dumps(_states(False, True)))
    result = _node_venv.run(_params(find_links="/opt/gpuharden/wheels", index_url="https://pypi.example/simple"), check_mode=False,
                            run_command=node, exists=lambda path: True)
    assert node.kinds() == ["read", "install"] and result["installed"] == [PACKAGES[0]]
    argv = node.calls[1][1]
    assert argv[argv.index("--no-index") + 1 : argv.index("--no-index") + 3] == ["--find-links", "/opt/gpuharden/wheels"]
    assert "--index-url" not in argv and argv[-1] == PACKAGES[0]


def test_index_url_when_no_wheels():
    argv = _node_venv.install_argv(VENV, PACKAGES, index_url="https://pypi.example/simple")
    assert argv[argv.index("--index-url") + 1] == "https://pypi.example/simple" and "--no-index" not in argv
    assert "--index-url" not in _node_venv.install_argv(VENV, PACKAGES)


@pytest.mark.parametrize(
    ("params", "node", "exists", "message"),
    [
        (_params(path="opt/venv"), Recorder(), False, "path: 'opt/venv' is not an absolute directory"),
        (_params(path="/"), Recorder(), False, "path: '/' is not an absolute directory"),
        (_params(packages=[]), Recorder(), False, "packages: the list is empty"),
        (_params(), Recorder(rc={"create": 1}), False, "/usr/bin/python3 -m venv /opt/gpuharden/venv failed (rc 1): boom | last line"),
        (_params(), Recorder(rc={"install": 1}), False, "pip install into /opt/gpuharden/venv failed (rc 1)"),
        (_params(), Recorder(rc={"read": 1}), True, "reading the packages of /opt/gpuharden/venv failed"),
        (_params(), Recorder(read_answer="not json"), True, "answered no package list"),
        (_params(), Recorder(read_answer='[{"requirement": "x y", "invalid": "bad"}]'), True, "packages: 'x y' is not a pip requirement"),
    ],
)
def test_failures_name_the_field_and_the_fix(params, node, exists, message):
    with pytest.raises(GpuhardenError) as raised:
        _node_venv.run(params, check_mode=False, run_command=node, exists=lambda path: exists)
    assert message in raised.value.msg and raised.value.result["fix"]


def test_read_script_in_a_real_venv():
    """The script the module runs in the node's venv, run in this checkout's venv (pip's vendored parser, metadata)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a venv with pip (make setup's .venv)")
    packages = ["PyYAML>=6,<7", "PyYAML<1", "no-such-distribution-gpuharden>=1", "pip"]
    argv = _node_venv.read_argv(sys.prefix, packages)
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    states = _node_venv.parse_read(done.stdout, sys.prefix)
    assert [state["satisfied"] for state in states] == [True, False, False, True]
    assert states[2]["installed"] is None and states[0]["installed"].startswith("6.")
    argv = _node_venv.read_argv(sys.prefix, ["not a requirement!"])
    argv[0] = sys.executable
    with pytest.raises(GpuhardenError, match="is not a pip requirement"):
        _node_venv.parse_read(subprocess.run(argv, capture_output=True, text=True, check=True).stdout, sys.prefix)


# Tasks that run no module on the target (an action plugin alone): the interpreter does not matter to them.
ACTION_ONLY = {"ansible.builtin." + name for name in ("set_fact", "assert", "debug", "fail", "set_stats", "meta", "pause", "include_tasks",
                                                     "import_tasks", "include_role", "import_role")} | {"gpuharden.k8s.check_variables",
                                                                                                "gpuharden.k8s.cluster_stage_gate",
                                                                                                "gpuharden.k8s.role_preflight"}
# Actions that give each module they run on the controller the role's controller Python themselves (plugin_utils/
# _controller_python.py on_controller; their unit tests check it: test_node_maintenance_step.py, test_node_maintenance_budget.py,
# test_kubelet_stage.py (workloads), test_cgroup_limits_stage.py (list)): a delegated task of theirs needs no task var, as
# long as the action does what the task var did.  The action's plugin file by its name.
NAMES_ITS_PYTHON = {"gpuharden.k8s." + name: name for name in ("node_maintenance_step", "node_maintenance_budget", "kubelet_topology_plan",
                                                               "cgroup_limits_immediate", "drift_play", "node_plan_pods", "unharden_node",
                                                               "unharden_rollout", "postcheck_step", "device_plugin_stage",
                                                               "harden_rollout", "bootstrap_node", "container_runtime_wave",
                                                               "runtime_class_stage")}
# The role variable each of them reads for that Python, where its role has one (test_postcheck_plan.py and
# test_device_plugin_stage.py check the interpreter a delegated module run gets)
ROLE_PYTHON = {"postcheck_step": "postcheck_controller_python", "device_plugin_stage": "device_plugin_controller_python",
               "node_maintenance_step": "node_maintenance_controller_python", "node_maintenance_budget": "node_maintenance_controller_python",
               "kubelet_topology_plan": "kubelet_topology_controller_python", "cgroup_limits_immediate": "cgroup_limits_controller_python",
               "node_plan_pods": "cgroup_limits_controller_python", "runtime_class_stage": "runtime_class_controller_python"}


def _delegated_module_tasks(tasks, inherited, where):
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        scope = dict(inherited, **(task.get("vars") or {}))
        for key in ("block", "rescue", "always"):
            yield from _delegated_module_tasks(task.get(key), scope, where)
        action = next((key for key in task if "." in key), None)
        if "block" not in task and task.get("delegate_to") in ("localhost", "127.0.0.1") and action not in ACTION_ONLY:
            yield where, task.get("name"), action, "ansible_python_interpreter" in scope or action in NAMES_ITS_PYTHON


def test_every_delegated_module_task_names_its_interpreter():
    """bootstrap_gpu_node.yml runs its node tasks with the venv's Python through a play var (ansible_python_interpreter):
    a task delegated to the controller without a task var of its own would take that path there (ansible-core 2.19,
    measured), so each one keeps the controller's (ansible_playbook_python, *_controller_python)."""
    found = []
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"), *REPO.glob("playbooks/*.yml"),
                        *REPO.glob("playbooks/tasks/*.yml")]):
        data = yaml.safe_load(path.read_text()) or []
        where = str(path.relative_to(REPO))
        plays = data if data and isinstance(data[0], dict) and "hosts" in data[0] else None
        for play in plays or [{"tasks": data}]:
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                found += _delegated_module_tasks(play.get(key), {}, where)
    # the scan finds them (31 at stop 52; 20 once the drift, unharden and harden steps moved into actions, 20 still with
    # the post-check's and device plugin's steps counted as setting their interpreter themselves)
    assert len(found) >= 15
    assert [entry[:3] for entry in found if not entry[3]] == []


def test_bootstrap_node_runs_its_delegated_modules_with_the_controllers_python():
    """The delegated steps of bootstrap_gpu_node.yml (admit, keep_out) carry no interpreter task var: the action names
    ansible_playbook_python for the delegated host itself; a step on the node keeps the play's node Python."""
    task_vars = {"ansible_playbook_python": "/ctl/bin/python3", "ansible_python_interpreter": "/opt/gpuharden/venv/bin/python3",
                 "ansible_delegated_vars": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": "/opt/x/python3"}}}
    action = object.__new__(bootstrap_node.ActionModule)
    action._variables = task_vars
    action._task = SimpleNamespace(delegate_to="localhost")
    delegated = action._task_vars_for_modules()
    assert delegated["ansible_delegated_vars"]["localhost"] == {"ansible_connection": "local", "ansible_python_interpreter": "/ctl/bin/python3"}
    assert task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/opt/x/python3"  # a copy
    action._task = SimpleNamespace(delegate_to=None)
    assert action._task_vars_for_modules() is task_vars
    play = yaml.safe_load((REPO / "playbooks" / "bootstrap_gpu_node.yml").read_text())[0]
    tasks = [task for key in ("pre_tasks", "tasks") for entry in play[key] for task in [entry, *entry.get("block", []),
                                                                                          *entry.get("rescue", []), *entry.get("always", [])]]
    delegated_steps = [task["gpuharden.k8s.bootstrap_node"]["step"] for task in tasks
                       if "gpuharden.k8s.bootstrap_node" in task and task.get("delegate_to") == "localhost"]
    # targeted runs no module (it hands a record over to localhost)
    assert delegated_steps == ["targeted", "admit", "keep_out"]


def test_bootstrap_runs_the_role_with_the_hosts_python_and_the_rest_with_the_venvs():
    play = yaml.safe_load((REPO / "playbooks" / "bootstrap_gpu_node.yml").read_text())[0]
    names = [task["name"] for task in play["pre_tasks"]]
    step = next(task for task in play["pre_tasks"] if task.get("ansible.builtin.include_role", {}).get("name") == "gpuharden.k8s.node_prerequisites")
    # the role's action takes the host's own Python (vars/node_python.yml's) itself, not the play's node-task Python
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert _node_prerequisites_plan.plan(defaults, "/usr/bin/python3")["interpreter"] == "/usr/bin/python3"
    assert _node_prerequisites_plan.plan(defaults, None)["interpreter"] is None
    assert node_prerequisites_action.HOST_PYTHON == "__gpuharden_host_python"
    assert "__gpuharden_host_python" in yaml.safe_load((REPO / "playbooks" / "vars" / "node_python.yml").read_text())
    # after SSH is up, before the first task that needs the node packages (the Python facts, pynvml, gpu_facts)
    assert names.index("Bootstrap | wait for SSH on the new node") < names.index(step["name"])
    assert names.index(step["name"]) < names.index("Bootstrap | find the Python that runs the modules on the node, ship pynvml.py to it "
                                                   "where it lacks pynvml")


def test_every_node_play_takes_the_node_python_and_no_host_wide_interpreter():
    """The interpreter is the node tasks' (vars/node_python.yml in every play on the nodes), never set host-wide by the
    collection (a set_fact of ansible_python_interpreter would outlive the play, for other playbooks of the run)."""
    node_python = yaml.safe_load((REPO / "playbooks" / "vars" / "node_python.yml").read_text())
    assert node_python["ansible_python_interpreter"] == (
        "{{ node_prerequisites_venv_python | default(gpuharden_node_python | default(__gpuharden_host_python)) }}")
    assert "hostvars[inventory_hostname]['ansible_python_interpreter']" in node_python["__gpuharden_host_python"]
    plays = {}
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            if "hosts" in play and play["hosts"] != "localhost:all":
                plays["%s: %s" % (path.name, play["name"])] = play.get("vars_files")
    assert len(plays) >= 10
    assert {name: files for name, files in plays.items() if files != ["vars/node_python.yml"]} == {}
    setters = [path for path in [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/**/*.yml")]
               if re.search(r"set_fact:\s*\n\s+ansible_python_interpreter:", path.read_text())]
    assert setters == []


@pytest.mark.parametrize("delegate", ["localhost", None])
def test_an_action_that_names_the_controller_python_puts_it_where_ansible_reads_it(delegate):
    from types import SimpleNamespace

    from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller

    play = {"ansible_python_interpreter": "/opt/gpuharden/venv/bin/python3", "ansible_playbook_python": "/usr/bin/python3",
            "ansible_delegated_vars": {"localhost": {"ansible_python_interpreter": "/opt/gpuharden/venv/bin/python3", "ansible_host": "127.0.0.1"}}}
    task = SimpleNamespace(delegate_to=delegate)
    named = on_controller(task, play)
    if delegate:
        # the delegated host's variables are what the module's interpreter is read from; the play's stay as they were
        assert named["ansible_delegated_vars"]["localhost"] == {"ansible_python_interpreter": "/usr/bin/python3", "ansible_host": "127.0.0.1"}
        assert play["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/opt/gpuharden/venv/bin/python3"
    else:
        assert named["ansible_python_interpreter"] == "/usr/bin/python3"
    assert on_controller(task, play, "/srv/python")[("ansible_delegated_vars" if delegate else "ansible_python_interpreter")] != play.get(
        "ansible_delegated_vars" if delegate else "ansible_python_interpreter")


def test_the_actions_exempted_for_their_python_name_it_where_they_run_a_module_delegated():
    for action, name in NAMES_ITS_PYTHON.items():
        assert action not in ACTION_ONLY
        source = (REPO / "plugins" / "action" / ("%s.py" % name)).read_text()
        # an action that subclasses another collection action (container_runtime_wave: harden_rollout) runs its modules
        for base in re.findall(r"^class ActionModule\((\w+)\.ActionModule\)", source, flags=re.M):
            source += (REPO / "plugins" / "action" / ("%s.py" % base)).read_text()
        assert "on_controller(" in source, name
        assert ROLE_PYTHON.get(name, "_controller_python") in source, name
        # every module the action runs on the controller by its name goes through on_controller (unharden_node: its cluster step)
        runs = re.findall(r"(?:_execute_module|read_outside_check_mode)\(([^\n]*\n?[^\n]*)", source)
        delegated = [call for call in runs if "unharden_cluster" in call or "disruption_budget" in call or "gpu_pods_info" in call]
        assert all("on_controller(" in call for call in delegated), (name, runs)
    # unharden_node runs node_lock on the node: only its cluster step (unharden_cluster, on_controller above) and its
    # stopped step, which runs no module at all (it reads hostvars), are delegated
    plays = yaml.safe_load((REPO / "playbooks" / "unharden_gpu_nodes.yml").read_text())
    steps = [task["gpuharden.k8s.unharden_node"]["step"] for play in plays for task in _delegated_tasks(play["tasks"])
             if "gpuharden.k8s.unharden_node" in task]
    assert steps == ["cluster", "stopped"]
    source = (REPO / "plugins" / "action" / "unharden_node.py").read_text()
    stopped = re.search(r"\n    def _stopped\(.*?(?=\n    def |\Z)", source, flags=re.S).group(0)
    assert "_execute_module" not in stopped and "read_outside_check_mode" not in stopped


def _delegated_tasks(tasks):
    for task in tasks or []:
        for key in ("block", "rescue", "always"):
            yield from _delegated_tasks(task.get(key))
        if task.get("delegate_to") == "localhost":
            yield task
