# SPDX-License-Identifier: GPL-3.0-or-later
"""The real NVIDIA k8s-device-plugin on the NVML double: what it advertises, refuses and reports per fixture.

Needs root and the binaries of `make real-device-plugin` (skips without them).  Each case starts the plugin
without kubelet registration and reads its resources through dp-listwatch (ListAndWatch on its sockets).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml._nvml_node import driver_mig_devices
from gpuharden_lab.noderoot import build_node_root, mig_gi_minor, mig_minors_text

from tests.real.device_plugin import REFUSED_CONFIGS, PluginRunner, counts, plugin_dir, versions

pytestmark = pytest.mark.real

FIXTURES = Path(__file__).resolve().parents[1] / "fakes" / "nvml" / "fixtures"


def config(**flags) -> dict:
    plugin = flags.pop("plugin", None)
    cfg = {"version": "v1", "flags": {"migStrategy": "none", **flags}}
    if plugin:
        cfg["flags"]["plugin"] = plugin
    return cfg


def uuids(fixture: str) -> list[str]:
    return [g["uuid"] for g in json.loads((FIXTURES / fixture).read_text())["gpus"]]


@pytest.fixture
def run_plugin():
    runner = PluginRunner()
    yield runner.start
    runner.close()


@pytest.mark.parametrize(
    ("version_key", "kubelet"),
    [("NVIDIA_DEVICE_PLUGIN_VERSION", False), ("NVIDIA_DEVICE_PLUGIN_VERSION", True),
     ("NVIDIA_DEVICE_PLUGIN_OLD_VERSION", True)],  # v0.15.x has no --kubelet-socket: it must register
    ids=["current", "current-registered", "old-registered"],
)
def test_l4_whole_gpus(run_plugin, version_key, kubelet):
    run = run_plugin("l4", config(), version=versions()[version_key], kubelet=kubelet)
    assert run.returncode is None, run.log()
    res = run.resources()
    assert counts(res) == {"nvidia.com/gpu": 2}
    devices = res["nvidia.com/gpu"]
    assert sorted(d["id"] for d in devices) == sorted(uuids("l4.json"))
    assert {d["health"] for d in devices} == {"Healthy"}
    # NUMA from the node's sysfs: GPU0 (00000000:01:00.0) on node 0, GPU1 on node 1.
    assert sorted(tuple(d.get("numa", [])) for d in devices) == [(0,), (1,)]


def test_allocate_answers_the_uuid(run_plugin):
    run = run_plugin("l4", config())
    allocs = [x for x in run.listwatch("-allocate") if x["event"] == "allocate"]
    assert len(allocs) == 1 and "error" not in allocs[0], allocs
    assert allocs[0]["envs"]["NVIDIA_VISIBLE_DEVICES"] in uuids("l4.json")


def test_mig_allocate_passes_the_capability_device_nodes(run_plugin):
    """passDeviceSpecs on MIG: the parent GPU plus the GI and CI access capabilities numbered as in mig-minors."""
    run = run_plugin("h100-mig-enabled", config(migStrategy="mixed", plugin={"passDeviceSpecs": True}))
    allocs = {x["socket"]: x for x in run.listwatch("-allocate") if x["event"] == "allocate"}
    specs = sorted(allocs["nvidia-mig-2g.20gb.sock"]["device_specs"])
    # Either 2g.20gb instance of GPU1 (GI 3 or 4, CI 0): minors 3 + 135*1 + 9*gi and that + 1.
    gi = {165: 3, 174: 4}[int(specs[0].split(":")[0].removeprefix("/dev/nvidia-caps/nvidia-cap"))]
    base = mig_gi_minor(1, gi)
    assert specs == ["/dev/nvidia-caps/nvidia-cap%d:/dev/nvidia-caps/nvidia-cap%d:rw" % (m, m) for m in (base, base + 1)] + \
        ["/dev/nvidia1:/dev/nvidia1:rw"]


def test_preferred_allocation_on_an_nvlink_node(run_plugin):
    """GetPreferredAllocation walks NVLink remote PCI info and the PCIe topology (go-gpuallocator)."""
    run = run_plugin("dgx-a100-80gb", config())
    pref = [x for x in run.listwatch("-preferred", "2") if x["event"] == "preferred"]
    assert len(pref) == 1 and "error" not in pref[0], pref
    ids = uuids("dgx-a100-80gb.json")
    # PCIe switches pair the GPUs (0,1) ... (6,7): the pair shares a switch.
    assert sorted(ids.index(i) // 2 for i in pref[0]["ids"]) in ([0, 0], [1, 1], [2, 2], [3, 3]), pref
    assert "symbol lookup error" not in run.log()


def test_device_list_strategy_none_refuses_to_start(run_plugin):
    run = run_plugin("l4", config(plugin={"deviceListStrategy": "none"}))
    assert run.returncode not in (None, 0), run.log()
    assert "invalid --device-list-strategy option" in run.log()


def test_mig_enabled_node_with_strategy_none_advertises_whole_gpus(run_plugin):
    run = run_plugin("h100-mig-enabled", config())
    res = run.resources()
    assert counts(res) == {"nvidia.com/gpu": 4}
    assert sorted(d["id"] for d in res["nvidia.com/gpu"]) == sorted(uuids("h100-mig-enabled.json"))


def test_mig_mixed_advertises_the_plugin_profile_names(run_plugin):
    run = run_plugin("h100-mig-enabled", config(migStrategy="mixed"))
    res = run.resources()
    # GPU0 7x 1g.10gb; GPU1 3g.40gb split into three 1c CIs (advertised as mig-3g.40gb) + 2x 2g.20gb;
    # GPU2 MIG on but empty (nothing); GPU3 MIG off (a whole GPU).
    assert counts(res) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-2g.20gb": 2,
                           "nvidia.com/mig-3g.40gb": 3}
    assert [d["id"] for d in res["nvidia.com/gpu"]] == [uuids("h100-mig-enabled.json")[3]]
    assert all(d["id"].startswith("MIG-") for d in res["nvidia.com/mig-1g.10gb"])


def test_mig_single_refuses_a_node_with_an_empty_mig_gpu(run_plugin):
    run = run_plugin("h100-mig-enabled", config(migStrategy="single"))
    assert run.returncode not in (None, 0), run.log()
    assert "invalid MIG configuration" in run.log()


def test_lost_gpu_stops_the_plugin(run_plugin):
    run = run_plugin("dgx-a100-gpu-lost", config())
    assert run.returncode not in (None, 0), run.log()
    assert "GPU is lost" in run.log()


def test_no_fixture_is_driver_not_loaded(run_plugin):
    run = run_plugin("l4", config(), env={"NVML_DOUBLE_FIXTURE": "/nonexistent/fixture.json"})
    assert run.returncode not in (None, 0), run.log()
    assert "Driver Not Loaded" in run.log()


def test_no_library_fails_discovery(run_plugin):
    run = run_plugin(None, config(), library=False)
    assert run.returncode not in (None, 0), run.log()
    assert "invalid device discovery strategy" in run.log()


def test_injected_xid_marks_the_gpu_unhealthy(run_plugin):
    run = run_plugin("l4", config())
    target = uuids("l4.json")[1]
    run.wait_for_log(r"Ignoring the following XIDs for health checks")
    time.sleep(0.5)  # the event set is created right after that line; earlier events are not delivered
    for _attempt in range(3):
        run.inject_xid(gpu=1, xid=79)
        lines = run.listwatch("-watch", "3s")
        if any(x["seq"] > 0 for x in lines) or "marked unhealthy" in run.log():
            break
    health = {d["id"]: d["health"] for x in lines if x["event"] == "list" for d in x["devices"]}
    assert "XidCriticalError: Xid=79 on Device=%s" % target in run.log(), run.log()
    assert health[target] == "Unhealthy"
    assert [h for u, h in health.items() if u != target] == ["Healthy"]


def test_ignored_xid_keeps_the_gpu_healthy(run_plugin):
    run = run_plugin("l4", config())
    run.wait_for_log(r"Ignoring the following XIDs for health checks")
    time.sleep(0.5)  # as above; on a slow machine the event set can come later still, hence the retries
    for attempt in range(3):
        run.inject_xid(gpu=0, xid=13)  # Graphics Engine Exception: on the plugin's ignore list
        try:
            run.wait_for_log(r"Skipping event", timeout=10.0)
            break
        except AssertionError:
            if attempt == 2:
                raise
    assert {d["health"] for d in run.resources()["nvidia.com/gpu"]} == {"Healthy"}


def test_versions_file_pins_both_releases():
    v = versions()
    assert v["NVIDIA_DEVICE_PLUGIN_VERSION"] == "v0.18.2"
    assert v["NVIDIA_DEVICE_PLUGIN_OLD_VERSION"] < v["NVIDIA_DEVICE_PLUGIN_VERSION"]
    assert plugin_dir("v0.18.2").name == "nvidia-device-plugin-v0.18.2"


def test_old_release_refuses_an_empty_mig_gpu_even_when_mixed(run_plugin):
    """v0.15.x checks every MIG-enabled GPU for MIG devices under mixed too (and names it 'device 0')."""
    run = run_plugin("h100-mig-enabled", config(migStrategy="mixed"), version=versions()["NVIDIA_DEVICE_PLUGIN_OLD_VERSION"],
                     kubelet=True)
    assert run.returncode not in (None, 0), run.log()
    assert "invalid MIG configuration" in run.log() and "has an invalid MIG configuration" in run.log()


def test_node_root_mig_files_match_the_driver_and_the_double(tmp_path):
    """mig-minors numbering (MIG user guide: gpu31/gi14/ci7 = 4322) and the capability tree of the fixture's instances."""
    assert mig_gi_minor(31, 14) + 1 + 7 == 4322 and mig_gi_minor(4, 7) == 606
    lines = mig_minors_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert lines[-1] == "gpu31/gi14/ci7/access 4322" and len(lines) == 2 + 32 * 15 * 9
    if os.geteuid() != 0:
        pytest.skip("build_node_root needs root (mknod)")
    plain = build_node_root(tmp_path / "plain", "h100-mig-enabled")
    assert (plain.root / "proc/driver/nvidia-caps/mig-minors").read_text() == mig_minors_text()
    assert not (plain.root / "proc/driver/nvidia/capabilities").exists()
    node = build_node_root(tmp_path / "caps", "h100-mig-enabled", mig_capabilities=True)
    caps = node.root / "proc/driver/nvidia/capabilities"
    assert (caps / "mig/config").read_text() == "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    ctl = Path(__file__).resolve().parents[1] / "fakes" / "nvml" / "nvml_double_ctl.py"
    shown = json.loads(subprocess.run([sys.executable, str(ctl), "show", "--state", str(tmp_path / "st.json"),
                                       "--fixture", str(node.fixture)], check=True, capture_output=True, text=True).stdout)
    expected = sorted((g["index"], gi["id"], ci["id"]) for g in shown["gpus"] if g["mig_current"]
                      for gi in g["gpu_instances"] for ci in gi["compute_instances"])
    found = sorted((int(p.parts[-5][3:]), int(p.parts[-3][2:]), int(p.parts[-2][2:])) for p in caps.glob("gpu*/mig/gi*/ci*/access"))
    assert found == expected  # minors equal indices in this fixture
    assert driver_mig_devices(str(node.root), [0, 1, 2, 3]) == len(expected) == 12
    access = (caps / "gpu1/mig/gi1/ci2/access").read_text()
    assert access.startswith("DeviceFileMinor: %d\n" % (mig_gi_minor(1, 1) + 3))


