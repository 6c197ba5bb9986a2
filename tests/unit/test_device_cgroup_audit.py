# SPDX-License-Identifier: GPL-3.0-or-later
"""The device-cgroup audit's pure planner (synthetic programs) and the module on a v1 tree (no kernel BPF).

The kernel's own verdicts are compared in tests/integration/test_device_cgroup_audit.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit as audit_mod
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _ebpf
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _cgroup_paths
from gpuharden_lab.noderoot import build_node_root

from tests.integration import devcg_shapes as shapes
from tests.unit.conftest import run_module

UID_A = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
UID_B = "6a1b9f1c-2d4e-4f60-8a7b-9c0d1e2f3a4b"
UID_C = "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162"
CID = {name: (name * 64)[:64] for name in ("a", "b", "c", "d", "e", "f")}


def _devices(gpus=4):
    devices = [{"path": "/dev/nvidia%d" % m, "type": "c", "major": 195, "minor": m} for m in range(gpus)]
    devices += [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 510, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 510, "minor": 1},
    ]
    return devices


def _container(uid, cid, programs, name=None, v1=None, nested=(), sandbox=False):
    path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (uid.replace("-", "_"), cid)
    cgroups = [{"path": path, "programs": programs, "v1": v1, "v1_file": "/sys/fs/cgroup/devices" + path + "/devices.list"}]
    cgroups += [{"path": path + "/" + sub, "programs": progs, "v1": None} for sub, progs in nested]
    return dict(_cgroup_paths.parse_container_path(path), cgroup=path, cgroups=cgroups, name=name, sandbox=sandbox)


def _prog(rules, default_allow=False):
    return {"xlated": shapes.runc_like(rules, default_allow).bytes(), "unauditable": None}


def _gpu_prog(minors):
    return _prog([("c", 195, None, "m", True), ("c", 1, 3, "rwm", True)] + [("c", 195, m, "rw", True) for m in minors]
                 + [("c", 195, 255, "rw", True), ("c", 510, None, "rw", True)])  # fmt: skip


ALLOW_ALL = {"xlated": shapes.runc_like([], default_allow=True).bytes(), "unauditable": None}


def _by_id(result):
    found = {}
    for finding in result["findings"]:
        found.setdefault(finding["id"], []).append(finding)
    return found


# ---------------------------------------------------------------------------------------------
# Paths


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (UID_A.replace("-", "_"), CID["a"]),
         (UID_A, CID["a"], "systemd", "burstable")),
        ("/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (UID_A.replace("-", "_"), CID["a"]),
         (UID_A, CID["a"], "systemd", "guaranteed")),
        ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/crio-%s.scope" % (UID_A.replace("-", "_"), CID["b"]),
         (UID_A, CID["b"], "systemd", "besteffort")),
        ("/kubepods/besteffort/pod%s/%s" % (UID_B, CID["c"]), (UID_B, CID["c"], "cgroupfs", "besteffort")),
        ("/kubepods/pod%s/%s" % (UID_B, CID["c"]), (UID_B, CID["c"], "cgroupfs", "guaranteed")),
        ("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod%s.slice/cri-containerd-%s.scope" % (UID_A.replace("-", "_"), CID["d"]),
         (UID_A, CID["d"], "systemd", "guaranteed")),  # --cgroup-root=/kubelet (kind): prefixed slice names
        ("/kubepods/besteffort/pod%s" % UID_B, None),
        ("/system.slice/pod%s/%s" % (UID_B, CID["c"]), None),
        ("/kubepods/besteffort/pod%s/not-a-container" % UID_B, None),
        ("/kubepods/besteffort/podnot-a-uid/%s" % CID["c"], None),
    ],
)  # fmt: skip
def test_parse_container_path(path, expected):
    parsed = _cgroup_paths.parse_container_path(path)
    if expected is None:
        assert parsed is None
    else:
        assert (parsed["pod_uid"], parsed["container_id"], parsed["driver"], parsed["qos"]) == expected


def test_devices_list_parse_and_decide():
    rules = audit_mod.parse_devices_list("c 195:1 rw\nc 195:* m\nb *:* m\na 1:3 rwm\n\n", "f")
    decide = lambda *a: audit_mod.v1_decide(rules, *a).decision  # noqa: E731
    assert decide("c", 195, 1, "rw") == _ebpf.ALLOW
    assert decide("c", 195, 1, "m") == _ebpf.ALLOW
    assert decide("c", 195, 2, "r") == _ebpf.DENY
    assert decide("b", 1, 3, "rw") == _ebpf.ALLOW
    assert decide("b", 8, 0, "m") == _ebpf.ALLOW
    assert audit_mod.v1_decide(audit_mod.parse_devices_list("a *:* rwm", "f"), "c", 195, 7, "rw").decision == _ebpf.ALLOW
    assert audit_mod.v1_decide([], "c", 1, 3, "r").decision == _ebpf.DENY


@pytest.mark.parametrize("line", ["x 1:3 rwm", "c 1:3", "c 1 rwm", "c 1:3 rwx", "c a:3 r", "c 1:3 rrw", "c  1:3 r"])
def test_devices_list_malformed(line):
    with pytest.raises(GpuhardenError) as caught:
        audit_mod.parse_devices_list("c 1:3 rwm\n" + line, "/x/devices.list")
    assert "/x/devices.list line 2" in caught.value.msg and repr(line) in caught.value.msg


# ---------------------------------------------------------------------------------------------
# The planner


def _run(containers, programs, allocations=None, **kwargs):
    return audit_mod.audit("gpu-1", containers, programs, _devices(), allocations=allocations, **kwargs)


def test_breach_broken_privileged_and_clean():
    containers = [
        _container(UID_A, CID["a"], [1], name="main"),  # allocated 1, opens 1
        _container(UID_B, CID["b"], [2], name="main"),  # allocated none, opens 0-3 (NVIDIA_VISIBLE_DEVICES=all)
        _container(UID_C, CID["c"], [3], name="main"),  # allocated 2, lost access
        _container(UID_C, CID["d"], [4], name="debug"),  # privileged
    ]
    programs = {1: _gpu_prog([1]), 2: _gpu_prog([0, 1, 2, 3]), 3: _prog([("c", 195, None, "m", True)]), 4: ALLOW_ALL}
    allocations = [
        {"pod_uid": UID_A, "container": "main", "gpu_minors": [1], "pod": "ml/ok"},
        {"pod_uid": UID_C, "container": "main", "gpu_minors": [2]},
    ]
    result = _run(containers, programs, allocations)
    found = _by_id(result)
    assert set(found) == {"isolation_breach", "broken_allocation", "privileged_container"}
    assert [(f["pod"], f["gpu"], f["device"]) for f in found["isolation_breach"]] == [(UID_B, m, "/dev/nvidia%d" % m) for m in range(4)]
    assert {f["found"] for f in found["isolation_breach"]} == {"r+w allowed"}
    assert [(f["device"], f["gpu"]) for f in found["broken_allocation"]] == [
        ("/dev/nvidia-uvm", None), ("/dev/nvidiactl", None), ("/dev/nvidia2", 2)
    ]  # fmt: skip
    assert found["broken_allocation"][0]["found"] == "r+w denied by the device cgroup"
    [privileged] = found["privileged_container"]
    assert privileged["container"] == "debug" and "nvidia0, nvidia1, nvidia2, nvidia3" in privileged["found"]
    assert result["findings"][0]["severity"] == "critical"  # most severe first
    for finding in result["findings"]:
        assert set(finding) >= {"id", "severity", "node", "pod", "container", "gpu", "expected", "found", "hint"}
        assert finding["node"] == "gpu-1"
    views = {v["container_id"]: v for v in result["containers"]}
    assert views[CID["a"]]["gpus"] == [1] and views[CID["a"]]["allowed"]["/dev/nvidia1"] == ["r", "w", "m"]
    assert views[CID["a"]]["allowed"]["/dev/nvidia0"] == ["m"]
    assert views[CID["d"]]["privileged"] is True and views[CID["a"]]["privileged"] is False


def test_without_allocations_reports_access_only():
    containers = [_container(UID_A, CID["a"], [1]), _container(UID_B, CID["b"], [2])]
    result = _run(containers, {1: _gpu_prog([1, 3]), 2: _prog([("c", 1, 3, "rwm", True)])})
    [access] = result["findings"]
    assert (access["id"], access["severity"], access["found"], access["container"]) == ("gpu_access", "info", "can open nvidia1, nvidia3", CID["a"])


def test_effective_list_is_an_and_and_nested_cgroups_count():
    # Own program allows 0 and 1, an ancestor's (second in the effective list) only 1.
    container = _container(UID_A, CID["a"], [1, 2], nested=[("sub", [3, 1, 2])])
    programs = {1: _gpu_prog([0, 1]), 2: _gpu_prog([1]), 3: ALLOW_ALL}
    result = _run([container], programs, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    assert result["findings"] == []
    assert result["containers"][0]["gpus"] == [1]
    assert result["containers"][0]["nested"] == [container["cgroup"] + "/sub"]
    # A nested cgroup that escapes (its list does not include the container's program) is counted.
    container = _container(UID_A, CID["a"], [2], nested=[("escape", [5])])
    programs[5] = _gpu_prog([0, 1, 2, 3])
    result = _run([container], programs, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    assert {f["gpu"] for f in result["findings"] if f["id"] == "isolation_breach"} == {0, 2, 3}


def test_v1_layer_is_anded():
    # BPF allows everything, but devices.list only the GPU 1 (a hybrid host where both enforce).
    v1 = "c 195:1 rw\nc 195:255 rw\nc 510:* rw\nc *:* m\nb *:* m\n"
    container = _container(UID_A, CID["a"], [3], v1=v1)
    result = _run([container], {3: ALLOW_ALL}, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    assert result["findings"] == [] and result["containers"][0]["v1"] is True
    # v1 only (no BPF programs): allow-all devices.list is a privileged container.
    container = _container(UID_A, CID["a"], [], v1="a *:* rwm\n")
    result = _run([container], {}, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    assert [f["id"] for f in result["findings"]] == ["privileged_container"]


def test_unparseable_devices_list_is_unauditable():
    container = _container(UID_A, CID["a"], [], v1="c 195:1 rw\nbogus line\n")
    result = _run([container], {}, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    [finding] = result["findings"]
    assert finding["id"] == "unauditable_program" and finding["severity"] == "warning"
    assert "devices.list line 2: 'bogus line'" in finding["found"]


def test_unauditable_programs_are_reported_never_guessed():
    calls = {"xlated": _ebpf.encode([(0x85, 0, 0, 14), (0x95, 0, 0, 0)]), "unauditable": None}
    blinded = {"xlated": None, "unauditable": "the kernel will not dump the program: constant blinding"}
    torn = {"xlated": b"\x95\x00\x00", "unauditable": None}
    containers = [_container(UID_A, CID["a"], [1]), _container(UID_B, CID["b"], [2]), _container(UID_C, CID["c"], [3])]
    result = _run(containers, {1: calls, 2: blinded, 3: torn}, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    found = _by_id(result)
    assert set(found) == {"unauditable_program"}
    reasons = {f["pod"]: f["found"] for f in found["unauditable_program"]}
    assert reasons[UID_A].startswith("program 1: insn 0 calls a helper function")
    assert reasons[UID_B].startswith("program 2: the kernel will not dump")
    assert reasons[UID_C].startswith("program 3:") and "8-byte" in reasons[UID_C]
    assert result["containers"][0]["unauditable"]["/dev/nvidia1"] == ["r", "w", "m"]
    # A certain deny from another program in the list still decides.
    containers = [_container(UID_A, CID["a"], [1, 4])]
    result = _run(containers, {1: calls, 4: _prog([("c", 1, 3, "rwm", True)])}, allocations=[{"pod_uid": UID_A}])
    assert result["findings"] == []


def test_vanished_program_is_unauditable():
    result = _run([_container(UID_A, CID["a"], [9])], {}, allocations=[])
    assert "vanished" in result["findings"][0]["found"]


def test_allocation_matching():
    containers = [
        _container(UID_A, CID["a"], [1], name="main"),
        _container(UID_A, CID["b"], [2], name="sidecar"),
        _container(UID_A, CID["e"], [2], sandbox=True),
        _container(UID_B, CID["c"], [1]),  # name unknown, only container: matched by position
        _container(UID_C, CID["d"], [1]),
        _container(UID_C, CID["f"], [1]),
    ]
    programs = {1: _gpu_prog([1]), 2: _prog([("c", 1, 3, "rwm", True)])}
    allocations = [
        {"pod_uid": UID_A, "container": "main", "gpu_minors": [1]},
        {"pod_uid": UID_B, "container": "whatever", "gpu_uuids": ["GPU-one"]},
        {"pod_uid": UID_C.upper(), "container": CID["d"][:12], "gpu_minors": [1]},
        {"pod_uid": UID_C, "gpu_minors": [1]},  # two containers: ambiguous
        {"pod_uid": UID_A, "container": "sidecar", "gpu_uuids": ["GPU-nope"]},
    ]
    result = _run(containers, programs, allocations, uuid_to_minor={"GPU-one": 1})
    found = _by_id(result)
    assert set(found) == {"allocation_unmatched", "isolation_breach"}
    assert [(f["pod"], f["container"]) for f in found["isolation_breach"]] == [(UID_C, CID["f"])]
    unmatched = sorted(f["found"] for f in found["allocation_unmatched"])
    assert unmatched[0] == "no GPU with UUID GPU-nope in /proc/driver/nvidia/gpus"
    assert "has 2 containers here" in unmatched[1]
    assert found["isolation_breach"][0]["gpu_uuid"] == "GPU-one"


def test_severity_overrides_and_option_checks():
    containers = [_container(UID_A, CID["a"], [1])]
    result = _run(containers, {1: ALLOW_ALL}, allocations=[], severity_overrides={"privileged_container": "info"})
    assert [(f["id"], f["severity"]) for f in result["findings"]] == [("privileged_container", "info")]
    audit_mod.check_options(["r", "rw"], {"isolation_breach": "error"}, [{"pod_uid": UID_A, "gpu_minors": [0], "gpu_uuids": ["MIG-x"]}])


def test_allocated_gpu_missing_on_the_node():
    result = _run([_container(UID_A, CID["a"], [1])], {1: _gpu_prog([9])}, allocations=[{"pod_uid": UID_A, "gpu_minors": [9]}])
    [finding] = result["findings"]
    assert finding["id"] == "allocation_unmatched" and finding["gpu"] == 9


def test_thousand_containers_share_verdicts():
    containers = [_container(UID_A[:-4] + "%04d" % i, "%064x" % i, [i]) for i in range(1000)]
    programs = {i: _gpu_prog([i % 4]) for i in range(1000)}
    result = _run(containers, programs, allocations=[])
    assert len(result["findings"]) == 1000 and {f["id"] for f in result["findings"]} == {"isolation_breach"}
    # shared by content (1,000 program IDs, four shapes), never mixed up between shapes
    assert [view["gpus"] for view in result["containers"]] == [[i % 4] for i in range(1000)]
    assert [f["gpu"] for f in sorted(result["findings"], key=lambda f: f["container_id"])] == [i % 4 for i in range(1000)]


def test_identical_unauditable_programs_keep_their_own_ids():
    """Verdicts are shared by the programs' bytes, except unauditable ones: their reason names the program."""
    calls = {"xlated": _ebpf.encode([(0x85, 0, 0, 14), (0x95, 0, 0, 0)]), "unauditable": None}
    containers = [_container(UID_A, CID["a"], [1]), _container(UID_B, CID["b"], [2])]
    result = _run(containers, {1: calls, 2: dict(calls)}, allocations=[])
    reasons = {f["pod"]: f["found"] for f in result["findings"]}
    assert reasons[UID_A].startswith("program 1: ") and reasons[UID_B].startswith("program 2: ")


