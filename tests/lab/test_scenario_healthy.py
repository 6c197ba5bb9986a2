# SPDX-License-Identifier: GPL-3.0-or-later
"""The healthy scenario is a fresh install on real nodes, reached by the product's harden run (its `harden:` key),
without bringing a lab up: the running healthy lab is checked in tests/integration (TestHealthy in test_postcheck.py,
test_installed_artifacts.py, test_node_maintenance.py)."""

from __future__ import annotations

import pytest
import yaml
from gpuharden_lab import scenario
from gpuharden_lab.system import LabError

# What a fresh kubeadm install's kubelet config leaves unset (the kubelet's own defaults), and harden then sets.
MANAGED_BY_HARDEN = {"cpuManagerPolicy", "topologyManagerPolicy", "topologyManagerScope", "reservedSystemCPUs", "memoryThrottlingFactor"}


def test_healthy_nodes_start_as_fresh_real_installs_and_are_reached_by_harden():
    loaded = scenario.load("healthy")
    assert loaded.harden == {}
    assert {spec.name: spec.real_containerd for spec in loaded.nodes} == {"gpu-a100-0": "2", "gpu-h100-0": "1.7", "gpu-l4-0": "2"}
    assert loaded.cluster == {} and loaded.pods == []  # no plugin, RuntimeClass or ConfigMap: harden brings them
    for spec in loaded.nodes:
        config = yaml.safe_load(spec.files["/var/lib/kubelet/config.yaml"])
        assert not MANAGED_BY_HARDEN & set(config), (spec.name, config)
        assert "/var/lib/kubelet/cpu_manager_state" not in spec.files
        # containerd's config is the release's own default, written at `up` (realnode.default_containerd_config)
        assert "/etc/containerd/config.toml" not in spec.files


def test_scenarios_written_in_their_state_have_no_harden_run():
    assert scenario.load("seed-failures").harden is None
    assert scenario.load("real-nodes").harden is None  # fresh: the tests harden it themselves


@pytest.mark.parametrize("data, message", [
    ({"harden": ["device_plugin_version=v1"], "nodes": [{"name": "n0", "fixture": "l4", "real": {"containerd": "2"}}]},
     "'harden' must be a mapping"),
    # A harden run on stand-ins would only confirm what they were written to accept.
    ({"harden": {}, "nodes": [{"name": "n0", "fixture": "l4", "real": {"containerd": "2"}}, {"name": "n1", "fixture": "l4"}]},
     r"'harden' needs every node real .*\['n1'\]"),
])
def test_a_bad_harden_key_is_refused(tmp_path, monkeypatch, data, message):
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    with pytest.raises(LabError, match=message):
        scenario.load("broken")


