# SPDX-License-Identifier: GPL-3.0-or-later
"""The uninstall on a node that was broken before gpuharden came: seed-stale-cpu-state's kubelet refuses to start on
its CPU Manager checkpoint (policy none in the checkpoint, static configured).  Harden removes that checkpoint and the
kubelet starts; unharden puts every file back but never that checkpoint, which would stop the kubelet again.  (Found in
the lab: the first unharden restored it byte for byte and the kubelet never came back.)"""

from __future__ import annotations

import os
import sys
import tempfile

import ansible_runner
import pytest
from gpuharden_lab import REPO_ROOT
from kubernetes import client

from tests.integration.cluster_side import admin
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
NODE = "seed-stale-cpu-state"


@pytest.fixture(scope="module")
def lab():
    with running_lab("seed-failures") as state:
        yield state


def _playbook(state, name, extravars=None, skip_tags=None):
    with tempfile.TemporaryDirectory(prefix="gpuharden-unharden-seeded-") as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=state["inventory"], limit=NODE,
                                    playbook=str(REPO_ROOT / "playbooks" / name), extravars=extravars or {}, quiet=True,
                                    skip_tags=skip_tags)
        results = [event["event_data"] for event in runner.events if event.get("event") in ("runner_on_ok", "runner_on_failed")]
        return runner.rc, results, runner.stdout.read()


def _node(state):
    return client.CoreV1Api(admin(state)).read_node(NODE)


def test_unharden_keeps_the_kubelet_running(lab):
    # The seeded RuntimeClass has a wrong (immutable) handler: recreating it is a decision the run takes only when told.
    # The device plugin stage is cluster-wide: its rollout would cover seed-no-runtime, outside this run, whose real
    # containerd has no nvidia handler, and the stage refuses that (test_real_nodes.py pins the refusal).  This module is
    # about this node's checkpoint, so the run leaves the plugin out as an adopter does, by its tag.
    rc, _results, out = _playbook(lab, "harden_gpu_nodes.yml", {"gpuharden_mig_strategy": "mixed", "runtime_class_force": True},
                                  skip_tags="device_plugin")
    assert rc == 0, out[-3000:]
    rc, results, out = _playbook(lab, "unharden_gpu_nodes.yml")
    assert rc == 0, out[-3000:]
    entries = [entry for data in results if data.get("task_action") == "gpuharden.k8s.unharden_files"
               for entry in (data.get("res") or {}).get("files") or []]
    checkpoint = [entry for entry in entries if entry["path"].endswith("/cpu_manager_state")]
    # The passes before the drained one leave it alone (it needs the kubelet stopped); the drained pass removes the
    # kubelet's current checkpoint, and no pass puts back the one the kubelet refused.
    assert "restore" not in [entry["action"] for entry in checkpoint], checkpoint
    assert checkpoint[-1]["action"] == "remove" and "already stale" in checkpoint[-1]["reason"], checkpoint
    node = _node(lab)
    assert any(condition.type == "Ready" and condition.status == "True" for condition in node.status.conditions or [])
    assert not node.spec.unschedulable
