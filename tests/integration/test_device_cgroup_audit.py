# SPDX-License-Identifier: GPL-3.0-or-later
"""device_cgroup_audit against the kernel: every interpreter verdict checked against the kernel's own.

Most tests use a throwaway node (a holder process with its own mount and cgroup namespaces, cgroup2
mounted at /sys/fs/cgroup, a mknod'd /dev from the DGX fixture), built by the lab pods tests' helper:
no global lab, no lab lock.  In it:

* real runc containers (Debian's runc) with GPU device rules, so the kernel holds the programs runc
  generates (systemd and cgroupfs cgroup paths);
* programs shaped like crun's, systemd's and libnvidia-container's (NVIDIA blocks prepended to a runc
  program's xlated instructions: 16-bit ctx load, JMP32), loaded directly with BPF_PROG_LOAD and
  attached to test cgroups, nested ones too.

For each (cgroup, device, access) a child process joins the cgroup and opens (or mknods) the device:
EPERM = the device cgroup denied, ENXIO/ENODEV/success = allowed (no driver behind the nodes).  The
audit's verdict must be the same for every triple.  One last test runs the module over SSH in the
seed-failures lab.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import ansible_runner
import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _bpf_syscalls as bpf
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _ebpf
from gpuharden_lab import REPO_ROOT, pods
from gpuharden_lab.pods import ContainerSpec

from tests.integration import devcg_shapes as shapes
from tests.lab.test_pods import BUNDLES, RUNC_ROOT, _make_node
from tests.labfixtures import shared_lab

pytestmark = pytest.mark.sandbox

MODULE = REPO_ROOT / "plugins/modules/device_cgroup_audit.py"
COLLECTIONS = REPO_ROOT / "build/collections"
ACCESSES = ("r", "w", "rw", "m")
UVM_MAJOR = 510

# One child per cgroup: join it, then try every (device, access).  Same errno reading as pods._PROBE.
_BATCH_PROBE = r"""
import errno, json, os, stat, sys
results = []
for path, access in json.load(sys.stdin):
    err = None
    try:
        if access == "m":
            st = os.stat(path)
            kind = stat.S_IFCHR if stat.S_ISCHR(st.st_mode) else stat.S_IFBLK
            target = "/tmp/.gpuharden-devcg-%d" % os.getpid()
            os.mknod(target, kind | 0o600, st.st_rdev)
            os.unlink(target)
        else:
            flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}[access]
            os.close(os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY))
    except OSError as exc:
        err = errno.errorcode.get(exc.errno, str(exc.errno))
    results.append(err)
print(json.dumps(results))
"""


def kernel_verdicts(node, cgroup_path, pairs):
    """{(device, access): "allow" | "deny"} from a child process inside ``cgroup_path`` (node view)."""
    procs = "/sys/fs/cgroup/%s/cgroup.procs" % cgroup_path.strip("/")
    proc = subprocess.run(
        node.enter + ["sh", "-c", 'echo $$ > "$1" && exec "$2" -c "$3"', "sh", procs, pods.NODE_PYTHON, _BATCH_PROBE],
        input=json.dumps(pairs), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    verdicts = {}
    for (path, access), err in zip(pairs, json.loads(proc.stdout), strict=True):
        assert err in (None, "ENXIO", "ENODEV", "EPERM"), (cgroup_path, path, access, err)
        verdicts[(path, access)] = _ebpf.DENY if err == "EPERM" else _ebpf.ALLOW
    return verdicts


def interpreter_verdicts(host_dir, devices, accesses=ACCESSES):
    """The same triples, decided from the cgroup's effective programs (bpf(2) + the interpreter)."""
    ids, _flags = bpf.query_programs(str(host_dir), effective=True)
    programs = []
    for prog_id in ids:
        info = bpf.dump_program(prog_id)
        assert info and info["xlated"], (prog_id, info)
        programs.append(_ebpf.Program(_ebpf.decode(info["xlated"])))
    verdicts = {}
    for dev in devices:
        for access in accesses:
            ctx = _ebpf.make_ctx(dev["type"], dev["major"], dev["minor"], access)
            verdict = _ebpf.combine([p.run(ctx) for p in programs])
            assert verdict.decision != _ebpf.UNAUDITABLE, (host_dir, dev, access, verdict)
            verdicts[(dev["path"], access)] = verdict.decision
    return verdicts, ids


