# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the real containerd and kubelet (built by lab/realcomponents/build-*.sh) standalone in a temp root.

Every daemon runs in its own session inside a private mount namespace (`unshare --mount --propagation private`),
with every path it would create on the host (root, state, sockets, plugin and CNI dirs, the kubelet's root and cert
dirs, /var/log/containers) moved into the temp root; it is bounded by timeouts and killed (its whole process group)
when the test ends. HOST_PATHS lists the host locations these daemons use by default; tests assert that none of
them appears while they run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomlkit
from gpuharden_lab import realnode

from tests.builds import skip_unbuilt

# Defaults of containerd (v2 defaults/defaults_linux.go, defaults_unix.go, plugins/services/opt/path_unix.go,
# internal/cri/config/config_unix.go, plugins/imageverifier/path_unix.go; containerd/nri pkg/adaptation defaults) and
# of the kubelet (cmd/kubelet/app/options/options.go root dir, pkg/kubelet/kubelet.go DefaultContainerLogsDir).
HOST_PATHS = ("/var/lib/containerd", "/run/containerd", "/opt/containerd", "/etc/cni/net.d", "/opt/cni/bin",
              "/var/run/nri", "/etc/nri", "/etc/cdi", "/var/run/cdi", "/var/lib/kubelet", "/var/log/pods",
              "/var/log/containers", "/etc/kubernetes/manifests")


def binary(directory: str, name: str, target: str) -> Path:
    """The built binary, or skip the test naming the make target that builds it."""
    path = realnode.CACHE / directory / name
    if not os.access(path, os.X_OK):
        skip_unbuilt("%s not built: run `make %s`" % (path, target))
    return path


def containerd_bin(version: str) -> Path:
    return binary("containerd-" + version, "containerd", "real-containerd")


def ctr_bin(version: str) -> Path:
    return binary("containerd-" + version, "ctr", "real-containerd")


def cri_status_bin() -> Path:
    return binary("containerd-" + versions()["CONTAINERD_VERSION"], "cri-status", "real-containerd")


def kubelet_bin() -> Path:
    return binary("kubelet-" + versions()["K8S_VERSION"], "kubelet", "real-kubelet")


versions = realnode.versions  # the one reader of versions.env and the control plane's K8S_VERSION


def host_paths_present() -> dict[str, bool]:
    return {path: os.path.lexists(path) for path in HOST_PATHS}


def host_sysctls() -> dict[str, str]:
    return {name: Path("/proc/sys", name).read_text() for name in KUBELET_SYSCTLS}


# ---------------------------------------------------------------------------------------------
# processes


@dataclass
class Daemon:
    """A daemon started in its own session (process group); stop() kills the whole group."""

    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None
    extra: dict = field(default_factory=dict)

    def start(self, env: dict | None = None, cwd: str | None = None) -> Daemon:
        handle = open(self.log, "ab")  # noqa: SIM115 - owned by the child, closed in stop()
        self.extra["handle"] = handle
        self.process = subprocess.Popen(self.argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=env, cwd=cwd)
        return self

    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.process is not None:
            try:  # anything left in the group (shims would be here)
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait(timeout=5)
        handle = self.extra.pop("handle", None)
        if handle:
            handle.close()


