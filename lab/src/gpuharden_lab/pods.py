# SPDX-License-Identifier: GPL-3.0-or-later
"""Real runc containers for the pods a lab scenario declares.

Each container gets the cgroup path the kubelet (through containerd) would give it and the device
rules containerd would generate, so the kernel holds the BPF_CGROUP_DEVICE programs that runc
compiles from them.  The product's device-cgroup audit is checked against those real programs, and
``probe_from_cgroup`` asks the kernel itself for its verdict in any cgroup.

Everything runs inside a lab node through ``node_enter_argv`` (for example
``["nsenter", "--target", "<pid>", "--mount", "--cgroup", "--"]``).  The node must have cgroup2
mounted at /sys/fs/cgroup (then runc 1.1 uses its unified-mode manager and attaches BPF programs;
on a hybrid /sys/fs/cgroup it would only write the v1 ``devices.list``).  runc's cgroupfs manager
is used throughout: it takes a systemd-looking ``/kubepods.slice/...scope`` path as a plain
directory path, while its systemd driver would need D-Bus.

Paths (bundles, the runc root, device nodes, cgroups) are as the node sees them.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import json
import os
import secrets
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RUNC_ROOT = "/run/gpuharden-runc"
NODE_PYTHON = "/usr/bin/python3"
RUNC = os.environ.get("GPUHARDEN_RUNC", "runc")
CGROUP_MOUNT = "/sys/fs/cgroup"
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
KUBEPODS_ROOTS = ("/kubepods.slice", "/kubepods")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
CGROUP_DRIVERS = ("systemd", "cgroupfs")
ACCESS_MODES = ("r", "w", "rw", "m")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# containerd's default capability set for unprivileged containers (oci.defaultUnixCaps).
DEFAULT_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
# Capability numbers (linux/capability.h), for privileged containers: every one in the node's
# bounding set (a lab machine may lack some, e.g. CAP_SYS_RESOURCE, and runc cannot grant those).
CAP_NAMES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
    "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]  # fmt: skip

# The standard allowed set runc 1.1 appends to every container (specconv.AllowedDevices) and that
# containerd's WithDefaultUnixDevices sends as well: mknod of any char/block device, the usual
# character devices, /dev/pts/*, /dev/ptmx and tun/tap.
STANDARD_DEVICE_RULES = [
    {"allow": True, "type": "c", "access": "m"},
    {"allow": True, "type": "b", "access": "m"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},  # null
    {"allow": True, "type": "c", "major": 1, "minor": 8, "access": "rwm"},  # random
    {"allow": True, "type": "c", "major": 1, "minor": 7, "access": "rwm"},  # full
    {"allow": True, "type": "c", "major": 5, "minor": 0, "access": "rwm"},  # tty
    {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rwm"},  # zero
    {"allow": True, "type": "c", "major": 1, "minor": 9, "access": "rwm"},  # urandom
    {"allow": True, "type": "c", "major": 136, "access": "rwm"},  # /dev/pts/*
    {"allow": True, "type": "c", "major": 5, "minor": 2, "access": "rwm"},  # ptmx
    {"allow": True, "type": "c", "major": 10, "minor": 200, "access": "rwm"},  # tun/tap
]
DENY_ALL = {"allow": False, "access": "rwm"}
ALLOW_ALL = {"allow": True, "access": "rwm"}

MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
]  # fmt: skip
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


class PodError(RuntimeError):
    """A runc or node command failed."""


@dataclass
class ContainerSpec:
    """One container of a pod, as the kubelet and containerd would set it up.

    ``gpu_minors`` is the device plugin's allocation.  Variants:

    * ``privileged``: every /dev/nvidia* node of the node injected, device rules ``a *:* rwm``.
    * ``env["NVIDIA_VISIBLE_DEVICES"] == "all"`` (or a list of indices, read as minors): the
      toolkit hook injects those GPUs and allows them, whatever the pod requested.
    * ``lost_gpu_access``: the device nodes are there but every NVIDIA allow rule is gone, as after
      a ``systemctl daemon-reload`` re-applied the unit's DeviceAllow= list on a systemd-driver node.
    * ``extra_devices``: further node device paths, injected and allowed rw (``"path"``), or dicts
      ``{"path", "inject": True, "access": "rw", "allow": True}``: ``inject`` puts the node in the
      container, ``access``/``allow`` make its rule (``access: None``: no rule, so the node is
      there but the default deny applies).
    """

    pod_uid: str
    pod_name: str
    namespace: str
    container_name: str
    container_id: str
    qos: str = "besteffort"
    cgroup_driver: str = "systemd"
    gpu_minors: list[int] = field(default_factory=list)
    privileged: bool = False
    env: dict[str, str] = field(default_factory=dict)
    extra_devices: list = field(default_factory=list)
    lost_gpu_access: bool = False
    args: list[str] = field(default_factory=lambda: ["sleep", "infinity"])

    def __post_init__(self) -> None:
        if self.qos not in QOS_CLASSES:
            raise ValueError("qos must be one of %s, not %r" % (QOS_CLASSES, self.qos))
        if self.cgroup_driver not in CGROUP_DRIVERS:
            raise ValueError("cgroup_driver must be one of %s, not %r" % (CGROUP_DRIVERS, self.cgroup_driver))
        if len(self.container_id) != 64 or any(c not in "0123456789abcdef" for c in self.container_id):
            raise ValueError("container_id must be 64 lowercase hex digits")

    @classmethod
    def new(cls, pod_name: str, namespace: str = "default", container_name: str = "main", **kwargs) -> ContainerSpec:
        """A spec with a fresh pod UID and container ID."""
        kwargs.setdefault("pod_uid", str(uuid.uuid4()))
        kwargs.setdefault("container_id", secrets.token_hex(32))
        return cls(pod_name=pod_name, namespace=namespace, container_name=container_name, **kwargs)

    @property
    def cgroup_path(self) -> str:
        return kubelet_cgroup_path(self.pod_uid, self.container_id, self.qos, self.cgroup_driver)

    @property
    def pod_cgroup_path(self) -> str:
        return self.cgroup_path.rsplit("/", 1)[0]

    def visible_minors(self, node_gpu_minors: list[int]) -> list[int]:
        """GPU minors the toolkit hook injects from NVIDIA_VISIBLE_DEVICES, beyond the allocation."""
        value = self.env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if value == "all":
            return list(node_gpu_minors)
        if value in ("", "none", "void"):
            return []
        return [int(part) for part in value.split(",") if part.strip().isdigit() and int(part) in node_gpu_minors]


def kubelet_cgroup_path(pod_uid: str, container_id: str, qos: str, cgroup_driver: str) -> str:
    """The container cgroup the kubelet (pkg/kubelet/cm) and containerd's CRI plugin produce.

    systemd: ``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope``
    with the UID's dashes escaped to underscores; cgroupfs: ``/kubepods/<qos>/pod<uid>/<id>``.
    Guaranteed pods sit directly below the top-level ``kubepods`` cgroup.
    """
    if cgroup_driver == "systemd":
        escaped = pod_uid.replace("-", "_")
        if qos == "guaranteed":
            return "/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (escaped, container_id)
        return "/kubepods.slice/kubepods-%s.slice/kubepods-%s-pod%s.slice/cri-containerd-%s.scope" % (
            qos,
            qos,
            escaped,
            container_id,
        )
    if cgroup_driver == "cgroupfs":
        if qos == "guaranteed":
            return "/kubepods/pod%s/%s" % (pod_uid, container_id)
        return "/kubepods/%s/pod%s/%s" % (qos, pod_uid, container_id)
    raise ValueError("unknown cgroup driver %r" % cgroup_driver)


# ---------------------------------------------------------------------------------------------
# Running things in the node


def _node_run(node_enter_argv, argv, *, input_text=None, timeout=60, check=True, stdout=None, stderr=None):
    env = dict(os.environ, PATH=_PATH)
    capture = stdout is None and stderr is None
    proc = subprocess.run(
        list(node_enter_argv) + list(argv),
        input=input_text,
        stdin=None if input_text is not None else subprocess.DEVNULL,
        stdout=stdout if stdout is not None else (subprocess.PIPE if capture else None),
        stderr=stderr if stderr is not None else (subprocess.PIPE if capture else None),
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and proc.returncode != 0:
        raise PodError(
            "%s failed (rc %d): %s" % (" ".join(argv[:4]), proc.returncode, (proc.stderr or proc.stdout or "").strip())
        )
    return proc


def _node_python(node_enter_argv, script, payload=None, timeout=60):
    proc = _node_run(node_enter_argv, [NODE_PYTHON, "-c", script], input_text=json.dumps(payload or {}), timeout=timeout)
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def _runc(node_enter_argv, runc_root, *args, check=True, timeout=60):
    # runc creates its --root on every command; only `run` may (cleanup must leave nothing behind).
    guard = 'test -d "$1" || { echo "runc root $1 does not exist" >&2; exit 3; }; shift; exec "$@"'
    argv = ["sh", "-c", guard, "sh", runc_root, RUNC, "--root", runc_root, *args]
    return _node_run(node_enter_argv, argv, check=check, timeout=timeout)


# Reads the node's NVIDIA device nodes, /proc/devices and bounding set, and which top-level
# directories are symlinks (merged /usr).
_NODE_FACTS = r"""
import json, os, stat
devices = []
for top, dirs, files in os.walk("/dev"):
    dirs.sort()
    for name in sorted(files):
        path = os.path.join(top, name)
        if not path.startswith("/dev/nvidia"):
            continue
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            devices.append({"path": path, "type": "c" if stat.S_ISCHR(st.st_mode) else "b",
                            "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                            "fileMode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid})
