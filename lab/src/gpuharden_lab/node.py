# SPDX-License-Identifier: GPL-3.0-or-later
"""One lab node: a network namespace on the lab bridge, with private mount and cgroup namespaces,
its own /dev, driver views, /etc, /usr/local, /var/lib and /run, running a real OpenSSH server.

How a node is laid out on the host (``<lab>/nodes/<name>/``):
  root/            dev/, proc/devices, proc/driver/, sys/bus/pci/devices/ (see noderoot.py)
  upper/<layer>    the node's writes on top of the host's /etc, /usr/local and /var/lib (overlayfs)
  work/<layer>     overlayfs work directories
  launch.sh        runs in the node's network namespace, sets up the mounts and execs sshd
The sshd process holds the namespaces: ``enter_argv()`` runs a command inside the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpuharden_lab import layout
from gpuharden_lab.noderoot import build_node_root
from gpuharden_lab.system import LabError, cgroup_v1_hierarchies, run, spawn, wait_for_tcp

# /usr/bin holds what distribution packages install there (the NVIDIA container toolkit's runtime).
OVERLAY_LAYERS = {"/etc": "etc", "/usr/bin": "usr-bin", "/usr/local": "usr-local", "/var/lib": "var-lib", "/var/log": "var-log"}
SYSTEM_DEVICES = {  # path: (major, minor, mode)
    "null": (1, 3, 0o666), "zero": (1, 5, 0o666), "full": (1, 7, 0o666), "random": (1, 8, 0o666),
    "urandom": (1, 9, 0o666), "tty": (5, 0, 0o666),
    "kmsg": (1, 11, 0o644),  # the kubelet's OOM watcher opens it (pkg/kubelet/oom/oom_watcher_linux.go via kmsgparser)
}


@dataclass
class NodeSpec:
    """What a scenario says about one node."""

    name: str
    fixture: str | None  # None: a CPU-only node
    device_overrides: dict = field(default_factory=dict)
    driver_params: dict = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # absolute node path -> content
    labels: dict[str, str] = field(default_factory=dict)
    kubelet_unit: str = "kubelet"
    unschedulable: bool = False  # the Node is registered cordoned
    taints: list[dict] = field(default_factory=list)  # and with these taints
    python_missing: list[str] = field(default_factory=list)  # distributions the node's Python lacks
    real_containerd: str | None = None  # "2" or "1.7": the real containerd and kubelet run here (realnode.py)
    # "default": before containerd first starts, the real nvidia-ctk configures its nvidia runtime as the default one,
    # as NVIDIA's install guide has an admin do (realnode.NVIDIA_CTK_CONFIGURE); "operator": the GPU Operator's toolkit
    # and driver containers have run (operatornode.py); None: containerd's config as installed
    real_nvidia_runtime: str | None = None
    # Files a real node gets after its kubelet registered the Node, followed by a kubelet restart: what changed on a
    # node that had joined (a seed the real kubelet refuses at start, which a node that never joined could not show)
    seeded_after_join: dict[str, str] = field(default_factory=dict)
    # The node's NUMA nodes ({nodes, cpu_nodes, gpu_memory_nodes}, noderoot.numa_layout); None: the fixture's, else the host's
    numa: dict | None = None


@dataclass
class Node:
    spec: NodeSpec
    index: int

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def directory(self) -> Path:
        return layout.NODES_DIR / self.name

    @property
    def address(self) -> str:
        return layout.node_address(self.index)

    @property
    def netns(self) -> str:
        return layout.netns_name(self.index)

    @property
    def cgroup(self) -> Path:
        return layout.lab_cgroup() / "nodes" / self.name

    @property
    def pid_file(self) -> Path:
        return self.directory / "sshd.pid"

    def holder_pid(self) -> int:
        try:
            return int(self.pid_file.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            raise LabError("node %s is not running (no sshd pid in %s)" % (self.name, self.pid_file)) from None

    def enter_argv(self, *, net: bool = True) -> list[str]:
        """argv prefix that runs a command inside the node: in its cgroup subtree first (nsenter changes
        namespaces, not cgroup membership, and whatever the command starts — services through the
        systemctl stand-in — must die with the node), then in its namespaces."""
        exec_cgroup = self.cgroup / "system.slice" / "lab-exec.scope"
        exec_cgroup.mkdir(parents=True, exist_ok=True)
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(exec_cgroup)]
        argv += ["nsenter", "--target", str(self.holder_pid()), "--mount", "--cgroup", "--uts"]
        return argv + (["--net"] if net else [])

    def upper_path(self, node_path: str) -> Path:
        for prefix, layer in OVERLAY_LAYERS.items():
            if node_path == prefix or node_path.startswith(prefix + "/"):
                return self.directory / "upper" / layer / node_path[len(prefix) :].lstrip("/")
        raise LabError("node %s: file %s is outside the node's private trees %s" % (self.name, node_path, sorted(OVERLAY_LAYERS)))

    def write_file(self, node_path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Create or replace a file as the node sees it (goes into the node's overlay upper layer)."""
        target = self.upper_path(node_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        target.chmod(mode)

    def write_symlink(self, node_path: str, target: str) -> None:
        """Create or replace a symbolic link as the node sees it (in the node's overlay upper layer)."""
        link = self.upper_path(node_path)
        link.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(target)

    def write_live(self, node_path: str, content: str) -> None:
        """Write a file inside the running node (through its overlay, not behind its back)."""
        run(self.enter_argv() + ["--", "sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", node_path], input=content)

    def read_file(self, node_path: str) -> str | None:
        target = self.upper_path(node_path)
        if target.exists():
            return target.read_text()
        host = Path(node_path)
        return host.read_text() if host.exists() else None


def node_site_packages() -> Path | None:
    """site-packages of the lab's node Python (build/node-python), which the nodes see at the host's path."""
    found = sorted(layout.NODE_PYTHON.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def _dist_files(site_packages: Path, distribution: str) -> list[str]:
    """What an installed distribution put into site-packages (from its RECORD), as paths relative to it."""
    wanted = distribution.replace("-", "_").replace(".", "_").lower()
    for info in site_packages.glob("*.dist-info"):
        if info.name[: -len(".dist-info")].split("-", 1)[0].replace(".", "_").lower() != wanted:
            continue
        paths = {info.name}
        for line in (info / "RECORD").read_text().splitlines():
            path = line.rsplit(",", 2)[0]
            if path and not path.startswith("..") and not path.startswith(info.name + "/"):
                paths.add(path)
        return sorted(paths)
    raise LabError("node Python %s has no distribution %r to hide" % (site_packages, distribution))


def _hide_python_packages(node: Node) -> None:
    """Whiteouts in the node's overlay on the node Python's site-packages: on this node only, the
    distributions in python_missing are not installed (and installing them writes to the node's layer)."""
    site_packages = node_site_packages()
    if site_packages is None:
        raise LabError("node %s: python_missing needs the node Python (%s)" % (node.name, layout.NODE_PYTHON))
    upper = node.directory / "upper" / "node-python"
    (node.directory / "work" / "node-python").mkdir(parents=True, exist_ok=True)
    for distribution in node.spec.python_missing:
        for relative in _dist_files(site_packages, distribution):
            target = upper / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                os.mknod(target, stat.S_IFCHR, os.makedev(0, 0))  # overlayfs whiteout


def _system_devices(dev: Path) -> None:
    for name, (major, minor, mode) in SYSTEM_DEVICES.items():
        path = dev / name
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
        path.chmod(mode)
    for name in ("pts", "shm", "char"):
        (dev / name).mkdir(exist_ok=True)
    (dev / "shm").chmod(0o1777)
    os.symlink("pts/ptmx", dev / "ptmx")
    os.symlink("/proc/self/fd", dev / "fd")
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink("/proc/self/fd/%d" % number, dev / name)


# What a distribution's default root ~/.bashrc does in a shell that is not interactive (an ssh command's): nothing.
NODE_BASHRC = "# gpuharden lab node: root's ~/.bashrc; non-interactive shells stop here\ncase $- in *i*) ;; *) return ;; esac\n"


def _sshd_config(node: Node) -> str:
    return "\n".join(
        [
            "# gpuharden lab node %s" % node.name,
            "ListenAddress %s:22" % node.address,
            "HostKey %s" % (layout.SSH_DIR / "host_ed25519"),
            "PidFile %s" % node.pid_file,
            "AuthorizedKeysFile %s" % (layout.SSH_DIR / "authorized_keys"),
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def _launch_script(node: Node) -> str:
    directory = node.directory
    mounts = []
    for prefix, layer in OVERLAY_LAYERS.items():
        mounts.append(
            "mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s"
            % (prefix, directory / "upper" / layer, directory / "work" / layer, prefix)
        )
    if node.spec.real_containerd is not None:
        # containerd's overlayfs snapshotter needs a backing filesystem other than overlayfs (the node's /var/lib), and
        # the kubelet's stats and eviction manager read the same directory, so both see this one (realnode.py)
        mounts.append("mkdir -p /var/lib/containerd && mount -t tmpfs -o size=256m,mode=0711 tmpfs /var/lib/containerd")
    site_packages = node_site_packages()
    if node.spec.python_missing and site_packages is not None:
        mounts.append(
            "mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s"
            % (site_packages, directory / "upper" / "node-python", directory / "work" / "node-python", site_packages)
        )
    return """#!/bin/sh
# Runs inside the node's network namespace (ip netns exec); generated by gpuharden lab.
set -eu
# The lab already moved this process into the node's cgroup (before `ip netns exec`, which
# remounts /sys and so hides the host's cgroup2 mount here).
if [ "${1:-}" != inside ]; then
    exec unshare --mount --cgroup --uts --propagation private "$0" inside
fi
%(overlays)s
mount --bind %(root)s/dev /dev
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount --bind %(root)s/proc/driver /proc/driver
mount --bind %(root)s/proc/devices /proc/devices
mount --bind %(root)s/sys/bus/pci/devices /sys/bus/pci/devices
# the node's own NUMA nodes where it declares them (a Grace system's CPU-less GPU memory nodes): the kubelet's cadvisor
# counts the node<N> directories here
if [ -d %(root)s/sys/devices/system/node ]; then mount --bind %(root)s/sys/devices/system/node /sys/devices/system/node; fi
mount -t tmpfs -o mode=0755 tmpfs /run
# root's ~/.bashrc as a fresh node has it: bash reads it for every ssh command, and this machine's own one (pyenv
# init) costs about 0.15 CPU-s each time, more than sshd and the session together
if [ -e /root/.bashrc ]; then mount --bind %(directory)s/bashrc /root/.bashrc; fi
mkdir -p /run/sshd /run/systemd/system
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/system.slice/sshd.service
echo $$ > /sys/fs/cgroup/system.slice/sshd.service/cgroup.procs
ldconfig
hostname %(name)s 2>/dev/null || true
exec /usr/sbin/sshd -D -f %(directory)s/sshd_config -E %(directory)s/sshd.log
""" % {
        "overlays": "\n".join(mounts),
        "root": directory / "root",
        "directory": directory,
        "name": node.name,
    }


def prepare(node: Node) -> None:
    """Lay out the node's directory on the host (nothing runs yet)."""
    directory = node.directory
    if directory.exists():
        shutil.rmtree(directory)
    for layer in OVERLAY_LAYERS.values():
        (directory / "upper" / layer).mkdir(parents=True)
        (directory / "work" / layer).mkdir(parents=True)
    root = build_node_root(
        directory / "root",
        node.spec.fixture,
        device_overrides=node.spec.device_overrides,
        driver_params=node.spec.driver_params,
        # the real device plugin on real nodes reads the capability files for its MIG strategies
        mig_capabilities=node.spec.real_containerd is not None,
        numa=node.spec.numa,
    )
    _system_devices(directory / "root" / "dev")
    if root.fixture is not None:
        # The double's defaults (/etc/nvml-double/fixture.json, /var/lib/nvml-double/state.json) are node-private.
        node.write_file("/etc/nvml-double/fixture.json", root.fixture.read_text())
        (node.upper_path("/var/lib/nvml-double")).mkdir(parents=True, exist_ok=True)
    for path, content in node.spec.files.items():
        node.write_file(path, content)
    if node.spec.python_missing:
        _hide_python_packages(node)
    (directory / "sshd_config").write_text(_sshd_config(node))
    (directory / "bashrc").write_text(NODE_BASHRC)
    launcher = directory / "launch.sh"
    launcher.write_text(_launch_script(node))
    launcher.chmod(0o755)


def start(node: Node, timeout: float = 15.0) -> float:
    """Create the namespace and veth, launch sshd; returns seconds until SSH answered."""
    run(["ip", "netns", "add", node.netns])
    veth = layout.host_veth(node.index)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
    run(["ip", "link", "set", veth, "master", layout.BRIDGE, "up"])
    run(["ip", "-n", node.netns, "addr", "add", "%s/%d" % (node.address, layout.PREFIX_LENGTH), "dev", "eth0"])
    run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
    run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
    node.cgroup.mkdir(parents=True, exist_ok=True)
    # A real node's pods are runc containers in the host's v1 hierarchies (hybrid host): the node's cgroup namespace
    # is rooted at a cgroup of its own in each of them too, so its pods' cgroups nest there and go with the node.
    v1_cgroups = () if node.spec.real_containerd is None else tuple(
        layout.in_v1_hierarchy(node.cgroup, hierarchy) for hierarchy in cgroup_v1_hierarchies())
    spawn(
        ["ip", "netns", "exec", node.netns, str(node.directory / "launch.sh")],
        log=node.directory / "launch.log",
        cgroup=node.cgroup,
        v1_cgroups=v1_cgroups,
    )
    return wait_for_tcp(node.address, 22, timeout, what="sshd of node %s" % node.name, log=node.directory / "launch.log")


def run_in(node: Node, argv: list[str], **kwargs):
    """Run a command inside the node (as root, all of its namespaces)."""
    return run(node.enter_argv() + ["--"] + argv, **kwargs)
