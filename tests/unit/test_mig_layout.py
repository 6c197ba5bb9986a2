# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden.k8s.mig_layout against the NVML double: real pynvml, the double's MIG model and state file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
from gpuharden_lab import NVML_FIXTURES, REPO_ROOT
from gpuharden_lab.noderoot import build_node_root

from tests.unit.conftest import run_module

MIG_FIXTURES = Path(__file__).parent / "fixtures" / "mig"
CTL = REPO_ROOT / "tests/fakes/nvml/nvml_double_ctl.py"
EXAMPLES = ["all-disabled", "all-enabled", "all-1g.10gb", "all-2g.20gb", "all-3g.40gb", "all-balanced",
            "mixed-per-index"]
MIG_NODES = ["dgx-a100-80gb", "h100-sxm5-80gb", "h100-mig-enabled"]


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Node:
    def __init__(self, root, fixture):
        self.fixture = fixture
        self.data = json.loads((NVML_FIXTURES / (fixture + ".json")).read_text())
        self.root = build_node_root(root, fixture)

    @property
    def state(self):
        return self.root.state_file

    def env(self):
        return self.root.env()

    def run(self, args, check=False, diff=True):
        return run_module("mig_layout", dict(args, _ansible_check_mode=check, _ansible_diff=diff), self.env())

    def ctl(self, *args):
        return subprocess.run([sys.executable, str(CTL), *args, "--state", str(self.state),
                               "--fixture", str(self.root.fixture)], capture_output=True, text=True, check=False)

    def clear_processes(self):
        for index, gpu in enumerate(self.data["gpus"]):
            if gpu.get("processes"):
                assert self.ctl("set-processes", "--gpu", str(index), "--clear").returncode == 0

    def materialize(self):
        """Let the double write its state file (the first nvmlInit does): later reads must not change it."""
        self.run({"layout": {"all": "disabled"}}, check=True)
        assert self.state.exists()

    def show(self):
        return json.loads(self.ctl("show").stdout)


@pytest.fixture
def node(world_tmp, nvml_library):
    made = []

    def factory(fixture):
        made.append(Node(world_tmp / ("node%d" % len(made)), fixture))
        return made[-1]

    return factory


def example_args(name):
    return {"config": yaml.safe_load((MIG_FIXTURES / (name + ".yaml")).read_text()), "selected": name}


def expected_layouts(name, gpus):
    entries = _mig.parse_mig_parted(example_args(name)["config"], name)
    desired = _mig.resolve(entries, [{"index": i, "pci_device_id": g["pci_device_id"]} for i, g in enumerate(gpus)])
    return {str(i): {"mig_enabled": d["mig_enabled"], "mig_devices": d["mig_devices"] if d["mig_enabled"] else {}}
            for i, d in desired.items()}


@pytest.mark.parametrize("fixture", MIG_NODES)
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_layout_applies_and_reapplies_unchanged(node, fixture, name):
    target = node(fixture)
    target.clear_processes()
    args = example_args(name)
    checked = target.run(args, check=True)
    assert not checked.get("failed"), checked.get("msg")
    before = _sha(target.state)
    applied = target.run(args)
    assert not applied.get("failed"), applied.get("msg")
    assert applied["changed"] is checked["changed"] is bool(checked["plan"])
    assert applied["reset_required"] is False
    expected = expected_layouts(name, target.data["gpus"])
    for index, layout in expected.items():
        assert applied["after"][index] == layout, (index, applied["after"][index])
    assert checked["after"] == applied["after"]  # check mode predicted what apply did
    if not applied["changed"]:
        assert _sha(target.state) == before
    again = target.run(args)
    assert again["changed"] is False and again["plan"] == [], again["plan"]
    assert again["after"] == applied["after"]
    assert not [f for f in again["findings"] if f["id"] == "mig_layout_drift"]
    # every GPU instance has its default compute instance, at an explicit (valid) placement
    for gpu in again["gpus"]:
        assert all(gi["compute_instances"] >= 1 for gi in gpu["gpu_instances"])


def test_walk_through_every_layout_on_one_node(node):
    """One node taken from each example to the next: exercises the destroy path and minimal steps."""
    target = node("h100-mig-enabled")
    target.clear_processes()
    for name in EXAMPLES + ["all-1g.10gb", "all-disabled"]:
        result = target.run(example_args(name))
        assert not result.get("failed"), (name, result.get("msg"))
        assert target.run(example_args(name))["changed"] is False, name


