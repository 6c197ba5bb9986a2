# SPDX-License-Identifier: GPL-3.0-or-later
"""Runs the real NVIDIA device plugin for the plugin pods bound to a real node (realnode.py), as the container would.

Pods run on the lab's real nodes, but only with the one image the lab imports there (the sandbox image, realnode.py):
no registry is reachable, so the plugin pod's own container waits in ErrImagePull.  This lab service, inside the node,
starts the real ``nvidia-device-plugin`` binary for each plugin pod the apiserver has on the node instead, and stops it
when the pod goes.  Everything it runs with comes from the live objects:
- the binary: the image tag's release, built by lab/realcomponents (another tag is an image the lab does not have:
  nothing runs, as with ErrImagePull);
- argv and environment: the container's command, args and env (values and the spec.nodeName field);
- files: each ConfigMap volume, mounted at its mountPath in the plugin's private mount namespace;
- NVML: only when the NVIDIA runtime would have prepared the container, i.e. the pod's RuntimeClass handler (or, with
  none, containerd's default runtime) is a runtime of the node's real containerd (``containerd config dump``) whose
  BinaryName is the NVIDIA container runtime.  Otherwise the driver library directory is empty for the plugin, and the
  real plugin fails as it does in a container the toolkit did not prepare.  A handler containerd does not have: no
  sandbox, so nothing runs (containerd's "no runtime for ... is configured").
The plugin registers with the real kubelet through /var/lib/kubelet/device-plugins/kubelet.sock, so allocatable,
health and re-registration are the kubelet's.  A plugin that exits is started again after a back-off (10 s, doubling
to 60 s), as the kubelet restarts a crashing container.  Its output goes to
/var/log/gpuharden-lab/device-plugin/<namespace>_<pod>.log; this service's decisions to its own unit log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from gpuharden_lab.realnode import CACHE
from gpuharden_lab.standins.kubelet import is_device_plugin_container

LOG_DIR = Path("/var/log/gpuharden-lab/device-plugin")
POD_FILES = Path("/run/gpuharden-lab/plugin-pods")
DRIVER_LIBRARY_DIR = "/usr/local/nvidia/lib64"
NVIDIA_RUNTIME = "nvidia-container-runtime"
CRI_PLUGINS = ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri")  # containerd 2.x, 1.x


def say(message: str) -> None:
    sys.stderr.write("%s plugin-runner: %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


@dataclass
class Running:
    pod: dict
    process: subprocess.Popen | None = None
    exits: int = 0
    next_start: float = 0.0
    blocked: str = ""  # why nothing runs for this pod (no image, no runtime)


def plugin_container(pod: dict) -> dict | None:
    return next((c for c in (pod.get("spec") or {}).get("containers") or [] if is_device_plugin_container(c)), None)


def plugin_binary(image: str) -> Path | None:
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    path = CACHE / ("nvidia-device-plugin-" + tag) / "nvidia-device-plugin"
    return path if os.access(path, os.X_OK) else None


def containerd_runtimes() -> tuple[str, dict]:
    """The default runtime name and the runtimes of the node's containerd, as the running release merges its config."""
    dump = subprocess.run(["containerd", "config", "dump"], capture_output=True, text=True, timeout=30, check=False)
    if dump.returncode != 0:
        raise RuntimeError("containerd config dump: %s" % dump.stderr.strip()[-300:])
    config = tomllib.loads(dump.stdout)
    for name in CRI_PLUGINS:
        cri = (config.get("plugins") or {}).get(name) or {}
        if "containerd" in cri:
            return cri["containerd"].get("default_runtime_name", "runc"), cri["containerd"].get("runtimes") or {}
    return "runc", {}


def runtime_decision(api, pod: dict) -> tuple[bool | None, str]:
    """(NVML given?, why). None: no sandbox at all."""
    handler_source = "containerd's default runtime"
    class_name = (pod.get("spec") or {}).get("runtimeClassName")
    default, runtimes = containerd_runtimes()
    handler = default
    if class_name:
        from kubernetes import client

        handler, handler_source = client.NodeV1Api(api).read_runtime_class(class_name).handler, "RuntimeClass %s" % class_name
    if handler not in runtimes:
        return None, "no runtime for %r is configured (%s; containerd has %s)" % (handler, handler_source, sorted(runtimes))
    binary = str(((runtimes[handler].get("options") or {}).get("BinaryName")) or "runc")
    given = os.path.basename(binary) == NVIDIA_RUNTIME
    return given, "runtime %r (%s) runs %s: %s" % (handler, handler_source, binary, "NVML given" if given else "no NVML")


