# SPDX-License-Identifier: GPL-3.0-or-later
"""The components' own checks of what a module wrote (a success counts only when the component accepts it).

* kubelet: ``kubelet-validate`` (lab/controlplane/kubelet-validate, built against k8s.io/kubernetes v1.36.3 by
  ``make control-plane``): the kubelet's own decoder, defaulting and validation.  Every written config or drop-in
  must decode (exit 2 is "couldn't get version/kind", a JSON parse error, an unknown field); the file the kubelet
  starts on must validate (exit 0).
* containerd: the real containerd's config loader, ``containerd --config <file> config dump`` (v2.4.2, and v1.7.35 for
  version-2 files), which reads the main file and its imports as the daemon does at start.  Imports are pointed into
  the node root first (a copy of the main file outside it).  Starting the daemon on each case would take seconds; the
  real daemon's start on the module's layouts is tests/real/test_containerd_real.py.
* MIG: what mig-parted's ``assert`` checks (NVIDIA/mig-parted v0.15.0 cmd/nvidia-mig-parted/assert): every GPU the
  selected config selects has the mode and the GPU-instance profile counts of its entry; plus what the driver
  enforces: placements inside the profile's table, no two instances on one memory slice.
* modprobe.d and cgroup values: their kernel syntax.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tomllib
from functools import lru_cache
from pathlib import Path

import tomlkit
import yaml
from gpuharden_lab import REPO_ROOT

CACHE = Path.home() / ".cache" / "gpuharden"
CTL = REPO_ROOT / "tests/fakes/nvml/nvml_double_ctl.py"


@lru_cache(maxsize=1)
def kubelet_validate_binary():
    found = sorted(glob.glob(str(CACHE / "controlplane" / "*" / "bin" / "kubelet-validate")))
    return found[-1] if found else None


@lru_cache(maxsize=2)
def containerd_binary(major):
    found = sorted(glob.glob(str(CACHE / "realcomponents" / ("containerd-v%s.*" % major) / "containerd")))
    return found[-1] if found else None


def require_built():
    return os.environ.get("GPUHARDEN_REQUIRE_BUILT") == "1"


# kubelet-validate's exit codes (lab/controlplane/kubelet-validate): 0 the kubelet would start on the file, 1 its
# validation refuses it, 2 its decoder refuses it
KUBELET_VALIDATE_ACCEPTS, KUBELET_VALIDATE_REFUSES, KUBELET_DECODER_REFUSES = 0, 1, 2


def kubelet_validate_exit(directory, text):
    """kubelet-validate's exit code for a config file of ``text`` written in ``directory``; a test that needs it is
    skipped where it is not built (failed under GPUHARDEN_REQUIRE_BUILT=1)."""
    import pytest  # noqa: PLC0415 (the fuzz runner imports this module without pytest)

    binary = kubelet_validate_binary()
    if binary is None:
        if require_built():
            pytest.fail("kubelet-validate is not built (make control-plane)")
        pytest.skip("kubelet-validate is not built (make control-plane)")
    path = Path(directory) / "config.yaml"
    path.write_text(text)
    done = subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (KUBELET_VALIDATE_ACCEPTS, KUBELET_VALIDATE_REFUSES, KUBELET_DECODER_REFUSES), done.stderr[-300:]
    return done.returncode


def kubelet_file(path, full=True):
    """Problems the kubelet's own code finds in the config file ``path`` (empty: accepted)."""
    binary = kubelet_validate_binary()
    if binary is None:
        if require_built():
            return ["kubelet-validate is not built (make control-plane)"]
        try:
            yaml.safe_load(Path(path).read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            return ["%s: not YAML: %s" % (path, " ".join(str(error).split())[:200])]
        return []
    done = subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 2 or (full and done.returncode != 0):
        reason = (done.stderr.strip().splitlines() or [done.stdout.strip()[:300]])[-1]
        return ["kubelet-validate refuses %s (rc %d): %s" % (path, done.returncode, reason[:300])]
    return []


def containerd_config(root, main):
    """Problems the real containerd's loader finds in the node's main config ``main`` (node path) and its imports."""
    here = Path(str(root) + main)
    if not here.is_file():
        return []
    try:
        data = tomllib.loads(here.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        return ["%s is not TOML: %s" % (main, error)]
    doc = tomlkit.parse(here.read_text())
    if "imports" in doc:
        base = os.path.dirname(main)
        doc["imports"] = [str(root) + (item if item.startswith("/") else os.path.join(base, item)) for item in data["imports"]]
    problems = []
    versions = ["2"] + (["1"] if data.get("version", 1) <= 2 else [])
    for major in versions:
        binary = containerd_binary(major)
        if binary is None:
            if require_built():
                problems.append("containerd v%s is not built (make real-components)" % major)
            continue
        copy = Path(root).parent / "containerd-validate.toml"
        copy.write_text(tomlkit.dumps(doc))
        done = subprocess.run([binary, "--config", str(copy), "config", "dump"], capture_output=True, text=True, timeout=60,
                              check=False)
        if done.returncode != 0:
            problems.append("containerd %s refuses %s: %s" % (Path(binary).parent.name, main,
                                                            (done.stderr.strip().splitlines() or ["?"])[-1][:300]))
    return problems


_MODPROBE_LINE = re.compile(r"^(?:options\s+\S+(?:\s+[A-Za-z_][A-Za-z0-9_.-]*(?:=\S+)?)+|(?:install|remove|blacklist|alias|softdep|weakdep)\s.*)$")


def modprobe_file(path):
    problems = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not _MODPROBE_LINE.match(stripped):
            problems.append("%s:%d is not a modprobe.d line: %r" % (path, number, line[:120]))
    return problems


def cgroup_value(text):
    return [] if re.fullmatch(r"[0-9]+\n?", text) else ["not a byte count the kernel takes: %r" % text[:40]]


# ---------------------------------------------------------------------------------------------------------------
# MIG: mig-parted's assert, and the driver's placement rules


def nvml_show(env):
    done = subprocess.run([sys.executable, str(CTL), "show", "--state", env["NVML_DOUBLE_STATE"], "--fixture",
                           env["NVML_DOUBLE_FIXTURE"]], capture_output=True, text=True, timeout=60, check=False)
    return json.loads(done.stdout)


def mig_assert(config, selected, shown, tables):
    """Problems mig-parted's assert would report for ``config``'s ``selected`` entries on the GPUs ``shown``."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig

    problems = []
    entries = config["mig-configs"][selected]
    gpus = shown["gpus"]
    want = {}
    for entry in entries:
        devices = entry["devices"]
        for gpu in gpus:
            index = gpu["index"]
            if devices != "all" and index not in devices:
                continue
            filters = entry.get("device-filter")
            if filters:
                filters = [filters] if isinstance(filters, str) else filters
                if (gpu.get("pci_device_id") or "").upper() not in [f[:10].upper() for f in filters]:
                    continue
            want[index] = entry
    for gpu in gpus:
        entry = want.get(gpu["index"])
        if entry is None:
            continue
        enabled = bool(entry["mig-enabled"])
        current, pending = gpu.get("mig_current"), gpu.get("mig_pending")
        if current is None:
            if enabled:
                problems.append("GPU %d is not MIG-capable but the config enables MIG" % gpu["index"])
            continue
        if bool(pending) != enabled:
            problems.append("GPU %d: MIG mode %s, the config says %s" % (gpu["index"], pending, enabled))
            continue
        if not enabled or current != pending:
            continue
        table = tables.get(gpu["index"]) or {}
        counts, used = {}, set()
        for instance in gpu.get("gpu_instances") or []:
            name = next((n for n, row in table.items() if row["id"] == instance.get("profile_id")), None)
            if name is None:
                problems.append("GPU %d: an instance of unknown profile id %s" % (gpu["index"], instance.get("profile_id")))
                continue
            counts[name] = counts.get(name, 0) + 1
            start, size = instance.get("start"), table[name]["size"]
            if start not in table[name]["starts"]:
                problems.append("GPU %d: %s at %s, not one of its placements %s" % (gpu["index"], name, start, table[name]["starts"]))
            slices = set(range(start, start + size))
            if slices & used:
                problems.append("GPU %d: %s at %s overlaps another instance" % (gpu["index"], name, start))
            used |= slices
        wanted = {_mig.table_name(name, table) or name: count for name, count in (entry.get("mig-devices") or {}).items() if count}
        if counts != wanted:
            problems.append("GPU %d: instances %s, the config asks for %s" % (gpu["index"], counts, wanted))
    return problems