# The lab's kubelet stand-in predicts what the plugin advertises (gpuharden_lab.standins.kubelet); the real binary
# is the reference.  Each case: fixture and plugin config file (None: the plugin refuses to start).
STANDIN_CASES = {
    "l4-none": ("l4", config()),
    "l4-list-none": ("l4", config(plugin={"deviceListStrategy": "none"})),
    "l4-timeslicing": ("l4", dict(config(), sharing={"timeSlicing": {"resources": [{"name": "nvidia.com/gpu",
                                                                                   "replicas": 4}]}})),
    "l4-timeslicing-renamed": ("l4", dict(config(), sharing={"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}})),
    "dgx-none": ("dgx-a100-80gb", config()),
    "h100-single-mig-off": ("h100-sxm5-80gb", config(migStrategy="single")),
    "h100mig-none": ("h100-mig-enabled", config()),
    "h100mig-mixed": ("h100-mig-enabled", config(migStrategy="mixed")),
    "h100mig-single": ("h100-mig-enabled", config(migStrategy="single")),
}


def standin_prediction(fixture: str, cfg: dict, tmp_path: Path) -> dict[str, int] | None:
    """The stand-in's answer for a plugin pod using ``cfg`` on ``fixture``'s node; None when it refuses."""
    from gpuharden_lab.standins import kubelet as kl

    node = build_node_root(tmp_path / ("standin-" + fixture), fixture)
    code = "import json; from gpuharden_lab.standins import kubelet as k; print(json.dumps(k.nvml_inventory()))"
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, **node.env()}, capture_output=True, text=True,
                       timeout=60, check=True)
    inventory = json.loads(p.stdout)
    pod = {"metadata": {"name": "dp", "namespace": "kube-system", "labels": {}},
           "spec": {"nodeName": "n", "volumes": [{"name": "cfg", "configMap": {"name": "dp-config"}}],
                    "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.18.2",
                                    "args": ["--config-file=/config/config.yaml"],
                                    "volumeMounts": [{"name": "cfg", "mountPath": "/config"}]}]},
           "status": {"phase": "Running"}}
    try:
        out = kl.desired_nvidia_resources([pod], "n", {("kube-system", "dp-config"): {"config.yaml": json.dumps(cfg)}},
                                          inventory)
    except kl.PluginError:
        return None
    return out or None