def config_map_files(core, pod: dict, container: dict, directory: Path) -> list[tuple[Path, str]]:
    """Write each ConfigMap volume the container mounts; returns (host dir, mountPath) pairs to bind."""
    namespace = pod["metadata"]["namespace"]
    volumes = {volume["name"]: volume for volume in (pod.get("spec") or {}).get("volumes") or []}
    binds = []
    for mount in container.get("volumeMounts") or []:
        source = (volumes.get(mount["name"]) or {}).get("configMap")
        if not source:
            continue
        data = json.loads(core.read_namespaced_config_map(source["name"], namespace, _preload_content=False).data).get("data") or {}
        target = directory / mount["name"]
        target.mkdir(parents=True, exist_ok=True)
        items = source.get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            if item["key"] in data:
                (target / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (target / item["path"]).write_text(data[item["key"]])
        if mount.get("subPath"):
            binds.append((target / mount["subPath"], mount["mountPath"]))
        else:
            binds.append((target, mount["mountPath"]))
    return binds


def environment(container: dict, node_name: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "spec.nodeName":
            env[item["name"]] = node_name
    return env


def start(core, api, node_name: str, state: Running) -> None:
    pod = state.pod
    container = plugin_container(pod)
    name = "%s_%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"])
    binary = plugin_binary(container.get("image") or "")
    if binary is None:
        state.blocked = "image %s is not in the lab (lab/realcomponents builds the pinned releases)" % container.get("image")
        return
    nvml, why = runtime_decision(api, pod)
    if nvml is None:
        state.blocked = "Failed to create pod sandbox: " + why
        return
    directory = POD_FILES / pod["metadata"]["uid"]
    directory.mkdir(parents=True, exist_ok=True)
    binds = config_map_files(core, pod, container, directory)
    words = list(container.get("command") or []) + list(container.get("args") or [])
    if not container.get("command"):
        words = [str(binary)] + words
    elif os.path.basename(words[0]) == "nvidia-device-plugin":
        words[0] = str(binary)
    script = ["set -e"]
    for source, target in binds:
        script.append("mkdir -p %s && mount --bind %s %s" % (shlex.quote(target if source.is_dir() else os.path.dirname(target)),
                                                              shlex.quote(str(source)), shlex.quote(target)))
    if not nvml:
        script.append("mount -t tmpfs -o size=1m tmpfs %s" % DRIVER_LIBRARY_DIR)
    script.append('exec "$@"')
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = open(LOG_DIR / (name + ".log"), "ab")  # noqa: SIM115 - the child's stdout, closed with it
    log.write(("--- %s start %d: %s; %s\n" % (time.strftime("%H:%M:%S"), state.exits + 1, " ".join(words), why)).encode())
    log.flush()
    state.process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "plugin", *words],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment(container, node_name),
                                     start_new_session=True)
    log.close()
    say("%s: started %s (pid %d); %s" % (name, binary, state.process.pid, why))


def stop(state: Running) -> None:
    if state.process is not None and state.process.poll() is None:
        os.killpg(state.process.pid, signal.SIGTERM)
        try:
            state.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(state.process.pid, signal.SIGKILL)
            state.process.wait(timeout=10)


def sync(core, api, node_name: str, pods: dict[str, Running]) -> None:
    listed = json.loads(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=%s" % node_name, _preload_content=False).data)["items"]
    wanted = {pod["metadata"]["uid"]: pod for pod in listed
              if plugin_container(pod) is not None and not pod["metadata"].get("deletionTimestamp")}
    for uid in list(pods):
        if uid not in wanted:
            stop(pods.pop(uid))
            say("pod %s is gone: plugin stopped" % uid)
    now = time.monotonic()
    for uid, pod in wanted.items():
        state = pods.setdefault(uid, Running(pod))
        if state.process is not None and state.process.poll() is not None:
            state.exits += 1
            state.next_start = now + min(60, 10 * 2 ** (state.exits - 1))
            say("%s: plugin exited with %d (restart %d in %.0f s)" % (pod["metadata"]["name"], state.process.returncode, state.exits,
                                                                       state.next_start - now))
            state.process = None
        if state.process is None and now >= state.next_start:
            before = state.blocked
            state.blocked = ""
            start(core, api, node_name, state)
            if state.blocked:
                if state.blocked != before:
                    say("%s: %s" % (pod["metadata"]["name"], state.blocked))
                state.next_start = now + 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=args.kubeconfig)
    core = client.CoreV1Api(api)
    pods: dict[str, Running] = {}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    say("watching plugin pods on %s" % args.node)
    while not stopping:
        try:
            sync(core, api, args.node, pods)
        except Exception as error:  # keep going, like the kubelet's sync loop  # noqa: BLE001
            say("sync failed: %s" % error)
        time.sleep(args.interval)
    for state in pods.values():
        stop(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
