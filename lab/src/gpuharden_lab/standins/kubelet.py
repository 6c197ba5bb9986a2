# SPDX-License-Identifier: GPL-3.0-or-later
"""A kubelet stand-in for lab nodes.

What it does, in the kubelet's order:

1. parse the command line (k3s mode: also ``kubelet-arg:`` from the k3s config files), load
   ``--config``, merge ``--config-dir`` drop-ins (``*.conf``, lexical order, JSON merge patch as in
   cmd/kubelet/app.mergeKubeletConfigurations) and let flags win;
2. validate with the REAL kubelet code: the ``kubelet-validate`` helper (lab/controlplane/kubelet-validate),
   which decodes the file with the kubelet's codecs, re-parses the kubelet flags over it and runs
   ValidateKubeletConfiguration; a missing helper is an error, never a skip;
3. container-manager start checks: the static CPU policy needs a CPU reservation, and the CPU/memory
   manager checkpoints must name the configured policies; then write the checkpoints;
4. serve ``GET /healthz`` on healthzBindAddress:healthzPort (127.0.0.1:10248);
5. mirror device-plugin registration: while an NVIDIA device-plugin pod runs on this node, the
   node's ``nvidia.com/*`` capacity/allocatable follow what NVML reports.

Messages reproduce the kubelet v1.36 wording (cmd/kubelet/app/server.go, pkg/kubelet/cm/cpumanager,
pkg/kubelet/cm/memorymanager).  Everything it does is logged to stderr, klog style.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from gpuharden_lab.standins import klog, rooted

DEFAULT_KUBECONFIG = "/etc/kubernetes/kubelet.conf"
DEFAULT_ROOT_DIR = "/var/lib/kubelet"
DEFAULT_VALIDATOR = "/usr/local/bin/kubelet-validate"
K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
K3S_KUBELET_CONFIG_DIR = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"
LAB_FLAGS = {"lab-validator", "k3s-config", "lab-poll-interval", "lab-no-device-plugin-mirror"}
LAB_BOOL_FLAGS = {"lab-no-device-plugin-mirror"}
# kubelet flags that take no value (pflag bools); all others take one.
BOOL_FLAGS = {
    "help", "h", "fail-swap-on", "register-node", "register-schedulable", "exit-on-lock-contention",
    "enable-server", "enable-debugging-handlers", "enable-load-reader", "cgroups-per-qos", "protect-kernel-defaults",
    "rotate-certificates", "rotate-server-certificates", "serialize-image-pulls", "make-iptables-util-chains",
    "fail-cgroupv1", "keep-terminated-pod-volumes", "experimental-allocatable-ignore-eviction", "seccomp-default",
    "alsologtostderr", "logtostderr", "one-output", "skip-headers", "skip-log-headers",
    "local-storage-capacity-isolation", "enable-controller-attach-detach", "reregister-node",
}
CPU_STATE = "cpu_manager_state"
MEM_STATE = "memory_manager_state"


class StartError(Exception):
    """The kubelet exits 1; ``where`` and ``msg`` are the klog call site and message."""

    def __init__(self, err: str, msg: str = "command failed", where: str = "run.go:72") -> None:
        super().__init__(err)
        self.err = err
        self.msg = msg
        self.where = where


def info(msg: str, **kv: object) -> None:
    klog("I", "kubelet.go:0", msg, **kv)


# --------------------------------------------------------------------------------------------
# command line


def parse_flags(argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """pflag-like parsing into (name, value) pairs in order; names are normalised (``_`` -> ``-``)."""
    flags: list[tuple[str, str | None]] = []
    positional: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--":
            positional.extend(argv[i:])
            break
        if not a.startswith("-") or a == "-":
            positional.append(a)
            continue
        body = a.lstrip("-")
        if "=" in body:
            name, value = body.split("=", 1)
            flags.append((name.replace("_", "-"), value))
            continue
        name = body.replace("_", "-")
        if name in BOOL_FLAGS or name in LAB_BOOL_FLAGS:
            flags.append((name, None))
        elif i < len(argv):
            flags.append((name, argv[i]))
            i += 1
        else:
            flags.append((name, None))
    return flags, positional


def flag_value(flags: list[tuple[str, str | None]], name: str, default: str | None = None) -> str | None:
    value = default
    for n, v in flags:
        if n == name:
            value = v
    return value


def render_flags(flags: list[tuple[str, str | None]]) -> list[str]:
    return ["--%s" % n if v is None else "--%s=%s" % (n, v) for n, v in flags]


def k3s_kubelet_args(config: str) -> list[str]:
    """``kubelet-arg`` from the k3s config file and ``<file>.d/*.yaml`` (later files replace the list,
    ``kubelet-arg+`` appends), as k3s does; entries become ``--key=value`` flags."""
    args: list[str] = []
    files = [rooted(config)]
    dd = Path(str(rooted(config)) + ".d")
    if dd.is_dir():
        files += sorted(f for f in dd.iterdir() if f.suffix in (".yaml", ".yml"))
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text()) or {}
        except FileNotFoundError:
            continue
        except yaml.YAMLError as e:
            raise StartError("failed to parse %s: %s" % (f, e)) from e
        if "kubelet-arg" in doc:
            args = list(_as_list(doc["kubelet-arg"]))
        if "kubelet-arg+" in doc:
            args += list(_as_list(doc["kubelet-arg+"]))
    return ["--" + a.lstrip("-") for a in args]


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, list):
        return [str(x) for x in v]
    return [str(v)]


# --------------------------------------------------------------------------------------------
# config file + drop-ins


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (what jsonpatch.MergePatch does for the kubelet's drop-ins)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = json_merge_patch(result.get(k), v)
    return result


def load_yaml_file(path: str) -> dict:
    text = rooted(path).read_text()
    doc = yaml.safe_load(text)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ValueError("not a KubeletConfiguration object")
    return doc


def merged_config(config: str | None, config_dir: str | None) -> tuple[dict | None, list[str]]:
    """The base file merged with the drop-ins; ``None`` when neither is given."""
    if not config and not config_dir:
        return None, []
    base: dict = {}
    if config:
        try:
            base = load_yaml_file(config)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise StartError("failed to load kubelet config file, path: %s, error: %s" % (config, e)) from e
    used: list[str] = []
    if config_dir:
        d = rooted(config_dir)
        if not d.is_dir():
            raise StartError("failed to merge kubelet configs: failed to walk through kubelet dropin directory %r: "
                             "lstat %s: no such file or directory" % (config_dir, config_dir))
        files = sorted(p for p in d.rglob("*") if p.is_file())
        for p in files:
            node_path = os.path.join(config_dir, str(p.relative_to(d)))
            if p.suffix != ".conf":
                info("Skipping drop-in file without .conf extension", path=node_path)
                continue
            try:
                doc = load_yaml_file(node_path)
            except (OSError, ValueError, yaml.YAMLError) as e:
                raise StartError("failed to merge kubelet configs: failed to walk through kubelet dropin directory %r: "
                                 "failed to load kubelet dropin file, path: %s, error: %s" % (config_dir, node_path, e)
                                 ) from e
            if not doc.get("apiVersion") or not doc.get("kind"):
                raise StartError("failed to merge kubelet configs: failed to walk through kubelet dropin directory %r: "
                                 "failed to load kubelet dropin file, path: %s, no apiVersion/kind"
                                 % (config_dir, node_path))
            if doc.get("apiVersion") != "kubelet.config.k8s.io/v1beta1" or doc.get("kind") != "KubeletConfiguration":
                raise StartError("failed to merge kubelet configs: failed to walk through kubelet dropin directory %r: "
                                 "failed to load kubelet dropin file, path: %s, unknown apiVersion/kind: %s, Kind=%s"
                                 % (config_dir, node_path, doc.get("apiVersion"), doc.get("kind")))
            base = json_merge_patch(base, doc)
            used.append(node_path)
    base.setdefault("apiVersion", "kubelet.config.k8s.io/v1beta1")
    base.setdefault("kind", "KubeletConfiguration")
    return base, used


# --------------------------------------------------------------------------------------------
# validation through the real kubelet code


def find_validator(flags: list[tuple[str, str | None]]) -> str:
    path = flag_value(flags, "lab-validator") or os.environ.get("GPUHARDEN_KUBELET_VALIDATE") or DEFAULT_VALIDATOR
    if not os.access(path, os.X_OK):
        raise StartError("kubelet stand-in cannot validate its configuration: kubelet-validate helper %r is missing "
                         "or not executable (build it with lab/controlplane/build.sh and set GPUHARDEN_KUBELET_VALIDATE "
                         "or --lab-validator)" % path)
    return path


def validate(validator: str, flags: list[tuple[str, str | None]], merged: dict | None, source: str) -> dict:
    """Run kubelet-validate; returns its JSON result. Flags it does not know are dropped (and logged)."""
    passthrough = [(n, v) for n, v in flags if n not in LAB_FLAGS and n not in ("config", "config-dir")]
    with tempfile.TemporaryDirectory(prefix="kubelet-standin-") as tmp:
        args_tail: list[str] = []
        if merged is not None:
            cfg = Path(tmp) / "merged-config.yaml"
            cfg.write_text(yaml.safe_dump(merged, sort_keys=False))
            args_tail = ["--config=%s" % cfg]
        for _attempt in range(50):
            cmd = [validator, *render_flags(passthrough), *args_tail]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if p.returncode == 2 and "unknown flag: --" in p.stderr:
                bad = p.stderr.split("unknown flag: --", 1)[1].split()[0]
                klog("W", "server.go:0", "Ignoring flag the kubelet does not know (the real kubelet would refuse it)",
                     flag="--" + bad)
                passthrough = [(n, v) for n, v in passthrough if n != bad]
                continue
            if p.returncode == 2:
                msg = p.stderr.strip().removeprefix("kubelet-validate: ").splitlines()[0] if p.stderr.strip() else ""
                raise StartError("failed to load kubelet config file, path: %s, error: %s" % (source, msg))
            try:
                res = json.loads(p.stdout)
            except ValueError as e:
                raise StartError("kubelet-validate produced no result (rc=%d): %s" % (p.returncode, p.stderr)) from e
            return res
    raise StartError("too many unknown flags")


def aggregate(errs: list[str]) -> str:
    return errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"


# --------------------------------------------------------------------------------------------
# container manager start checks and checkpoints


def check_checkpoints(root_dir: str, cpu_policy: str, mem_policy: str, ncpu: int) -> None:
    cpu_file = os.path.join(root_dir, CPU_STATE)
    mem_file = os.path.join(root_dir, MEM_STATE)
    cpu_err = _checkpoint_policy_error(cpu_file, cpu_policy, "")
    if cpu_err:
        raise StartError(
            "start cpu manager error: could not restore state from checkpoint: %s, please drain this node and delete "
            "the CPU manager checkpoint file %s before restarting Kubelet" % (cpu_err, _q(cpu_file)),
            msg="Failed to start ContainerManager", where="kubelet.go:1821")
    mem_err = _checkpoint_policy_error(mem_file, mem_policy, "[memorymanager] ")
    if mem_err:
        raise StartError(
            "start memory manager error: could not restore state from checkpoint: %s, please drain this node and "
            "delete the memory manager checkpoint file %s before restarting Kubelet" % (mem_err, _q(mem_file)),
            msg="Failed to start ContainerManager", where="kubelet.go:1821")
    if not rooted(cpu_file).exists():
        default = "" if cpu_policy == "none" else ("0-%d" % (ncpu - 1) if ncpu > 1 else "0")
        _write_checkpoint(cpu_file, {"policyName": cpu_policy, "defaultCpuSet": default, "checksum": 0})
    if not rooted(mem_file).exists():
        _write_checkpoint(mem_file, {"policyName": mem_policy, "machineState": {}, "checksum": 0})


def _q(s: str) -> str:
    return json.dumps(s)


def _checkpoint_policy_error(path: str, policy: str, prefix: str) -> str:
    try:
        blob = rooted(path).read_text()
    except FileNotFoundError:
        return ""
    try:
        cp = json.loads(blob)
        if not isinstance(cp, dict):
            raise ValueError("json: cannot unmarshal %s into Go value" % type(cp).__name__)
    except ValueError as e:
        return str(e)
    have = cp.get("policyName", "")
    if have != policy:
        return "%sconfigured policy %s differs from state checkpoint policy %s" % (prefix, _q(policy), _q(have))
    return ""


def _write_checkpoint(path: str, data: dict) -> None:
    p = rooted(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(".%s.tmp" % p.name)
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, p)
    info("Wrote checkpoint", path=path, policy=data["policyName"])


# --------------------------------------------------------------------------------------------
# device-plugin mirroring: pure part


class PluginError(Exception):
    pass


def is_device_plugin_container(c: dict) -> bool:
    words = " ".join(list(c.get("command") or []) + list(c.get("args") or []))
    if "gpu-feature-discovery" in words or "config-manager" in words:
        return False
    return "k8s-device-plugin" in (c.get("image") or "")


def device_plugin_pods(pods: list[dict], node_name: str) -> list[dict]:
    out = []
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node_name or (pod.get("status") or {}).get("phase") != "Running":
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/name") == "nvidia-device-plugin" or any(
            is_device_plugin_container(c) for c in spec.get("containers") or []
        ):
            out.append(pod)
    return out


def _container_setting(c: dict, flag: str, env: str) -> str | None:
    words = list(c.get("command") or []) + list(c.get("args") or [])
    value = None
    for i, w in enumerate(words):
        if w.startswith("--%s=" % flag):
            value = w.split("=", 1)[1]
        elif w == "--%s" % flag and i + 1 < len(words):
            value = words[i + 1]
    if value is not None:
        return value
    for e in c.get("env") or []:
        if e.get("name") == env and "value" in e:
            return str(e["value"])
    return None


def plugin_config(pod: dict, configmaps: dict[tuple[str, str], dict[str, str]]) -> dict:
    """The device plugin's config file as mounted from a ConfigMap; {} when the plugin uses none."""
    spec = pod.get("spec") or {}
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    containers = [c for c in spec.get("containers") or [] if is_device_plugin_container(c)] or list(
        spec.get("containers") or [])
    c = containers[0] if containers else {}
    path = _container_setting(c, "config-file", "CONFIG_FILE")
    if not path:
        return {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        mp = (m.get("mountPath") or "").rstrip("/")
        vol = volumes.get(m.get("name")) or {}
        cm = vol.get("configMap")
        if not cm:
            continue
        if m.get("subPath"):
            if path != mp:
                continue
            key_path = m["subPath"]
        elif path.startswith(mp + "/"):
            key_path = path[len(mp) + 1:]
        else:
            continue
        key = key_path
        for item in cm.get("items") or []:
            if item.get("path") == key_path:
                key = item.get("key")
        data = configmaps.get((ns, cm.get("name")))
        if data is None or key not in data:
            raise PluginError("unable to load config: unable to read config file %s" % path)
        doc = yaml.safe_load(data[key]) or {}
        if not isinstance(doc, dict):
            raise PluginError("unable to parse config file %s" % path)
        return doc
    raise PluginError("unable to load config: unable to read config file %s: no such file or directory" % path)


def _mig_default_name(profile: str) -> str:
    """The name the real plugin (v0.18.2, measured on the NVML double) gives a MIG device by default: its patterns are
    the GPU-instance profiles, matched unanchored (k8s-device-plugin internal/rm/rm.go, api/config/v1/resources.go),
    so a 1c.3g.40gb compute instance is advertised as nvidia.com/mig-3g.40gb (and 1g.10gb+me as mig-1g.10gb)."""
    head, _, rest = profile.partition(".")
    gi_profile = rest if head.endswith("c") and rest else profile
    return "nvidia.com/mig-" + gi_profile.split("+", 1)[0].split("-", 1)[0]


def _qualify(name: str) -> str:
    return name if "/" in name else "nvidia.com/" + name


def desired_nvidia_resources(pods: list[dict], node_name: str, configmaps: dict[tuple[str, str], dict[str, str]],
                             inventory: list[dict]) -> dict[str, int]:
    """What the NVIDIA device plugin would advertise for this node.

    ``inventory``: one dict per GPU: ``{"name": product, "mig_enabled": bool, "mig_devices": [profile, ...]}``.
    Returns ``{}`` when no device-plugin pod runs on the node (or it would fail to start)."""
    running = device_plugin_pods(pods, node_name)
    if not running:
        return {}
    pod = running[0]
    containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if is_device_plugin_container(c)]
    c = containers[0] if containers else ((pod.get("spec") or {}).get("containers") or [{}])[0]
    cfg = plugin_config(pod, configmaps)
    flags = cfg.get("flags") or {}
    strategy = _container_setting(c, "mig-strategy", "MIG_STRATEGY") or flags.get("migStrategy") or "none"
    if strategy not in ("none", "single", "mixed"):
        raise PluginError("unknown MIG strategy: %s" % strategy)
    # The plugin refuses an unknown device list strategy at start ("none" is the classic mistake).
    list_strategies = _container_setting(c, "device-list-strategy", "DEVICE_LIST_STRATEGY") or (flags.get("plugin") or {}).get(
        "deviceListStrategy", "envvar"
    )
    for list_strategy in list_strategies if isinstance(list_strategies, list) else str(list_strategies).split(","):
        if list_strategy not in ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"):
            raise PluginError("invalid --device-list-strategy option: %s" % list_strategy)
    # The real plugin ignores the config's `resources` (custom names for GPUs and MIG devices) and any per-resource
    # `rename` under sharing, with a warning: k8s-device-plugin api/config/v1/config.go DisableResourceNamingInConfig
    # and replicas.go disableResoureRenaming, called by cmd/nvidia-device-plugin/main.go in v0.15.0 and v0.18.2 alike.
    # Measured: the real v0.15.0 with `resources.gpus: [{pattern: "*", name: nvidia-gpu}]` advertised nvidia.com/gpu.
    counts: dict[str, int] = {}

    def add(name: str, n: int = 1) -> None:
        name = _qualify(name)
        counts[name] = counts.get(name, 0) + n

    mig_gpus = [g for g in inventory if g.get("mig_enabled")]
    if strategy == "none" or not mig_gpus:
        add("nvidia.com/gpu", len(inventory))
    elif strategy == "single":
        if len(mig_gpus) != len(inventory):
            raise PluginError("invalid MIG configuration for strategy single: all GPUs must have MIG enabled or disabled")
        profiles = {p for g in mig_gpus for p in g.get("mig_devices") or []}
        if not profiles:
            raise PluginError("invalid MIG configuration for strategy single: no MIG devices found")
        if len(profiles) > 1:
            raise PluginError("invalid MIG configuration for strategy single: more than one MIG device type present")
        add("nvidia.com/gpu", sum(len(g.get("mig_devices") or []) for g in mig_gpus))
    else:  # mixed
        for g in inventory:
            if not g.get("mig_enabled"):
                add("nvidia.com/gpu")
                continue
            for prof in g.get("mig_devices") or []:
                add(_mig_default_name(prof))
    counts = {k: v for k, v in counts.items() if v > 0}
    sharing = cfg.get("sharing") or {}
    for kind in ("timeSlicing", "mps"):
        sh = sharing.get(kind) or {}
        rename = bool(sh.get("renameByDefault"))
        for r in sh.get("resources") or []:
            name = _qualify(str(r.get("name", "")))
            replicas = int(r.get("replicas") or 1)
            if name in counts and replicas > 1:
                n = counts.pop(name) * replicas
                counts[name + ".shared" if rename else name] = n
    return counts


def status_patch(node: dict, desired: dict[str, int]) -> dict | None:
    """A merge patch making the node's nvidia.com/* capacity and allocatable equal ``desired``; None if equal."""
    status = node.get("status") or {}
    patch: dict[str, dict] = {}
    for field in ("capacity", "allocatable"):
        cur = {k: str(v) for k, v in (status.get(field) or {}).items() if k.startswith("nvidia.com/")}
        want = {k: str(v) for k, v in desired.items()}
        if cur == want:
            continue
        p: dict[str, str | None] = {k: None for k in cur if k not in want}
        p.update({k: v for k, v in want.items() if cur.get(k) != v})
        patch[field] = p
    return {"status": patch} if patch else None


# --------------------------------------------------------------------------------------------
# device-plugin mirroring: NVML and the apiserver


def mig_profile_name(parent: Any, mig: Any, pynvml: Any) -> str:
    """``<g>g.<mem>gb`` (``<c>c.`` prefix when compute slices differ), as go-nvlib names MIG profiles."""
    gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
    gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
    gi_prof = None
    for idx in range(0, 16):
        try:
            p = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, idx)
        except pynvml.NVMLError:
            continue
        if p.id == gi_info.profileId:
            gi_prof = p
            break
    if gi_prof is None:
        raise PluginError("unknown GPU instance profile id %d" % gi_info.profileId)
    total = pynvml.nvmlDeviceGetMemoryInfo(parent).total
    one_mb, one_gb = 1024 * 1024, 1024 * 1024 * 1024
    frac = math.ceil(gi_prof.memorySizeMB * one_mb / total * 8) / 8
    mem_gb = round(frac * ((total + one_gb - 1) // one_gb))
    name = "%dg.%dgb" % (gi_prof.sliceCount, mem_gb)
    try:
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, pynvml.nvmlDeviceGetComputeInstanceId(mig))
        ci_info = pynvml.nvmlComputeInstanceGetInfo(ci)
        ci_slices = ci_info.profileId  # fallback below when the profile table is available
        for idx in range(0, 8):
            try:
                cp = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, idx, 0)
            except pynvml.NVMLError:
                continue
            if cp.id == ci_info.profileId:
                ci_slices = cp.sliceCount
                break
        if ci_slices != gi_prof.sliceCount:
            name = "%dc.%s" % (ci_slices, name)
    except pynvml.NVMLError:
        pass
    return name


def nvml_inventory() -> list[dict]:
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            try:
                mig_enabled = pynvml.nvmlDeviceGetMigMode(h)[0] == 1
            except pynvml.NVMLError:
                mig_enabled = False
            devices = []
            if mig_enabled:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except pynvml.NVMLError:
                        continue
                    devices.append(mig_profile_name(h, m, pynvml))
            gpus.append({"name": name, "mig_enabled": mig_enabled, "mig_devices": devices})
        return gpus
    finally:
        pynvml.nvmlShutdown()


class DevicePluginMirror(threading.Thread):
    def __init__(self, kubeconfig: str, node_name: str, interval: float) -> None:
        super().__init__(daemon=True, name="device-plugin-mirror")
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.interval = interval
        self.stop = threading.Event()
        self.last_error = ""

    def run(self) -> None:
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(config_file=str(rooted(self.kubeconfig))))
        info("Device plugin mirror started", node=self.node_name, kubeconfig=self.kubeconfig)
        while not self.stop.is_set():
            try:
                self.sync(api)
                self.last_error = ""
            except Exception as e:  # keep polling, like the kubelet's sync loops
                if str(e) != self.last_error:
                    klog("E", "manager.go:0", "Device plugin sync failed", err=str(e))
                self.last_error = str(e)
            self.stop.wait(self.interval)

    def sync(self, api: Any) -> None:
        resp = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=%s" % self.node_name,
                                               _preload_content=False)
        pods = json.loads(resp.data)["items"]
        configmaps: dict[tuple[str, str], dict[str, str]] = {}
        for pod in device_plugin_pods(pods, self.node_name):
            ns = pod["metadata"]["namespace"]
            for v in (pod.get("spec") or {}).get("volumes") or []:
                cm = v.get("configMap")
                if cm and (ns, cm["name"]) not in configmaps:
                    with contextlib.suppress(Exception):
                        r = api.read_namespaced_config_map(cm["name"], ns, _preload_content=False)
                        configmaps[(ns, cm["name"])] = json.loads(r.data).get("data") or {}
        try:
            desired = desired_nvidia_resources(pods, self.node_name, configmaps,
                                               nvml_inventory() if device_plugin_pods(pods, self.node_name) else [])
        except PluginError as e:
            if str(e) != self.last_error:
                klog("E", "manager.go:0", "NVIDIA device plugin would fail; no devices registered", err=str(e))
            self.last_error = str(e)
            desired = {}
        node = json.loads(api.read_node(self.node_name, _preload_content=False).data)
        patch = status_patch(node, desired)
        if patch:
            info("Updating node extended resources", node=self.node_name, patch=json.dumps(patch, sort_keys=True))
            api.patch_node_status(self.node_name, patch)


# --------------------------------------------------------------------------------------------
# healthz


def serve_healthz(bind: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.split("?", 1)[0] == "/healthz":
                body = b"ok"
                self.send_response(200)
            else:
                body = b"404 page not found\n"
                self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    srv = ThreadingHTTPServer((bind, port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True, name="healthz").start()
    return srv


# --------------------------------------------------------------------------------------------
# main


def run(argv: list[str]) -> int:
    flags, positional = parse_flags(argv)
    if positional:
        raise StartError("unknown command %s" % positional[0])
    k3s_cfg = flag_value(flags, "k3s-config")
    if k3s_cfg is None and os.environ.get("GPUHARDEN_KUBELET_FLAVOR") == "k3s":
        k3s_cfg = K3S_CONFIG
    if k3s_cfg:
        extra = k3s_kubelet_args(k3s_cfg)
        info("k3s mode: kubelet-arg from config", file=k3s_cfg, args=" ".join(extra))
        flags = [("config-dir", K3S_KUBELET_CONFIG_DIR), *flags, *parse_flags(extra)[0]]
    info("kubelet stand-in starting", args=" ".join(render_flags(flags)))
    for n, v in flags:
        if n in ("v", "vmodule", "log-file", "logtostderr"):
            continue
        info("FLAG: --%s=%s" % (n, "" if v is None else json.dumps(v)))

    config = flag_value(flags, "config")
    config_dir = flag_value(flags, "config-dir")
    merged, dropins = merged_config(config, config_dir)
    if dropins:
        info("Merged kubelet drop-in configuration", files=",".join(dropins))
    validator = find_validator(flags)
    res = validate(validator, flags, merged, config or config_dir or "")
    if res.get("validationErrors"):
        raise StartError("failed to validate kubelet configuration, error: %s, path: &KubeletConfiguration{%s}"
                         % (aggregate(res["validationErrors"]), config or ""))
    eff = res.get("effective") or {}
    info("Validated kubelet configuration", kubeletVersion=res.get("kubeletVersion", ""),
         cpuManagerPolicy=eff.get("cpuManagerPolicy", ""), topologyManagerPolicy=eff.get("topologyManagerPolicy", ""),
         topologyManagerScope=eff.get("topologyManagerScope", ""), memoryManagerPolicy=eff.get("memoryManagerPolicy", ""),
         reservedCPU=eff.get("effectiveReservedCPU", ""))
    cpu_policy = eff.get("cpuManagerPolicy", "none")
    if cpu_policy == "static" and eff.get("effectiveReservedCPU", "0") in ("0", ""):
        klog("E", "container_manager_linux.go:340", "Failed to initialize cpu manager",
             err="[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero")
        raise StartError("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be "
                         "greater than zero")
    for e in res.get("startupErrors") or []:
        if "static policy requires" in e:
            continue
        raise StartError(e)
    if not res.get("valid", False):
        raise StartError("kubelet-validate reported the configuration invalid: %s" % json.dumps(res))

    root_dir = flag_value(flags, "root-dir") or DEFAULT_ROOT_DIR
    check_checkpoints(root_dir, cpu_policy, eff.get("memoryManagerPolicy", "None"), os.cpu_count() or 1)

    cfg = merged or {}
    port = int(flag_value(flags, "healthz-port") or cfg.get("healthzPort") or 10248)
    bind = flag_value(flags, "healthz-bind-address") or cfg.get("healthzBindAddress") or "127.0.0.1"
    # The handlers go in before healthz answers: a caller that sees healthz ok may stop us at once,
    # and a SIGTERM before them would kill the process instead of shutting it down cleanly.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv = serve_healthz(bind, port)
    info("Started healthz server", address="%s:%d" % (bind, port))

    mirror = None
    node_name = flag_value(flags, "hostname-override") or os.environ.get("GPUHARDEN_NODE_NAME") or ""
    kubeconfig = flag_value(flags, "kubeconfig") or DEFAULT_KUBECONFIG
    if flag_value(flags, "lab-no-device-plugin-mirror", "unset") != "unset":
        info("Device plugin mirroring disabled (--lab-no-device-plugin-mirror)")
    elif not node_name:
        klog("W", "kubelet.go:0", "No node name (--hostname-override or GPUHARDEN_NODE_NAME); device plugins not mirrored")
    elif not rooted(kubeconfig).exists():
        klog("W", "kubelet.go:0", "No kubeconfig; running standalone, device plugins not mirrored", path=kubeconfig)
    else:
        interval = float(flag_value(flags, "lab-poll-interval") or 2.0)
        mirror = DevicePluginMirror(kubeconfig, node_name, interval)
        mirror.start()

    while not stop.wait(1.0):
        pass
    info("Shutting down kubelet stand-in")
    if mirror:
        mirror.stop.set()
    srv.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["--version=true"]):
        print("Kubernetes v1.36.3 (gpuharden kubelet stand-in)")
        return 0
    try:
        return run(args)
    except StartError as e:
        klog("E", e.where, e.msg, err=e.err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
