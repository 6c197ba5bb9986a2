# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 47: a kubelet config written as JSON stays JSON, and the real kubelet v1.36.3 runs on it after a harden.

One fresh kubeadm-like node running the real kubelet.  Its /var/lib/kubelet/config.yaml is rewritten as JSON (the
kubelet's decoder takes a document that starts with "{" as JSON: k8s.io/apimachinery v0.36.3
pkg/runtime/serializer/json/json.go RecognizesData), the kubelet restarted on it, then the Topology Manager settings
applied with the drop-in route turned off, so that gpuharden edits the JSON file itself.  Before phase 2 of issue 47
it appended YAML inside the braces and the kubelet refused the file ("couldn't get version/kind; json parse error").
"""

from __future__ import annotations

import json

import pytest
import yaml
from gpuharden_lab import manager, realnode

from tests.builds import skip_unbuilt
from tests.integration.cluster_side import failures, kubelet_configz, kubelet_healthy, run, run_on, wait_for
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NODE = "fresh-0"
CONFIG = "/var/lib/kubelet/config.yaml"


@pytest.fixture(scope="module")
def lab():
    if not realnode.available():
        skip_unbuilt("the real kubelet and containerd are not built: run `make real-lab` (or `make real-components`)")
    with running_lab("fresh-fleet", node_count=1) as state:
        yield state


def sh(state, command):
    return run_on(state, NODE, command)


def healthy(state):
    return kubelet_healthy(state, NODE)


def test_a_json_kubelet_config_stays_json_and_the_real_kubelet_runs_on_it_after_a_harden(lab):
    config = yaml.safe_load(sh(lab, "cat %s" % CONFIG).stdout)
    node = next(node for node in manager.nodes_from_state(lab) if node.name == NODE)
    node.write_live(CONFIG, json.dumps(config, indent=2) + "\n")
    sh(lab, "systemctl restart kubelet")
    wait_for(lambda: healthy(lab), timeout=120, what="the real kubelet healthy on its JSON config")

    found, _stats, _seconds = run(lab, playbook="kubelet_topology.yml", extravars={"kubelet_topology_kubeadm_config_dir": ""})
    assert not [r for r in found if r["_event"] == "runner_on_failed"], failures(found)

    text = sh(lab, "cat %s" % CONFIG).stdout
    assert text.lstrip().startswith("{"), text[:500]
    written = json.loads(text)
    assert written["topologyManagerPolicy"] == "single-numa-node", written
    assert all(written[key] == value for key, value in config.items() if key != "topologyManagerPolicy")
    sh(lab, "systemctl restart kubelet")
    wait_for(lambda: healthy(lab), timeout=120, what="the real kubelet healthy on the written JSON config")
    assert kubelet_configz(lab, NODE)["topologyManagerPolicy"] == "single-numa-node"
