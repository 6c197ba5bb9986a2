# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43 item 4: where the NVIDIA GPU Operator owns a node's part, the node stage that would change it defers.

The toolkit's layout (its drop-in with the runtimes under /usr/local/nvidia/toolkit, nvidia-container-toolkit v1.20.0
cmd/nvidia-ctk-installer), the driver container's root (/run/nvidia/driver, gpu-operator v26.7.0), and the controller's
reading of the ClusterPolicy (spec.<component>.enabled and the node's nvidia.com/gpu.deploy.<component> label) each make
the stage refuse: it changes nothing and says why and how to fix it; gpuharden_operator_takeover lets it act.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_operator_policy
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _gpu_operator
from gpuharden_lab.noderoot import build_node_root

from tests.unit.conftest import run_module, tree_snapshot

FIXTURES = Path(__file__).parent / "fixtures"
TOOLKIT = "/usr/local/nvidia/toolkit"
CLAIM = ("ClusterPolicy cluster-policy runs the GPU Operator's container toolkit on this node (spec.toolkit.enabled is unset; "
         "node label nvidia.com/gpu.deploy.container-toolkit=true)")


def _executable(root: Path, path: str) -> None:
    binary = root / path.lstrip("/")
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)


def _containerd_node(root: Path, fixture: str) -> Path:
    """A node root with the containerd fixture as /etc/containerd, and the runtime binaries of both toolkits."""
    shutil.copytree(FIXTURES / "containerd" / fixture, root / "etc/containerd", dirs_exist_ok=True)
    _executable(root, "/usr/bin/nvidia-container-runtime")
    return root


def _operator_node(root: Path) -> Path:
    """What the operator's toolkit container leaves: its drop-in and its runtimes under /usr/local/nvidia/toolkit."""
    _containerd_node(root, "v3-operator")
    for suffix in ("", ".cdi", ".legacy"):
        _executable(root, TOOLKIT + "/nvidia-container-runtime" + suffix)
    return root


def _containerd(root, check=False, **gpu_operator):
    args = {"root": str(root), "_ansible_check_mode": check}
    if gpu_operator:
        args["gpu_operator"] = gpu_operator
    result = run_module("containerd_nvidia_runtime", args, {})
    assert not result.get("failed"), result
    return result


# ---------------------------------------------------------------------------------------------
# the node's layout


def test_toolkit_layout_is_a_runtime_under_the_toolkit_dir_or_its_binary(tmp_path):
    runtimes = [("/etc/containerd/conf.d/99-nvidia.toml", "nvidia", TOOLKIT + "/nvidia-container-runtime"),
                ("/etc/containerd/config.toml", "runc", "/usr/bin/runc")]
    evidence = _gpu_operator.toolkit_layout(str(tmp_path), TOOLKIT, runtimes)
    assert evidence == ["/etc/containerd/conf.d/99-nvidia.toml defines runtime 'nvidia' with BinaryName %s/nvidia-container-runtime" % TOOLKIT]
    # a sibling directory whose name starts the same is not the toolkit's
    assert _gpu_operator.toolkit_layout(str(tmp_path), TOOLKIT, [("f", "nvidia", TOOLKIT + "-old/nvidia-container-runtime")]) == []
    _executable(tmp_path, TOOLKIT + "/nvidia-container-runtime")
    assert _gpu_operator.toolkit_layout(str(tmp_path), TOOLKIT, []) == [
        "%s/nvidia-container-runtime exists (the operator's toolkit container installs there)" % TOOLKIT]


def test_driver_layout_an_empty_driver_root_is_no_evidence(tmp_path):
    # the toolkit's and the MIG manager's DaemonSets create /run/nvidia/driver (DirectoryOrCreate) on host-driver nodes too
    (tmp_path / "run/nvidia/driver").mkdir(parents=True)
    assert _gpu_operator.driver_layout(str(tmp_path), "/run/nvidia/driver") == []
    (tmp_path / "run/nvidia/driver/usr/bin").mkdir(parents=True)
    assert _gpu_operator.driver_layout(str(tmp_path), "/run/nvidia/driver") == ["/run/nvidia/driver holds the driver container's root (usr)"]
    shutil.rmtree(tmp_path / "run/nvidia/driver/usr")
    (tmp_path / "run/nvidia/validations").mkdir(parents=True)
    (tmp_path / "run/nvidia/validations/.driver-ctr-ready").write_text("")
    assert _gpu_operator.driver_layout(str(tmp_path), "/run/nvidia/driver") == [
        "/run/nvidia/validations/.driver-ctr-ready exists (the driver container is ready)"]