@pytest.mark.parametrize("case", sorted(STANDIN_CASES))
def test_lab_kubelet_standin_agrees_with_the_real_plugin(case, run_plugin, tmp_path):
    fixture, cfg = STANDIN_CASES[case]
    run = run_plugin(fixture, cfg)
    real = None if run.returncode is not None else counts(run.resources())
    assert standin_prediction(fixture, cfg, tmp_path) == real, run.log()[-3000:]


# Every config the audit predicts a refusal for (tests/real/device_plugin.py REFUSED_CONFIGS, the table the planner's
# unit test reads too), on each release built here: the real binary refuses it at start (exit 1, the message) or, where
# the table says that release starts, it runs and advertises what the table says.
BUILT = ("NVIDIA_DEVICE_PLUGIN_VERSION", "NVIDIA_DEVICE_PLUGIN_OLD_VERSION")


@pytest.mark.parametrize("version_key", BUILT, ids=["current", "old"])
@pytest.mark.parametrize("case", sorted(REFUSED_CONFIGS))
def test_the_plugin_refuses_each_config_the_audit_predicts(run_plugin, case, version_key):
    entry = REFUSED_CONFIGS[case]
    version = versions()[version_key]
    # v0.15.x has no --kubelet-socket and must register: dp-listwatch plays the kubelet for the old release.
    run = run_plugin(entry.fixture, entry.config, version=version, env=entry.env, kubelet=version_key != BUILT[0])
    if version in entry.refused:
        assert run.returncode == 1, run.log()[-3000:]
        assert re.search(entry.refused[version], run.log()), run.log()[-3000:]
        return
    assert run.returncode is None, run.log()[-3000:]
    assert counts(run.resources()) == entry.advertised


