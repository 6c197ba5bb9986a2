# SPDX-License-Identifier: GPL-3.0-or-later
"""Role node_maintenance's steps in Python (issue 45): the action gpuharden.k8s.node_maintenance_step turns the role's
node_maintenance_* variables into node_maintenance's options (the task files spelled them in Jinja before), keeps a cordon
someone else made, and gives each host its part of the batch's budget."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import node_maintenance_step as step

# the role defaults, templated
SETTINGS = {"node_name": "gpu-1", "kubeconfig": "", "kube_context": "", "state": "drained", "force": False, "delete_emptydir_data": False,
            "grace_period": -1, "timeout": 300, "retry_interval": 5, "owner": "", "purpose": "", "ready_timeout": 120,
            "keep_preexisting_cordon": True}


def test_the_drain_takes_the_role_defaults_and_leaves_out_what_is_unset():
    assert step.drain_args(SETTINGS) == {"nodes": ["gpu-1"], "state": "drained", "force": False, "delete_emptydir_data": False,
                                         "timeout": 300.0, "retry_interval": 5.0, "owner": "", "purpose": ""}


def test_the_drain_passes_what_is_set():
    settings = dict(SETTINGS, kubeconfig="/k", kube_context="c", state="cordoned", force="yes", delete_emptydir_data="true", grace_period="0",
                    timeout="60", retry_interval="2", owner="harden@x", purpose="mig")
    assert step.drain_args(settings) == {"nodes": ["gpu-1"], "kubeconfig": "/k", "context": "c", "state": "cordoned", "force": True,
                                         "delete_emptydir_data": True, "grace_period": 0, "timeout": 60.0, "retry_interval": 2.0,
                                         "owner": "harden@x", "purpose": "mig"}


@pytest.mark.parametrize(("keep", "preexisting", "uncordoned"), [
    (True, True, False),  # someone else's cordon stays
    (True, False, True),
    ("no", True, True),  # the role told to end it anyway
])
def test_uncordon_keeps_a_cordon_someone_else_made_before(keep, preexisting, uncordoned):
    drained = {"nodes": {"gpu-1": {"preexisting_cordon": preexisting}}}
    args = step.uncordon_args(dict(SETTINGS, keep_preexisting_cordon=keep), drained)
    assert (args is not None) is uncordoned
    if uncordoned:
        assert args == {"nodes": ["gpu-1"], "state": "uncordoned", "ready_timeout": 120, "owner": ""}


def test_uncordon_without_a_drain_of_this_run_uncordons():
    assert step.uncordon_args(SETTINGS, None)["state"] == "uncordoned"
    assert step.uncordon_args(SETTINGS, {"failed": True, "msg": "x"})["state"] == "uncordoned"


def test_the_plugin_restart():
    assert step.restart_args(dict(SETTINGS, kubeconfig="/k", timeout="60")) == {"nodes": ["gpu-1"], "kubeconfig": "/k",
                                                                                 "state": "device_plugin_restarted", "timeout": 60.0}


BUDGET = {"allowed": ["gpu-1"], "not_started": {"gpu-2": "gpu-2: disruptive step not started: disruption budget exhausted"},
          "would_defer": {"gpu-3": "gpu-3: a real run would not start the disruptive step now: stopped by gpu-9"}}


@pytest.mark.parametrize(("node", "wanted", "failure", "would_defer", "allowed_in"), [
    ("gpu-1", True, None, None, ["harden", ["a", "b"]]),
    ("gpu-1", "False", None, None, []),  # allowed, but wants no step: nothing remembered
    ("gpu-2", True, BUDGET["not_started"]["gpu-2"], None, []),
    ("gpu-3", True, None, BUDGET["would_defer"]["gpu-3"], []),
])
def test_each_host_gets_its_part_of_the_batch_s_budget(node, wanted, failure, would_defer, allowed_in):
    assert step.budget_verdict(node, BUDGET, wanted, "harden", ("a", "b")) == (failure, would_defer, allowed_in)