def test_decide_refuses_on_either_source_and_takeover_turns_it_into_a_warning():
    refused, not_checked, warnings = _gpu_operator.decide("container_runtime", "the runtime", [], {"gpu_operator": {"toolkit": CLAIM}})
    assert not_checked == [] and warnings == [] and len(refused) == 1
    assert refused[0]["what"] == "the runtime" and CLAIM in refused[0]["why"] and "reverted" in refused[0]["why"]
    assert "spec.toolkit" in refused[0]["fix"] and "gpuharden_operator_takeover: [container_runtime]" in refused[0]["fix"]
    refused, _not_checked, _warnings = _gpu_operator.decide("container_runtime", "the runtime", ["a drop-in"], {})
    assert "a drop-in" in refused[0]["why"]
    refused, _not_checked, warnings = _gpu_operator.decide(
        "container_runtime", "the runtime", ["a drop-in"], {"gpu_operator": {"toolkit": CLAIM, "takeover": ["container_runtime"]}})
    assert refused == [] and len(warnings) == 1 and "taken over" in warnings[0] and "disable the container toolkit" in warnings[0]
    # another stage's takeover is not this one's
    refused, _not_checked, _warnings = _gpu_operator.decide("container_runtime", "x", ["a drop-in"], {"gpu_operator": {"takeover": ["mig"]}})
    assert len(refused) == 1


def test_decide_a_clusterpolicy_not_read_is_not_checked_unless_the_node_shows_the_layout():
    params = {"gpu_operator": {"error": "403 forbidden: list clusterpolicies"}}
    refused, not_checked, _warnings = _gpu_operator.decide("device_permissions", "the nodes", [], params)
    assert refused == [] and [entry["cause"] for entry in not_checked] == ["403 forbidden: list clusterpolicies"]
    assert "driver container" in not_checked[0]["what"] and "clusterpolicies.nvidia.com" in not_checked[0]["fix"]
    refused, not_checked, _warnings = _gpu_operator.decide("device_permissions", "the nodes", ["a driver root"], params)
    assert len(refused) == 1 and not_checked == []


# ---------------------------------------------------------------------------------------------
# containerd_nvidia_runtime on the operator's toolkit layout


def test_module_leaves_the_operators_drop_in_byte_identical_and_says_why(world_tmp):
    root = _operator_node(world_tmp)
    before = tree_snapshot(root)
    for check in (True, False):
        result = _containerd(root, check=check)
        assert result["changed"] is False and result["restart_required"] is False and result["actions"] == [], result
        assert tree_snapshot(root) == before
    assert result["runtime_binary"] == TOOLKIT + "/nvidia-container-runtime" and result["runtime_file"] == "/etc/containerd/conf.d/99-nvidia.toml"
    [entry] = result["refused"]
    assert entry["what"] == "containerd's nvidia runtime (/etc/containerd/conf.d/99-nvidia.toml)"
    assert "container toolkit owns it" in entry["why"] and "BinaryName %s/nvidia-container-runtime.cdi" % TOOLKIT in entry["why"]
    assert "not changed (refused)" in str(result["warnings"])


def test_module_without_the_toolkit_layout_still_writes_its_runtime(world_tmp):
    # a plain node (the package's toolkit under /usr/bin): the refusal needs the operator
    root = _containerd_node(world_tmp, "v3-confd")
    result = _containerd(root)
    assert result["changed"] is True and result["refused"] == [], result


def test_module_defers_to_the_clusterpolicy_before_the_toolkit_has_written_anything(world_tmp):
    # the operator's toolkit pod has not run on the node yet: the controller's reading alone defers the stage
    root = _containerd_node(world_tmp, "v3-confd")
    before = tree_snapshot(root)
    result = _containerd(root, toolkit=CLAIM)
    assert result["changed"] is False and CLAIM in result["refused"][0]["why"], result
    assert tree_snapshot(root) == before