def _load(tmp_path, monkeypatch, data):
    (tmp_path / "custom.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    return scenario.load("custom")


def test_a_real_node_prepared_by_nvidia_ctk_and_a_checkpoint_seeded_after_it_joined(tmp_path, monkeypatch):
    """`real: {nvidia_runtime: default}`: the real nvidia-ctk makes the toolkit's runtime containerd's default before
    containerd first starts (realnode.NVIDIA_CTK_CONFIGURE).  A CPU Manager checkpoint the scenario names on a real node
    is written once the Node joined, then the kubelet restarts on it; without one the real kubelet writes its own."""
    loaded = _load(tmp_path, monkeypatch, {"nodes": [
        {"name": "n0", "fixture": "l4", "real": {"containerd": "2", "nvidia_runtime": "default"},
         "kubelet": {"config": {"cpuManagerPolicy": "static"}, "cpu_manager_state": "none"}},
        {"name": "n1", "fixture": "l4", "real": {"containerd": "1.7"}, "kubelet": {"config": {"cpuManagerPolicy": "static"}}},
        {"name": "n2", "fixture": "l4", "kubelet": {"cpu_manager_state": "none"}},
    ]})
    n0, n1, n2 = loaded.nodes
    assert (n0.real_nvidia_runtime, n1.real_nvidia_runtime, n2.real_nvidia_runtime) == ("default", None, None)
    assert "/var/lib/kubelet/cpu_manager_state" not in n0.files
    assert '"policyName": "none"' in n0.seeded_after_join["/var/lib/kubelet/cpu_manager_state"]
    assert "/var/lib/kubelet/cpu_manager_state" not in n1.files and n1.seeded_after_join == {}
    # a stand-in node keeps the checkpoint among the files it starts with
    assert '"policyName": "none"' in n2.files["/var/lib/kubelet/cpu_manager_state"] and n2.seeded_after_join == {}


@pytest.mark.parametrize("real, message", [
    ({"containerd": "2", "nvidia_runtime": "yes"}, r"'real' must be \{containerd: .*nvidia_runtime: default"),
    ({"containerd": "2", "toolkit": True}, r"'real' must be \{containerd"),
])
def test_a_bad_real_key_is_refused(tmp_path, monkeypatch, real, message):
    with pytest.raises(LabError, match=message):
        _load(tmp_path, monkeypatch, {"nodes": [{"name": "n0", "fixture": "l4", "real": real}]})


def test_the_nvidia_runtime_needs_a_gpu_node(tmp_path, monkeypatch):
    with pytest.raises(LabError, match="needs a GPU node"):
        _load(tmp_path, monkeypatch, {"nodes": [{"name": "cpu", "fixture": None, "real": {"containerd": "2", "nvidia_runtime": "default"}}]})


def test_the_lab_raises_the_hosts_inotify_limits_for_real_nodes_and_never_lowers_them(tmp_path):
    from gpuharden_lab import manager

    (tmp_path / "fs/inotify").mkdir(parents=True)
    (tmp_path / "fs/inotify/max_user_instances").write_text("128\n")
    (tmp_path / "fs/inotify/max_user_watches").write_text("99999999\n")
    manager.raise_inotify_limits(tmp_path)
    assert (tmp_path / "fs/inotify/max_user_instances").read_text() == "%d\n" % manager.INOTIFY_LIMITS["fs/inotify/max_user_instances"]
    assert (tmp_path / "fs/inotify/max_user_watches").read_text() == "99999999\n"


def test_seed_failures_runs_its_gpu_nodes_real_and_stand_ins_only_where_its_file_says():
    loaded = scenario.load("seed-failures")
    stand_ins = sorted(spec.name for spec in loaded.nodes if spec.real_containerd is None)
    assert stand_ins == ["seed-isolation", "seed-memory-high"]
    real = {spec.name: spec for spec in loaded.nodes if spec.real_containerd is not None}
    assert len(real) == 9 and {spec.real_containerd for spec in real.values()} == {"2"}
    # prepared by the real nvidia-ctk, as the seeded plugins without a runtimeClassName need, but the node without it
    assert {name for name, spec in real.items() if spec.real_nvidia_runtime is None} == {"seed-no-runtime"}
    # the stale checkpoint is written after the Node joined (a real kubelet writes its own at first start)
    assert set(real["seed-stale-cpu-state"].seeded_after_join) == {"/var/lib/kubelet/cpu_manager_state"}


def test_stand_ins_drop_every_real_key_and_a_scenario_reached_by_harden_refuses_them():
    loaded = scenario.load("seed-failures", stand_ins=True)
    assert all(spec.real_containerd is None and spec.real_nvidia_runtime is None for spec in loaded.nodes)
    # the stand-in containerd's config where the real node writes its own at `up`
    no_runtime = next(spec for spec in loaded.nodes if spec.name == "seed-no-runtime")
    assert "nvidia" not in no_runtime.files.get("/etc/containerd/config.toml", "") and any(
        path.startswith("/etc/containerd/") for path in no_runtime.files)
    with pytest.raises(LabError, match="'harden' needs every node real"):
        scenario.load("healthy", stand_ins=True)
