# SPDX-License-Identifier: GPL-3.0-or-later
"""The uninstall's decisions, in Python since issue 45: which files each pass undoes, what restarts in which order and
which unit runs the kubelet (gpuharden.k8s.unharden_files, module_utils/node/_unharden_node.py); which hosts take the
drained pass, in which order and batches, and each node's verdict at the end (actions unharden_rollout and
unharden_report, module_utils/cluster/_unharden_run.py).  playbooks/unharden_gpu_nodes.yml only calls them.

The playbook-level plumbing (facts delegated to localhost for the next play's hosts and serial, stats from an action's
result) runs through ansible-playbook on localhost at the end of this file."""

from __future__ import annotations

import datetime
import os
import re
import sys
import tempfile

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.action import unharden_files as unharden_files_action
from ansible_collections.gpuharden.k8s.plugins.action import unharden_node, unharden_rollout
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _unharden_node
from ansible_collections.gpuharden.k8s.plugins.modules import unharden_files
from gpuharden_lab import REPO_ROOT

from tests.unit.test_unharden import FakeModule, harden, write

ALL = list(unharden_files.WRITERS)
KUBELET_FLAGS = "/etc/default/kubelet"


# --- module_utils/node/_unharden_node.py ----------------------------------------------------------------------------

def test_kubelet_false_leaves_the_kubelet_writer_out():
    assert _unharden_node.requested_writers(ALL, kubelet=False) == ["nvidia_device_nodes", "containerd_nvidia_runtime"]
    assert _unharden_node.requested_writers(ALL, kubelet=True) == ALL


@pytest.mark.parametrize("disruptive, defer, now, deferred", [
    (True, True, ["nvidia_device_nodes", "containerd_nvidia_runtime"], ["kubelet_config"]),
    (True, False, ALL, []),  # the drained pass itself: nothing left for later
    (False, True, ALL, []),  # no manager policy change: the kubelet's files come back in the first pass
])
def test_a_kubelet_policy_change_waits_for_the_drained_pass(disruptive, defer, now, deferred):
    assert _unharden_node.writers_now(ALL, disruptive, defer) == (now, deferred)


def test_without_the_kubelet_writer_nothing_is_deferred():
    assert _unharden_node.writers_now(["containerd_nvidia_runtime"], True, True) == (["containerd_nvidia_runtime"], [])


@pytest.mark.parametrize("restored, restart, stop_kubelet, check_mode, expected", [
    (["kubelet", "containerd"], "if_required", False, False, ["containerd", "kubelet"]),  # containerd first
    (["containerd"], "never", False, False, []),
    ([], "never", True, False, ["kubelet"]),  # a kubelet this run stopped starts again
    (["containerd", "kubelet"], "if_required", True, True, []),  # never in check mode
])
def test_restarts_in_order(restored, restart, stop_kubelet, check_mode, expected):
    assert _unharden_node.restarts(restored, restart, stop_kubelet, check_mode) == expected


@pytest.mark.parametrize("option, listing, unit", [
    ("auto", "k3s-agent.service enabled enabled\nrke2-server.service disabled enabled\n", "k3s-agent"),
    ("auto", "rke2-server.service disabled enabled\nkubelet.service enabled enabled\n", "kubelet"),  # the order is ours
    ("auto", "", "kubelet"),
    ("my-kubelet", "kubelet.service enabled enabled\n", "my-kubelet"),
])
def test_the_kubelet_unit(option, listing, unit):
    assert _unharden_node.kubelet_unit(option, listing) == unit
    assert _unharden_node.kubelet_unit_listing_argv()[:3] == ["systemctl", "list-unit-files", "--no-legend"]


# --- unharden_files: one task for what the playbook did in six ------------------------------------------------------

