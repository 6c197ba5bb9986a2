#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compare the NVML double with a real NVIDIA machine, READ-ONLY (< 5 min).

On a machine with a real NVIDIA GPU and driver, from a checkout of this repository (run as root):

    .venv/bin/python tools/gpu_reality_check.py [--fixture NAME] [--build] [--json REPORT]

1. Real side: the collection's gpu_facts and nvml_check modules (run directly by Python, as Ansible would
   run them) and the real NVIDIA k8s-device-plugin's discovery (``--kubelet-socket ''``: no registration;
   its fixed socket dir is a temp dir in a private mount namespace; read by dp-listwatch), on a MIG-capable
   GPU its MIG GPU-instance profiles (NVML getters; the collection's profile table of them), and node_audit
   (read-only, without the run lock).
2. Double side: the same three against the NVML double with the nearest shipped fixture (by GPU name, count
   and MIG mode), on a node root built by the lab (bind-mounted over /proc/driver and /sys/bus/pci/devices in
   the plugin's private namespace only).
3. Prints every value where the two disagree (UUIDs and bus ids included: they always differ).

It never changes GPU or driver settings: no MIG mode, GPU/compute instance, reset, persistence, clocks or power
call is made (gpu_facts and nvml_check are read-only modules, the plugin only enumerates and waits for health
events), and nothing outside a temp dir and this checkout's build/ is written.  --build compiles the NVML
double (gcc) and the plugin (Go, Go module proxy) when they are missing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fakes" / "nvml" / "fixtures"
NVML_BUILD = REPO / "build" / "nvml"
COLLECTIONS = REPO / "build" / "collections"
VERSIONS_ENV = REPO / "lab" / "realcomponents" / "versions.env"
DOUBLE_VARS = ("NVML_DOUBLE_FIXTURE", "NVML_DOUBLE_STATE", "NVML_DOUBLE_DEV_DIR")
STRATEGIES_WITH_MIG = ("none", "single", "mixed")


def log(msg: str) -> None:
    print("gpu_reality_check: " + msg, file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    out = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        m = re.match(r"^([A-Z0-9_]+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def double_library(work: Path) -> Path:
    """A copy of the double in the (world-readable) work dir, so nvml_check's unprivileged probe can load it."""
    d = work / "nvml"
    if not (d / "libnvidia-ml.so.1").exists():
        d.mkdir(mode=0o755)
        shutil.copy2(NVML_BUILD / "libnvidia-ml.so.1", d / "libnvidia-ml.so.1")
    return d


def real_env() -> dict[str, str]:
    """The environment with nothing pointing at the double.

    A driver whose libraries are reached only through LD_LIBRARY_PATH (a container image's /usr/local/nvidia) keeps
    that entry; an entry holding the double does not stay.  PYTHONPATH keeps what it had (a carried ansible-core).
    """
    env = {k: v for k, v in os.environ.items() if k not in DOUBLE_VARS and k != "LD_LIBRARY_PATH"}
    kept = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
            if d and not _is_double_dir(Path(d))]
    if kept:
        env["LD_LIBRARY_PATH"] = ":".join(kept)
    env["PYTHONPATH"] = os.pathsep.join([str(COLLECTIONS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _is_double_dir(d: Path) -> bool:
    lib = d / "libnvidia-ml.so.1"
    try:
        return lib.exists() and (d.resolve() == NVML_BUILD.resolve() or b"NVML_DOUBLE_FIXTURE" in lib.read_bytes())
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Preparation


def prepare(build: bool, plugin_version: str | None = None) -> tuple[Path | None, str]:
    """Collection link, the NVML double, the plugin binaries (dir or None) and its version (versions.env's
    NVIDIA_DEVICE_PLUGIN_VERSION, or ``plugin_version``: a version, or ``old`` for NVIDIA_DEVICE_PLUGIN_OLD_VERSION)."""
    link = COLLECTIONS / "ansible_collections" / "gpuharden" / "k8s"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO)
    if not (NVML_BUILD / "libnvidia-ml.so.1").exists():
        log("building the NVML double")
        subprocess.run(["sh", str(REPO / "tests/fakes/nvml/build.sh"), str(NVML_BUILD)], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
    pinned = versions()
    version = {None: pinned["NVIDIA_DEVICE_PLUGIN_VERSION"],
               "old": pinned["NVIDIA_DEVICE_PLUGIN_OLD_VERSION"]}.get(plugin_version, plugin_version)
    cache = Path(os.environ.get("GPUHARDEN_CACHE") or Path.home() / ".cache" / "gpuharden")
    bindir = cache / "realcomponents" / ("nvidia-device-plugin-" + version)
    if not (bindir / "nvidia-device-plugin").exists() and build:
        log("building nvidia-device-plugin %s (minutes)" % version)
        subprocess.run(["bash", str(REPO / "lab/realcomponents/build-device-plugin.sh"), version], check=True,
                       stdout=subprocess.DEVNULL, timeout=900)
    if not all(os.access(bindir / n, os.X_OK) for n in ("nvidia-device-plugin", "dp-listwatch")):
        log("%s not built (make real-device-plugin, or --build): the plugin part is skipped" % bindir)
        return None, version
    return bindir, version


# ---------------------------------------------------------------------------------------------------------------
# The collection's modules


def run_module(name: str, args: dict, env: dict[str, str], work: Path) -> dict:
    """Run plugins/modules/<name>.py with AnsibleModule's args file; its JSON result."""
    args_file = work / ("%s-args-%d.json" % (name, time.monotonic_ns()))
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    p = subprocess.run([sys.executable, "-m", "ansible_collections.gpuharden.k8s.plugins.modules." + name,
                        str(args_file)], capture_output=True, text=True, env=env, timeout=120, cwd=work)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"failed": True, "msg": "no JSON from %s (rc %d)" % (name, p.returncode),
                "stdout": p.stdout[-2000:], "stderr": p.stderr[-2000:]}


def without_root(value, root: str):
    """The result as seen from inside the node: the node root's prefix taken off every path in it."""
    if root == "/":
        return value
    text = json.dumps(value).replace(json.dumps(root)[1:-1], "")
    return json.loads(text)


# What node_audit (read-only; no lock) says of the GPU node: the device nodes as the device_permissions role's defaults
# want them, NVML health, the device cgroups (the real machine's; the double's node root has none) and, on a
# MIG-capable GPU, a layout of the profile with the most instances (planned from the profile table NVML reports; an
# audit never applies it).
def audit_args(root: str, profiles: dict | None, cgroups: bool = True) -> dict:
    """node_audit's options; ``cgroups=False`` leaves out the device-cgroup check (a node root has no cgroups)."""
    args = {"root": root, "device_nodes": {}, "nvml": {}}
    if cgroups:
        args["device_cgroups"] = {}
    table = ((profiles or {}).get("0") or {}).get("table") or {}
    if table:
        name = max(sorted(table), key=lambda n: (table[n]["instance_count"], -table[n]["slices"], "+" not in n))
        args["mig"] = {"layout": {"all": {name: table[name]["instance_count"]}}, "strategy": "mixed"}
    return args


# ---------------------------------------------------------------------------------------------------------------
# MIG profile tables (NVML getters only)

PROFILE_PROBE = r"""
import json, pynvml
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml, _nvml
FIELDS = ("id", "sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount", "decoderCount",
          "encoderCount", "jpegCount", "ofaCount", "memorySizeMB")
out = {}
pynvml.nvmlInit()
try:
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpu = {"raw": {}, "errors": {}}
        for enum in _nvml.GPU_INSTANCE_PROFILE_ENUMS:
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
            except pynvml.NVMLError as error:
                gpu["errors"][str(enum)] = str(error)
                continue
            gpu["raw"][str(enum)] = dict({f: getattr(info, f) for f in FIELDS}, name=_nvml.profile_name(info.name))
        try:
            gpu["table"] = _mig_nvml.profile_table(handle)
        except pynvml.NVMLError as error:
            gpu["table_error"] = str(error)
        # What mig_layout plans from (its read path: getters only).
        seen = _mig_nvml.read_gpu(index)
        gpu["mig_layout_reads"] = {key: seen[key] for key in ("mig_capable", "mode_current", "mode_pending",
                                                              "profile_table_source")}
        out[str(index)] = gpu
finally:
    pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def mig_profiles(env: dict[str, str], work: Path) -> dict:
    """Every GPU's MIG GPU-instance profiles as NVML reports them, and the collection's profile table of them."""
    p = subprocess.run([sys.executable, "-c", PROFILE_PROBE], capture_output=True, text=True, env=env, timeout=60,
                       cwd=work)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"failed": True, "rc": p.returncode, "stderr": p.stderr[-2000:]}


# ---------------------------------------------------------------------------------------------------------------
# The real device plugin


def skips_registration(version: str) -> bool:
    """Whether the release has ``--kubelet-socket ''`` (no registration); v0.15.x has no such flag and must register
    (tests/real/device_plugin.py runs it the same way)."""
    numbers = tuple(int(part) for part in re.findall(r"[0-9]+", version)[:2])
    return numbers >= (0, 16)


def run_plugin(bindir: Path, version: str, strategy: str, env: dict[str, str], work: Path,
               node_root: Path | None) -> dict:
    """Start the plugin in a private mount namespace (without registering, or registering with dp-listwatch playing
    the kubelet where the release cannot skip it); what it advertised, or how it failed."""
    d = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: unix socket paths
    fake_kubelet = None
    try:
        sockdir = d / "varlib" / "kubelet" / "device-plugins"
        sockdir.mkdir(parents=True)
        flags = '--kubelet-socket ""'
        if not skips_registration(version):
            flags = ""
            fake_kubelet = subprocess.Popen([str(bindir / "dp-listwatch"), "-dir", str(sockdir), "-kubelet", "60s",
                                             "-quiet", "1.5s", "-timeout", "5s"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while not (sockdir / "kubelet.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        (d / "config.yaml").write_text(json.dumps({"version": "v1", "flags": {"migStrategy": strategy}}))
        host_dir = Path("/var/lib/kubelet/device-plugins")
        # Over the existing socket dir when there is one (a kubelet may use it), else over /var/lib: nothing new
        # is created on the host.
        mounts = ("mount --bind %s %s" % (sockdir, host_dir)) if host_dir.is_dir() else "mount --bind %s/varlib /var/lib" % d
        if node_root is not None:
            mounts += " && mount --bind %s/proc/driver /proc/driver" % node_root
            mounts += " && mount --bind %s/sys/bus/pci/devices /sys/bus/pci/devices" % node_root
        script = 'set -e; %s; cd %s; exec "$0" %s --config-file %s/config.yaml' % (mounts, d, flags, d)
        logf = d / "plugin.log"
        with open(logf, "wb") as out:
            proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                                     str(bindir / "nvidia-device-plugin")],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=d)
        result: dict = {"strategy": strategy}
        deadline, last, since = time.monotonic() + 45, None, time.monotonic()
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            text = logf.read_text(errors="replace")
            if text != last:
                last, since = text, time.monotonic()
            if ("Registered device plugin for" in text or "No devices found" in text) and time.monotonic() - since > 1:
                break
            time.sleep(0.1)
        if proc.poll() is None:
            p = subprocess.run([str(bindir / "dp-listwatch"), "-dir", str(sockdir), "-timeout", "5s"],
                               capture_output=True, text=True, timeout=30)
            resources = {}
            for line in p.stdout.splitlines():
                ev = json.loads(line)
                if ev["event"] == "list":
                    name = "nvidia.com/" + ev["socket"].removeprefix("nvidia-").removesuffix(".sock")
                    resources[name] = sorted(x["id"] + ("" if x["health"] == "Healthy" else " (%s)" % x["health"])
                                             for x in ev["devices"])
            result["resources"] = {k: {"count": len(v), "devices": v} for k, v in sorted(resources.items())}
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        else:
            result["exit_code"] = proc.returncode
        text = logf.read_text(errors="replace")
        errors = [ln.split("] ", 1)[-1] for ln in text.splitlines() if re.match(r"^[EF]\d{4} ", ln)]
        result["errors"] = errors[-6:]
        result["warnings"] = [ln.split("] ", 1)[-1] for ln in text.splitlines() if re.match(r"^W\d{4} ", ln)][-5:]
        if "symbol lookup error" in text:
            result["errors"].append(text[text.index("symbol lookup error"):].splitlines()[0])
        return result
    finally:
        if fake_kubelet is not None:
            fake_kubelet.kill()
            fake_kubelet.wait()
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# Fixture choice and comparison


def nearest_fixture(gpus: list[dict]) -> tuple[str, float]:
    names = [g.get("name") or "" for g in gpus]
    mig_on = any((g.get("mig") or {}).get("mode_current") == "enabled" for g in gpus)
    best, best_score = None, -1.0
    for path in sorted(FIXTURES.glob("*.json")):
        fx = json.loads(path.read_text())
        fnames = [g["name"] for g in fx["gpus"]]
        sim = sum(max((difflib.SequenceMatcher(None, n, f).ratio() for f in fnames), default=0) for n in names)
        sim /= max(len(names), 1)
        fx_mig = any((g.get("mig") or {}).get("mode") for g in fx["gpus"])
        healthy = not any(g.get("lost") or g.get("ecc", {}).get("volatile", {}).get("uncorrected") for g in fx["gpus"])
        score = sim * 10 + (1 if fx_mig == mig_on else 0) + (0.5 if healthy else 0) - 0.05 * abs(len(fnames) - len(names))
        score -= 0.2 * ("degraded" in path.name)
        if score > best_score:
            best, best_score = path.stem, score
    return best, best_score


def flatten(value, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for i, v in enumerate(value):
            out.update(flatten(v, "%s[%d]" % (prefix, i)))
    else:
        out[prefix] = value
    return out


def disagreements(real: dict, double: dict) -> list[tuple[str, object, object]]:
    real, double = ({k: v for k, v in d.items() if k != "invocation"} for d in (real, double))
    a, b = flatten(real), flatten(double)
    missing = object()
    rows = []
    for key in sorted(set(a) | set(b)):
        if key.rsplit(".", 1)[-1] in ("seconds", "cpu_seconds"):  # timings, and node_audit's CPU
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            rows.append((key, "<absent>" if va is missing else va, "<absent>" if vb is missing else vb))
    return rows


def show(title: str, rows: list[tuple[str, object, object]]) -> None:
    print("\n== %s: %d value(s) differ" % (title, len(rows)))
    if rows:
        width = min(max(len(r[0]) for r in rows), 70)
        print("%-*s  %-40s  %s" % (width, "path", "real", "double"))
        for key, va, vb in rows:
            print("%-*s  %-40s  %s" % (width, key, json.dumps(va)[:200], json.dumps(vb)[:200]))


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", help="fixture name under tests/fakes/nvml/fixtures (default: the nearest)")
    ap.add_argument("--build", action="store_true", help="build the NVML double and the device plugin when missing")
    ap.add_argument("--json", help="also write every raw result here")
    ap.add_argument("--no-plugin", action="store_true", help="skip the device plugin part")
    ap.add_argument("--plugin-version", help="the device plugin release to run (default: versions.env's; 'old': the "
                    "older pinned one)")
    ap.add_argument("--self-test", metavar="FIXTURE",
                    help="check this tool without a GPU: the 'real' side is the NVML double with FIXTURE")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        log("run as root: nvml_check's unprivileged probe, the node root (mknod) and the plugin's mount namespace need it")
        return 2
    t0 = time.monotonic()
    bindir, version = prepare(args.build, args.plugin_version)
    if args.no_plugin:
        bindir = None
    work = Path(tempfile.mkdtemp(prefix="gpu-reality-"))
    os.chmod(work, 0o755)
    report: dict = {"plugin_version": version}
    sys.path.insert(0, str(REPO / "lab" / "src"))
    from gpuharden_lab.noderoot import build_node_root

    try:
        env, real_root = real_env(), None
        if args.self_test:
            real_root = build_node_root(work / "self-test", args.self_test, mig_capabilities=True)
            env = dict(env, **real_root.env())
            env["LD_LIBRARY_PATH"] = str(double_library(work))
            report["self_test"] = args.self_test
        root_opt = str(real_root.root) if real_root else "/"
        log("real: gpu_facts, nvml_check")
        report["real"] = {"gpu_facts": run_module("gpu_facts", {"root": root_opt}, env, work),
                          "nvml_check": run_module("nvml_check", {"root": root_opt}, env, work)}
        facts = report["real"]["gpu_facts"].get("ansible_facts", {}).get("gpuharden", {})
        if not (facts.get("nvml") or {}).get("available"):
            log("NVML is not usable on this machine: %s" % json.dumps((facts.get("nvml") or {}).get("reason")))
        gpus = facts.get("gpus") or []
        fixture = args.fixture
        if not fixture:
            fixture, score = nearest_fixture(gpus)
            log("nearest fixture: %s (score %.2f) for %s" % (fixture, score, sorted({g.get("name") for g in gpus})))
        report["fixture"] = fixture
        mig_capable = any((g.get("mig") or {}).get("capable") for g in gpus)
        strategies = STRATEGIES_WITH_MIG if mig_capable else ("none",)

        node = build_node_root(work / "node", fixture, mig_capabilities=True)
        denv = dict(env, **node.env())
        denv["LD_LIBRARY_PATH"] = str(double_library(work))
        log("double: gpu_facts, nvml_check on %s" % fixture)
        report["double"] = {"gpu_facts": run_module("gpu_facts", {"root": str(node.root)}, denv, work),
                            "nvml_check": run_module("nvml_check", {"root": str(node.root)}, denv, work)}
        if mig_capable:
            log("real and double: MIG profile tables")
            report["real"]["mig_profiles"] = mig_profiles(env, work)
            report["double"]["mig_profiles"] = mig_profiles(denv, work)
        profiles = report["real"].get("mig_profiles")
        log("real and double: node_audit")
        report["real"]["node_audit"] = without_root(
            run_module("node_audit", audit_args(root_opt, profiles), env, work), root_opt)
        report["double"]["node_audit"] = without_root(
            run_module("node_audit", audit_args(str(node.root), profiles, cgroups=real_root is not None), denv, work),
            str(node.root))
        if bindir is not None:
            for side, e, root in (("real", env, real_root.root if real_root else None), ("double", denv, node.root)):
                report[side]["device_plugin"] = {}
                for strategy in strategies:
                    log("%s: nvidia-device-plugin %s, migStrategy %s" % (side, version, strategy))
                    report[side]["device_plugin"][strategy] = run_plugin(bindir, version, strategy, e, work, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for part in ("gpu_facts", "nvml_check", "mig_profiles", "node_audit", "device_plugin"):
        if part in report["real"] or part in report["double"]:
            show("%s (real vs double %s)" % (part, report["fixture"]),
                 disagreements(report["real"].get(part, {}), report["double"].get(part, {})))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        log("raw results in %s" % args.json)
    log("done in %.0fs" % (time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