def test_check_mode_plans_without_touching_nvml(node):
    target = node("dgx-a100-80gb")
    target.clear_processes()
    target.materialize()
    before = _sha(target.state)
    result = target.run({"layout": {"all": {"1g.10gb": 7}}}, check=True)
    assert result["changed"] is True and len(result["plan"]) == 8 * 15
    assert _sha(target.state) == before
    assert result["diff"]["before"].startswith("GPU 0 (00000000:07:00.0): MIG disabled\n")
    assert "GPU 7 (00000000:BD:00.0): 7x 1g.10gb\n" in result["diff"]["after"]
    drift = [f for f in result["findings"] if f["id"] == "mig_layout_drift"]
    assert drift[3] == {"id": "mig_layout_drift", "check": "mig", "stage": "mig", "severity": "warning", "gpu": 3,
                        "expected": "7x 1g.10gb", "found": "MIG disabled",
                        "hint": "the mig stage drains the node and applies the layout", "remediable": True}
    assert result["advertised_resources"]["mixed"] == {"nvidia.com/mig-1g.10gb": 56}
    assert result["advertised_resources"]["single"] == {"nvidia.com/gpu": 56}


def test_a_disabled_gpu_takes_its_table_from_nvml(make_node, monkeypatch):
    """A real H200 (driver 580.159.04) answered its profile table with MIG disabled: read it; the built-in table
    stands in only when NVML answers none."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml

    make_node("h200-vm")
    with _mig_nvml.Session():
        gpu = _mig_nvml.read_gpu(0)
    assert (gpu["mode_current"], gpu["profile_table_source"]) == (0, "nvml")
    assert sorted(gpu["profile_table"]) == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                                            "7g.141gb"]
    monkeypatch.setattr(_mig_nvml, "profile_table", lambda handle, profiles=None: {})
    with _mig_nvml.Session():
        fallback = _mig_nvml.read_gpu(0)
    assert fallback["profile_table_source"] == "builtin"
    assert fallback["profile_table"] == gpu["profile_table"]


@pytest.mark.parametrize("fixture", ["h100-mig-enabled", "dgx-a100-80gb", "h200-vm"])
def test_nvml_table_matches_the_builtin_one(make_node, fixture):
    """The table read from NVML (enum -> id, placements, limits) is the one the packing test proves."""
    import pynvml
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml

    make_node(fixture)
    with _mig_nvml.Session():
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        if pynvml.nvmlDeviceGetMigMode(handle)[0] != 1:
            pynvml.nvmlDeviceSetMigMode(handle, 1)
        table = _mig_nvml.profile_table(handle)
        gpu = _mig_nvml.read_gpu(0)
    builtin = _mig.builtin_table(gpu["pci_device_id"])
    assert gpu["profile_table_source"] == "nvml"
    assert table == builtin


def test_busy_gpu_is_refused_without_force(node):
    target = node("dgx-a100-80gb")
    target.materialize()
    before = _sha(target.state)
    result = target.run({"layout": {"all": {"3g.40gb": 2}}})
    assert result["failed"] is True
    assert "GPU 1 (00000000:0F:00.0) pids 4242" in result["msg"]
    assert "GPU 5 (00000000:90:00.0) pids 5151, 5152" in result["msg"]
    assert "force=true" in result["msg"]
    assert _sha(target.state) == before
    # GPUs the plan does not touch may be busy
    fine = target.run({"layout": {"0": {"3g.40gb": 2}}})
    assert fine["changed"] is True and not fine.get("failed")


def test_pending_mode_reports_reset_and_converges_after_reset(node):
    target = node("dgx-a100-80gb")
    args = {"layout": {"all": {"2g.20gb": 3}}, "force": True}
    checked = target.run(args, check=True)
    assert checked["reset_required"] is True
    assert checked["gpus_to_reset"] == ["00000000:0F:00.0", "00000000:90:00.0"]
    first = target.run(args)
    assert first["changed"] is True and first["reset_required"] is True
    assert first["gpus_to_reset"] == ["00000000:0F:00.0", "00000000:90:00.0"]
    state = target.show()
    assert [(g["mig_current"], g["mig_pending"]) for g in state["gpus"]][:2] == [(1, 1), (0, 1)]
    assert first["after"]["1"] == {"mig_enabled": False, "mig_devices": {}}
    assert first["after"]["0"] == {"mig_enabled": True, "mig_devices": {"2g.20gb": 3}}
    gpu1 = first["gpus"][1]
    assert (gpu1["mode_current"], gpu1["mode_pending"]) == ("disabled", "enabled")
    # nothing more happens until the reset; the answer stays the same
    waiting = target.run(args)
    assert waiting["changed"] is False and waiting["reset_required"] is True
    # the simulated reset refuses while processes run, as nvidia-smi -r does
    assert target.ctl("reset", "--gpu", "1", "--gpu", "5").returncode == 3
    target.clear_processes()
    assert target.ctl("reset", "--gpu", "1", "--gpu", "5").returncode == 0
    after = target.run(args)
    assert after["changed"] is True and after["reset_required"] is False
    assert all(layout == {"mig_enabled": True, "mig_devices": {"2g.20gb": 3}} for layout in after["after"].values())
    assert target.run(args)["changed"] is False


def test_minor_numbers_are_read_back(node):
    target = node("h100-sxm5-80gb")
    result = target.run({"layout": {"all": {"7g.80gb": 1}}})
    assert [g["minor"] for g in result["gpus"]] == [g.get("minor", i) for i, g in enumerate(target.data["gpus"])]


def test_partial_failure_stops_reports_and_rerun_converges(node, world_tmp):
    target = node("h100-sxm5-80gb")
    data = json.loads(json.dumps(target.data))
    data["faults"] = [{"symbol": "nvmlDeviceCreateGpuInstanceWithPlacement", "error": 7, "gpu": 2}]
    faulty = world_tmp / "faulty.json"
    faulty.write_text(json.dumps(data))
    env = dict(target.env(), NVML_DOUBLE_FIXTURE=str(faulty))
    args = {"layout": {"all": {"3g.40gb": 2}}}
    result = run_module("mig_layout", args, env)
    assert result["failed"] is True
    assert "create_gi(3g.40gb @0) on GPU 2 failed" in result["msg"]
    assert result["failed_step"]["action"] == "create_gi" and result["failed_step"]["gpu"] == 2
    assert result["failed_step"]["error"]["nvml_return"] == 7
    states = {g["index"]: g for g in result["gpus"]}
    assert states[0]["layout"] == states[1]["layout"] == {"mig_enabled": True, "mig_devices": {"3g.40gb": 2}}
    assert states[2]["layout"] == {"mig_enabled": True, "mig_devices": {}}  # mode changed, no instance yet
    assert states[3]["layout"] == {"mig_enabled": False, "mig_devices": {}}  # never reached
    assert [s["gpu"] for s in result["steps_done"]].count(2) == 1  # set_mode only
    # the fault is gone: a re-run does only what is left
    rerun = target.run(args)
    assert rerun["changed"] is True
    assert {s["gpu"] for s in rerun["plan"]} == {2, 3}
    assert all(layout["mig_devices"] == {"3g.40gb": 2} for layout in rerun["after"].values())
    assert target.run(args)["changed"] is False


def test_non_mig_gpu_asked_for_mig_fails_naming_gpu_and_profile(node):
    target = node("l4")
    target.materialize()
    before = _sha(target.state)
    result = target.run(example_args("all-1g.10gb"))
    assert result["failed"] is True
    assert "GPU 0 (00000000:" in result["msg"] and "NVIDIA L4" in result["msg"]
    assert "does not support MIG" in result["msg"] and "1g.10gb" in result["msg"]
    assert _sha(target.state) == before
    # all-disabled holds on a GPU without MIG
    assert target.run(example_args("all-disabled"))["changed"] is False
    assert target.run({"layout": {"all": "disabled"}, "strategy": "none"})["findings"] == []


INVALID = [
    ({"layout": {"all": {"1g.5gb": 7}}}, "GPU 0 (00000000:07:00.0, NVIDIA A100-SXM4-80GB) has no MIG profile 1g.5gb"),
    ({"layout": {"all": {"1g.10gb": 8}}}, "profile 1g.10gb allows at most 7 instance(s), the layout asks for 8"),
    ({"layout": {"3": {"3g.40gb": 2, "1g.10gb": 1}}}, "GPU 3 (00000000:4E:00.0, NVIDIA A100-SXM4-80GB): layout"),
    ({"layout": {"all": {"4g.40gb": 1, "2g.20gb": 2}}}, "needs 8 compute slices, the GPU has 7"),
    ({"layout": {"0": {"2g.20gb": 2, "3g.40gb@0": 1}}}, "does not fit"),
    ({"layout": {"0": {"3g.40gb@2": 1}}}, "profile 3g.40gb cannot start at 2"),
    ({"layout": {"all": "half"}}, "layout.all must be a mapping of MIG profile to count or 'disabled', got 'half'"),
    ({"layout": {"gpu0": {"1g.10gb": 1}}}, "key 'gpu0' is neither 'all' nor a GPU index"),
    ({"layout": {"all": {"1g.10gb": "7"}}}, "count of 1g.10gb must be a non-negative integer, got '7'"),
    ({"layout": {"all": {"7g": 1}}}, "'7g' is not a MIG profile name"),
    ({"config": {"version": "v2", "mig-configs": {}}, "selected": "x"}, "config: version must be v1, got 'v2'"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True}]}},
      "selected": "b"}, "selected config 'b' is not in mig-configs (have: a)"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "gpus": 1}]}},
      "selected": "a"}, "config: mig-configs.a.0: unknown field(s) gpus"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": [0], "mig-enabled": "true"}]}},
      "selected": "a"}, "mig-enabled is required and must be true or false, got 'true'"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False,
                                                          "mig-devices": {"1g.10gb": 7}}]}}, "selected": "a"},
     "mig-devices must be empty when mig-enabled is false"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True,
                                                          "mig-devices": ["1g.10gb"]}]}}, "selected": "a"},
     "mig-configs.a.0.mig-devices must be a mapping of MIG profile to count"),
    ({"layout": {"all": {"1g.10gb": 1}}, "strategy": "both"}, "value of strategy must be one of: none, single, mixed"),
    ({"config": {"version": "v1"}}, "missing parameter(s) required by 'config': selected"),
]


@pytest.mark.parametrize(("args", "message"), INVALID)
def test_invalid_layouts_fail_clearly_with_no_nvml_mutation(node, args, message):
    target = node("dgx-a100-80gb")
    target.clear_processes()
    target.materialize()
    before = _sha(target.state)
    result = target.run(dict(args, force=True))
    assert result["failed"] is True, result
    assert message in result["msg"]
    assert _sha(target.state) == before


@pytest.mark.parametrize(("text", "message"), [
    ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true\n", "line 3, column 1: expected ',' or '}'"),
    ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: maybe\n",
     "mig-configs.a.0: mig-enabled is required and must be true or false, got 'maybe'"),
    (b"\xff\xfe", "not UTF-8 text (byte 0xff at offset 0)"),
    # a repeated config name: mig-parted v0.15.0 keeps the last one silently (sigs.k8s.io/yaml Unmarshal, not strict)
    ("version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: false}\n  a:\n    - {devices: all, mig-enabled: true, "
     "mig-devices: {}}\n", "line 5, column 3: key 'a' appears twice in one mapping (first at line 3)"),
])
def test_malformed_config_file_names_the_file(node, world_tmp, text, message):
    target = node("dgx-a100-80gb")
    target.materialize()
    before = _sha(target.state)
    path = world_tmp / "mig.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    content = path.read_bytes()
    result = target.run({"config_file": str(path), "selected": "a"})
    assert result["failed"] is True and message in result["msg"]
    assert str(path) in result["msg"] and "\n" not in result["msg"]
    assert path.read_bytes() == content and _sha(target.state) == before


def test_config_file_on_the_node_below_root(node):
    target = node("h100-sxm5-80gb")
    etc = Path(target.root.root) / "etc" / "nvidia-mig-manager"
    etc.mkdir(parents=True)
    (etc / "config.yaml").write_text((MIG_FIXTURES / "all-balanced.yaml").read_text())
    args = {"config_file": "/etc/nvidia-mig-manager/config.yaml", "selected": "all-balanced",
            "root": str(target.root.root), "strategy": "single"}
    result = target.run(args)
    assert result["changed"] is True, result.get("msg")
    assert result["advertised_resources"]["mixed"] == {
        "nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-2g.20gb": 4, "nvidia.com/mig-3g.40gb": 4}
    ids = [f["id"] for f in result["findings"]]
    assert ids == ["mig_layout_drift"] * 4 + ["mig_strategy_single_mismatch"]  # drift as found before the run


def test_check_mode_predicts_the_pending_gpus(node):
    target = node("dgx-a100-80gb")
    checked = target.run({"layout": {"all": {"7g.80gb": 1}}, "force": True}, check=True)
    applied = target.run({"layout": {"all": {"7g.80gb": 1}}, "force": True})
    assert checked["after"] == applied["after"]
    assert checked["after"]["1"] == {"mig_enabled": False, "mig_devices": {}}
    assert checked["gpus_to_reset"] == applied["gpus_to_reset"] == ["00000000:0F:00.0", "00000000:90:00.0"]


def test_item06_kept_instance_with_small_compute_instances_is_flagged_with_the_plugins_names(node):
    """The real v0.18.2 plugin advertised this fixture's split 3g.40gb as nvidia.com/mig-3g.40gb x3 (real-components.md)."""
    target = node("h100-mig-enabled")
    result = target.run({"layout": {"1": {"3g.40gb": 1, "2g.20gb": 2}}}, check=True)
    assert result["changed"] is False
    assert [f for f in result["findings"] if f["id"] == "mig_custom_compute_instances"] == [{
        "id": "mig_custom_compute_instances", "check": "mig", "stage": "mig", "severity": "warning", "gpu": 1,
        "expected": "one default compute instance in GPU instance 1 (3g.40gb)", "remediable": False,
        "hint": "use default compute instances (one per GPU instance)",
        "found": "3 compute instance(s) of 1 slice(s) (MIG devices 1c.3g.40gb): the device plugin v0.19.x and older "
                  "advertises each as one nvidia.com/mig-3g.40gb; v0.20.0 and newer match no resource pattern and do not "
                  "start (internal/rm/device_map.go)"}]


