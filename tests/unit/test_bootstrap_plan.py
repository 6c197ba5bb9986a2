# SPDX-License-Identifier: GPL-3.0-or-later
"""The bootstrap's decisions, in Python since issue 45 (module_utils/cluster/_bootstrap_plan.py, action
gpuharden.k8s.bootstrap_node): playbooks/bootstrap_gpu_node.yml decided them in Jinja.  Each decision: a case that fires
and one that must not.  The playbook-level steps (the settings step's failure, the last play's) run through
ansible-playbook on localhost at the end of this file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _bootstrap_plan as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._vocabulary import SEVERITIES
from gpuharden_lab import REPO_ROOT

from tests.unit.test_cli import run_playbook, throwaway_inventory

# ---------------------------------------------------------------------------------------------------
# settings


def test_the_defaults():
    settings = plan.settings({}, "gpu-1")
    assert settings["connect_timeout"] == 600 and settings["connect_delay"] == 0
    assert settings["node_venv"] is True and settings["ship_pynvml"] is True and settings["uncordon"] is True
    assert settings["taint_key"] == "gpuharden.io/bootstrap" and settings["taint_effect"] == "NoSchedule"
    assert settings["out_of_service_taints"] == ["gpuharden.io/bootstrap"]
    assert settings["labels"] == {"gpuharden.io/hardened": "true"}
    assert settings["node_name"] == "gpu-1" and settings["kubeconfig"] == ""
    assert settings["lock_path"] == "/run/gpuharden/run.lock" and settings["lock_timeout"] == 600
    assert settings["postcheck_settle_seconds"] == 60 and settings["allow_non_gpu_nodes"] is False


def test_the_variables_override_the_defaults():
    settings = plan.settings({"gpuharden_bootstrap_connect_timeout": "30", "gpuharden_bootstrap_uncordon": "no",
                              "gpuharden_k8s_node_name": "node-a", "gpuharden_bootstrap_taint_key": "example.com/new",
                              "gpuharden_bootstrap_pynvml_source": "/opt/x/pynvml.py", "gpuharden_postcheck_settle_seconds": 5,
                              "gpuharden_lock_timeout": 0}, "gpu-1")
    assert settings["connect_timeout"] == 30 and settings["uncordon"] is False and settings["node_name"] == "node-a"
    assert settings["out_of_service_taints"] == ["example.com/new"] and settings["pynvml_source"] == "/opt/x/pynvml.py"
    assert settings["postcheck_settle_seconds"] == 5 and settings["lock_timeout"] == 0


def test_check_mode_lets_nothing_settle():
    assert plan.settings({}, "gpu-1", check_mode=True)["postcheck_settle_seconds"] == 0


@pytest.mark.parametrize(("name", "value", "what"), [
    ("gpuharden_bootstrap_connect_timeout", 0, "a positive number of seconds"),
    ("gpuharden_bootstrap_connect_timeout", "ten", "a positive number of seconds"),
    ("gpuharden_bootstrap_connect_delay", "-1", "a number of seconds"),
    ("gpuharden_bootstrap_node_venv", "maybe", "a boolean"),
    ("gpuharden_bootstrap_ship_pynvml", "2", "a boolean"),
    ("gpuharden_bootstrap_uncordon", [], "a boolean"),
    ("gpuharden_bootstrap_pynvml_source", "pynvml.py", 'an absolute path to a pynvml.py or ""'),
    ("gpuharden_bootstrap_pynvml_source", "/opt/pynvml/__init__.py", 'an absolute path to a pynvml.py or ""'),
    ("gpuharden_bootstrap_pynvml_dest", "site-packages", 'an absolute directory or ""'),
    ("gpuharden_bootstrap_taint_key", "Bad Key", "a label key"),
    ("gpuharden_bootstrap_taint_effect", "noschedule", "one of NoSchedule, PreferNoSchedule, NoExecute"),
    ("gpuharden_bootstrap_labels", {}, "a non-empty mapping of strings"),
    ("gpuharden_bootstrap_labels", {"gpuharden.io/hardened": True}, "a non-empty mapping of strings"),
    ("gpuharden_k8s_node_name", "", "a Node name"),
    ("gpuharden_kubeconfig", 5, "a string"),
])
def test_a_wrong_value_is_refused_naming_the_variable_and_the_value(name, value, what):
    with pytest.raises(GpuhardenError) as refused:
        plan.settings({name: value}, "gpu-1")
    assert refused.value.msg.startswith("bootstrap_gpu_node.yml: %s must be %s" % (name, what)), refused.value.msg
    assert refused.value.msg.endswith("got %r" % (value,))
    assert "\n" not in refused.value.msg


@pytest.mark.parametrize("key", ["gpuharden.io/bootstrap", "bootstrap", "a.b-c/D_e.f"])
def test_label_keys_pass_as_taint_keys(key):
    assert plan.settings({"gpuharden_bootstrap_taint_key": key}, "gpu-1")["taint_key"] == key


def test_the_run_owner():
    assert plan.run_owner("ci-42", "20261207T010203", 7) == "ci-42"
    assert plan.run_owner("", "20261207T010203", 7) == "bootstrap@20261207T010203-7"
    assert plan.run_owner(None, "20261207T010203", 7) == "bootstrap@20261207T010203-7"


# ---------------------------------------------------------------------------------------------------
# the device plugin's tolerations


def test_the_plugin_tolerates_the_bootstrap_taint_besides_the_roles_default():
    assert plan.device_plugin_tolerations(None, "gpuharden.io/bootstrap", "NoSchedule") == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpuharden.io/bootstrap", "operator": "Exists", "effect": "NoSchedule"}]


def test_given_tolerations_replace_the_roles_default():
    given = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}]
    assert plan.device_plugin_tolerations(given, "k/t", "NoExecute") == given + [{"key": "k/t", "operator": "Exists", "effect": "NoExecute"}]
    with pytest.raises(GpuhardenError, match="gpuharden_device_plugin_tolerations must be a list of tolerations"):
        plan.device_plugin_tolerations(["dedicated"], "k/t", "NoExecute")


# ---------------------------------------------------------------------------------------------------
# GPU nodes only


def test_a_host_without_gpus_is_refused_naming_nvmls_reason():
    refusal = plan.gpu_node_refusal("cpu-1", {"driver_gpus": {}, "gpu_count": 0, "nvml": {"reason": {"code": "library_missing"}}}, False)
    assert refusal == ("cpu-1 shows no NVIDIA GPU (no /proc/driver/nvidia/gpus, NVML: library_missing). Set "
                       "gpuharden_allow_non_gpu_nodes=true to run anyway.")
    assert "NVML: no GPUs" in plan.gpu_node_refusal("cpu-1", None, False)


@pytest.mark.parametrize(("facts", "allow"), [({"driver_gpus": {"0000:01:00.0": {}}}, False), ({"gpu_count": "2"}, False), ({}, True)])
def test_a_gpu_node_or_an_allowed_host_is_not_refused(facts, allow):
    assert plan.gpu_node_refusal("gpu-1", facts, allow) is None


# ---------------------------------------------------------------------------------------------------
# pynvml.py


PROBE_WITHOUT = {"pynvml": None, "purelib": "/usr/lib/python3/dist-packages"}


def test_pynvml_is_shipped_to_a_python_without_it():
    assert plan.pynvml_plan(True, PROBE_WITHOUT, "", "/ctl/site-packages/pynvml.py", "") == {
        "ship": True, "src": "/ctl/site-packages/pynvml.py", "dest": "/usr/lib/python3/dist-packages/pynvml.py",
        "why": "the node's Python cannot import pynvml"}
    shipped = plan.pynvml_plan(True, PROBE_WITHOUT, "/given/pynvml.py", None, "/opt/site")
    assert (shipped["src"], shipped["dest"]) == ("/given/pynvml.py", "/opt/site/pynvml.py")


def test_pynvml_is_not_shipped_where_the_python_has_it_or_the_run_says_no():
    assert plan.pynvml_plan(True, {"pynvml": "/venv/pynvml.py", "purelib": "/venv"}, "", None, "")["ship"] is False
    assert plan.pynvml_plan(False, None, "", None, "") == {"ship": False, "why": "gpuharden_bootstrap_ship_pynvml is false"}


@pytest.mark.parametrize("controller_file", [None, "/ctl/pynvml/__init__.py"])
def test_only_nvidia_ml_pys_single_file_is_shipped(controller_file):
    with pytest.raises(GpuhardenError, match="not nvidia-ml-py's pure-Python pynvml.py: install nvidia-ml-py on the controller"):
        plan.pynvml_plan(True, PROBE_WITHOUT, "", controller_file, "")


# ---------------------------------------------------------------------------------------------------
# the verdict


def test_a_node_that_passed_is_labelled_untainted_and_uncordoned_alone():
    """admit runs for each node that reached it (it follows the post-check; a failed node is in the rescue): it names
    that node alone, and with gpuharden_bootstrap_uncordon false only labels it (the taint stays, no uncordon)."""
    settings = dict(plan.settings({"gpuharden_k8s_node_name": "node-a"}, "host-a"), owner="o")
    admitted = plan.admit_args(settings)
    assert admitted["labels"] == {"nodes": ["node-a"], "labels": {"gpuharden.io/hardened": "true"}, "taint": "absent",
                                  "taint_key": "gpuharden.io/bootstrap", "taint_effect": "NoSchedule"}
    assert admitted["uncordon"] == {"nodes": ["node-a"], "state": "uncordoned"}
    kept = plan.admit_args(dict(plan.settings({"gpuharden_bootstrap_uncordon": False}, "host-b"), owner="o"))
    assert kept["labels"]["nodes"] == ["host-b"] and kept["labels"]["taint"] == "ignore" and kept["uncordon"] is None


def test_only_the_nodes_that_passed_go_into_service():
    """In the playbook: admit comes after the post-check inside the block, once per node (no run_once: a node that
    failed is in the rescue and never reaches it), and the rescue keeps the node out and fails it."""
    play = yaml.safe_load((REPO_ROOT / "playbooks" / "bootstrap_gpu_node.yml").read_text())[0]
    [block] = [task for task in play["tasks"] if "block" in task]
    steps = [(task.get("gpuharden.k8s.bootstrap_node") or {}).get("step") or task.get("ansible.builtin.import_role", {}).get("name")
             for task in block["block"]]
    assert steps.index("gpuharden.k8s.postcheck") == len(steps) - 2 and steps[-1] == "admit"
    assert "run_once" not in block["block"][-1] and block["block"][-1]["delegate_to"] == "localhost"
    assert [task["gpuharden.k8s.bootstrap_node"]["step"] for task in block["rescue"]] == ["keep_out", "fail"]
    assert [task["gpuharden.k8s.bootstrap_node"]["step"] for task in block["always"]] == ["unlock"]


def test_the_run_lock_is_taken_and_given_back_as_the_settings_name_it():
    settings = dict(plan.settings({"gpuharden_lock_path": "/run/x.lock", "gpuharden_lock_timeout": 5}, "h"), owner="bootstrap@1")
    assert plan.lock_args(settings, release=False) == {"owner": "bootstrap@1", "path": "/run/x.lock", "timeout": 5}
    assert plan.lock_args(settings, release=True) == {"owner": "bootstrap@1", "path": "/run/x.lock", "state": "released"}


def test_the_failure_report_names_the_findings_of_error_and_above_once():
    assert plan.REPORTED_SEVERITIES == tuple(SEVERITIES[SEVERITIES.index("error"):]) == ("error", "critical")
    findings = [{"id": "gpu_lost", "severity": "critical"}, {"id": "gpu_not_allocatable", "severity": "error"},
                {"id": "gpu_lost", "severity": "critical"}, {"id": "clock_throttled", "severity": "warning"}, {"id": "x", "severity": "info"}]
    report = plan.failure_report("n1", {"name": "Post-check | verdict"}, {"msg": "2 findings"}, findings, {"failed": False}, {"changed": True})
    assert report == {"node": "n1", "stage": "Post-check | verdict", "reason": "2 findings", "findings": ["gpu_lost", "gpu_not_allocatable"],
                      "kept_cordoned": True, "kept_tainted": True}
    assert plan.failure_message(report, "gpuharden.io/bootstrap") == (
        "n1 stays cordoned with the gpuharden.io/bootstrap taint: Post-check | verdict failed: 2 findings")


def test_a_failure_without_findings_or_a_failed_cordon_says_so():
    report = plan.failure_report("n1", None, None, None, {"failed": True, "msg": "forbidden"}, None)
    assert report == {"node": "n1", "stage": "unknown", "reason": "failed", "findings": [], "kept_cordoned": False, "kept_tainted": False}


def test_a_run_without_nodes_names_the_pattern_and_the_limit():
    assert plan.no_target_message("gpu_nodes", None).startswith(
        "No GPU node to bootstrap: the hosts pattern 'gpu_nodes' (gpuharden_target_hosts, default gpu_nodes) matched no host of the inventory. ")
    assert "matched no host of the inventory within --limit 'cp-1'. Put the new GPU nodes" in plan.no_target_message("gpu_nodes", "cp-1")


def test_step_plan_runs_the_engine_for_a_new_node_and_hands_its_plan_to_the_stages():
    """What bootstrap_node's step plan hands over, stage_steps (tasks/stages.yml's first step) reads: bootstrap's
    __stages gives no plan."""
    from types import SimpleNamespace

    from ansible_collections.gpuharden.k8s.plugins.action import bootstrap_node, stage_steps
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core._stage_plan import NODE_STAGE_NAMES

    runs = {name: name == "mig" for name in NODE_STAGE_NAMES}
    engine = {"changed": True, "plan": {"runs": runs, "stages": []}, "kubelet_plan": None, "diff": [{"before": "a", "after": "b"}],
              "ansible_facts": {"gpuharden": {"gpu_count": 1}}}
    calls = []
    action = object.__new__(bootstrap_node.ActionModule)
    action._variables = {"inventory_hostname": "gpu-a"}
    action._action = lambda name, args, task_vars: calls.append((name, args)) or engine
    result = action._step_plan()
    assert calls == [("gpuharden.k8s.node_stages", {"skip_compliant": False, "allow_non_gpu_nodes": True, "audit_from_play": ["mig"]})]
    # the engine's result is the task's (its diff, its facts), with the hand-over added
    assert result["diff"] == engine["diff"] and result["changed"] is True and result["ansible_facts"]["gpuharden"] == {"gpu_count": 1}
    consumer = object.__new__(stage_steps.ActionModule)
    consumer._templar = SimpleNamespace(template=lambda value: value)
    consumer.role_variable = lambda name, default=None: default
    steps = consumer.decide_task({"step": "stages"}, dict({"inventory_hostname": "gpu-a", "__stages": {"inline_disruptive": True}},
                                                          **result["ansible_facts"]))
    assert {name: steps[name] for name in NODE_STAGE_NAMES} == runs and steps["budget"] is True
    # an engine that failed hands nothing over (the node fails here)
    engine = {"failed": True, "msg": "node_audit failed: no NVML"}
    assert "ansible_facts" not in action._step_plan()


# ---------------------------------------------------------------------------------------------------
# the action, through ansible-playbook on localhost (no node is contacted by these steps)

# Each play's start: the settings step, registered as the playbook registers it.
SETTINGS_FIRST = """
- hosts: localhost
  gather_facts: false
  tasks:
    - gpuharden.k8s.bootstrap_node:
        step: settings
      register: __bootstrap