def compare(node, cgroup_path, devices):
    """Interpreter vs kernel on every (device, access) of ``cgroup_path``; returns the verdicts."""
    mine, ids = interpreter_verdicts(node.host_path(cgroup_path), devices)
    kernel = kernel_verdicts(node, cgroup_path, sorted(mine))
    mismatches = {key: (mine[key], kernel[key]) for key in mine if mine[key] != kernel[key]}
    assert not mismatches, (cgroup_path, ids, mismatches)
    return kernel


def run_module_in(node, args):
    """The module run inside the node (its mount and cgroup namespaces), as Ansible would run it."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, dir="/tmp") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        proc = subprocess.run(
            node.enter + ["env", "PYTHONPATH=%s" % COLLECTIONS, sys.executable, str(MODULE), handle.name],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.unlink(handle.name)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError("module printed no JSON: %s\n%s" % (proc.stdout, proc.stderr)) from error


@pytest.fixture(scope="module")
def node():
    node = _make_node()
    try:
        yield node
    finally:
        problems = node.teardown()
        assert not problems, problems


def _spec(name, **kwargs):
    return ContainerSpec.new(name, namespace="lab", **kwargs)


@pytest.fixture(scope="module")
def running(node):
    specs = {
        "train": _spec("train", qos="burstable", cgroup_driver="systemd", gpu_minors=[1]),
        "train-fs": _spec("train-fs", qos="guaranteed", cgroup_driver="cgroupfs", gpu_minors=[2, 3]),
        "privileged": _spec("dcgm", qos="besteffort", cgroup_driver="cgroupfs", privileged=True),
        "sneaky": _spec("sneaky", qos="besteffort", env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        "lost": _spec("lost", qos="guaranteed", cgroup_driver="systemd", gpu_minors=[4], lost_gpu_access=True),
        "extra": _spec("extra", qos="burstable", cgroup_driver="cgroupfs", gpu_minors=[5],
                       extra_devices=[{"path": "/dev/nvidia6", "access": "r"}, {"path": "/dev/nvidia-modeset", "access": "w"}]),
    }  # fmt: skip
    for spec in specs.values():
        node.pids.append(pods.start_container(node.enter, spec, BUNDLES, RUNC_ROOT))
    return specs


@pytest.fixture(scope="module")
def devices(node, running):
    """Every NVIDIA node of the throwaway node, plus /dev/null, as the module lists them."""
    result = run_module_in(node, {"devices": None, "node_name": "throwaway", "bundle_dirs": [BUNDLES]})
    assert not result.get("failed"), result
    found = result["devices"]
    assert {d["path"] for d in found} >= {"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    st = os.stat(node.tmp / "node/dev/nvidia-modeset")
    extra = [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3},
             {"path": "/dev/nvidia-modeset", "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}]  # fmt: skip
    return found + extra


# ---------------------------------------------------------------------------------------------
# runc-generated programs


def test_runc_programs_match_the_kernel(node, running, devices):
    total = 0
    for key, spec in running.items():
        kernel = compare(node, spec.cgroup_path, devices)
        total += len(kernel)
        allowed = {k for k, v in kernel.items() if v == _ebpf.ALLOW}
        if key == "train":
            assert ("/dev/nvidia1", "rw") in allowed and ("/dev/nvidia0", "r") not in allowed
        if key == "lost":
            assert ("/dev/nvidia4", "r") not in allowed and ("/dev/nvidiactl", "r") not in allowed
        if key in ("privileged", "sneaky"):
            assert all(("/dev/nvidia%d" % m, "rw") in allowed for m in range(8)), key
        if key == "extra":
            assert ("/dev/nvidia6", "r") in allowed and ("/dev/nvidia6", "w") not in allowed
            assert ("/dev/nvidia-modeset", "w") in allowed and ("/dev/nvidia-modeset", "rw") not in allowed
    assert total >= 6 * 15 * 4


def test_module_findings_with_allocations(node, running):
    specs = running
    allocations = [
        {"pod_uid": specs["train"].pod_uid, "container": "main", "gpu_minors": [1], "pod": "lab/train"},
        {"pod_uid": specs["train-fs"].pod_uid, "container": specs["train-fs"].container_id[:12], "gpu_minors": [2, 3]},
        {"pod_uid": specs["privileged"].pod_uid, "gpu_minors": []},
        {"pod_uid": specs["sneaky"].pod_uid, "container": "main"},
        {"pod_uid": specs["lost"].pod_uid, "container": specs["lost"].container_id, "gpu_minors": [4]},
        {"pod_uid": specs["extra"].pod_uid, "gpu_minors": [5]},
        {"pod_uid": "00000000-0000-4000-8000-000000000000", "gpu_minors": [0]},
    ]
    result = run_module_in(node, {"allocations": allocations, "node_name": "throwaway", "bundle_dirs": [BUNDLES]})
    assert not result.get("failed"), result
    assert result["changed"] is False and result["cgroup_layout"] == "v2"
    by_id = {}
    for finding in result["findings"]:
        assert finding["node"] == "throwaway"
        by_id.setdefault(finding["id"], []).append(finding)
    assert set(by_id) == {"isolation_breach", "broken_allocation", "privileged_container", "allocation_unmatched"}, by_id.keys()
    breaches = {(f["pod"], f["gpu"]) for f in by_id["isolation_breach"]}
    assert breaches == {(specs["sneaky"].pod_uid, m) for m in range(8)} | {(specs["extra"].pod_uid, 6)}
    assert all(f["severity"] == "critical" and f["container"] == "main" for f in by_id["isolation_breach"])
    broken = {(f["pod"], f["device"]) for f in by_id["broken_allocation"]}
    assert broken == {(specs["lost"].pod_uid, p) for p in ("/dev/nvidia4", "/dev/nvidiactl", "/dev/nvidia-uvm")}
    assert [f["gpu"] for f in by_id["broken_allocation"] if f["device"] == "/dev/nvidia4"] == [4]
    [privileged] = by_id["privileged_container"]
    assert privileged["pod"] == specs["privileged"].pod_uid and privileged["severity"] == "error"
    [unmatched] = by_id["allocation_unmatched"]
    assert unmatched["pod"] == "00000000-0000-4000-8000-000000000000"
    views = {v["pod_uid"]: v for v in result["containers"]}
    assert views[specs["train"].pod_uid]["gpus"] == [1] and views[specs["train"].pod_uid]["container"] == "main"
    assert views[specs["train-fs"].pod_uid]["gpus"] == [2, 3] and views[specs["train-fs"].pod_uid]["driver"] == "cgroupfs"
    assert views[specs["lost"].pod_uid]["gpus"] == []
    assert views[specs["sneaky"].pod_uid]["gpus"] == list(range(8))
    assert result["summary"]["max_severity"] == "critical"


def test_module_without_allocations_reports_access(node, running):
    result = run_module_in(node, {"node_name": "throwaway", "accesses": ["r", "w", "rw", "m"], "severity_overrides": {"privileged_container": "warning"}})
    assert not result.get("failed"), result
    access = {(f["pod"]): f for f in result["findings"] if f["id"] == "gpu_access"}
    assert access[running["train"].pod_uid]["found"] == "can open nvidia1"
    assert access[running["extra"].pod_uid]["found"] == "can open nvidia5, nvidia6"
    assert running["lost"].pod_uid not in access
    [privileged] = [f for f in result["findings"] if f["id"] == "privileged_container"]
    assert privileged["severity"] == "warning"
    # Without bundle annotations the container is named by its ID.
    assert access[running["train"].pod_uid]["container"] == running["train"].container_id


# ---------------------------------------------------------------------------------------------
# Directly loaded programs: crun, systemd and NVIDIA shapes; nested cgroups


@pytest.fixture
def scratch(node):
    """A test cgroup tree in the node (removed afterwards: rmdir detaches the programs)."""
    made = []

    def make(path):
        host = node.host_path(path)
        host.mkdir(parents=True)
        made.append(host)
        return host

    yield make
    for host in reversed(made):
        for _ in range(100):
            try:
                host.rmdir()
                break
            except OSError:
                time.sleep(0.02)


def _attach(host_dir, program_bytes, name):
    fd = bpf.load_program(program_bytes, name=name)
    try:
        bpf.attach_program(str(host_dir), fd, bpf.BPF_F_ALLOW_MULTI)
    finally:
        os.close(fd)


CRUN_RULES = [  # evaluation order: crun's built-in devices, then user rules, last the catch-all deny
    ("c", 195, 3, "rwm", False),  # an explicit deny before an allow that would match
    ("c", 195, None, "r", True),
    ("c", 195, 1, "rw", True),
    ("a", 1, 3, "rwm", True),  # type "a": no type test
    ("c", UVM_MAJOR, 0, "rw", True),
    ("b", None, None, "m", True),
    ("a", None, None, "rwm", False),  # all-wildcard: generation ends here
]
SYSTEMD_ALLOWS = [("c", 195, 0, "rw"), ("c", 195, 2, "rwm"), ("c", 1, 3, "rwm"), ("c", UVM_MAJOR, None, "r")]
NVIDIA_ALLOWS = [("c", 195, 4, "rw"), ("c", 195, 255, "rw"), ("c", UVM_MAJOR, 0, "rw")]


def test_crun_shaped_program(node, devices, scratch):
    host = scratch("/devcg-crun")
    _attach(host, shapes.crun_like(CRUN_RULES).bytes(), "crun")
    kernel = compare(node, "/devcg-crun", devices)
    assert kernel[("/dev/nvidia3", "r")] == _ebpf.DENY and kernel[("/dev/nvidia5", "r")] == _ebpf.ALLOW
    assert kernel[("/dev/nvidia5", "w")] == _ebpf.DENY and kernel[("/dev/nvidia1", "rw")] == _ebpf.ALLOW


def test_systemd_shaped_program(node, devices, scratch):
    host = scratch("/devcg-systemd")
    _attach(host, shapes.systemd_like(SYSTEMD_ALLOWS).bytes(), "sd_devices")
    kernel = compare(node, "/devcg-systemd", devices)
    assert kernel[("/dev/nvidia0", "rw")] == _ebpf.ALLOW and kernel[("/dev/nvidia0", "m")] == _ebpf.DENY
    assert kernel[("/dev/nvidia2", "m")] == _ebpf.ALLOW and kernel[("/dev/nvidia-uvm", "w")] == _ebpf.DENY


def test_nvidia_prepended_to_runc_program(node, running, devices, scratch):
    # libnvidia-container reads the attached program's xlated instructions and prepends its blocks.
    ids, _flags = bpf.query_programs(str(node.host_path(running["lost"].cgroup_path)), effective=True)
    [runc_prog] = ids
    base = bpf.dump_program(runc_prog)["xlated"]
    program = shapes.nvidia_prepend(NVIDIA_ALLOWS, base)
    insns = _ebpf.decode(program)
    assert {0x69, 0x5E} <= {i.code for i in insns}
    host = scratch("/devcg-nvidia")
    _attach(host, program, "nvidia")
    kernel = compare(node, "/devcg-nvidia", devices)
    assert kernel[("/dev/nvidia4", "rw")] == _ebpf.ALLOW and kernel[("/dev/nvidiactl", "r")] == _ebpf.ALLOW
    assert kernel[("/dev/nvidia4", "m")] == _ebpf.ALLOW  # runc's own `c *:* m`, after the prepended blocks
    assert kernel[("/dev/nvidia0", "r")] == _ebpf.DENY


def test_nested_cgroups_and_the_effective_list(node, running, devices, scratch):
    # A deny-list parent (runc-shaped, default allow), a systemd-shaped child, a crun-shaped grandchild.
    parent, child, grandchild = "/devcg-nest", "/devcg-nest/child", "/devcg-nest/child/leaf"
    _attach(scratch(parent), shapes.runc_like([("c", 195, 2, "rwm", False)], default_allow=True).bytes(), "deny2")
    _attach(scratch(child), shapes.systemd_like(SYSTEMD_ALLOWS).bytes(), "sd_devices")
    _attach(scratch(grandchild), shapes.crun_like(CRUN_RULES).bytes(), "crun")
    assert len(bpf.query_programs(str(node.host_path(grandchild)), effective=True)[0]) == 3
    assert len(bpf.query_programs(str(node.host_path(grandchild)), effective=False)[0]) == 1
    top = compare(node, parent, devices)
    mid = compare(node, child, devices)
    leaf = compare(node, grandchild, devices)
    assert top[("/dev/nvidia0", "rw")] == _ebpf.ALLOW and top[("/dev/nvidia2", "r")] == _ebpf.DENY
    assert mid[("/dev/nvidia0", "rw")] == _ebpf.ALLOW and mid[("/dev/nvidia2", "r")] == _ebpf.DENY
    assert leaf[("/dev/nvidia0", "w")] == _ebpf.DENY  # crun allows 195:* read only
    assert leaf[("/dev/nvidia1", "r")] == _ebpf.DENY  # crun's does, systemd's does not
    assert leaf[("/dev/null", "rw")] == _ebpf.ALLOW
    # A cgroup nested in a container: the module counts what any cgroup of the container allows.
    nested = running["train"].cgroup_path + "/sub"
    _attach(scratch(nested), shapes.runc_like([], default_allow=True).bytes(), "allowall")
    compare(node, nested, devices)
    result = run_module_in(node, {"node_name": "throwaway"})
    view = next(v for v in result["containers"] if v["pod_uid"] == running["train"].pod_uid)
    assert view["nested"] == [nested] and view["gpus"] == [1]


# ---------------------------------------------------------------------------------------------
# The real lab: seed-failures, node seed-isolation, over SSH


@pytest.mark.lab
def test_seed_isolation_over_ssh():
    with shared_lab("seed-failures") as state:
        placed = {p["name"]: p for p in state["pods"] if p["node"] == "seed-isolation"}
        assert set(placed) == {"train-ok", "privileged-debug", "sneaky-all-gpus", "lost-access"}
        allocations = [
            {"pod_uid": p["uid"], "container": p["container_id"], "gpu_minors": p["gpu_minors"], "pod": "%s/%s" % (p["namespace"], p["name"])}
            for p in placed.values()
        ]
        envvars = {
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        }
        with tempfile.TemporaryDirectory(prefix="gpuharden-devcg-test-") as private:
            runner = ansible_runner.run(
                private_data_dir=private, project_dir=str(REPO_ROOT), inventory=state["inventory"], envvars=envvars,
                host_pattern="seed-isolation", module="gpuharden.k8s.device_cgroup_audit",
                module_args=json.dumps({"allocations": allocations, "node_name": "seed-isolation"}), quiet=True,
            )  # fmt: skip
            events = [e for e in runner.events if e.get("event") in ("runner_on_ok", "runner_on_failed")]
        assert [e["event"] for e in events] == ["runner_on_ok"], events
        result = events[0]["event_data"]["res"]
    assert result["changed"] is False
    findings = {}
    for finding in result["findings"]:
        assert finding["node"] == "seed-isolation"
        findings.setdefault(finding["id"], []).append(finding)
    assert set(findings) == {"isolation_breach", "privileged_container", "broken_allocation"}, findings
    sneaky, lost, privileged = placed["sneaky-all-gpus"], placed["lost-access"], placed["privileged-debug"]
    assert {(f["pod"], f["gpu"]) for f in findings["isolation_breach"]} == {(sneaky["uid"], m) for m in range(8)}
    assert {f["pod_name"] for f in findings["isolation_breach"]} == {"ml/sneaky-all-gpus"}
    [minor] = lost["gpu_minors"]
    assert {(f["pod"], f["device"]) for f in findings["broken_allocation"]} == {
        (lost["uid"], "/dev/nvidia%d" % minor), (lost["uid"], "/dev/nvidiactl"), (lost["uid"], "/dev/nvidia-uvm")
    }  # fmt: skip
    assert [f["pod"] for f in findings["privileged_container"]] == [privileged["uid"]]
    ok = next(v for v in result["containers"] if v["pod_uid"] == placed["train-ok"]["uid"])
    assert ok["gpus"] == placed["train-ok"]["gpu_minors"]
