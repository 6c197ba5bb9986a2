# SPDX-License-Identifier: GPL-3.0-or-later
"""Thin wrappers over the host tools the lab drives: ip, cgroupfs, processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

# How many nodes the lab works on at once where their steps are independent (service start-up, NVML process
# lists): enough to overlap the waits for child processes, few enough for a 2-core machine.
NODE_WORKERS = 4


class LabError(Exception):
    """The lab's one exception type: a clear message about what could not be set up or torn down."""


def run(argv: list[str], *, check: bool = True, capture: bool = True, **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(argv, capture_output=capture, text=True, check=False, **kwargs)
    if check and completed.returncode != 0:
        raise LabError("%s failed (rc=%d): %s" % (" ".join(argv), completed.returncode, (completed.stderr or "").strip()))
    return completed


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root: it creates network namespaces, device nodes (mknod), mounts and cgroups; "
            "run it with sudo or as root"
        )


def cgroup_exec_prefix(*cgroups: Path) -> list[str]:
    """argv prefix that moves the process into each of ``cgroups`` (one per hierarchy) before exec'ing the rest."""
    return ["sh", "-c", 'set -e; for c in $0; do echo $$ > "$c/cgroup.procs"; done; exec "$@"', " ".join(map(str, cgroups))]


def cgroup_v1_hierarchies() -> list[Path]:
    """Where the host mounts its cgroup v1 hierarchies (a hybrid host's /sys/fs/cgroup/<controllers>), from
    /proc/self/mountinfo; none on a cgroup2-only host."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype == "cgroup" and Path(fields[4]) not in found:
            found.append(Path(fields[4]))
    return found


def make_cgroup_v1(path: Path) -> None:
    """``mkdir -p`` in a v1 hierarchy.  A new v1 cpuset cgroup starts without CPUs or memory nodes, and no process
    can join it then, so each new level gets its parent's."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (directory / name).exists():
                (directory / name).write_text((directory.parent / name).read_text())


def spawn(argv: list[str], *, log: Path, cgroup: Path | None = None, v1_cgroups: tuple[Path, ...] = (),
          env: dict | None = None, cwd=None) -> int:
    """Start a long-running process detached from us, in ``cgroup`` (and, on a hybrid host, in ``v1_cgroups``);
    returns its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if cgroup is not None:
        cgroup.mkdir(parents=True, exist_ok=True)
        for v1_cgroup in v1_cgroups:
            make_cgroup_v1(v1_cgroup)
        argv = cgroup_exec_prefix(cgroup, *v1_cgroups) + argv
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, cwd=cwd,
        )
    return process.pid


def wait_for_tcp(host: str, port: int, timeout: float, *, what: str, log: Path | None = None) -> float:
    """Seconds until ``host:port`` accepts a connection; LabError (with the log's tail) on timeout."""
    start = time.monotonic()
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return time.monotonic() - start
        except OSError:
            if time.monotonic() - start > timeout:
                tail = ""
                if log is not None and log.exists():
                    tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise LabError("%s did not come up on %s:%d within %.0fs%s" % (what, host, port, timeout, tail)) from None
            time.sleep(0.05)


def kill_cgroup_tree(cgroup: Path, timeout: float = 10.0) -> None:
    """Kill every process in ``cgroup`` and below, then remove the directories depth-first."""
    if not cgroup.exists():
        return
    kill_file = cgroup / "cgroup.kill"
    if kill_file.exists():
        kill_file.write_text("1")
    else:  # kernels before 5.14: signal each member
        for procs in cgroup.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + timeout
    directories = sorted((path for path in cgroup.rglob("*") if path.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for directory in [*directories, cgroup]:
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise LabError("cannot remove cgroup %s: processes are still in it" % directory) from None
                time.sleep(0.05)