def wait_for(predicate, timeout: float, daemon: Daemon | None = None, interval: float = 0.1):
    """predicate() until truthy; None when the daemon exits or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if daemon is not None and daemon.returncode() is not None:
            return predicate() or None
        time.sleep(interval)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# containerd: keep a node's config off the host


def _set(container, keys, value):
    for key in keys[:-1]:
        if key not in container:
            container[key] = tomlkit.table(is_super_table=True)
        container = container[key]
    container[keys[-1]] = value


def _has(container, keys) -> bool:
    for key in keys:
        if not hasattr(container, "get") or key not in container:
            return False
        container = container[key]
    return True


def jail_containerd(root: Path, main: str, files: list[str], daemon_version: str) -> dict:
    """Rewrite the config files containerd will read (node paths, main first) so that everything it creates stays
    under root: root/state/temp, the gRPC/ttrpc sockets, absolute imports, CNI/CDI dirs, the opt plugin's path;
    NRI disabled. Only these keys change (parsed with tomlkit, the rest of each file stays byte for byte).

    Returns {"config": host path of the main file, "socket": its gRPC socket}. containerd 1.x replaces a whole
    plugin table with the one of the last file that defines it (2.x merges key by key), so the CRI keys go into
    every file that defines the CRI section there, and into the main file otherwise.
    """
    run = root / "run"
    run.mkdir(parents=True, exist_ok=True)
    sock = run / "containerd.sock"
    for directory in ("state", "varlib", "tmp", "opt", "cni/net.d", "cni/bin", "cdi", "cdi-run", "verifier"):
        (run.parent / "jail" / directory).mkdir(parents=True, exist_ok=True)
    jail = run.parent / "jail"
    docs = {}
    for path in files:
        host = root / path.lstrip("/")
        docs[path] = tomlkit.parse(host.read_text())
    version = docs[main].get("version", 1)
    if version >= 3:
        cri = ("plugins", "io.containerd.cri.v1.runtime")
        cni = {"bin_dirs": [str(jail / "cni/bin")], "conf_dir": str(jail / "cni/net.d")}
    else:
        cri = ("plugins", "io.containerd.grpc.v1.cri")
        cni = {"bin_dir": str(jail / "cni/bin"), "conf_dir": str(jail / "cni/net.d")}
    main_doc = docs[main]
    for key, value in (("root", str(jail / "varlib")), ("state", str(jail / "state")), ("temp", str(jail / "tmp"))):
        main_doc[key] = value
    # the server sockets: top-level [grpc]/[ttrpc] up to config version 3; containerd 2.4 reads them from the server
    # plugins in version 4 and moves the top-level ones there only for older files (v2.4.2
    # cmd/containerd/server/config/config.go serviceMigrate): a version-4 file's top-level [grpc] is ignored.
    _set(main_doc, ("grpc", "address"), str(sock))
    _set(main_doc, ("ttrpc", "address"), str(sock) + ".ttrpc")
    _set(main_doc, ("plugins", "io.containerd.internal.v1.opt", "path"), str(jail / "opt"))
    # NRI off (containerd 1.7 pkg/nri/config.go, 2.x internal/nri/config.go: `disable`; 2.x still logs "using
    # experimental NRI integration" because the plugin exists, but it stays inactive and opens no socket)
    _set(main_doc, ("plugins", "io.containerd.nri.v1.nri", "disable"), True)
    if not daemon_version.startswith("v1."):
        _set(main_doc, ("plugins", "io.containerd.server.v1.grpc", "address"), str(sock))
        _set(main_doc, ("plugins", "io.containerd.server.v1.ttrpc", "address"), str(sock) + ".ttrpc")
        _set(main_doc, ("plugins", "io.containerd.image-verifier.v1.bindir", "bin_dir"), str(jail / "verifier"))
    holders = [path for path in files if _has(docs[path], cri)] if daemon_version.startswith("v1.") else []
    for path in holders or [main]:
        for key, value in cni.items():
            _set(docs[path], (*cri, "cni", key), value)
        _set(docs[path], (*cri, "cdi_spec_dirs"), [str(jail / "cdi"), str(jail / "cdi-run")])
    for path, doc in docs.items():
        imports = doc.get("imports")
        if imports is not None:
            doc["imports"] = [str(root) + item if str(item).startswith("/") else str(item) for item in imports]
        (root / path.lstrip("/")).write_text(tomlkit.dumps(doc))
    return {"config": root / main.lstrip("/"), "socket": sock, "jail": jail}


# A belt under the jail: in the daemon's private mount namespace /run, /var/lib and /opt are empty tmpfs, so a default
# path the jail missed lands there, never on the host (the test then fails: it cannot reach what the daemon made).
BELT = """
for dir in /run /var/lib /opt; do mount -t tmpfs -o size=16m,mode=0755 tmpfs "$dir"; done
"""


def start_containerd(version: str, config: Path, log: Path) -> Daemon:
    argv = ["unshare", "--mount", "--propagation", "private", "--fork", "--kill-child",
            "sh", "-c", "set -e\n" + BELT + 'exec "$@"', "containerd-wrapper",
            str(containerd_bin(version)), "--config", str(config), "--log-level", "info"]
    return Daemon(argv, log).start(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root"}, cwd=str(config.parent))


def ctr_version(version: str, sock: Path, timeout: float = 5) -> subprocess.CompletedProcess:
    return subprocess.run([str(ctr_bin(version)), "--address", str(sock), "--timeout", "3s", "version"],
                          capture_output=True, text=True, timeout=timeout, check=False)


def wait_containerd(daemon: Daemon, version: str, sock: Path, timeout: float = 30) -> bool:
    def answered():
        return sock.exists() and ctr_version(version, sock).returncode == 0

    return bool(wait_for(answered, timeout, daemon, interval=0.2))


def cri_status(sock: Path, timeout: float = 20) -> dict:
    done = subprocess.run([str(cri_status_bin()), "-endpoint", "unix://%s" % sock, "-timeout", "%ds" % timeout],
                          capture_output=True, text=True, timeout=timeout + 5, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cri_runtimes(status: dict) -> dict:
    """The runtimes of the CRI plugin's effective config (the verbose Status info, 1.7 and 2.x alike)."""
    config = status["info"].get("config") or {}
    return (config.get("containerd") or {}).get("runtimes") or {}