class Systemd:
    """systemctl and the probes as the node answers them; records every command."""

    def __init__(self, units="kubelet.service enabled enabled\n", is_active="active", fail=()):
        self.calls, self.units, self.is_active, self.fail = [], units, is_active, set(fail)

    def run(self, argv, timeout=None):
        self.calls.append(" ".join(argv[1:3]) if argv[1] != "list-unit-files" else "list-unit-files")
        if " ".join(argv[1:3]) in self.fail:
            return 1, "", "unit failed"
        if argv[1] == "list-unit-files":
            return 0, self.units, ""
        if argv[1] == "is-active":
            return 0, self.is_active + "\n", ""
        return 0, "", ""


@pytest.fixture
def systemd(monkeypatch):
    fake = Systemd()
    monkeypatch.setattr(unharden_files._command, "run", fake.run)
    monkeypatch.setattr(unharden_files._command, "runner", lambda timeout=None: fake.run)
    healthz = unharden_files._kubelet_restart.restart_and_wait  # the real restart and poll, against a healthy kubelet
    monkeypatch.setattr(unharden_files._kubelet_restart, "restart_and_wait",
                        lambda run_command, service, url, timeout: healthz(run_command, service, url, timeout, get=lambda _url, _timeout: 200))
    return fake


def run(root, check=False, **params):
    options = {"writers": ALL, "kubelet": True, "force": False, "keep_backups": False, "checkpoints": False,
               "defer_disruptive": False, "restart": "never", "stop_kubelet": False, "kubelet_service": "auto",
               "kubelet_health_url": "http://127.0.0.1:10248/healthz", "kubelet_health_timeout": 2,
               "containerd_service": "containerd", "containerd_ready_timeout": 2}
    options.update(params)
    return unharden_files.run(FakeModule(root, "gpuharden.k8s.unharden_files", check_mode=check, **options))


