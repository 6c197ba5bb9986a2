# SPDX-License-Identifier: GPL-3.0-or-later
"""The MIG stage's plan in Python (issue 45): the action gpuharden.k8s.mig_plan's decide(), which
roles/mig/tasks/plan.yml calls (a set_fact chain and a block decided it in Jinja before)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import mig_plan


@pytest.mark.parametrize(("planned", "disruptive"), [
    ({"changed": True, "reset_required": False}, True),  # a layout change drains the node
    ({"changed": False, "reset_required": True}, True),  # a mode change that waits for a reset too
    ({"changed": False, "reset_required": False}, False),
])
def test_a_layout_change_or_a_pending_reset_is_disruptive(planned, disruptive):
    result = mig_plan.decide([], lambda: dict(planned, advertised_resources={}))
    assert result["disruptive"] is disruptive and result["changed"] is planned["changed"] and "advertised_resources" in result


def test_a_layout_the_gpu_operator_owns_is_not_planned_and_the_refusal_is_said():
    refused = [{"what": "mig", "why": "the GPU Operator's MIG manager owns the layout", "fix": "set gpuharden_operator_takeover"}]
    calls = []
    result = mig_plan.decide(refused, lambda: calls.append(1))
    assert calls == [] and result["refused"] == refused and result["disruptive"] is False and result["changed"] is False
    assert result["warnings"] == ["mig: layout left alone: mig: the GPU Operator's MIG manager owns the layout; fix: set gpuharden_operator_takeover"]


def test_a_failed_plan_is_the_tasks_failure():
    failed = {"failed": True, "msg": "GPU processes run on GPUs the MIG plan touches: GPU 3 (00000000:5D:00.0) pids 4711"}
    assert mig_plan.decide([], lambda: dict(failed)) == failed