majors = {}
section = None
for line in open("/proc/devices"):
    line = line.strip()
    if line.endswith(":"):
        section = line[:-1]
    elif line and section == "Character devices":
        num, name = line.split(None, 1)
        majors.setdefault(name, int(num))
capbnd = 0
for line in open("/proc/self/status"):
    if line.startswith("CapBnd:"):
        capbnd = int(line.split()[1], 16)
tops = {}
for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
        tops[top] = os.readlink(top)
    elif os.path.isdir(top):
        tops[top] = None
print(json.dumps({"devices": devices, "majors": majors, "capbnd": capbnd, "tops": tops}))
"""


def node_facts(node_enter_argv) -> dict:
    return _node_python(node_enter_argv, _NODE_FACTS)


# ---------------------------------------------------------------------------------------------
# OCI config


def _rule(major, minor, access, allow=True, dev_type="c"):
    rule = {"allow": allow, "type": dev_type, "access": access}
    if major is not None:
        rule["major"] = major
    if minor is not None:
        rule["minor"] = minor
    return rule


def _gpu_minors_on_node(facts) -> list[int]:
    return sorted(
        d["minor"] for d in facts["devices"] if d["major"] == NVIDIA_MAJOR and d["path"][len("/dev/nvidia") :].isdigit()
    )


def _uvm_major(facts) -> int | None:
    if "nvidia-uvm" in facts["majors"]:
        return facts["majors"]["nvidia-uvm"]
    for dev in facts["devices"]:
        if dev["path"] == "/dev/nvidia-uvm":
            return dev["major"]
    return None


def device_plan(spec: ContainerSpec, facts: dict) -> tuple[list[dict], list[dict]]:
    """(linux.devices, linux.resources.devices) for the spec on a node with these facts."""
    by_path = {d["path"]: d for d in facts["devices"]}
    if spec.privileged:
        return [dict(d) for d in facts["devices"]], [dict(ALLOW_ALL)]
    node_minors = _gpu_minors_on_node(facts)
    minors = sorted(set(spec.gpu_minors) | set(spec.visible_minors(node_minors)))
    inject: list[dict] = []
    rules: list[dict] = [dict(DENY_ALL)] + [dict(r) for r in STANDARD_DEVICE_RULES]
    if minors:
        uvm = _uvm_major(facts)
        paths = ["/dev/nvidia%d" % m for m in minors] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        for path in paths:
            if path in by_path:
                inject.append(dict(by_path[path]))
        if not spec.lost_gpu_access:
            rules += [_rule(NVIDIA_MAJOR, m, "rw") for m in minors]
            rules.append(_rule(NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw"))
            if uvm is not None:
                rules.append(_rule(uvm, None, "rw"))
    for extra in spec.extra_devices:
        extra = {"path": extra} if isinstance(extra, str) else dict(extra)
        dev = by_path.get(extra["path"])
        if dev is None:
            raise PodError("extra device %s is not a device node of the node" % extra["path"])
        if extra.get("inject", True) and dev not in inject:
            inject.append(dict(dev))
        if extra.get("access", "rw"):
            rules.append(_rule(dev["major"], dev["minor"], extra.get("access", "rw"), extra.get("allow", True), dev["type"]))
    return inject, rules


def _caps(spec: ContainerSpec, facts: dict) -> list[str]:
    if not spec.privileged:
        return list(DEFAULT_CAPS)
    return [name for bit, name in enumerate(CAP_NAMES) if facts["capbnd"] >> bit & 1]


def oci_config(spec: ContainerSpec, facts: dict) -> dict:
    """The config.json for the spec (rootfs ``rootfs`` next to it)."""
    devices, rules = device_plan(spec, facts)
    caps = _caps(spec, facts)
    env = {"PATH": _PATH, "HOSTNAME": spec.pod_name}
    env.update(spec.env)
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=1777", "size=65536k"]},
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"]},
        {"destination": "/etc", "type": "bind", "source": "/etc", "options": ["rbind", "ro", "nosuid", "nodev"]},
    ]  # fmt: skip
    for top, target in sorted(facts["tops"].items()):
        if target is None:  # a real directory (not merged-/usr): bind it too
            mounts.append({"destination": top, "type": "bind", "source": top, "options": ["rbind", "ro", "nosuid", "nodev"]})
    linux = {
        "cgroupsPath": spec.cgroup_path,
        "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")],
        "devices": devices,
        "resources": {"devices": rules},
    }
    if not spec.privileged:
        linux["maskedPaths"] = list(MASKED_PATHS)
        linux["readonlyPaths"] = list(READONLY_PATHS)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(spec.args),
            "env": ["%s=%s" % item for item in env.items()],
            "cwd": "/",
            "capabilities": {k: list(caps) for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": not spec.privileged,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": spec.pod_name[:63],
        "mounts": mounts,
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": spec.container_name,
            "io.kubernetes.cri.sandbox-name": spec.pod_name,
            "io.kubernetes.cri.sandbox-namespace": spec.namespace,
            "io.kubernetes.cri.sandbox-uid": spec.pod_uid,
        },
        "linux": linux,
    }


_WRITE_BUNDLE = r"""
import json, os, shutil, sys
p = json.load(sys.stdin)
bundle = p["bundle"]
if os.path.isdir(bundle):
    shutil.rmtree(bundle)