@pytest.fixture
def hardened(tmp_path):
    """containerd's config and the kubelet's flags file changed; with the policy change, a CPU Manager checkpoint removed."""
    root = tmp_path / "node"
    write(root / "etc/containerd/config.toml", "version = 2\n# the admin's\n", 0o600)
    harden(root, root / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    harden(root, root / KUBELET_FLAGS.lstrip("/"), "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n",
           name="gpuharden.k8s.kubelet_config", backup=False)
    return root


def with_policy_change(root):
    write(root / "var/lib/kubelet/cpu_manager_state", '{"policyName":"none"}')
    harden(root, root / "var/lib/kubelet/cpu_manager_state", None, name="gpuharden.k8s.kubelet_config", backup=False)
    write(root / "var/lib/kubelet/cpu_manager_state", '{"policyName":"static"}')  # the kubelet's new one


def test_first_pass_without_a_policy_change_restores_everything_and_restarts_containerd_then_the_kubelet(hardened, systemd):
    result = run(hardened, defer_disruptive=True, restart="if_required")
    assert result["deferred"] == [] and not result["disruptive"]
    assert (hardened / "etc/containerd/config.toml").read_text() == "version = 2\n# the admin's\n"
    assert not (hardened / KUBELET_FLAGS.lstrip("/")).exists()
    assert [(entry["service"], entry["unit"], entry["ready"]) for entry in result["restarts"]] == [
        ("containerd", "containerd", True), ("kubelet", "kubelet", True)]
    assert systemd.calls == ["list-unit-files", "restart containerd", "is-active containerd", "restart kubelet"]
    again = run(hardened, defer_disruptive=True, restart="if_required")
    assert not again["changed"] and again["restarts"] == []


def test_first_pass_defers_the_kubelet_files_of_a_policy_change_to_the_drained_pass(hardened, systemd):
    with_policy_change(hardened)
    checked = run(hardened, check=True, defer_disruptive=True, restart="if_required")
    assert checked["deferred"] == ["kubelet_config"] and checked["disruptive"] and checked["conflicts"] == []
    assert systemd.calls == []  # check mode: nothing restarts, and no kubelet restart to name a unit for
    result = run(hardened, defer_disruptive=True, restart="if_required")
    assert result["deferred"] == ["kubelet_config"] and result["disruptive"]
    kubelet_entries = {entry["path"]: entry["action"] for entry in result["files"] if entry["writer"] == "kubelet_config"}
    assert set(kubelet_entries.values()) == {"skip"}, kubelet_entries
    assert (hardened / KUBELET_FLAGS.lstrip("/")).exists()  # still gpuharden's: it goes in the drained pass
    assert (hardened / "etc/containerd/config.toml").read_text() == "version = 2\n# the admin's\n"
    assert [entry["service"] for entry in result["restarts"]] == ["containerd"]
    # without defer_disruptive the checkpoint is a conflict (the old read-only plan's answer)
    assert run(hardened, check=True)["conflicts"][0]["path"] == "/var/lib/kubelet/cpu_manager_state"


def test_drained_pass_stops_the_kubelet_restores_its_files_and_checkpoint_and_starts_it(hardened, systemd):
    with_policy_change(hardened)
    run(hardened, defer_disruptive=True, restart="if_required")
    systemd.calls.clear()
    result = run(hardened, writers=["kubelet_config"], checkpoints=True, stop_kubelet=True)
    assert systemd.calls == ["list-unit-files", "stop kubelet", "restart kubelet"]
    assert (hardened / "var/lib/kubelet/cpu_manager_state").read_text() == '{"policyName":"none"}'
    assert not (hardened / KUBELET_FLAGS.lstrip("/")).exists()
    assert result["changed"] and result["kubelet_service"] == "kubelet" and result["restarts"][0]["ready"]


def test_a_failed_restore_starts_the_kubelet_again_and_fails(hardened, systemd, monkeypatch):
    with_policy_change(hardened)

    def broken(module, root, plan):
        raise OSError(28, "No space left on device", "/var/lib/kubelet/cpu_manager_state")

    monkeypatch.setattr(unharden_files._originals, "apply_restore", broken)
    with pytest.raises(GpuhardenError, match="kubelet files not put back .*No space left"):
        run(hardened, writers=["kubelet_config"], checkpoints=True, stop_kubelet=True)
    assert systemd.calls == ["list-unit-files", "stop kubelet", "start kubelet"]


def test_a_service_that_does_not_come_back_fails_the_task_after_the_files_came_back(hardened, systemd):
    systemd.is_active = "failed"
    with pytest.raises(GpuhardenError, match="containerd .* did not come back .*failed after the restart") as caught:
        run(hardened, writers=["containerd_nvidia_runtime"], restart="if_required")
    assert (hardened / "etc/containerd/config.toml").read_text() == "version = 2\n# the admin's\n"
    assert caught.value.result["restarts"][0]["status"] == "failed"


def test_kubelet_false_keeps_the_kubelet_files(hardened, systemd):
    result = run(hardened, kubelet=False, restart="if_required")
    assert (hardened / KUBELET_FLAGS.lstrip("/")).exists() and result["restart"] == ["containerd"]


# --- module_utils/cluster/_unharden_run.py --------------------------------------------------------------------------

def host(name, deferred=(), node=None):
    return {"host": name, "node": node or name, "first_pass": {"deferred": list(deferred)}}


def test_no_drain_needed_no_budget_read_and_an_empty_rollout():
    hosts = [host("a"), host("b"), {"host": "c", "node": "c", "first_pass": None}]
    assert _unharden_run.plan(hosts) == {"hosts": [], "nodes": [], "serial": [1, 1], "budget_needed": False}


def test_the_rollout_takes_unavailable_nodes_first_and_batches_within_the_budget():
    hosts = [host("a", ["kubelet_config"]), host("b"), host("c", ["kubelet_config"], node="node-c"), host("d", ["kubelet_config"])]
    assert _unharden_run.plan(hosts)["budget_needed"]
    budget = {"budget": 3, "unavailable": [{"node": "node-c", "reasons": ["cordoned"]}, {"node": "x", "reasons": ["NotReady"]}]}
    assert _unharden_run.plan(hosts, budget) == {"hosts": ["c", "a", "d"], "nodes": ["node-c", "a", "d"], "serial": [1, 2],
                                                 "budget_needed": True}
    # a budget used up outside the rollout still lets one at a time start (the budget role defers what may not)
    assert _unharden_run.plan(hosts, {"budget": 1, "unavailable": [{"node": "x"}, {"node": "y"}]})["serial"] == [1, 1]


def test_the_report_of_a_node():
    files = {"conflicts": [{"path": "/etc/containerd/config.toml", "reason": "left as it is: changed"}]}
    cluster = {"conflicts": [{"node": "gpu-1", "label": "x", "reason": "label x changed"},
                             {"node": "gpu-0", "taint": "t", "reason": "taint t changed"}]}
    verdict = _unharden_run.report("gpu-1", [files, None], cluster)
    assert [c["reason"] for c in verdict["conflicts"]] == ["left as it is: changed", "label x changed"]
    assert verdict["failure"] == ("gpu-1: left as they are, changed since gpuharden wrote them: left as it is: changed; label x "
                                  "changed. Restore them by hand, or run again with gpuharden_unharden_force=true.")
    assert _unharden_run.report("gpu-1", [None], cluster, deferred="budget exhausted")["failure"] == "budget exhausted"
    assert _unharden_run.report("gpu-2", [{"conflicts": []}], cluster) == {"conflicts": [], "failure": None}


def test_a_node_the_rollout_took_but_never_reached_fails():
    """A batch that failed whole ends play 2 (and ansible-playbook's run): a node the rollout took whose drained pass
    neither ran, failed nor was deferred still has gpuharden's kubelet files, and must not pass as clean."""
    missing = _unharden_run.report("gpu-2", [{"conflicts": []}, None], None, drain_expected=True)
    assert missing["failure"].startswith("gpu-2: the kubelet's files were not put back: the drained pass did not reach this node")
    failed = _unharden_run.report("gpu-2", [{"conflicts": [{"path": "/x", "reason": "x"}]}, None], None, failed="gpu-2: Kubelet | drain failed: PDB",
                                  drain_expected=True)
    assert failed == {"conflicts": [], "failure": "gpu-2: Kubelet | drain failed: PDB"}
    assert _unharden_run.report("gpu-2", [{"conflicts": []}, {"conflicts": []}], None, drain_expected=True)["failure"] is None
    assert _unharden_run.report("gpu-2", [{"conflicts": []}, None], None, deferred="budget", drain_expected=True)["failure"] == "budget"
    assert _unharden_run.report("gpu-2", [{"conflicts": []}, None], None)["failure"] is None


def test_the_run_owner_and_a_failed_step():
    now = datetime.datetime(2026, 12, 7, 10, 1, 2, tzinfo=datetime.UTC)
    assert _unharden_run.run_owner("", now, 42) == "unharden@20261207T100102-42"
    assert _unharden_run.run_owner("ci-run-7", now, 42) == "ci-run-7"
    assert _unharden_run.failure_message("gpu-1", {"name": "Kubelet | drain"}, {"msg": "PDB"}) == "gpu-1: Kubelet | drain failed: PDB"
    assert _unharden_run.failure_message("gpu-1", None, None) == "gpu-1: a step failed: failed"


def test_the_actions_read_the_play_variables_defaults_from_the_settings_table():
    assert unharden_node.setting_default("gpuharden_lock_timeout") == 600  # unharden's own, not the drift check's 60
    assert unharden_node.setting_default("gpuharden_unharden_cluster") is True
    assert unharden_node.setting_default("kubelet_topology_service") == "auto"
    assert unharden_node.setting_default("device_plugin_namespace") == "kube-system"
    spec = unharden_files.argument_spec()
    for option, variable in unharden_files_action.PLAY_OPTIONS.items():
        # the settings table's default of the variable is the module option's own: a task that leaves both out gets the same
        assert unharden_node.setting_default(variable) == spec[option]["default"], option


def test_the_playbook_registers_only_what_an_include_reads():
    """The steps hand their results over in Python (_unharden_run.HANDOVERS): the playbook registers none of them, only
    the deferral the drained pass's include reads in its `when` (and the report with it)."""
    registered = set()
    for path in ("playbooks/unharden_gpu_nodes.yml", "playbooks/tasks/unharden_kubelet_drained.yml"):
        text = (REPO_ROOT / path).read_text()
        registered |= set(re.findall(r"register: (\S+)", text))
        assert not [name for name in _unharden_run.HANDOVERS.values() if name in text], path
    assert registered == {_unharden_run.DEFERRED}
    play2 = yaml.safe_load((REPO_ROOT / "playbooks/unharden_gpu_nodes.yml").read_text())[1]
    assert "vars" not in play2  # node_maintenance's fleet and stopped_by: facts of step stopped


RUN = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 1}


