# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet-wide disruption budget (plugins/module_utils/cluster/_disruption.py): pure planner."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _disruption
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


def node(name, *, cordoned=False, ready="True", gpus=1, taints=(), labels=None):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": cordoned, "taints": list(taints)},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)} if gpus else {"cpu": "8"},
                   "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown"}]},
    }


FLEET = ["gpu-%d" % i for i in range(8)]


@pytest.mark.parametrize(("value", "fleet", "expected"), [
    (1, 8, 1), ("1", 8, 1), (0, 8, 0), ("25%", 8, 2), ("25%", 9, 2), ("25%", 3, 1), ("0%", 8, 0), ("100%", 8, 8),
    ("50 %", 5, 2), ("10%", 0, 0),
])
def test_budget_counts_and_percentages_round_down_but_never_to_zero(value, fleet, expected):
    assert _disruption.resolve_budget(value, fleet) == expected


@pytest.mark.parametrize("value", ["-1", "one", "25.5%", "150%", True, None, [1]])
def test_bad_budget_is_refused_with_the_value(value):
    with pytest.raises(GpuhardenError, match="max_unavailable"):
        _disruption.resolve_budget(value, 8)


def test_default_budget_lets_one_node_of_the_batch_go():
    result = _disruption.plan([node(n) for n in FLEET], fleet=FLEET, batch=FLEET[:2], max_unavailable=1)
    assert result["allowed"] == ["gpu-0"]
    assert "budget exhausted" in result["deferred"]["gpu-1"]
    assert result["budget"] == 1 and result["fleet_size"] == 8


def test_percentage_budget_of_the_fleet():
    result = _disruption.plan([node(n) for n in FLEET], fleet=FLEET, batch=FLEET[:3], max_unavailable="25%")
    assert result["allowed"] == ["gpu-0", "gpu-1"]
    assert list(result["deferred"]) == ["gpu-2"]


def test_already_cordoned_or_not_ready_nodes_count_against_the_budget():
    nodes = [node(n) for n in FLEET]
    nodes[5] = node("gpu-5", cordoned=True)
    nodes[6] = node("gpu-6", ready="Unknown")
    result = _disruption.plan(nodes, fleet=FLEET, batch=["gpu-0"], max_unavailable=2)
    assert result["allowed"] == []
    reason = result["deferred"]["gpu-0"]
    assert "gpu-5 (cordoned)" in reason and "gpu-6 (NotReady (NodeStatusUnknown))" in reason
    assert _disruption.plan(nodes, fleet=FLEET, batch=["gpu-0"], max_unavailable=3)["allowed"] == ["gpu-0"]


def test_a_batch_node_that_is_already_cordoned_takes_its_own_slot_not_another():
    nodes = [node(n, cordoned=(n == "gpu-0")) for n in FLEET]
    assert _disruption.plan(nodes, fleet=FLEET, batch=["gpu-0"], max_unavailable=1)["allowed"] == ["gpu-0"]


def test_gpu_nodes_outside_the_run_count_too_but_cpu_nodes_do_not():
    nodes = [node(n) for n in FLEET[:2]] + [node("other-gpu", cordoned=True), node("cpu-1", cordoned=True, gpus=0),
                                           node("labelled", cordoned=True, gpus=0, labels={"nvidia.com/gpu.present": "true"})]
    result = _disruption.plan(nodes, fleet=FLEET[:2], batch=["gpu-0"], max_unavailable=2)
    assert [entry["node"] for entry in result["unavailable"]] == ["labelled", "other-gpu"]
    assert result["allowed"] == []
    assert "cpu-1" not in result["fleet"]


def test_unregistered_fleet_nodes_count_and_unregistered_batch_nodes_are_deferred():
    result = _disruption.plan([node("gpu-0")], fleet=["gpu-0", "gpu-1"], batch=["gpu-0"], max_unavailable=1)
    assert result["unavailable"] == [{"node": "gpu-1", "reasons": ["not registered"]}]
    assert result["allowed"] == []
    result = _disruption.plan([node("gpu-0")], fleet=["gpu-0", "ghost"], batch=["ghost"], max_unavailable=5)
    assert result["deferred"] == {"ghost": "no Node ghost in the cluster"}