"""
PLAY = SETTINGS_FIRST + """    - gpuharden.k8s.bootstrap_node:
        step: targeted
      delegate_to: localhost
      delegate_facts: true
      run_once: true
    - gpuharden.k8s.bootstrap_node:
        step: no_target
      register: last
    - ansible.builtin.debug:
        msg: "{{ {'settings': __bootstrap.settings, 'tolerations': __bootstrap.device_plugin_tolerations, 'last': last.why} | to_json }}"
"""


def _play(tmp_path, text, extravars, python=sys.executable):
    """ansible-runner over ``text`` on localhost (a local connection, ``python``: this one unless named): the runner and
    every event."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(text)
    envvars = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    events = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=envvars, playbook=str(playbook), inventory="localhost,",
                                    extravars=dict(extravars, ansible_connection="local", ansible_python_interpreter=python),
                                    quiet=True, event_handler=lambda event: events.append(event) or True)
    return runner, events


def _run(tmp_path, extravars):
    runner, events = _play(tmp_path, PLAY, extravars)
    return runner, [event["event_data"].get("res") or {} for event in events if event["event"] in ("runner_on_ok", "runner_on_failed")]


def test_the_settings_step_reads_the_hosts_variables(tmp_path):
    runner, results = _run(tmp_path, {"gpuharden_bootstrap_taint_key": "example.com/joining", "gpuharden_run_owner": "ci-1"})
    assert runner.rc == 0, results
    shown = yaml.safe_load(results[-1]["msg"])
    assert shown["settings"]["taint_key"] == "example.com/joining" and shown["settings"]["owner"] == "ci-1"
    assert shown["tolerations"][-1] == {"key": "example.com/joining", "operator": "Exists", "effect": "NoSchedule"}
    assert shown["last"] == "the first play had nodes to bootstrap"