def test_the_refusal_table_covers_each_built_release():
    built = {versions()[key] for key in BUILT}
    assert built <= set(REFUSED_CONFIGS["version-v2"].refused)
    assert all(entry.finding or not entry.refused for entry in REFUSED_CONFIGS.values())


# What gpuharden renders (the option time_slicing in either spelling and the plugin's own resource form among them):
# the real plugin starts with it and advertises what the options say.
RENDERED = {
    "defaults": ({}, {"nvidia.com/gpu": 2}),
    "time-slicing-renamed": ({"time_slicing": {"replicas": 2, "renameByDefault": True}}, {"nvidia.com/gpu.shared": 4}),
    "time-slicing-plugin-form": ({"time_slicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}],
                                                   "fail_requests_greater_than_one": True}}, {"nvidia.com/gpu": 6}),
}


@pytest.mark.parametrize("version_key", BUILT, ids=["current", "old"])
@pytest.mark.parametrize("case", sorted(RENDERED))
def test_every_config_gpuharden_renders_starts_the_real_plugin(run_plugin, case, version_key):
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin as dp
    from ansible_collections.gpuharden.k8s.plugins.modules import device_plugin as module

    overrides, advertised = RENDERED[case]
    version = versions()[version_key]
    params = {name: spec.get("default") for name, spec in module.argument_spec().items()}
    params.update(overrides, version=version)
    _objects, config = dp.desired_objects(dp.check_params(params))
    run = run_plugin("l4", config, version=version, kubelet=version_key != BUILT[0])
    assert run.returncode is None, run.log()[-3000:]
    assert counts(run.resources()) == advertised