def test_item06_attribute_profile_advertised_names(node):
    target = node("h100-sxm5-80gb")
    target.clear_processes()
    result = target.run({"layout": {"all": {"1g.10gb+me": 1, "1g.10gb": 6}}}, check=True)
    assert not result.get("failed"), result.get("msg")
    assert result["advertised_resources"]["mixed"] == {"nvidia.com/mig-1g.10gb": 24, "nvidia.com/mig-1g.10gb.me": 4}
    assert result["advertised_resources"]["mixed_legacy"] == {"nvidia.com/mig-1g.10gb": 28}
    created = [(s["profile"], s["profile_id"]) for s in result["plan"] if s["action"] == "create_gi"]
    assert created.count(("1g.10gb+me", 20)) == 4


def test_item19_indices_the_node_does_not_have_are_skipped(node):
    target = node("h100-mig-enabled")
    target.clear_processes()
    config = {"version": "v1", "mig-configs": {"eight": [
        {"devices": [0, 1, 2, 3, 4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"device-filter": ["0x20B210DE"], "devices": "all", "mig-enabled": False},
    ]}}
    result = target.run({"config": config, "selected": "eight", "force": True})
    assert not result.get("failed"), result.get("msg")
    assert result["unmatched_entries"] == [
        {"entry": 0, "devices": [4, 5, 6, 7], "reason": "no GPU with index 4, 5, 6, 7 on the node (GPUs [0, 1, 2, 3])"},
        {"entry": 1, "device_filter": ["0x20B210DE"],
         "reason": "no GPU on the node matches device-filter 0x20B210DE (their PCI ids: 0x233010DE)"}]
    assert result["reset_required"] is False
    assert all(result["after"][str(i)] == {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}} for i in range(4))
    assert target.run({"layout": {"9": "disabled"}}, check=True)["unmatched_entries"][0]["devices"] == [9]


@pytest.mark.parametrize(("mig_devices", "message"), [
    ({"1g.10gb": 0, "2g.20gb": 0}, "config: mig-configs.x.0.mig-devices: every count is 0 (1g.10gb: 0, 2g.20gb: 0)"),
    (None, "config: mig-configs.x.0: mig-devices is required when mig-enabled is true"),
])
def test_item20_rejected_like_mig_parted_and_nothing_changes(node, mig_devices, message):
    target = node("h100-mig-enabled")
    target.clear_processes()
    target.materialize()
    before = _sha(target.state)
    entry = {"devices": "all", "mig-enabled": True}
    if mig_devices is not None:
        entry["mig-devices"] = mig_devices
    result = target.run({"config": {"version": "v1", "mig-configs": {"x": [entry]}}, "selected": "x", "force": True})
    assert result["failed"] is True and message in result["msg"], result.get("msg")
    assert _sha(target.state) == before