def _handed(result):
    """A host's variables after a task returned ``result`` (its facts, as Ansible injects them)."""
    return dict(result.get("ansible_facts") or {})


def test_what_each_step_hands_over_the_next_reads(monkeypatch):
    """Producer to consumer through _handover, stamped with one run: the first pass to the rollout and the report, the
    failed step to the stopped step and the report, the report to the release; another run's are never taken."""
    from ansible_collections.gpuharden.k8s.plugins.action import unharden_report
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    monkeypatch.setattr(_handover, "this_run", lambda *args, **kwargs: dict(RUN))
    first = _handover.handed_over(unharden_files_action.handover_name({"defer_disruptive": True}), {"deferred": ["kubelet_config"], "conflicts": []})
    drained = _handover.handed_over(unharden_files_action.handover_name({"stop_kubelet": True}), {"deferred": [], "conflicts": [{"reason": "r"}]})
    assert set(first) == {_unharden_run.HANDOVERS["first_pass"]} and set(drained) == {_unharden_run.HANDOVERS["drained_pass"]}
    hostvars = {"a": dict(first), "b": {}}
    assert [entry["first_pass"] for entry in unharden_rollout.play_hosts(hostvars, ["a", "b"])] == [{"deferred": ["kubelet_config"], "conflicts": []}, None]
    stale = {name: dict(value, run=dict(RUN, pid=8)) for name, value in first.items()}  # a fact cache's, from another run
    assert unharden_rollout.play_hosts({"a": stale}, ["a"])[0]["first_pass"] is None

    # the failed step's hand-over stops the rollout (step stopped) and fails the node in its report
    step = unharden_node.ActionModule.__new__(unharden_node.ActionModule)
    lock = step._failed({"inventory_hostname": "b", **_handover.handed_over(_unharden_run.HANDOVERS["lock"], {"node": "node-b", "owner": "o", "path": "/l"})},
                        {})
    assert lock["node"] == "node-b"
    hostvars = {"a": dict(first), "b": _handed(lock), "localhost": {_unharden_run.ROLLOUT: {"fleet": ["a", "node-b"]}}}
    stopped = step._stopped({"hostvars": hostvars, "ansible_play_hosts_all": ["a", "b"]}, {})
    assert stopped["ansible_facts"] == {"node_maintenance_stopped_by": ["node-b"], "node_maintenance_fleet": ["a", "node-b"]}

    class Templar:
        def copy_with_new_env(self, **_kwargs):
            return self

        def template(self, value):
            return value

    report = unharden_report.ActionModule.__new__(unharden_report.ActionModule)
    report._task = type("Task", (), {"args": {}, "async_val": 0, "check_mode": False, "diff": False})()
    report._templar = Templar()
    monkeypatch.setattr(unharden_report.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    localhost = {_unharden_run.ROLLOUT: {"hosts": ["a", "b"]}}
    done = report.run(task_vars={"inventory_hostname": "a", "hostvars": {"localhost": localhost}, **first, **drained})
    assert done["conflicts"] == [{"reason": "r"}] and done["failure"].startswith("a: left as they are")
    failed = report.run(task_vars={"inventory_hostname": "b", "hostvars": {"localhost": localhost}, **_handed(lock)})
    assert failed["failure"] == lock["why"]
    # the release fails the node with the report's failure, and gives back the lock the lock step handed over
    released = step._release({"inventory_hostname": "b", **_handed(failed)}, {"then_fail": "report"})
    assert released == {"changed": False, "lock": None, "node": "b", "failed": True, "msg": lock["why"]}


def test_play_hosts_reads_node_names_and_first_pass_results():
    hostvars = {"a": {"r": {"deferred": ["kubelet_config"]}}, "b": {"gpuharden_k8s_node_name": "node-b"}}
    assert unharden_rollout.play_hosts(hostvars, ["a", "b"], "r") == [
        {"host": "a", "node": "a", "first_pass": {"deferred": ["kubelet_config"]}},
        {"host": "b", "node": "node-b", "first_pass": None}]


# --- the plumbing, through ansible-playbook on localhost ------------------------------------------------------------

PLUMBING = """
- name: First pass stand-in
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Register a first-pass result
      ansible.builtin.set_fact:
        first: "{{ {'deferred': ['kubelet_config'] if inventory_hostname == 'gpu-b' else [], 'conflicts': []} }}"
    - name: Plan the rollout
      unharden_rollout_stub:
        first_pass: first
      delegate_to: localhost
      delegate_facts: true
      run_once: true
      check_mode: false
- name: Drained pass stand-in
  hosts: "{{ hostvars['localhost']['__unharden_rollout']['hosts'] | default([]) }}"
  serial: "{{ hostvars['localhost']['__unharden_rollout']['serial'] | default(1) }}"
  gather_facts: false
  tasks:
    - name: Be in the drained pass
      ansible.builtin.set_fact:
        drained: "{{ {'conflicts': [{'path': '/etc/x', 'reason': 'x changed'}]} }}"
- name: Report
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Report
      gpuharden.k8s.unharden_report:
        passes: [first, drained]
      register: report
"""


def test_the_rollout_reaches_the_next_play_and_the_report_reaches_the_stats(tmp_path, monkeypatch):
    """gpu-b needs the drained pass: the budget module would need a cluster, so the action (the real one, subclassed)
    gets the answer of a fleet with a budget of 1 and nothing unavailable."""
    (tmp_path / "play.yml").write_text(PLUMBING)
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu-a": local, "gpu-b": local}}}}}))
    plugin_dir = tmp_path / "action_plugins"
    plugin_dir.mkdir()
    (plugin_dir / "unharden_rollout_stub.py").write_text(
        "from ansible_collections.gpuharden.k8s.plugins.action import unharden_rollout\n"
        "class ActionModule(unharden_rollout.ActionModule):\n"
        "    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **kwargs):\n"
        "        assert module_name == 'gpuharden.k8s.disruption_budget' and module_args['fleet'] == ['gpu-a', 'gpu-b']\n"
        "        return {'budget': 1, 'unavailable': [], 'fleet': module_args['fleet']}\n")
    env = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO_ROOT / "build" / "collections"), "ANSIBLE_ACTION_PLUGINS": str(plugin_dir)}
    events = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=env, inventory=str(inventory), playbook=str(tmp_path / "play.yml"),
                                    quiet=True, event_handler=lambda event: events.append(event) or True)
        assert runner.rc == 0, runner.stdout.read()
    drained = sorted({event["event_data"]["host"] for event in events if event["event"] == "runner_on_ok"
                      and event["event_data"]["task"] == "Be in the drained pass"})
    assert drained == ["gpu-b"]
    stats = next(event["event_data"].get("artifact_data") for event in events if event["event"] == "playbook_on_stats")
    assert stats == {"gpuharden_unharden_conflicts": {"gpu-b": [{"path": "/etc/x", "reason": "x changed"}]}}
    reports = {event["event_data"]["host"]: event["event_data"]["res"]["failure"] for event in events
               if event["event"] == "runner_on_ok" and event["event_data"]["task"] == "Report"}
    assert reports["gpu-a"] is None and reports["gpu-b"].startswith("gpu-b: left as they are")