def test_nodes_being_bootstrapped_neither_count_nor_need_a_slot():
    taint = {"key": "gpuharden.io/bootstrap", "value": "pending", "effect": "NoSchedule"}
    nodes = [node(n, cordoned=True, taints=[taint]) for n in ("new-0", "new-1", "new-2")] + [node("old-0")]
    result = _disruption.plan(nodes, fleet=["new-0", "new-1", "new-2"], batch=["new-0", "new-1"], max_unavailable=1,
                              out_of_service_taints=["gpuharden.io/bootstrap"])
    assert result["allowed"] == ["new-0", "new-1"]
    assert result["unavailable"] == []
    without = _disruption.plan(nodes, fleet=["new-0", "new-1", "new-2"], batch=["new-0"], max_unavailable=1)
    assert without["allowed"] == []


def test_a_failed_node_stops_the_rollout():
    result = _disruption.plan([node(n) for n in FLEET], fleet=FLEET, batch=["gpu-2"], max_unavailable=4, stopped_by=["gpu-0"])
    assert result["allowed"] == []
    assert result["deferred"]["gpu-2"].startswith("rollout stopped: gpu-0 failed")


def test_zero_budget_allows_nothing():
    result = _disruption.plan([node(n) for n in FLEET], fleet=FLEET, batch=["gpu-0"], max_unavailable="0%")
    assert result["allowed"] == [] and result["budget"] == 0


# ---------------------------------------------------------------------------------------------------
# The module's wait for nodes this run restarted containerd or the kubelet on (plugins/modules/disruption_budget.py)

def _settle(nodes, settle_nodes, answers, seconds=60, poll=2):
    """settle() over ``nodes`` with a fake clock; ``answers``: {node: [Node objects the reads return, in order]}."""
    from ansible_collections.gpuharden.k8s.plugins.modules import disruption_budget

    now, reads = [0.0], []

    def read_node(name):
        reads.append(name)
        return answers[name].pop(0) if len(answers[name]) > 1 else answers[name][0]

    def sleep(seconds_):
        now[0] += seconds_

    return disruption_budget.settle(nodes, settle_nodes, read_node, lambda: now[0], sleep, seconds, poll), reads, now[0]


def test_a_node_restarted_by_this_run_is_given_time_to_be_ready_before_it_counts():
    """The race the first harden of seed-failures hit: seed-no-runtime was NotReady for a while after its containerd
    restart, and the rollout's budget counted it: two disruptive steps not started, the plugin rollout waited 300 s."""
    nodes = [node("gpu-0", ready="False"), node("gpu-1"), node("gpu-2")]
    settled, reads, waited = _settle(nodes, ["gpu-0", "gpu-1"], {"gpu-0": [node("gpu-0", ready="False"), node("gpu-0")]})
    assert settled == {"seconds": 2.0, "waited_for": ["gpu-0"], "not_ready": {}}
    assert reads == ["gpu-0", "gpu-0"] and waited == 2.0  # gpu-1 was Ready: never read again
    plan = _disruption.plan(nodes, fleet=FLEET[:3], batch=["gpu-2"], max_unavailable=1)
    assert plan["allowed"] == ["gpu-2"] and plan["unavailable"] == []


def test_a_restarted_node_still_not_ready_at_the_end_counts_and_is_named():
    nodes = [node("gpu-0", ready="False"), node("gpu-1")]
    settled, reads, waited = _settle(nodes, ["gpu-0"], {"gpu-0": [node("gpu-0", ready="False")]}, seconds=10, poll=2)
    assert settled["not_ready"] == {"gpu-0": ["NotReady (NodeStatusUnknown)"]} and waited == 10.0
    plan = _disruption.plan(nodes, fleet=["gpu-0", "gpu-1"], batch=["gpu-1"], max_unavailable=1)
    assert plan["deferred"] == {
        "gpu-1": "disruption budget exhausted: max_unavailable 1 = 1 node(s) of 2; unavailable now: gpu-0 (NotReady (NodeStatusUnknown))"}


def test_cordoned_unlisted_or_unknown_nodes_are_not_waited_for():
    """A cordon is no restart's doing, a node not in settle_nodes is not this run's, and an unregistered one has nothing
    to wait for: the budget counts each as it is, without a read."""
    nodes = [node("gpu-0", ready="False", cordoned=True), node("gpu-1", ready="False")]
    settled, reads, waited = _settle(nodes, ["gpu-0", "gpu-9"], {})
    assert settled == {"seconds": 0.0, "waited_for": [], "not_ready": {}} and reads == [] and waited == 0.0


def test_settle_seconds_zero_counts_the_nodes_as_they_are():
    nodes = [node("gpu-0", ready="False")]
    settled, reads, _waited = _settle(nodes, ["gpu-0"], {"gpu-0": [node("gpu-0")]}, seconds=0)
    assert settled["not_ready"] == {"gpu-0": ["NotReady (NodeStatusUnknown)"]} and reads == []