rootfs = os.path.join(bundle, "rootfs")
for d in ("proc", "dev", "sys", "tmp", "usr", "etc", "run", "root"):
    os.makedirs(os.path.join(rootfs, d), exist_ok=True)
for top, target in p["tops"].items():
    link = os.path.join(rootfs, top.lstrip("/"))
    if target is None:
        os.makedirs(link, exist_ok=True)
    else:
        os.symlink(target, link)
with open(os.path.join(bundle, "config.json"), "w") as f:
    json.dump(p["config"], f, indent=1)
print(json.dumps({"bundle": bundle}))
"""


def write_bundle(node_enter_argv, spec: ContainerSpec, bundle_root: str, facts: dict | None = None) -> str:
    """Write the OCI bundle for ``spec`` under ``bundle_root`` (a node path); returns its path."""
    facts = facts or node_facts(node_enter_argv)
    bundle = str(Path(bundle_root) / spec.container_id)
    payload = {"bundle": bundle, "tops": facts["tops"], "config": oci_config(spec, facts)}
    _node_python(node_enter_argv, _WRITE_BUNDLE, payload)
    return bundle


# ---------------------------------------------------------------------------------------------
# Container lifecycle


def container_state(node_enter_argv, container_id: str, runc_root: str = RUNC_ROOT) -> dict | None:
    """runc's state (``status``, ``pid``, ``bundle``...) or None when there is no such container."""
    proc = _runc(node_enter_argv, runc_root, "state", container_id, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def list_containers(node_enter_argv, runc_root: str = RUNC_ROOT) -> list[dict]:
    proc = _runc(node_enter_argv, runc_root, "list", "--format", "json", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return json.loads(proc.stdout) or []


def start_container(node_enter_argv, spec: ContainerSpec, bundle_root: str, runc_root: str = RUNC_ROOT) -> int:
    """Create and start the container (idempotent); returns its init PID (the node shares the host's
    PID namespace, so this is a host PID too)."""
    state = container_state(node_enter_argv, spec.container_id, runc_root)
    if state and state.get("status") == "running":
        return int(state["pid"])
    if state:
        delete_container(node_enter_argv, spec.container_id, runc_root)
    bundle = write_bundle(node_enter_argv, spec, bundle_root)
    # The init inherits runc's stdio: a pipe would keep the caller waiting for EOF, so use a file.
    log = _node_run(
        node_enter_argv,
        [
            "sh", "-c",
            'mkdir -p "$1" && "$2" --root "$1" run --detach --bundle "$3" "$4" </dev/null >"$3/stdio.log" 2>&1'
            ' || { rc=$?; cat "$3/stdio.log" >&2; exit $rc; }',
            "sh", runc_root, RUNC, bundle, spec.container_id,
        ],
        check=False,
    )  # fmt: skip
    state = container_state(node_enter_argv, spec.container_id, runc_root)
    if log.returncode != 0 or not state or state.get("status") != "running":
        if state:
            delete_container(node_enter_argv, spec.container_id, runc_root)
        raise PodError("runc run %s failed: %s" % (spec.container_id[:12], (log.stderr or log.stdout).strip()))
    return int(state["pid"])


def stop_container(node_enter_argv, container, runc_root: str = RUNC_ROOT, timeout: float = 10) -> None:
    """SIGKILL the container's processes and wait until runc reports it stopped (idempotent)."""
    container_id = _cid(container)
    state = container_state(node_enter_argv, container_id, runc_root)
    if not state or state.get("status") == "stopped":
        return
    _runc(node_enter_argv, runc_root, "kill", "--all", container_id, "KILL", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = container_state(node_enter_argv, container_id, runc_root)
        if not state or state.get("status") == "stopped":
            return
        time.sleep(0.05)
    raise PodError("container %s did not stop" % container_id[:12])


def delete_container(node_enter_argv, container, runc_root: str = RUNC_ROOT) -> None:
    """Kill and delete the container and its own cgroup (idempotent); pod/QoS cgroups stay."""
    container_id = _cid(container)
    if container_state(node_enter_argv, container_id, runc_root) is None:
        return
    proc = _runc(node_enter_argv, runc_root, "delete", "--force", container_id, check=False)
    if proc.returncode != 0 and container_state(node_enter_argv, container_id, runc_root) is not None:
        raise PodError("runc delete %s failed: %s" % (container_id[:12], proc.stderr.strip()))


_REMOVE_CGROUPS = r"""
import json, os, sys, time
p = json.load(sys.stdin)
mount = p["mount"]
removed, failed = [], []

def wait_empty(path):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(path, "cgroup.events")) as f:
                if "populated 0" in f.read():
                    return
        except OSError:
            return
        time.sleep(0.01)

def remove_tree(path):
    if not os.path.isdir(path):
        return
    for top, dirs, _files in os.walk(path, topdown=False):
        try:
            with open(os.path.join(top, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
        wait_empty(top)
        for attempt in range(100):
            try:
                os.rmdir(top)
                removed.append(top[len(mount):] or "/")
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if attempt == 99:
                    failed.append("%s: %s" % (top, exc))
                time.sleep(0.02)

for rel in p["trees"]:
    remove_tree(os.path.join(mount, rel.lstrip("/")))
for rel in p["parents"]:
    path = os.path.join(mount, rel.lstrip("/"))
    while path.startswith(mount + "/") and os.path.isdir(path):
        try:
            os.rmdir(path)  # only empty ones: no kill above the container's own cgroup
        except OSError:
            break
        removed.append(path[len(mount):])
        path = os.path.dirname(path)
print(json.dumps({"removed": removed, "failed": failed}))
"""


def remove_cgroups(node_enter_argv, trees=(), parents=()) -> list[str]:
    """Kill and remove every cgroup under each of ``trees``, depth first (cgroup.kill, wait until
    unpopulated, rmdir); then rmdir each of ``parents`` and its ancestors while they are empty."""
    result = _node_python(
        node_enter_argv, _REMOVE_CGROUPS, {"mount": CGROUP_MOUNT, "trees": list(trees), "parents": list(parents)}
    )
    if result["failed"]:
        raise PodError("cgroups left behind: %s" % "; ".join(result["failed"]))
    return result["removed"]


def cleanup_all(
    node_enter_argv, runc_root: str = RUNC_ROOT, cgroup_roots=KUBEPODS_ROOTS, bundle_root: str | None = None
) -> list[str]:
    """Kill and delete every container under ``runc_root``, then remove the container, pod and
    QoS cgroups (every cgroup under ``cgroup_roots``) depth first.  Returns the removed cgroups."""
    cgroups = []
    for entry in list_containers(node_enter_argv, runc_root):
        bundle = entry.get("bundle")
        if bundle:
            try:
                config = json.loads(_node_run(node_enter_argv, ["cat", bundle + "/config.json"]).stdout)
                cgroups.append(config["linux"]["cgroupsPath"])
            except (PodError, ValueError, KeyError):
                pass
        delete_container(node_enter_argv, entry["id"], runc_root)
    removed = remove_cgroups(node_enter_argv, trees=list(cgroup_roots) + cgroups, parents=cgroups)
    cleanup = ['rm -rf -- "$1"']
    args = [runc_root]
    if bundle_root:
        cleanup.append('rm -rf -- "$2"')
        args.append(bundle_root)
    _node_run(node_enter_argv, ["sh", "-c", "; ".join(cleanup), "sh", *args])
    return removed


# ---------------------------------------------------------------------------------------------
# Asking the kernel


@dataclass
class ProbeResult:
    """The kernel's answer: ``verdict`` is "allowed", "denied" or "inconclusive"; ``errno`` the
    errno name (None when the open/mknod succeeded)."""

    verdict: str
    errno: str | None
    path: str
    access: str

    @property
    def allowed(self) -> bool:
        return self.verdict == "allowed"


# EPERM is the device cgroup's answer.  ENXIO/ENODEV come from the char-device lookup after the
# cgroup said yes (no driver behind the node).  EACCES (file mode) and the rest are checked before
# the cgroup, so they say nothing about it.
_ALLOWED_ERRNOS = {None, "ENXIO", "ENODEV"}

_PROBE = r"""
import errno, json, os, stat, sys
path, access = sys.argv[1], sys.argv[2]
err = None
try:
    if access == "m":
        st = os.stat(path)
        kind = stat.S_IFCHR if stat.S_ISCHR(st.st_mode) else stat.S_IFBLK
        target = os.path.join(os.environ.get("PROBE_TMP", "/tmp"), ".gpuharden-mknod-%d" % os.getpid())
        os.mknod(target, kind | 0o600, st.st_rdev)
        os.unlink(target)
    else:
        flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}[access]
        os.close(os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY))
except OSError as exc:
    err = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"errno": err}))
"""


def _probe_result(proc, path, access) -> ProbeResult:
    if proc.returncode != 0:
        raise PodError("probe of %s (%s) failed: %s" % (path, access, (proc.stderr or proc.stdout).strip()))
    err = json.loads(proc.stdout.strip().splitlines()[-1])["errno"]
    if err in _ALLOWED_ERRNOS:
        verdict = "allowed"
    elif err == "EPERM":
        verdict = "denied"
    else:
        verdict = "inconclusive"
    return ProbeResult(verdict, err, path, access)


_ACCESS_ALIASES = {"read": "r", "write": "w", "readwrite": "rw", "mknod": "m", "wr": "rw"}


def _check_access(access: str) -> str:
    access = _ACCESS_ALIASES.get(access, access)
    if access not in ACCESS_MODES:
        raise ValueError("access must be one of %s (or read/write/mknod), not %r" % (ACCESS_MODES, access))
    return access


def _cid(container) -> str:
    return container.container_id if isinstance(container, ContainerSpec) else container


def exec_probe(node_enter_argv, container, path: str, access: str, runc_root: str = RUNC_ROOT) -> ProbeResult:
    """Open ``path`` (as the container sees it) for ``access`` r/w/rw, or mknod a copy of it (m),
    from a process started in the container with ``runc exec``.  ``container``: a spec or an ID."""
    access = _check_access(access)
    proc = _runc(node_enter_argv, runc_root, "exec", _cid(container), NODE_PYTHON, "-c", _PROBE, path, access, check=False)
    return _probe_result(proc, path, access)


def probe_from_cgroup(node_enter_argv, cgroup_path: str, device_path: str, access: str) -> ProbeResult:
    """The kernel's verdict for ``access`` to the node's ``device_path`` from inside ``cgroup_path``
    (relative to the node's cgroup2 root): a child joins the cgroup first, then opens/mknods."""
    access = _check_access(access)
    procs = "%s/%s/cgroup.procs" % (CGROUP_MOUNT, cgroup_path.strip("/"))
    proc = _node_run(
        node_enter_argv,
        ["sh", "-c", 'echo $$ > "$1" && exec "$2" -c "$3" "$4" "$5"', "sh", procs, NODE_PYTHON, _PROBE, device_path, access],
        check=False,
    )
    return _probe_result(proc, device_path, access)


# ---------------------------------------------------------------------------------------------
# Minimal bpf(2): which device programs are attached to a cgroup

_NR_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_QUERY = 16
BPF_CGROUP_DEVICE = 6
BPF_F_QUERY_EFFECTIVE = 1


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    nr = _NR_BPF[os.uname().machine]
    ret = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, "bpf(%d): %s" % (cmd, os.strerror(err)))
    return ret


def attached_device_programs(cgroup_dir: str | os.PathLike, effective: bool = False) -> list[int]:
    """IDs of the BPF_CGROUP_DEVICE programs on ``cgroup_dir`` (a path in the caller's view):
    BPF_PROG_QUERY; ``effective`` includes the ancestors' programs that apply."""
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        count = 16
        while True:
            ids = (ctypes.c_uint32 * count)()
            attr = ctypes.create_string_buffer(144)
            ctypes.c_uint32.from_buffer(attr, 0).value = fd
            ctypes.c_uint32.from_buffer(attr, 4).value = BPF_CGROUP_DEVICE
            ctypes.c_uint32.from_buffer(attr, 8).value = BPF_F_QUERY_EFFECTIVE if effective else 0
            ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(ids)
            ctypes.c_uint32.from_buffer(attr, 24).value = count
            try:
                _bpf(BPF_PROG_QUERY, attr)
            except OSError as exc:
                if exc.errno == errno_mod.ENOSPC:
                    count = ctypes.c_uint32.from_buffer(attr, 24).value
                    continue
                raise
            return list(ids[: ctypes.c_uint32.from_buffer(attr, 24).value])
    finally:
        os.close(fd)