def test_a_record_that_this_run_did_not_hand_over_does_not_make_a_run_targeted(tmp_path):
    """A fact cache keeps localhost's facts between runs: the record of an earlier run (another stamp), or a plain fact
    of that name, must not make a run whose first play matched no host pass."""
    earlier = {"run": {"boot_id": "x", "pid_ns": "pid:[1]", "pid": 1, "start": 1}, "value": True}
    for record in (True, earlier):
        text = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        __bootstrap_targeted: %s
    - gpuharden.k8s.bootstrap_node:
        step: no_target
""" % json.dumps(record)
        runner, events = _play(tmp_path, text, {})
        failed = [event["event_data"]["res"]["msg"] for event in events if event["event"] == "runner_on_failed"]
        assert runner.rc != 0 and failed and failed[0].startswith("No GPU node to bootstrap"), failed


def test_the_settings_step_fails_on_a_wrong_value_in_one_line(tmp_path):
    runner, results = _run(tmp_path, {"gpuharden_bootstrap_taint_effect": "Never"})
    assert runner.rc != 0
    assert results[-1]["msg"] == ("bootstrap_gpu_node.yml: gpuharden_bootstrap_taint_effect must be one of NoSchedule, PreferNoSchedule, "
                                  "NoExecute, got 'Never'")


PYTHON_TASK = "Bootstrap | find the Python that runs the modules on the node, ship pynvml.py to it where it lacks pynvml"


def test_bootstrap_in_check_mode_on_the_controller_runs_the_steps_tagged_always(tmp_path):
    """The controller as a GPU node (as test_cli's harden case), in check mode with a tag no stage has: the settings,
    python and facts steps run on it, the node's Python imports pynvml so nothing is shipped, and the last play passes."""
    runner, results = run_playbook(tmp_path, "bootstrap_gpu_node.yml", throwaway_inventory(tmp_path), limit="gpu-local",
                                   extravars={"gpuharden_allow_non_gpu_nodes": True, "gpuharden_lock_path": str(tmp_path / "run.lock"),
                                              "gpuharden_bootstrap_node_venv": False},
                                   cmdline="--check --tags gpuharden_no_such_stage")
    assert runner.rc == 0, runner.stdout.read()[-3000:]
    assert not [entry for entry in results if entry[0] in ("runner_on_failed", "runner_on_unreachable")]
    by_task = {task: (event, res) for event, _host, task, res in results}
    event, python = by_task[PYTHON_TASK]
    assert event == "runner_on_ok" and python["pynvml"]["ship"] is False and python["pynvml"]["check_import"] is False
    assert python["pynvml"]["why"].startswith("the node's Python imports pynvml (")
    assert "copied" not in python and not python["changed"]
    # wait_for_connection's own action skips itself in check mode
    assert by_task["Bootstrap | wait for SSH on the new node"][0] == "runner_on_skipped"
    assert by_task["Bootstrap | gather GPU facts, refuse nodes that are not GPU nodes"][0] == "runner_on_ok"
    assert results[-1][2] == "Bootstrap | fail when the first play matched no host"
    assert results[-1][3]["why"] == "the first play had nodes to bootstrap"
    assert not (tmp_path / "run.lock").exists()


KEEP_OUT = SETTINGS_FIRST + """    - block:
        - name: Device plugin | wait for the rollout
          ansible.builtin.fail:
            msg: "{{ 'not ready on 1 node(s)' if read_later is not defined else 'never' }}"
          vars:
            # the failed task's own template of a variable undefined in the rescue (as the device plugin stage's tasks have)
            an_option: "{{ read_later.attribute }}"
      rescue:
        - gpuharden.k8s.bootstrap_node:
            step: keep_out
          delegate_to: localhost
          become: false
        - gpuharden.k8s.bootstrap_node:
            step: fail
"""


def test_the_rescue_reports_the_failed_node_and_fails_it(tmp_path):
    """keep_out after a failed step whose task holds templates of variables undefined there: the report (stats
    gpuharden_bootstrap_failed) names the step and why, and the node fails with the message.  Without a cluster (a
    kubeconfig that does not exist) the node could be kept neither tainted nor cordoned, and the report says so."""
    runner, events = _play(tmp_path, KEEP_OUT, {"gpuharden_kubeconfig": str(tmp_path / "no-kubeconfig")})
    assert runner.rc != 0
    stats = next(event["event_data"] for event in events if event["event"] == "playbook_on_stats")
    assert stats["failures"] == {"localhost": 1}
    assert stats["artifact_data"]["gpuharden_bootstrap_failed"] == {"localhost": {
        "node": "localhost", "stage": "Device plugin | wait for the rollout", "reason": "not ready on 1 node(s)", "findings": [],
        "kept_cordoned": False, "kept_tainted": False}}
    [failed] = [event["event_data"]["res"] for event in events if event["event"] == "runner_on_failed" and "stays cordoned" in
                event["event_data"]["res"].get("msg", "")]
    assert failed["msg"] == ("localhost stays cordoned with the gpuharden.io/bootstrap taint: Device plugin | wait for the rollout failed: "
                             "not ready on 1 node(s)")


@pytest.mark.parametrize(("name", "value", "says"), [
    ("gpuharden_bootstrap_taint_key", "example..com/joining", "a label key"),
    ("gpuharden_bootstrap_taint_key", "example.com/" + "n" * 64, "a label key"),
    ("gpuharden_bootstrap_labels", {"Bad Key": "true"}, "label key 'Bad Key'"),
    ("gpuharden_bootstrap_labels", {"gpuharden.io/hardened": "not ok"}, "value 'not ok'"),
])
def test_taint_and_labels_are_checked_as_the_api_server_checks_them(name, value, says):
    """The key and labels the run writes at its end, checked in the settings step (before any node changes) by the
    cluster-side modules' own checks (_node_labels): the API server would refuse these after the node was bootstrapped."""
    with pytest.raises(GpuhardenError, match=re.escape(says)):
        plan.settings({name: value}, "gpu-1")


STEPS_ON_A_NODE = SETTINGS_FIRST + """    - name: connect
      gpuharden.k8s.bootstrap_node:
        step: connect
    - name: lock
      gpuharden.k8s.bootstrap_node:
        step: lock
    - name: python
      gpuharden.k8s.bootstrap_node:
        step: python
      # the import check's command finds the shipped file there (the probe before it does not look there)
      environment:
        PYTHONPATH: "{{ gpuharden_bootstrap_pynvml_dest }}"
    - name: unlock
      gpuharden.k8s.bootstrap_node:
        step: unlock
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="the copy sets owner root; needs /usr/bin/python3")
def test_the_node_steps_wait_lock_ship_pynvml_and_give_the_lock_back(tmp_path):
    """connect, lock, python and unlock on the controller as the node, outside check mode, with a node Python that cannot
    import pynvml (/usr/bin/python3 without nvidia-ml-py): wait_for_connection's and copy's own actions run inside the
    steps, pynvml.py lands in gpuharden_bootstrap_pynvml_dest and the Python imports it; a second run copies nothing."""
    if subprocess.run(["/usr/bin/python3", "-c", "import pynvml"], capture_output=True, check=False).returncode == 0:
        pytest.skip("/usr/bin/python3 imports pynvml already")
    import pynvml  # the controller's, nvidia-ml-py's pure-Python file

    dest = tmp_path / "site"
    dest.mkdir()
    extravars = {"gpuharden_lock_path": str(tmp_path / "run.lock"), "gpuharden_bootstrap_pynvml_dest": str(dest),
                 "gpuharden_bootstrap_pynvml_source": pynvml.__file__, "gpuharden_bootstrap_connect_timeout": 30}
    for run in ("first", "second"):
        runner, events = _play(tmp_path, STEPS_ON_A_NODE, dict(extravars), python="/usr/bin/python3")
        results = {event["event_data"]["task"]: (event["event"], event["event_data"].get("res") or {}) for event in events
                   if event["event"].startswith("runner_on_")}
        assert runner.rc == 0, results
        assert results["connect"][0] == "runner_on_ok" and results["lock"][0] == "runner_on_ok"
        event, python = results["python"]
        assert event == "runner_on_ok" and python["pynvml"]["ship"] is True and python["pynvml"]["dest"] == str(dest / "pynvml.py")
        assert python["copied"]["dest"] == str(dest / "pynvml.py") and python["changed"] is (run == "first")
        assert (dest / "pynvml.py").read_bytes() == Path(pynvml.__file__).read_bytes()
        assert results["unlock"][0] == "runner_on_ok"