def _run_playbook(tmp_path, playbook, hosts, extravars=None, cmdline=None, plugin_dir=None):
    """ansible-playbook over local hosts of group gpu_nodes: (rc, events, stdout)."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        host: dict(local, gpuharden_lock_path=str(tmp_path / ("%s.lock" % host))) for host in hosts}}}}}))
    env = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO_ROOT / "build" / "collections")}
    if plugin_dir:
        env["ANSIBLE_ACTION_PLUGINS"] = str(plugin_dir)
    events = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=env, inventory=str(inventory), playbook=str(playbook),
                                    extravars=extravars or {}, cmdline=cmdline, quiet=True,
                                    event_handler=lambda event: events.append(event) or True)
        return runner.rc, events, runner.stdout.read()


def _results(events, task):
    return {event["event_data"]["host"]: event["event_data"]["res"] for event in events
            if event["event"] in ("runner_on_ok", "runner_on_failed") and event["event_data"].get("task") == task}


@pytest.mark.parametrize("check", [False, True])
def test_the_playbook_runs_through_where_there_is_nothing_to_undo(tmp_path, check):
    """The real playbooks/unharden_gpu_nodes.yml on two local hosts without gpuharden records, cluster side off (it
    needs an API server): every step reads its variables itself, the locks are taken and given back, nothing changes."""
    rc, events, out = _run_playbook(tmp_path, REPO_ROOT / "playbooks/unharden_gpu_nodes.yml", ["gpu-a", "gpu-b"],
                                    {"gpuharden_unharden_cluster": False, "gpuharden_run_owner": "unit-run"},
                                    cmdline="--check --diff" if check else None)
    assert rc == 0, out[-4000:]
    locks = _results(events, "Take the node's run lock")
    assert {host: (lock["owner"], lock["node"]) for host, lock in locks.items()} == {"gpu-a": ("unit-run", "gpu-a"), "gpu-b": ("unit-run", "gpu-b")}
    assert locks["gpu-a"]["path"] == str(tmp_path / "gpu-a.lock")
    cluster = _results(events, "Cluster | remove gpuharden's objects and put back the labels and taints it set (once for the play)")
    assert [result["ran"] for result in cluster.values()] == [False]
    files = _results(events, "Files | put back the files that need no drain, restart containerd and the kubelet where theirs came back")
    assert sorted(files) == ["gpu-a", "gpu-b"] and not any(result.get("changed") for result in files.values())
    # the module got the play's defaults from the action (its invocation shows what it ran with)
    assert files["gpu-a"]["invocation"]["module_args"]["kubelet_service"] == "auto"
    assert files["gpu-a"]["invocation"]["module_args"]["defer_disruptive"] is True
    assert not [event for event in events if event["event"] == "runner_on_ok" and "drained" in (event["event_data"].get("task") or "")]
    assert not any(event["event"] == "runner_on_changed" for event in events)
    assert not (tmp_path / "gpu-a.lock").exists() and not (tmp_path / "gpu-b.lock").exists()  # given back


ROLLOUT_STOPS = """
- name: First pass stand-in
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Unharden under the lock
      block:
        - name: Take the node's run lock
          gpuharden.k8s.unharden_node:
            step: lock
        - name: First pass result stand-in
          handover_stub:
            step: first_pass
            value: {deferred: "{{ [] if inventory_hostname == 'gpu-a' else ['kubelet_config'] }}", conflicts: []}
        - name: Plan the rollout
          unharden_rollout_stub:
          delegate_to: localhost
          delegate_facts: true
          run_once: true