@pytest.mark.parametrize(("option", "value"), [("settle_seconds", -1), ("poll_interval", 0)])
def test_bad_settle_options_are_refused_before_any_request(option, value):
    from tests.unit.conftest import run_module

    result = run_module("disruption_budget", {option: value, "kubeconfig": "/nonexistent/kubeconfig"}, {})
    assert result.get("failed") and "%s=" % option in result["msg"], result


# ---------------------------------------------------------------------------------------------------
# containerd restarts: a canary, then waves within the budget (issue 43, item 8)

def test_the_canary_restarts_alone_then_waves_of_the_budget():
    nodes = [node(n) for n in FLEET]
    waves = _disruption.restart_waves(nodes, fleet=FLEET, restarts=FLEET[:6], max_unavailable=2)
    assert waves["waves"] == [["gpu-0"], ["gpu-1", "gpu-2"], ["gpu-3", "gpu-4"], ["gpu-5"]]
    assert waves["deferred"] == {} and waves["wave_size"] == 2
    # what the playbook loops over: each wave waits for the previous one, and a last step for the last one
    assert waves["steps"] == [
        {"index": 0, "nodes": ["gpu-0"], "settle": [], "before": []},
        {"index": 1, "nodes": ["gpu-1", "gpu-2"], "settle": ["gpu-0"], "before": ["gpu-0"]},
        {"index": 2, "nodes": ["gpu-3", "gpu-4"], "settle": ["gpu-1", "gpu-2"], "before": ["gpu-0", "gpu-1", "gpu-2"]},
        {"index": 3, "nodes": ["gpu-5"], "settle": ["gpu-3", "gpu-4"], "before": ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]},
        {"index": 4, "nodes": [], "settle": ["gpu-5"], "before": FLEET[:6]}]
    one = _disruption.restart_waves(nodes, fleet=FLEET, restarts=["gpu-3", "gpu-1", "gpu-3"], max_unavailable=1)
    assert one["waves"] == [["gpu-3"], ["gpu-1"]]  # the run's order, each node once


def test_the_canary_is_an_available_node_and_nodes_already_down_go_right_after_it():
    nodes = [node(n) for n in FLEET]
    nodes[0] = node("gpu-0", ready="False")
    nodes[1] = node("gpu-1", cordoned=True)
    waves = _disruption.restart_waves(nodes, fleet=FLEET, restarts=["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"], max_unavailable=1)
    assert waves["waves"] == [["gpu-2"], ["gpu-0", "gpu-1", "gpu-3"], ["gpu-4"]]
    # a node that was down before its restart is not waited for: it would prove nothing
    assert [step["settle"] for step in waves["steps"]] == [[], ["gpu-2"], ["gpu-3"], ["gpu-4"]]
    down = [node(n, ready="False") for n in FLEET[:2]] + [node(n) for n in FLEET[2:]]
    assert _disruption.restart_waves(down, fleet=FLEET, restarts=FLEET[:2], max_unavailable=1)["waves"] == [["gpu-0"], ["gpu-1"]]


def test_nodes_down_elsewhere_shrink_the_waves_to_one_node_but_never_block_them():
    nodes = [node(n) for n in FLEET]
    nodes[7] = node("gpu-7", ready="Unknown")
    assert _disruption.restart_waves(nodes, fleet=FLEET, restarts=FLEET[:4], max_unavailable=2)["waves"] == [
        ["gpu-0"], ["gpu-1"], ["gpu-2"], ["gpu-3"]]
    nodes[6] = node("gpu-6", cordoned=True)
    assert _disruption.restart_waves(nodes, fleet=FLEET, restarts=FLEET[:3], max_unavailable=2)["wave_size"] == 1


def test_a_budget_of_zero_restarts_nothing_and_says_so():
    waves = _disruption.restart_waves([node(n) for n in FLEET], fleet=FLEET, restarts=FLEET[:2], max_unavailable="0%")
    assert waves["waves"] == [] and set(waves["deferred"]) == {"gpu-0", "gpu-1"}
    assert "max_unavailable 0% = 0 node(s)" in waves["deferred"]["gpu-0"]
    assert _disruption.restart_waves([node("gpu-0")], fleet=["gpu-0"], restarts=[], max_unavailable=1) == {
        "waves": [], "deferred": {}, "wave_size": 1, "steps": []}