# ---------------------------------------------------------------------------------------------
# kubelet: standalone (no --kubeconfig), in a private mount + network namespace

# The kernel tunables the kubelet sets when they differ (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables; values from k8s.io/component-helpers node/util/sysctl/sysctl.go). vm.* and kernel.panic* are not
# namespaced: inside the kubelet's mount namespace each is a bind-mounted file already holding the wanted value, so
# the kubelet finds nothing to change and the host's values stay as they are.
KUBELET_SYSCTLS = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}

KUBELET_WRAPPER = "set -e\n" + BELT + r"""
ip link set lo up
# pkg/kubelet/kubelet.go creates ContainerLogsDir (/var/log/containers, not configurable) if it is missing
mount -t tmpfs -o size=8m,mode=0755 tmpfs /var/log
for entry in $GPUHARDEN_SYSCTLS; do
  name=${entry%%=*}; file="$GPUHARDEN_JAIL/sysctl/$(echo "$name" | tr / .)"
  echo "${entry#*=}" >"$file"
  mount --bind "$file" "/proc/sys/$name"
done
exec "$@"
"""


def start_kubelet(root: Path, jail: Path, log: Path, extra_args: list[str] | None = None) -> Daemon:
    """The real kubelet on the node tree under root: --config/--config-dir as the kubeadm unit passes them, its root
    and cert dirs in the tree, inside `unshare --mount --net` (loopback only: its ports are its own)."""
    (jail / "sysctl").mkdir(parents=True, exist_ok=True)
    argv = ["unshare", "--mount", "--net", "--propagation", "private", "--fork", "--kill-child",
            "sh", "-c", KUBELET_WRAPPER, "kubelet-wrapper", str(kubelet_bin()),
            "--config=%s" % (root / "var/lib/kubelet/config.yaml"),
            "--config-dir=%s" % (root / "etc/kubernetes/kubelet.conf.d"),
            "--root-dir=%s" % (root / "var/lib/kubelet"),
            "--cert-dir=%s" % (root / "var/lib/kubelet/pki"),
            "--hostname-override=gpuharden-real", "--v=2", *(extra_args or [])]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": "/root",
           "GPUHARDEN_JAIL": str(jail), "GPUHARDEN_SYSCTLS": " ".join("%s=%s" % item for item in KUBELET_SYSCTLS.items())}
    return Daemon(argv, log).start(env=env)


def in_netns(daemon: Daemon, argv: list[str], timeout: float = 5) -> subprocess.CompletedProcess:
    """Run argv in the daemon's network namespace (the unshare process holds it)."""
    return subprocess.run(["nsenter", "--net=/proc/%d/ns/net" % daemon.process.pid, *argv],
                          capture_output=True, text=True, timeout=timeout, check=False)


def kubelet_get(daemon: Daemon, url: str) -> str | None:
    done = in_netns(daemon, ["curl", "-sk", "--max-time", "3", "-f", url])
    return done.stdout if done.returncode == 0 else None


def wait_kubelet_healthy(daemon: Daemon, port: int = 10248, timeout: float = 90) -> bool:
    return bool(wait_for(lambda: kubelet_get(daemon, "http://127.0.0.1:%d/healthz" % port) == "ok", timeout, daemon, interval=0.5))


def kubelet_configz(daemon: Daemon, port: int = 10250) -> dict:
    text = kubelet_get(daemon, "https://127.0.0.1:%d/configz" % port)
    assert text, "no /configz answer"
    return json.loads(text)["kubeletconfig"]
