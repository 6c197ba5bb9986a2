# SPDX-License-Identifier: GPL-3.0-or-later
"""Real runc containers in a throwaway node-like namespace: the kernel's device verdicts.

The node is a holder process in a fresh host cgroup under the cgroup2 hierarchy, with its own
mount and cgroup namespaces, cgroup2 mounted at /sys/fs/cgroup, a mknod'd /dev from an NVML
fixture, the fixture's /proc/devices and a private /run.  Everything is torn down by a finalizer.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gpuharden_lab import noderoot, pods
from gpuharden_lab.pods import ContainerSpec

pytestmark = pytest.mark.sandbox

HOST_CGROUP2 = Path("/sys/fs/cgroup/unified")
FIXTURE = "dgx-a100-80gb"  # 8 GPUs, minors 0-7
BUNDLES = "/run/gpuharden-bundles"
RUNC_ROOT = "/run/gpuharden-runc"
STANDARD_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def _require_lab() -> None:
    # Fail, not skip: a lab run that silently skips proves nothing.
    if os.geteuid() != 0:
        pytest.fail("the pods lab needs root (mknod, namespaces, cgroups, runc)")
    if shutil.which(pods.RUNC, path=pods._PATH) is None:
        pytest.fail("runc (%s) is not installed" % pods.RUNC)
    if not (HOST_CGROUP2 / "cgroup.procs").exists():
        pytest.fail("no cgroup2 hierarchy at %s" % HOST_CGROUP2)


def _host_cgroup_tree_remove(path: Path) -> list[str]:
    """cgroup.kill + rmdir, depth first; returns what could not be removed."""
    failed = []
    if not path.exists():
        return failed
    for top, _dirs, _files in os.walk(path, topdown=False):
        try:
            Path(top, "cgroup.kill").write_text("1")
        except OSError:
            pass
        for _ in range(250):
            try:
                os.rmdir(top)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        else:
            failed.append(top)
    return failed


@dataclass
class Node:
    host_cgroup: Path
    tmp: Path
    holder: subprocess.Popen
    enter: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # container inits, to prove they are gone

    def host_path(self, cgroup_path: str) -> Path:
        return self.host_cgroup / cgroup_path.lstrip("/")

    def teardown(self) -> list[str]:
        problems = []
        if self.holder.poll() is None:
            try:
                pods.cleanup_all(self.enter, RUNC_ROOT, bundle_root=BUNDLES)
            except Exception as exc:  # keep tearing down
                problems.append("cleanup_all: %s" % exc)
            self.holder.send_signal(signal.SIGKILL)
            self.holder.wait(10)
        problems += _host_cgroup_tree_remove(self.host_cgroup)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return problems


def _make_node() -> Node:
    _require_lab()
    tag = secrets.token_hex(4)
    tmp = Path(tempfile.mkdtemp(prefix="gpuharden-pods-"))
    host_cgroup = HOST_CGROUP2 / ("gpuharden-test-" + tag)
    root = noderoot.build_node_root(tmp / "node", FIXTURE).root
    for name, (major, minor) in STANDARD_NODES.items():
        os.mknod(root / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(root / "dev" / name, 0o666)
    host_cgroup.mkdir()
    inner = (
        f"set -e; mount -t cgroup2 cgroup2 /sys/fs/cgroup; mount --bind {root}/dev /dev;"
        f" mount --bind {root}/proc/devices /proc/devices; mount -t tmpfs -o mode=755 tmpfs /run;"
        " echo ready; exec sleep infinity"
    )
    holder = subprocess.Popen(
        [
            "sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --mount --cgroup --propagation private sh -c "$2"',
            "sh", str(host_cgroup), inner,
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    node = Node(host_cgroup, tmp, holder, ["nsenter", "--target", str(holder.pid), "--mount", "--cgroup", "--"])
    line = holder.stdout.readline().strip()
    if line != "ready":
        node.teardown()
        pytest.fail("node holder did not start: %r" % line)
    return node


@pytest.fixture(scope="module")
def node():
    node = _make_node()
    try:
        yield node
    finally:
        problems = node.teardown()
        assert not problems, problems


def _spec(name, **kwargs) -> ContainerSpec:
    return ContainerSpec.new(name, namespace="lab", **kwargs)


@pytest.fixture(scope="module")
def running(node):
    """The scenario pods, started once for the module."""
    specs = {
        "gpu1": _spec("train-gpu1", qos="burstable", cgroup_driver="systemd", gpu_minors=[1]),
        "gpu1fs": _spec("train-gpu1-fs", qos="guaranteed", cgroup_driver="cgroupfs", gpu_minors=[1]),
        "privileged": _spec("dcgm-exporter", qos="besteffort", cgroup_driver="cgroupfs", privileged=True),
        "visible_all": _spec("sneaky", qos="besteffort", env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        "lost": _spec("lost-gpu", qos="guaranteed", cgroup_driver="systemd", gpu_minors=[2], lost_gpu_access=True),
    }
    pids = {}
    for key, spec in specs.items():
        pids[key] = pods.start_container(node.enter, spec, BUNDLES, RUNC_ROOT)
        node.pids.append(pids[key])
    return specs, pids


def _probe(node, spec, path, access):
    return pods.exec_probe(node.enter, spec.container_id, path, access, RUNC_ROOT)


def test_cgroup_path_forms():
    uid, cid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "ab" * 32
    assert (
        pods.kubelet_cgroup_path(uid, cid, "burstable", "systemd")
        == "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"
        "/cri-containerd-%s.scope" % cid
    )
    assert (
        pods.kubelet_cgroup_path(uid, cid, "guaranteed", "systemd")
        == "/kubepods.slice/kubepods-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice/cri-containerd-%s.scope" % cid
    )
    assert pods.kubelet_cgroup_path(uid, cid, "besteffort", "cgroupfs") == "/kubepods/besteffort/pod%s/%s" % (uid, cid)
    assert pods.kubelet_cgroup_path(uid, cid, "guaranteed", "cgroupfs") == "/kubepods/pod%s/%s" % (uid, cid)


def test_gpu_pod_sees_only_its_gpu(node, running):
    specs, _pids = running
    for key in ("gpu1", "gpu1fs"):
        spec = specs[key]
        for access in ("r", "w", "rw"):
            own = _probe(node, spec, "/dev/nvidia1", access)
            assert (own.verdict, own.errno) == ("allowed", "ENXIO"), (key, own)
        for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            assert _probe(node, spec, path, "rw").errno == "ENXIO", (key, path)
        # Not injected: the node is absent in the container.
        assert _probe(node, spec, "/dev/nvidia0", "r").errno == "ENOENT"
        assert _probe(node, spec, "/dev/null", "rw").errno is None
    # /dev/nvidia0 is not in the container; ask the kernel from the container's cgroup instead.
    other = pods.probe_from_cgroup(node.enter, specs["gpu1"].cgroup_path, "/dev/nvidia0", "r")
    assert (other.verdict, other.errno) == ("denied", "EPERM")
    own = pods.probe_from_cgroup(node.enter, specs["gpu1"].cgroup_path, "/dev/nvidia1", "rw")
    assert (own.verdict, own.errno) == ("allowed", "ENXIO")


def test_gpu_pod_denied_other_gpu_node_in_container(node):
    # /dev/nvidia0 injected into the container but without a rule: the default deny answers.
    spec = _spec("gpu1-extra", gpu_minors=[1], extra_devices=[{"path": "/dev/nvidia0", "access": None}])
    try:
        pods.start_container(node.enter, spec, BUNDLES, RUNC_ROOT)
        for access in ("r", "w", "rw"):
            res = _probe(node, spec, "/dev/nvidia0", access)
            assert (res.verdict, res.errno) == ("denied", "EPERM"), res
        assert _probe(node, spec, "/dev/nvidia1", "r").errno == "ENXIO"
    finally:
        pods.delete_container(node.enter, spec.container_id, RUNC_ROOT)
        pods.delete_container(node.enter, spec.container_id, RUNC_ROOT)  # idempotent


def test_privileged_opens_every_gpu(node, running):
    specs, _pids = running
    for minor in range(8):
        res = _probe(node, specs["privileged"], "/dev/nvidia%d" % minor, "rw")
        assert (res.verdict, res.errno) == ("allowed", "ENXIO"), res
    assert _probe(node, specs["privileged"], "/dev/nvidia-modeset", "rw").errno == "ENXIO"


def test_visible_devices_all_bypasses_the_allocation(node, running):
    specs, _pids = running
    assert specs["visible_all"].gpu_minors == []
    for minor in range(8):
        res = _probe(node, specs["visible_all"], "/dev/nvidia%d" % minor, "rw")
        assert (res.verdict, res.errno) == ("allowed", "ENXIO"), res


def test_lost_access_pod_denied_its_own_gpu(node, running):
    specs, _pids = running
    for path in ("/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"):
        res = _probe(node, specs["lost"], path, "r")
        assert (res.verdict, res.errno) == ("denied", "EPERM"), res
    assert _probe(node, specs["lost"], "/dev/zero", "r").errno is None


def test_cgroup_dirs_hold_the_container_and_a_device_program(node, running):
    specs, pids = running
    for key, spec in specs.items():
        host_dir = node.host_path(spec.cgroup_path)
        assert host_dir.is_dir(), (key, host_dir)
        assert str(pids[key]) in (host_dir / "cgroup.procs").read_text().split(), key
        line = [x for x in Path("/proc/%d/cgroup" % pids[key]).read_text().splitlines() if x.startswith("0::")][0]
        assert line.endswith(spec.cgroup_path), (key, line)
        progs = pods.attached_device_programs(host_dir)
        assert len(progs) == 1, (key, progs)
        # Nothing above the container carries one.
        assert pods.attached_device_programs(host_dir.parent) == []
        assert pods.attached_device_programs(host_dir, effective=True) == progs
    assert specs["gpu1"].cgroup_path.startswith("/kubepods.slice/kubepods-burstable.slice/")
    assert specs["gpu1fs"].cgroup_path.startswith("/kubepods/pod")


def test_start_is_idempotent(node, running):
    specs, pids = running
    assert pods.start_container(node.enter, specs["gpu1"], BUNDLES, RUNC_ROOT) == pids["gpu1"]
    ids = {c["id"] for c in pods.list_containers(node.enter, RUNC_ROOT)}
    assert {s.container_id for s in specs.values()} <= ids


def test_failed_start_leaves_no_container(node):
    spec = _spec("broken", args=["/no/such/binary"])
    with pytest.raises(pods.PodError, match="runc run"):
        pods.start_container(node.enter, spec, BUNDLES, RUNC_ROOT)
    assert pods.container_state(node.enter, spec.container_id, RUNC_ROOT) is None
    assert not node.host_path(spec.cgroup_path).exists()


def test_mknod(node, running):
    specs, _pids = running
    # runc 1.1 always appends `c *:* m` and `b *:* m`: its programs never deny mknod.
    for key in ("gpu1", "lost", "privileged"):
        res = pods.exec_probe(node.enter, specs[key], "/dev/nvidia1" if key != "lost" else "/dev/nvidia2", "mknod", RUNC_ROOT)
        assert (res.verdict, res.errno) == ("allowed", None), (key, res)


# --- a directly loaded program, in a cgroup nested below a container's ---------------------------

BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_F_ALLOW_MULTI = 2


def _insn(code, dst=0, src=0, off=0, imm=0) -> bytes:
    return (
        code.to_bytes(1, "little")
        + bytes([src << 4 | dst])
        + off.to_bytes(2, "little", signed=True)
        + (imm.to_bytes(4, "little", signed=True))
    )


# Deny mknod, allow everything else.
DENY_MKNOD = b"".join(
    [
        _insn(0x61, dst=3, src=1, off=0),  # w3 = ctx->access_type
        _insn(0x74, dst=3, imm=16),  # w3 >>= 16 (access)
        _insn(0x54, dst=3, imm=1),  # w3 &= MKNOD
        _insn(0xB4, dst=0, imm=1),  # w0 = 1
        _insn(0x15, dst=3, off=1, imm=0),  # if r3 == 0 goto exit
        _insn(0xB4, dst=0, imm=0),  # w0 = 0
        _insn(0x95),  # exit
    ]
)


def _load_and_attach(cgroup_dir: Path, insns: bytes) -> int:
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = ctypes.create_string_buffer(144)
    ctypes.c_uint32.from_buffer(attr, 0).value = BPF_PROG_TYPE_CGROUP_DEVICE
    ctypes.c_uint32.from_buffer(attr, 4).value = len(insns) // 8
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(code)
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(license_)
    ctypes.c_uint32.from_buffer(attr, 24).value = 1
    ctypes.c_uint32.from_buffer(attr, 28).value = len(log)
    ctypes.c_uint64.from_buffer(attr, 32).value = ctypes.addressof(log)
    try:
        prog_fd = pods._bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        raise AssertionError("PROG_LOAD: %s\n%s" % (exc, log.value.decode(errors="replace"))) from exc
    cg_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = ctypes.create_string_buffer(144)
        ctypes.c_uint32.from_buffer(attr, 0).value = cg_fd
        ctypes.c_uint32.from_buffer(attr, 4).value = prog_fd
        ctypes.c_uint32.from_buffer(attr, 8).value = pods.BPF_CGROUP_DEVICE
        ctypes.c_uint32.from_buffer(attr, 12).value = BPF_F_ALLOW_MULTI
        pods._bpf(BPF_PROG_ATTACH, attr)
    finally:
        os.close(cg_fd)
    return prog_fd


def test_probe_from_nested_cgroup_with_loaded_program(node, running):
    specs, _pids = running
    nested = specs["gpu1"].cgroup_path + "/probe-nested"
    host_dir = node.host_path(nested)
    host_dir.mkdir()
    prog_fd = _load_and_attach(host_dir, DENY_MKNOD)
    try:
        os.close(prog_fd)  # the attachment keeps it
        assert len(pods.attached_device_programs(host_dir, effective=True)) == 2
        verdicts = {
            (path, access): pods.probe_from_cgroup(node.enter, nested, path, access)
            for path in ("/dev/nvidia0", "/dev/nvidia1", "/dev/null")
            for access in ("r", "m")
        }
        got = {key: (res.verdict, res.errno) for key, res in verdicts.items()}
        assert got == {
            ("/dev/nvidia0", "r"): ("denied", "EPERM"),  # the container's program
            ("/dev/nvidia0", "m"): ("denied", "EPERM"),  # ours (runc's allows c *:* m)
            ("/dev/nvidia1", "r"): ("allowed", "ENXIO"),  # both allow
            ("/dev/nvidia1", "m"): ("denied", "EPERM"),
            ("/dev/null", "r"): ("allowed", None),
            ("/dev/null", "m"): ("denied", "EPERM"),
        }
        # The container itself still may mknod: the nested program does not apply upwards.
        assert _probe(node, specs["gpu1"], "/dev/nvidia1", "m").verdict == "allowed"
    finally:
        host_dir.rmdir()  # detaches the program


def test_probe_from_cgroup_outside_containers(node):
    # The node's root cgroup has no device program: everything is allowed.
    assert pods.probe_from_cgroup(node.enter, "/", "/dev/nvidia5", "rw").errno == "ENXIO"
    assert pods.probe_from_cgroup(node.enter, "/", "/dev/nvidia5", "m").errno is None


def test_cleanup_all_leaves_nothing():
    node = _make_node()
    try:
        specs = [
            _spec("a", cgroup_driver="systemd", gpu_minors=[0]),
            _spec("b", cgroup_driver="cgroupfs", qos="burstable", gpu_minors=[3]),
            _spec("c", cgroup_driver="cgroupfs", privileged=True),
        ]
        pids = [pods.start_container(node.enter, s, BUNDLES, RUNC_ROOT) for s in specs]
        pods.stop_container(node.enter, specs[2].container_id, RUNC_ROOT)
        pods.stop_container(node.enter, specs[2].container_id, RUNC_ROOT)  # idempotent
        # A process parked in a pod cgroup (not a container's) must be killed too.
        parked = node.host_path(specs[0].pod_cgroup_path) / "parked"
        parked.mkdir()
        subprocess.run(
            node.enter + ["sh", "-c", """sh -c 'echo $$ > "$1" && exec sleep 300' sh "$1" >/dev/null 2>&1 &""", "sh",
                          "/sys/fs/cgroup" + specs[0].pod_cgroup_path + "/parked/cgroup.procs"],
            check=True, timeout=30,
        )  # fmt: skip
        for _ in range(200):  # the background child joins asynchronously
            parked_pids = [int(p) for p in (parked / "cgroup.procs").read_text().split()]
            if parked_pids:
                break
            time.sleep(0.01)
        assert parked_pids
        removed = pods.cleanup_all(node.enter, RUNC_ROOT, bundle_root=BUNDLES)
        assert "/kubepods.slice" in removed and "/kubepods" in removed
        assert pods.list_containers(node.enter, RUNC_ROOT) == []
        left = subprocess.run(
            node.enter + ["sh", "-c", "ls -A $1 $2 2>/dev/null; ls /sys/fs/cgroup | grep -v '[.]' || true",
                          "sh", RUNC_ROOT, BUNDLES],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert left.strip() == ""
        assert [p.name for p in node.host_cgroup.iterdir() if p.is_dir()] == []
        for pid in pids + parked_pids:
            assert not Path("/proc/%d" % pid).exists() or "State:\tZ" in Path("/proc/%d/status" % pid).read_text()
        # Idempotent on an empty node.
        assert pods.cleanup_all(node.enter, RUNC_ROOT, bundle_root=BUNDLES) == []
        for spec in specs:
            pods.stop_container(node.enter, spec.container_id, RUNC_ROOT)
            pods.delete_container(node.enter, spec.container_id, RUNC_ROOT)
    finally:
        problems = node.teardown()
    assert not problems, problems
    assert not node.host_cgroup.exists()
    assert not node.tmp.exists()