# ---------------------------------------------------------------------------------------------
# The module on a v1 tree (a node root with the DGX fixture's /dev and /proc/driver/nvidia)


def _snapshot(root):
    digest = {}
    for top, _dirs, files in os.walk(root):
        for name in files:
            path = Path(top, name)
            if path.is_file() and not path.is_symlink():
                digest[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return digest


@pytest.fixture
def v1_node(world_tmp):
    node = build_node_root(world_tmp / "node", "dgx-a100-80gb")
    devices = node.root / "sys/fs/cgroup/devices"
    devices.mkdir(parents=True)
    (devices / "devices.list").write_text("a *:* rwm\n")
    pods = {
        "ok": ("kubepods/burstable/pod%s/%s" % (UID_A, CID["a"]), "c 195:1 rw\nc 195:255 rw\nc 510:* rw\nc *:* m\nb *:* m\nc 1:3 rwm\n"),
        "sneaky": ("kubepods/besteffort/pod%s/%s" % (UID_B, CID["b"]), "c 195:* rw\nc 195:255 rw\nc 510:* rw\nc *:* m\n"),
        "lost": ("kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (UID_C.replace("-", "_"), CID["c"]), "c 1:3 rwm\n"),
    }
    for path, text in pods.values():
        (devices / path).mkdir(parents=True)
        (devices / path / "devices.list").write_text(text)
    bundles = node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CID["a"]
    bundles.mkdir(parents=True)
    (bundles / "config.json").write_text(
        '{"annotations": {"io.kubernetes.cri.container-name": "trainer", "io.kubernetes.cri.container-type": "container",'
        ' "io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "train-0"}}'
    )
    return node


def _uuid(node, minor):
    for info in (node.root / "proc/driver/nvidia/gpus").glob("*/information"):
        fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        if int(fields["Device Minor"].strip()) == minor:
            return fields["GPU UUID"].strip()
    raise AssertionError(minor)


def test_module_on_a_v1_tree(v1_node):
    before = _snapshot(v1_node.root)
    allocations = [
        {"pod_uid": UID_A, "container": "trainer", "gpu_uuids": [_uuid(v1_node, 1)]},
        {"pod_uid": UID_C, "gpu_minors": [2]},
    ]
    result = run_module("device_cgroup_audit", {"root": str(v1_node.root), "node_name": "dgx", "allocations": allocations}, {})
    assert not result.get("failed"), result
    assert result["changed"] is False and result["cgroup_layout"] == "v1"
    assert {d["path"] for d in result["devices"]} >= {"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert "/dev/nvidia-modeset" not in {d["path"] for d in result["devices"]}
    found = _by_id(result)
    assert set(found) == {"isolation_breach", "broken_allocation"}
    assert {f["gpu"] for f in found["isolation_breach"]} == set(range(8))
    assert {f["pod"] for f in found["isolation_breach"]} == {UID_B}
    assert {f["device"] for f in found["broken_allocation"]} == {"/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    ok = next(v for v in result["containers"] if v["pod_uid"] == UID_A)
    assert ok["container"] == "trainer" and ok["gpus"] == [1] and ok["v1"] and ok["programs"] == []
    assert result["summary"] == {"containers": 3, "programs": 0, "findings": {"critical": 8, "error": 3}, "max_severity": "critical"}
    assert _snapshot(v1_node.root) == before


def test_module_explicit_devices_and_accesses(v1_node):
    args = {"root": str(v1_node.root), "devices": ["/dev/nvidia1", "/dev/nvidia2"], "accesses": ["rw", "m"]}
    result = run_module("device_cgroup_audit", args, {})
    assert not result.get("failed"), result
    ok = next(v for v in result["containers"] if v["pod_uid"] == UID_A)
    assert ok["allowed"] == {"/dev/nvidia1": ["rw", "m"], "/dev/nvidia2": ["m"]}
    assert [d["path"] for d in result["devices"]] == ["/dev/nvidia1", "/dev/nvidia2"]


# At least 15 malformed inputs: each fails with a message naming the option (or file) and the value,
# and leaves every file of the node tree as it was.
MALFORMED = [
    ({"root": "/no/such/root"}, "root: /no/such/root is not a directory"),
    ({"cgroup_root": "/no/cgroup"}, "cgroup_root:"),
    ({"cgroup_root": "/dev"}, "holds neither a cgroup2 hierarchy"),
    ({"devices": ["dev/nvidia0"]}, "devices: 'dev/nvidia0' is not an absolute node path"),
    ({"devices": ["/dev/nvidia99"]}, "devices: /dev/nvidia99: No such file or directory"),
    ({"devices": ["/proc/devices"]}, "devices: /proc/devices is not a character or block device"),
    ({"accesses": ["x"]}, "accesses"),
    ({"severity_overrides": {"isolation_breech": "critical"}}, "severity_overrides: unknown finding id 'isolation_breech'"),
    ({"severity_overrides": {"isolation_breach": "fatal"}}, "severity_overrides.isolation_breach: 'fatal' is not one of"),
    ({"allocations": [{"pod_uid": "abc"}]}, "allocations[0].pod_uid: 'abc' is not a pod UID"),
    ({"allocations": [{"pod_uid": UID_A, "gpu_minors": [-1]}]}, "allocations[0].gpu_minors: -1 is not a device minor number"),
    ({"allocations": [{"pod_uid": UID_A}, {"pod_uid": UID_B, "gpu_minors": ["one"]}]}, "gpu_minors"),
    ({"allocations": [{"pod_uid": UID_A, "gpu_uuids": ["0000:07:00.0"]}]}, "allocations[0].gpu_uuids: '0000:07:00.0' is not a GPU UUID"),
    ({"allocations": [{"gpu_minors": [1]}]}, "pod_uid"),
    ({"allocations": [{"pod_uid": UID_A, "gpus": [1]}]}, "gpus"),
    ({"allocations": "pod"}, "dictionary requested"),
    ({"severity_overrides": "critical"}, "severity_overrides"),
    ({"bundle_dirs": 5, "devices": {"a": 1}}, "devices"),
]


@pytest.mark.parametrize("args, message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_inputs(v1_node, args, message):
    before = _snapshot(v1_node.root)
    args = dict(args)
    args.setdefault("root", str(v1_node.root))
    result = run_module("device_cgroup_audit", args, {})
    assert result.get("failed") is True, result
    assert message in result["msg"], result["msg"]
    assert _snapshot(v1_node.root) == before


def test_malformed_devices_list_is_named_in_the_finding(v1_node):
    listing = v1_node.root / ("sys/fs/cgroup/devices/kubepods/burstable/pod%s/%s/devices.list" % (UID_A, CID["a"]))
    listing.write_text("c 195:1 rw\nc 195:x rw\n")
    before = _snapshot(v1_node.root)
    result = run_module("device_cgroup_audit", {"root": str(v1_node.root), "allocations": [{"pod_uid": UID_A, "gpu_minors": [1]}]}, {})
    assert not result.get("failed"), result
    [finding] = [f for f in result["findings"] if f["pod"] == UID_A]
    assert finding["id"] == "unauditable_program"
    assert "/sys/fs/cgroup/devices/kubepods/burstable/pod%s/%s/devices.list line 2: 'c 195:x rw'" % (UID_A, CID["a"]) in finding["found"]
    assert _snapshot(v1_node.root) == before


def _host_cgroup2():
    for path in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (path / "cgroup.controllers").exists() and os.access(path, os.W_OK):
            return path
    return None


@pytest.mark.skipif(_host_cgroup2() is None, reason="needs a writable cgroup2 hierarchy (root)")
def test_nested_cgroups_found_on_real_cgroupfs_by_link_count():
    """On cgroupfs, a container cgroup's link count says whether it has nested cgroups (fs/kernfs/inode.c); the
    walk must still find every nested one, and none where there are none."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit_node as node

    base = Path(_host_cgroup2()) / ("gpuharden-unit-%d" % os.getpid())
    pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice" % UID_A.replace("-", "_")
    plain, nesting = "%s/cri-containerd-%s.scope" % (pod, CID["a"]), "%s/cri-containerd-%s.scope" % (pod, CID["b"])
    made = [base / plain, base / nesting / "sub" / "deeper"]
    try:
        for path in made:
            path.mkdir(parents=True)
        assert node.filesystem_type(str(base)) in node.CGROUP_FS_MAGICS
        assert node.find_container_cgroups(str(base)) == {"/" + plain: [], "/" + nesting: ["/" + nesting + "/sub", "/" + nesting + "/sub/deeper"]}
    finally:
        for top, _dirs, _files in sorted(os.walk(base, topdown=False), key=lambda entry: -len(entry[0])):
            os.rmdir(top)
