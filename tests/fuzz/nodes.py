# SPDX-License-Identifier: GPL-3.0-or-later
"""The seed node roots, one spec per module: real-world files (tests/unit/fixtures: kubeadm and k3s kubelet configs,
containerd v2/v3 configs with imports, mig-parted configs; the lab's node root builder for /proc/driver/nvidia, /dev
and sysfs; cgroup trees as the kubelet lays them out), the module's arguments, the files and options a case may
mutate, and how a success is checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _originals
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
from gpuharden_lab import NVML_FIXTURES, REPO_ROOT
from gpuharden_lab.noderoot import build_node_root, sysfs_bdf

from tests.fuzz import validators
from tests.fuzz.engine import Built
from tests.fuzz.mutations import Target

UNIT = REPO_ROOT / "tests/unit/fixtures"
CTL = REPO_ROOT / "tests/fakes/nvml/nvml_double_ctl.py"
UID_A = "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162"
UID_B = "9b1e7c55-0000-4a4a-8b8b-123456789abc"
UID_C = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CONTAINER = "cri-containerd-" + "ab" * 32 + ".scope"
GI = 1024 ** 3
PAGE = 4096
KUBELET_ARGS = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0-1"}


@dataclass
class Spec:
    module: str
    variants: tuple
    targets: object  # targets(variant) -> [Target]
    build: object  # build(variant, root, outside) -> Built
    families: tuple | None = None  # None: every family that fits a target
    notes: list = field(default_factory=list)


def _write(root, node_path, text, mode=0o644):
    path = Path(str(root) + node_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(mode)
    return path


def _fixture(name):
    return json.loads((NVML_FIXTURES / (name + ".json")).read_text())


def _clear_processes(node, fixture):
    """The fixture's GPU processes gone (MIG changes need idle GPUs), which also makes the double write its state
    file: every later read leaves the node root as it is."""
    env = dict(os.environ, **node.env())
    for index, _gpu in enumerate(fixture["gpus"]):
        subprocess.run([sys.executable, str(CTL), "set-processes", "--gpu", str(index), "--clear", "--state",
                        str(node.state_file), "--fixture", str(node.fixture)], env=env, capture_output=True, check=True)


def _driver_targets(fixture_name):
    fixture = _fixture(fixture_name)
    bdf = sysfs_bdf(fixture["gpus"][0]["pci_bus_id"])
    return [
        Target("/proc/driver/nvidia/params", "colon"),
        Target("/proc/driver/nvidia/gpus/%s/information" % bdf, "colon"),
        Target("/proc/devices", "lines"),
        Target("/sys/bus/pci/devices/%s/numa_node" % bdf, "cgroup"),
        Target("/proc/driver/nvidia/gpus", "dir"),
        Target("/dev", "dir"),
    ]


def _nvml_node(root, fixture_name, clear=True):
    node = build_node_root(root, fixture_name)
    if clear:
        _clear_processes(node, _fixture(fixture_name))
    return node


# ---------------------------------------------------------------------------------------------------------------
# cgroup_memory


def _pod_dirs():
    systemd = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice" % UID_A.replace("-", "_")
    cgroupfs = "/sys/fs/cgroup/kubepods/pod%s" % UID_C
    return systemd, cgroupfs


def cgroup_targets(_variant):
    systemd, cgroupfs = _pod_dirs()
    return [
        Target("/sys/fs/cgroup/cgroup.controllers", "lines"),
        Target(systemd + "/memory.max", "cgroup"),
        Target(systemd + "/memory.high", "cgroup", writes=True),
        Target(systemd + "/" + CONTAINER + "/memory.high", "cgroup", writes=True),
        Target(systemd + "/" + CONTAINER + "/memory.max", "cgroup"),
        Target(cgroupfs + "/memory.max", "cgroup"),
        Target(cgroupfs + "/memory.high", "cgroup", writes=True),
        Target("cgroup_root", "option"),
        Target("pod_uids", "option"),
        Target("factor", "option"),
        Target("page_size", "option"),
    ]


def _write_cgroup(root, cgroup, memory_max, memory_high="max"):
    _write(root, cgroup + "/memory.max", "%s\n" % memory_max)
    _write(root, cgroup + "/memory.high", "%s\n" % memory_high)


def cgroup_build(_variant, root, outside):
    systemd, cgroupfs = _pod_dirs()
    _write(root, "/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    _write_cgroup(root, systemd, 16 * GI)
    _write_cgroup(root, systemd + "/" + CONTAINER, 16 * GI)
    _write_cgroup(root, "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice"
                  % UID_B.replace("-", "_"), "max")
    _write_cgroup(root, cgroupfs, 8 * GI)
    _write_cgroup(root, cgroupfs + "/" + "ef" * 32, 8 * GI)

    def validate(built, changed):
        problems = []
        factor, page = built.args.get("factor"), built.args.get("page_size")
        for path in changed:
            if path.endswith("/memory.high"):
                text = Path(path).read_text()
                problems.extend("%s: %s" % (path, problem) for problem in validators.cgroup_value(text))
                limit = Path(path).with_name("memory.max").read_text().strip()
                if not problems and limit.isdigit() and isinstance(page, int) and isinstance(factor, (int, float)):
                    # the value the module documents: floor(memory.max x factor / page) x page
                    want = int(Decimal(limit) * Decimal(repr(float(factor))) / page) * page
                    if int(text) != want:
                        problems.append("%s = %s, not %d (memory.max %s x %s, a multiple of %d)" % (path, text.strip(), want, limit, factor, page))
        return problems

    return Built(root, outside, {"root": str(root), "pod_uids": [UID_A, UID_B, UID_C], "page_size": PAGE, "factor": 0.9},
                 validate=validate, names={"pod_uids": ["pod_uids"], "factor": ["factor"], "page_size": ["page_size"]})


# ---------------------------------------------------------------------------------------------------------------
# mig_layout


MIG_VARIANTS = ("dgx-a100-80gb/all-balanced", "dgx-a100-80gb/mixed-per-index", "h100-mig-enabled/mixed-per-index",
                "h100-mig-enabled/all-1g.10gb", "h100-sxm5-80gb/all-3g.40gb")
MIG_FILE = "/etc/nvidia-mig-manager/config.yaml"


def mig_targets(variant):
    return [Target(MIG_FILE, "mig"), Target("config_file", "option"), Target("selected", "option")] + _driver_targets(variant.split("/")[0])[:1]


def _tables(fixture):
    return {index: _mig.BUILTIN_TABLES.get((gpu.get("mig") or {}).get("profile_table")) for index, gpu in enumerate(fixture["gpus"])}


def mig_build(variant, root, outside):
    fixture_name, config_name = variant.split("/")
    node = _nvml_node(root, fixture_name)
    text = (UNIT / "mig" / (config_name + ".yaml")).read_text()
    _write(root, MIG_FILE, text)
    fixture = _fixture(fixture_name)

    def after_success(built, result):
        path = Path(str(root) + MIG_FILE)
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return []  # a success on a file that is not there or not YAML is judged by its own outcome
        if not isinstance(config, dict) or built.args.get("selected") not in (config.get("mig-configs") or {}):
            return []
        shown = validators.nvml_show(built.env)
        for gpu in shown["gpus"]:
            gpu["pci_device_id"] = fixture["gpus"][gpu["index"]].get("pci_device_id")
        try:
            return validators.mig_assert(config, built.args["selected"], shown, _tables(fixture))
        except (KeyError, TypeError, AttributeError) as error:
            return ["the config the module accepted is not mig-parted's format (%s: %s)" % (type(error).__name__, error)]

    return Built(root, outside, {"root": str(root), "config_file": MIG_FILE, "selected": config_name, "strategy": "mixed"},
                 env=node.env(), after_success=after_success, names={"selected": ["selected", config_name]})


# ---------------------------------------------------------------------------------------------------------------
# read-only modules on the driver's view: gpu_facts, nvml_check


NVML_VARIANTS = ("dgx-a100-80gb", "h100-mig-enabled", "l4")


def facts_targets(variant):
    return _driver_targets(variant) + [Target("/dev/nvidia-caps", "dir")]


def facts_build(variant, root, outside):
    node = _nvml_node(root, variant)
    return Built(root, outside, {"root": str(root)}, env=node.env())


def nvml_build(variant, root, outside):
    node = _nvml_node(root, variant)
    return Built(root, outside, {"root": str(root), "node_name": "n1"}, env=node.env())


# ---------------------------------------------------------------------------------------------------------------
# process_cgroup_info


def proc_targets(_variant):
    return [Target("/proc/100/cgroup", "lines"), Target("/proc/200/cgroup", "lines"), Target("pids", "option")]


def proc_build(_variant, root, outside):
    _write(root, "/proc/100/cgroup", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/%s\n"
           % (UID_A.replace("-", "_"), CONTAINER))
    _write(root, "/proc/200/cgroup", "12:devices:/kubepods/besteffort/pod%s/%s\n1:name=systemd:/kubepods/besteffort/pod%s/%s\n"
           % (UID_C, "ef" * 32, UID_C, "ef" * 32))
    return Built(root, outside, {"root": str(root), "pids": [100, 200, 300]}, names={"pids": ["pids"]})


# ---------------------------------------------------------------------------------------------------------------
# device_cgroup_audit (a cgroup v1 devices tree: no BPF needed)


def _v1_paths():
    base = "/sys/fs/cgroup/devices"
    return {"ok": base + "/kubepods/burstable/pod%s/%s" % (UID_A, "ab" * 32),
            "sneaky": base + "/kubepods/besteffort/pod%s/%s" % (UID_B, "cd" * 32)}


BUNDLE = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/%s/config.json" % ("ab" * 32)


def audit_targets(_variant):
    paths = _v1_paths()
    bdf = sysfs_bdf(_fixture("dgx-a100-80gb")["gpus"][1]["pci_bus_id"])
    return [Target(paths["ok"] + "/devices.list", "lines"), Target(paths["sneaky"] + "/devices.list", "lines"),
            Target("/sys/fs/cgroup/devices/devices.list", "lines"), Target(BUNDLE, "json"),
            Target("/proc/driver/nvidia/gpus/%s/information" % bdf, "colon"), Target("cgroup_root", "option"),
            Target("devices", "option"), Target("bundle_dirs", "option")]


def audit_build(_variant, root, outside):
    node = build_node_root(root, "dgx-a100-80gb")
    _write(root, "/sys/fs/cgroup/devices/devices.list", "a *:* rwm\n")
    paths = _v1_paths()
    _write(root, paths["ok"] + "/devices.list", "c 195:1 rw\nc 195:255 rw\nc 510:* rw\nc *:* m\nb *:* m\nc 1:3 rwm\n")
    _write(root, paths["sneaky"] + "/devices.list", "c 195:* rw\nc 195:255 rw\nc 510:* rw\nc *:* m\n")
    _write(root, BUNDLE, json.dumps({"annotations": {
        "io.kubernetes.cri.container-name": "trainer", "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "train-0"}}))
    uuid = _fixture("dgx-a100-80gb")["gpus"][1]["uuid"]
    args = {"root": str(root), "node_name": "dgx", "allocations": [{"pod_uid": UID_A, "container": "trainer", "gpu_uuids": [uuid]}],
            "pod_resources_socket": "/nonexistent/kubelet.sock"}
    return Built(root, outside, args, env=node.env(), names={"devices": ["devices"], "bundle_dirs": ["bundle_dirs"]})


# ---------------------------------------------------------------------------------------------------------------
# node_lock (no check mode)


LOCK = "/run/gpuharden/run.lock"


def lock_targets(_variant):
    return [Target(LOCK, "json", writes=True), Target("path", "option"), Target("stale_after", "option")]


def lock_build(variant, root, outside):
    if variant == "stale":
        _write(root, LOCK, json.dumps({"owner": "old-run", "acquired_at": 1000, "stale_after": 60}))
    elif variant == "held":
        import time

        _write(root, LOCK, json.dumps({"owner": "other-run", "acquired_at": time.time(), "stale_after": 7200}))
    else:
        Path(str(root) + "/run/gpuharden").mkdir(parents=True)

    def validate(built, changed):
        problems = []
        for path in changed:
            if path.endswith("run.lock"):
                try:
                    data = json.loads(Path(path).read_text())
                    assert data["owner"] == "fuzz-run" and isinstance(data["acquired_at"], float)
                except (ValueError, KeyError, AssertionError) as error:
                    problems.append("%s is not this run's lock: %r" % (path, error))
        return problems

    return Built(root, outside, {"path": str(root) + LOCK, "owner": "fuzz-run", "timeout": 0}, check_mode=False, validate=validate,
                 names={"path": ["path"], "stale_after": ["stale_after"], "*": [str(root) + LOCK] if variant == "held" else []})


# ---------------------------------------------------------------------------------------------------------------
# unharden_files: a file gpuharden changed, with its original's record


MODPROBE = "/etc/modprobe.d/zz-gpuharden-nvidia.conf"
ORIGINAL = "# the site's own options\noptions nvidia NVreg_DeviceFileMode=0666\n"
WRITTEN = "# managed by gpuharden\noptions nvidia NVreg_DeviceFileMode=0660 NVreg_DeviceFileGID=44\n"


class _Recorder:
    _name = "gpuharden.k8s.nvidia_device_nodes"

    def __init__(self, root):
        self.params = {"root": str(root)}


def unharden_targets(_variant):
    return [Target(MODPROBE, "lines", writes=True), Target("/" + _record_rel(), "json", writes=True), Target("writers", "option")]


def _record_rel():
    return os.path.relpath(_originals.record_file("/", MODPROBE), "/")


def unharden_build(_variant, root, outside):
    path = _write(root, MODPROBE, ORIGINAL)
    _originals.before_write(_Recorder(root), _Change(str(path), ORIGINAL, WRITTEN))
    path.write_text(WRITTEN)

    def after_success(built, result):
        now = path.read_text() if path.is_file() and not path.is_symlink() else None
        restored = [entry for entry in result.get("files", []) if entry.get("action") == "restore"]
        if restored and now != ORIGINAL:
            return ["%s reported restored but holds %r" % (MODPROBE, (now or "")[:80])]
        return []

    return Built(root, outside, {"root": str(root)}, after_success=after_success, names={"writers": ["writers"]})


@dataclass
class _Change:
    path: str
    before: str
    after: str
    reason: str = ""
    restorable: bool = True


# ---------------------------------------------------------------------------------------------------------------
# node_audit: every node-side check in one run


AUDIT_MIG = "/etc/nvidia-mig-manager/config.yaml"


def node_audit_targets(variant):
    systemd, _cgroupfs = _pod_dirs()
    targets = [Target(AUDIT_MIG, "mig"), Target("/sys/fs/cgroup-v2/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s"
                                              ".slice/memory.max" % UID_A.replace("-", "_"), "cgroup"),
               Target(_v1_paths()["ok"] + "/devices.list", "lines")] + _driver_targets("h100-mig-enabled")
    if variant == "every-check":
        targets += [Target("/var/lib/kubelet/config.yaml", "yaml"), Target("/etc/containerd/config.toml", "toml"),
                    Target("/etc/group", "colon")]
    return targets


def node_audit_build(variant, root, outside):
    node = _nvml_node(root, "h100-mig-enabled")
    _write(root, AUDIT_MIG, (UNIT / "mig" / "mixed-per-index.yaml").read_text())
    systemd, cgroupfs = _pod_dirs()
    v2 = "/sys/fs/cgroup-v2"
    _write(root, v2 + "/cgroup.controllers", "cpuset cpu io memory pids\n")
    _write_cgroup(root, systemd.replace("/sys/fs/cgroup", v2), 16 * GI)
    _write(root, "/sys/fs/cgroup/devices/devices.list", "a *:* rwm\n")
    _write(root, _v1_paths()["ok"] + "/devices.list", "c 195:1 rw\nc 195:255 rw\nc *:* m\n")
    args = {"root": str(root), "node_name": "n1", "facts": True, "nvml": {"check_unprivileged": False},
            "mig": {"config_file": AUDIT_MIG, "selected": "mixed-per-index"},
            "cgroup_memory": {"cgroup_root": v2, "pod_uids": [UID_A], "page_size": PAGE},
            "device_cgroups": {"pod_resources_socket": "/nonexistent/kubelet.sock"}}
    if variant == "every-check":
        shutil.copytree(UNIT / "kubelet" / "kubeadm", root, dirs_exist_ok=True)
        _write(root, "/etc/containerd/config.toml", (UNIT / "containerd" / "v2-single.toml").read_text())
        _write(root, "/usr/bin/nvidia-container-runtime", "#!/bin/sh\nexit 0\n", 0o755)
        _write(root, "/etc/group", "root:x:0:\nvideo:x:44:\n")
        _write(root, "/etc/passwd", "root:x:0:0::/root:/bin/sh\n")
        args.update(kubelet=dict(KUBELET_ARGS), containerd={}, device_nodes={})

    def judge_result(built, result):
        problems = []
        for name, check in (result.get("checks") or {}).items():
            for entry in check.get("not_checked") or []:
                from tests.fuzz.engine import message_problem

                problem = message_problem(entry.get("cause", ""), None)
                if problem:
                    problems.append("checks.%s.not_checked cause %s" % (name, problem))
        return problems

    return Built(root, outside, args, env=node.env(), after_success=judge_result)


# ---------------------------------------------------------------------------------------------------------------
# the node planners of the kubelet, containerd and the device nodes


KUBEADM_CONFIG = "/var/lib/kubelet/config.yaml"
K3S_DROPINS = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"


def kubelet_targets(variant):
    if variant.startswith("kubeadm"):
        return [Target(KUBEADM_CONFIG, "json" if variant == "kubeadm-json" else "yaml", writes=True),
                Target("/var/lib/kubelet/kubeadm-flags.env", "lines"),
                Target("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", "lines"),
                Target("/var/lib/kubelet/cpu_manager_state", "json", writes=True)]
    return [Target("/etc/rancher/k3s/config.yaml", "yaml"), Target(K3S_DROPINS + "/10-site.conf", "yaml"),
            Target(K3S_DROPINS + "/00-k3s-defaults.conf", "yaml"), Target(K3S_DROPINS + "/50-gpuharden.conf", "yaml", writes=True),
            Target("/etc/systemd/system/k3s-agent.service", "lines")]


def kubelet_build(variant, root, outside):
    flavor = "kubeadm" if variant.startswith("kubeadm") else "k3s"
    shutil.copytree(UNIT / "kubelet" / flavor, root, dirs_exist_ok=True)
    if variant == "kubeadm-json":
        path = Path(str(root) + KUBEADM_CONFIG)
        path.write_text(json.dumps(yaml.safe_load(path.read_text()), indent=2) + "\n")

    def validate(built, changed):
        problems = []
        for path in changed:
            node_path = path[len(str(root)):]
            if node_path == KUBEADM_CONFIG:
                problems.extend(validators.kubelet_file(path, full=True))
            elif node_path.startswith(K3S_DROPINS) or node_path.startswith("/var/lib/kubelet/config.yaml"):
                problems.extend(validators.kubelet_file(path, full=False))
        return problems

    return Built(root, outside, dict(KUBELET_ARGS, root=str(root)), validate=validate)


CONTAINERD_VARIANTS = ("v2-single.toml", "v3-confd", "v2-comments.toml", "v3-single.toml")


def containerd_targets(variant):
    targets = [Target("/etc/containerd/config.toml", "toml", writes=True), Target("/etc/containerd/conf.d/99-nvidia.toml", "toml", writes=True),
               Target("/usr/bin/nvidia-container-runtime", "lines"), Target("path", "option"), Target("drop_in", "option")]
    if variant == "v3-confd":
        targets.append(Target("/etc/containerd/conf.d/10-registry.toml", "toml"))
    return targets


def containerd_build(variant, root, outside):
    source = UNIT / "containerd" / variant
    (root / "etc/containerd").mkdir(parents=True)
    if source.is_dir():
        shutil.copytree(source, root / "etc/containerd", dirs_exist_ok=True)
    else:
        shutil.copy(source, root / "etc/containerd/config.toml")
    _write(root, "/usr/bin/nvidia-container-runtime", "#!/bin/sh\nexit 0\n", 0o755)

    def validate(built, changed):
        if not any(path.endswith(".toml") for path in changed):
            return []
        return validators.containerd_config(root, "/etc/containerd/config.toml")

    return Built(root, outside, {"root": str(root), "drop_in": "/etc/containerd/conf.d/99-nvidia.toml"}, validate=validate,
                 names={"path": ["path"], "drop_in": ["drop_in"]})


DEVICE_VARIANTS = ("l4", "dgx-a100-80gb")


def device_targets(variant):
    return _driver_targets(variant)[:3] + [
        Target("/etc/group", "colon"), Target("/etc/passwd", "colon"), Target(MODPROBE, "lines", writes=True),
        Target("/dev/nvidia0", "dir"), Target("/dev/nvidia-caps", "dir"), Target("modprobe_file", "option"),
        Target("group", "option"), Target("mode", "option")]


def device_build(variant, root, outside):
    node = build_node_root(root, variant)
    (root / "dev/char").mkdir()
    _write(root, "/etc/passwd", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    _write(root, "/etc/group", "root:x:0:\nvideo:x:1234:\ngpu:x:2000:\nnogroup:x:65534:\n")

    def validate(built, changed):
        problems = []
        for path in changed:
            if path.endswith(".conf") and "/modprobe.d/" in path:
                problems.extend(validators.modprobe_file(path))
                if (built.args.get("group") == "video" and Path(str(root) + "/etc/group").is_file()
                        and "NVreg_DeviceFileGID=1234" not in Path(path).read_text()):
                    problems.append("%s does not give the node's video group (1234): %r" % (path, Path(path).read_text()[:200]))
        return problems

    def wrong_if(case, target):
        # the node's user database unreadable: any group id the module then applies is the wrong machine's
        if target.path in ("/etc/group", "/etc/passwd") and case.family in SPECIAL_UNREADABLE:
            return "%s is %s on the node, yet the module resolved the group and succeeded" % (target.path, case.family)
        return None

    return Built(root, outside, {"root": str(root), "policy": "restricted", "group": "video", "mode": "0660"}, env=node.env(),
                 validate=validate, names={"modprobe_file": ["modprobe_file"], "group": ["group"], "mode": ["mode"]},
                 wrong_if=wrong_if)


SPECIAL_UNREADABLE = ("fifo", "directory", "device", "socket", "parent_is_file", "link_out_abs", "link_out_rel", "link_dangling",
                      "link_loop", "invalid_utf8", "huge")


# ---------------------------------------------------------------------------------------------------------------
# device_plugin (the controller-side module, against tests/fuzz/apiserver.py)


PLUGIN_CONFIG_MAP = "/api/v1/namespaces/kube-system/configmaps/old-plugin-config"
PLUGIN_API = {"/apis/apps/v1/daemonsets": ["daemonsets", "DaemonSet"], "/api/v1/nodes": ["nodes", "Node"],
              PLUGIN_CONFIG_MAP: ["old-plugin-config", "ConfigMap", "config"]}


def plugin_targets(_variant):
    return [Target(path, "api") for path in PLUGIN_API] + [Target("time_slicing", "option"), Target("node_selector", "option"),
                                                           Target("version", "option"), Target("tolerations", "option")]


def plugin_build(_variant, root, outside):
    from tests.fuzz.apiserver import FakeApiServer
    from tests.unit.test_device_plugin import GPU, node, plugin_ds

    root.mkdir(parents=True, exist_ok=True)
    server = FakeApiServer()
    server.objects["/apis/apps/v1/daemonsets"] = [plugin_ds("old-plugin", config_map="old-plugin-config")]
    server.objects["/api/v1/nodes"] = [node("gpu-a", dict(GPU)), node("gpu-b", dict(GPU)), node("cpu-0")]
    server.objects["/apis/node.k8s.io/v1/runtimeclasses/nvidia"] = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                                   "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    server.objects[PLUGIN_CONFIG_MAP] = {"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "old-plugin-config", "namespace": "kube-system"},
                                         "data": {"config.yaml": "version: v1\nflags:\n  migStrategy: none\n"}}

    def validate(built, _changed):
        problems = []
        for path, body in server.written.items():
            if "/configmaps/" in path:
                for key, text in ((body.get("data") or {}) if isinstance(body.get("data"), dict) else {}).items():
                    try:
                        data = yaml.safe_load(text)
                        assert isinstance(data, dict) and data.get("version") == "v1"
                    except (yaml.YAMLError, AssertionError) as error:
                        problems.append("the ConfigMap %s key %s is no device plugin config: %s" % (path, key, error))
        return problems

    args = {"kubeconfig": server.kubeconfig(outside.parent / "kubeconfig"), "wait": False, "request_timeout": 5}
    built = Built(root, outside, args, server=server, validate=validate, again=False, names=dict(PLUGIN_API, **{
        option: [option] for option in ("time_slicing", "node_selector", "version", "tolerations")}))
    built.cleanup.append(server.close)
    return built


SPECS = {
    "cgroup_memory": Spec("cgroup_memory", ("systemd-and-cgroupfs",), cgroup_targets, cgroup_build),
    "mig_layout": Spec("mig_layout", MIG_VARIANTS, mig_targets, mig_build),
    "gpu_facts": Spec("gpu_facts", NVML_VARIANTS, facts_targets, facts_build),
    "nvml_check": Spec("nvml_check", NVML_VARIANTS, facts_targets, nvml_build),
    "process_cgroup_info": Spec("process_cgroup_info", ("v1-and-v2",), proc_targets, proc_build),
    "device_cgroup_audit": Spec("device_cgroup_audit", ("v1-tree",), audit_targets, audit_build),
    "node_lock": Spec("node_lock", ("absent", "stale", "held"), lock_targets, lock_build),
    "unharden_files": Spec("unharden_files", ("one-record",), unharden_targets, unharden_build),
    "node_audit": Spec("node_audit", ("gpu-checks", "every-check"), node_audit_targets, node_audit_build),
    "kubelet_config": Spec("kubelet_config", ("kubeadm", "kubeadm-json", "k3s"), kubelet_targets, kubelet_build),
    "containerd_nvidia_runtime": Spec("containerd_nvidia_runtime", CONTAINERD_VARIANTS, containerd_targets, containerd_build),
    "nvidia_device_nodes": Spec("nvidia_device_nodes", DEVICE_VARIANTS, device_targets, device_build),
    "device_plugin": Spec("device_plugin", ("one-old-plugin",), plugin_targets, plugin_build),
}