def test_module_takes_the_stage_over_when_told_and_warns(world_tmp):
    root = _operator_node(world_tmp)
    result = _containerd(root, takeover=["container_runtime"])
    assert result["changed"] is True and result["refused"] == [], result
    assert result["desired"]["runtime"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert "taken over from the GPU Operator's container toolkit" in str(result["warnings"])


def test_module_refuses_a_misspelt_stage_in_takeover(world_tmp):
    root = _operator_node(world_tmp)
    result = run_module("containerd_nvidia_runtime", {"root": str(root), "gpu_operator": {"takeover": ["containerd"]}}, {})
    assert result.get("failed") is True and "container_runtime, device_permissions, mig" in result["msg"], result


def test_module_honours_the_clusterpolicys_install_dir(world_tmp):
    root = _operator_node(world_tmp)
    result = _containerd(root, toolkit_dir="/opt/nvidia/toolkit")  # the toolkit is elsewhere: these runtimes are not its
    assert result["refused"] == [] and result["changed"] is True, result


# ---------------------------------------------------------------------------------------------
# nvidia_device_nodes with the operator's driver container


def _device_node(world_tmp):
    node = build_node_root(world_tmp / "node", "l4", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    root = node.root
    (root / "dev/char").mkdir(exist_ok=True)
    for name, text in (("passwd", "root:x:0:0::/root:/bin/sh\n"), ("group", "root:x:0:\n")):
        (root / "etc" / name).write_text(text)
    return root


def test_device_nodes_left_to_the_driver_container(world_tmp):
    root = _device_node(world_tmp)
    (root / "run/nvidia/driver/usr/bin").mkdir(parents=True)
    before = tree_snapshot(root)
    result = run_module("nvidia_device_nodes", {"root": str(root)}, {})
    assert result["changed"] is False and result["actions"] == [] and result["files"] == [], result
    assert tree_snapshot(root) == before
    assert "driver container owns it" in result["refused"][0]["why"] and "spec.driver" in result["refused"][0]["fix"]
    # the same node without the driver container's root: the stage repairs /dev/nvidia0
    shutil.rmtree(root / "run/nvidia/driver/usr")
    result = run_module("nvidia_device_nodes", {"root": str(root), "_ansible_check_mode": True}, {})
    assert result["changed"] is True and result["refused"] == [] and result["nodes"]["/dev/nvidia0"]["action"] == "fix", result


# ---------------------------------------------------------------------------------------------
# node_audit: refused, never drift


def _audit(root, **args):
    result = run_module("node_audit", dict({"root": str(root), "_ansible_check_mode": True}, **args), {})
    assert not result.get("failed"), result
    return result


def test_node_audit_reports_the_operators_runtime_as_refused_not_drift(world_tmp):
    root = _operator_node(world_tmp)
    result = _audit(root, containerd={})
    check = result["checks"]["containerd"]
    assert check["status"] == "ok" and check["would_change"] is False and result["findings"] == [], result
    assert check["refused"][0]["what"].startswith("containerd's nvidia runtime") and result["summary"]["refused"] == ["containerd"]
    assert result["summary"]["node_stages"]["container_runtime"] is False
    assert "containerd check: containerd's nvidia runtime" in str(result["warnings"])


def test_node_audit_defers_mig_from_the_clusterpolicy_alone_without_running_it(world_tmp):
    root = _operator_node(world_tmp)
    claim = "ClusterPolicy cluster-policy runs the GPU Operator's MIG manager on this node (...)"
    # an option the mig check would refuse shows it never ran
    result = _audit(root, mig={"layout": {"all": "bogus"}}, gpu_operator={"mig_manager": claim})
    assert result["checks"]["mig"]["status"] == "ok" and claim in result["checks"]["mig"]["refused"][0]["why"], result
    assert result["summary"]["node_stages"]["mig"] is False and result["gpu_operator"]["mig_manager"] == claim
    taken = _audit(root, mig={"layout": {"all": "bogus"}}, gpu_operator={"mig_manager": claim, "takeover": ["mig"]})
    assert taken["checks"]["mig"]["status"] == "not_checked" and "refused" not in taken["checks"]["mig"], taken


def test_node_audit_passes_its_reading_to_the_checks_and_names_what_it_could_not_read(world_tmp):
    root = _containerd_node(world_tmp, "v3-confd")
    result = _audit(root, containerd={}, gpu_operator={"toolkit": CLAIM})
    assert CLAIM in result["checks"]["containerd"]["refused"][0]["why"], result
    blind = _audit(root, containerd={}, gpu_operator={"error": "the API answered 403"})
    check = blind["checks"]["containerd"]
    assert check["status"] == "drift" and check["not_checked"][0]["cause"] == "the API answered 403", blind
    assert blind["summary"]["not_checked"] == ["containerd"]


# ---------------------------------------------------------------------------------------------
# the controller's reading of the ClusterPolicy


def _node(name, **labels):
    return {"metadata": {"name": name, "labels": labels}}


def _policy(name="cluster-policy", **spec):
    return {"metadata": {"name": name}, "spec": spec}


def test_views_follow_the_specs_default_and_the_deploy_labels():
    nodes = [_node("gpu-a", **{"nvidia.com/gpu.deploy.container-toolkit": "true", "nvidia.com/gpu.deploy.driver": "true",
                               "nvidia.com/gpu.deploy.mig-manager": "true"}),
             _node("gpu-b", **{"nvidia.com/gpu.deploy.container-toolkit": "paused-for-driver-upgrade",
                               "nvidia.com/gpu.deploy.driver": "false"}),
             _node("cpu-c")]
    views = _gpu_operator_policy.node_views([_policy(migManager={"enabled": False}, toolkit={"installDir": "/opt/nvidia"})], nodes)
    assert sorted(views) == ["gpu-a", "gpu-b"]
    assert sorted(views["gpu-a"]) == ["driver", "toolkit", "toolkit_dir"] and views["gpu-a"]["toolkit_dir"] == "/opt/nvidia/toolkit"
    assert views["gpu-a"]["driver"] == ("ClusterPolicy cluster-policy runs the GPU Operator's driver container on this node "
                                        "(spec.driver.enabled is unset (the operator's default: enabled); node label "
                                        "nvidia.com/gpu.deploy.driver=true)")
    # a paused operand comes back (k8s-driver-manager); a label "false" is no deployment
    assert "paused-for-driver-upgrade" in views["gpu-b"]["toolkit"] and "driver" not in views["gpu-b"]
    only_mig = _gpu_operator_policy.node_views([_policy(toolkit={"enabled": False}, driver={"enabled": False})], nodes[:1])
    assert list(only_mig["gpu-a"]) == ["mig_manager"] and "spec.migManager.enabled is unset" in only_mig["gpu-a"]["mig_manager"]


class _Client:
    """Client's list over canned answers (the ClusterPolicies, then Nodes by label); records each request."""

    def __init__(self, policies=None, nodes=(), error=None):
        self.api, self.policies, self.nodes, self.error, self.requests = object(), policies, list(nodes), error, []

    def list(self, kind, _page_limit, label_selector=None):
        if kind == "ClusterPolicy":
            self.requests.append(("list", "clusterpolicies"))
            if self.error is not None:
                raise self.error
            return self.policies
        self.requests.append((kind, label_selector))
        return [node for node in self.nodes if label_selector in node["metadata"]["labels"]]


def test_read_no_crd_is_no_operator_and_lists_no_node():
    client = _Client(error=GpuhardenError("404", status=404))
    assert _gpu_operator_policy.read(client, ["gpu-a"], 500) == {"nodes": {}, "policies": [], "error": None}
    assert client.requests == [("list", "clusterpolicies")]


def test_read_a_forbidden_list_is_the_readings_error():
    client = _Client(error=GpuhardenError("forbidden: the identity in use may not list clusterpolicies", status=403))
    result = _gpu_operator_policy.read(client, ["gpu-a"], 500)
    assert result["nodes"] == {} and "may not list clusterpolicies" in result["error"]


def test_read_lists_the_nodes_by_each_enabled_components_label_and_keeps_the_plays():
    labels = {"nvidia.com/gpu.deploy.container-toolkit": "true", "nvidia.com/gpu.deploy.driver": "true"}
    client = _Client([_policy(driver={"enabled": False})], [_node("gpu-a", **labels), _node("gpu-z", **labels)])
    result = _gpu_operator_policy.read(client, ["gpu-a"], 500)
    assert sorted(result["nodes"]) == ["gpu-a"] and sorted(result["nodes"]["gpu-a"]) == ["toolkit"] and result["policies"] == ["cluster-policy"]
    # the driver's label is not listed: no ClusterPolicy enables the driver
    assert client.requests == [("list", "clusterpolicies"), ("Node", "nvidia.com/gpu.deploy.container-toolkit"),
                                ("Node", "nvidia.com/gpu.deploy.mig-manager")]


@pytest.mark.parametrize("stage", sorted(_gpu_operator.STAGES))
def test_every_stage_names_its_component_and_its_fix(stage):
    refused, _not_checked, _warnings = _gpu_operator.decide(stage, "x", ["evidence"], {})
    key, component, consequence, _through = _gpu_operator.STAGES[stage]
    assert component in refused[0]["why"] and consequence[1:] in refused[0]["why"] and "[%s]" % stage in refused[0]["fix"]
    assert key in {component_key for component_key, *_rest in _gpu_operator_policy.COMPONENTS}