- name: Drained pass stand-in
  hosts: "{{ hostvars['localhost']['__unharden_rollout']['hosts'] | default([]) }}"
  serial: "{{ hostvars['localhost']['__unharden_rollout']['serial'] | default(1) }}"
  max_fail_percentage: 100
  gather_facts: false
  tasks:
    - name: Drained
      block:
        # the real playbook's step stopped goes here (the test puts it)
        - name: Budget stand-in, what node_maintenance's budget would be told
          ansible.builtin.set_fact:
            stopped_by_seen: "{{ node_maintenance_stopped_by }}"
        - name: Kubelet | drain
          ansible.builtin.fail:
            msg: a PodDisruptionBudget allows no eviction
          when: inventory_hostname == 'gpu-b'
        - name: Drained pass result stand-in
          handover_stub:
            step: drained_pass
            value: {deferred: [], conflicts: []}
      rescue:
        - name: Remember the node that stops the rollout
          gpuharden.k8s.unharden_node:
            step: failed
- name: Report
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Report
      block:
        - name: Report
          gpuharden.k8s.unharden_report:
      always:
        - name: Release
          gpuharden.k8s.unharden_node:
            step: release
            then_fail: report
"""


def test_a_failed_drained_pass_stops_the_rollout_and_fails_its_node_in_the_report(tmp_path):
    """gpu-b and gpu-c need the drained pass (budget 1: a canary, then one at a time); the canary's drain fails: it is
    remembered, stays in the play (a batch of one failed whole would end the run: no report, no lock given back), the
    next batch's budget is told it stops the rollout (the real playbook's node_maintenance_stopped_by), and it fails in
    the report with the step's message; every lock is given back."""
    plugin_dir = tmp_path / "action_plugins"
    plugin_dir.mkdir()
    (plugin_dir / "unharden_rollout_stub.py").write_text(
        "from ansible_collections.gpuharden.k8s.plugins.action import unharden_rollout\n"
        "class ActionModule(unharden_rollout.ActionModule):\n"
        "    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **kwargs):\n"
        "        assert module_name == 'gpuharden.k8s.disruption_budget' and module_args['max_unavailable'] == '1'\n"
        "        return {'budget': 1, 'unavailable': [], 'fleet': module_args['fleet']}\n")
    (plugin_dir / "handover_stub.py").write_text(
        "from ansible.plugins.action import ActionBase\n"
        "from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run\n"
        "from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover\n"
        "class ActionModule(ActionBase):\n"
        "    def run(self, tmp=None, task_vars=None):\n"
        "        args = self._task.args\n"
        "        return {'ansible_facts': _handover.handed_over(_unharden_run.HANDOVERS[args['step']], args['value'])}\n")
    plays = yaml.safe_load(ROLLOUT_STOPS)
    real = yaml.safe_load((REPO_ROOT / "playbooks/unharden_gpu_nodes.yml").read_text())[1]["tasks"][0]["block"][0]["block"]
    [stopped] = [task for task in real if (task.get("gpuharden.k8s.unharden_node") or {}).get("step") == "stopped"]
    plays[1]["tasks"][0]["block"].insert(0, stopped)
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    rc, events, out = _run_playbook(tmp_path, tmp_path / "play.yml", ["gpu-a", "gpu-b", "gpu-c"], plugin_dir=plugin_dir)
    assert rc != 0, out[-4000:]
    failed = {event["event_data"]["host"]: event["event_data"]["res"]["msg"] for event in events if event["event"] == "runner_on_failed"
              and event["event_data"]["task"] == "Release"}
    assert failed == {"gpu-b": "gpu-b: Kubelet | drain failed: a PodDisruptionBudget allows no eviction"}
    seen = {event["event_data"]["host"]: event["event_data"]["res"]["ansible_facts"]["stopped_by_seen"] for event in events
            if event["event"] == "runner_on_ok" and event["event_data"]["task"].startswith("Budget stand-in")}
    assert seen == {"gpu-b": [], "gpu-c": ["gpu-b"]}
    assert not list(tmp_path.glob("*.lock"))  # every lock given back after the report