def test_left_cordoned_names_the_fleets_nodes_with_gpuhardens_record():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _drain

    record = _drain.record_value({"owner": "harden@x", "at": "2026-07-01T12:00:03Z", "for": "mig"})
    nodes = [node(n, cordoned=n in ("gpu-1", "gpu-2", "gpu-3")) for n in FLEET[:4]] + [node("cpu-0", gpus=0, cordoned=True)]
    for item in (nodes[1], nodes[3], nodes[4]):
        item["metadata"]["annotations"] = {_drain.CORDON_ANNOTATION: record}
    assert _disruption.left_cordoned(nodes, fleet=FLEET[:2]) == [
        {"node": "gpu-1", "record": {"owner": "harden@x", "at": "2026-07-01T12:00:03Z", "for": "mig"}},
        {"node": "gpu-3", "record": {"owner": "harden@x", "at": "2026-07-01T12:00:03Z", "for": "mig"}}]


def _params(**overrides):
    from ansible_collections.gpuharden.k8s.plugins.modules import disruption_budget

    params = {key: spec.get("default") for key, spec in disruption_budget.argument_spec().items()}
    params.update(overrides)
    return params


def test_a_restart_wave_that_did_not_come_back_stops_the_rollout_naming_it():
    from ansible_collections.gpuharden.k8s.plugins.modules import disruption_budget

    settled = {"seconds": 60.0, "waited_for": ["gpu-0"], "not_ready": {"gpu-0": ["NotReady (KubeletNotReady)"]}}
    reason = disruption_budget.stop_reason(_params(settle_nodes=["gpu-0"], settle_required=True), settled)
    assert reason == "gpu-0 not Ready 60s after this run restarted it (gpu-0: NotReady (KubeletNotReady))"
    assert disruption_budget.stop_reason(_params(settle_nodes=["gpu-0"]), settled) is None  # counted, not a stop
    assert disruption_budget.stop_reason(_params(settle_required=True), dict(settled, not_ready={})) is None
    both = disruption_budget.stop_reason(_params(stopped_by=["gpu-5"], settle_required=True), settled)
    assert both.startswith("gpu-5 failed earlier in this run") and "gpu-0 not Ready" in both


def test_the_module_composes_settle_plan_waves_and_cordons(monkeypatch):
    from ansible_collections.gpuharden.k8s.plugins.modules import disruption_budget

    nodes = [node(n) for n in FLEET[:3]]
    nodes[0] = node("gpu-0", ready="False")
    monkeypatch.setattr(disruption_budget._k8s, "api_client", lambda params: type("Api", (), {"close": lambda self: None})())
    monkeypatch.setattr(disruption_budget, "list_all", lambda *args, **kwargs: (list(nodes), 1))
    monkeypatch.setattr(disruption_budget, "call", lambda *args, **kwargs: (200, node("gpu-0", ready="False")))
    clock = [0.0]
    result = disruption_budget.decide(_params(fleet=FLEET[:3], batch=["gpu-1"], settle_nodes=["gpu-0"], settle_seconds=4,
                                              settle_required=True, restarts=["gpu-1", "gpu-2"]),
                                      clock=lambda: clock[0], sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    assert result["stopped"].startswith("gpu-0 not Ready 4s after this run restarted it")
    assert result["deferred"] == {"gpu-1": "rollout stopped: " + result["stopped"]} and result["allowed"] == []
    assert result["restart_waves"] == [["gpu-1"], ["gpu-2"]] and result["restart_deferred"] == {}
    assert result["left_cordoned"] == []


def test_the_batch_belongs_to_the_fleet_even_before_its_nodes_advertise_a_gpu():
    """A role run on its own passes no fleet, and fresh nodes advertise no GPU before the device plugin runs: the
    budget still counts them (the lab's fresh-fleet nodes were all allowed at once before)."""
    fresh = [node(n, gpus=0) for n in ("fresh-0", "fresh-1", "fresh-2")]
    result = _disruption.plan(fresh, fleet=[], batch=["fresh-0", "fresh-1", "fresh-2"], max_unavailable=1)
    assert result["allowed"] == ["fresh-0"] and sorted(result["deferred"]) == ["fresh-1", "fresh-2"]
    assert result["fleet_size"] == 3
    waves = _disruption.restart_waves(fresh, fleet=[], restarts=["fresh-0", "fresh-1", "fresh-2"], max_unavailable=1)
    assert waves["waves"] == [["fresh-0"], ["fresh-1"], ["fresh-2"]]
