# SPDX-License-Identifier: GPL-3.0-or-later
"""A GPU node the NVIDIA GPU Operator runs: what its container toolkit and driver containers leave on the node
(scenario key ``real: {containerd: "2", nvidia_runtime: operator}``).

The lab runs no operator (its images are not served by the Go module proxy): it lays out what their DaemonSets' pods
write on a node, read from their sources, with the real toolkit binaries and the real containerd loading the result.

- The toolkit container (NVIDIA/gpu-operator v26.7.0 ``assets/state-container-toolkit/0500_daemonset.yaml``, ``ROOT``
  ``/usr/local/nvidia``) runs ``nvidia-toolkit`` (NVIDIA/nvidia-container-toolkit v1.20.0 ``cmd/nvidia-ctk-installer``):
  it installs the toolkit's executables under ``/usr/local/nvidia/toolkit`` (``main.go`` toolkitRoot,
  ``toolkit/installer/executables.go``), then writes containerd's drop-in ``/etc/containerd/conf.d/99-nvidia.toml``
  (``container/runtime/containerd/containerd.go`` DefaultDropInConfig) as ``container/container.go`` UpdateConfig does:
  the CRI runtime plugin's section of the config it read, copied (``pkg/config/engine/containerd/containerd.go``
  getBaseDropInConfigTree), the runtimes ``nvidia``, ``nvidia-cdi`` and ``nvidia-legacy`` (``container/operator/
  operator.go`` GetRuntimes) each with the default runtime's table and its own ``BinaryName`` (``pkg/config/engine/
  containerd/config.go`` AddRuntime, GetDefaultRuntimeOptions), and ``enable_cdi = true`` (EnableCDI: the operator
  enables CDI by default, ``api/nvidia/v1/clusterpolicy_types.go`` CDIConfigSpec, and then keeps runc the default
  runtime, ``controllers/object_controls.go`` transformToolkitCtrForCDI), and adds the import of ``conf.d/*.toml`` to
  the main config where it is missing (``config_drop_in.go`` ensureImports; containerd 2.4's default config has it).
  Here the executables are the real toolkit's (``build-container-toolkit.sh``), installed as the installer installs
  them (``toolkit/installer/executables.go``): ``nvidia-cdi-hook`` as it is, every other one as ``<name>.real`` behind a
  shell wrapper that puts the toolkit's directory first on ``PATH`` (where the runtime finds ``nvidia-cdi-hook`` and
  ``nvidia-ctk``).  Two differences, both for the lab's driver: the wrappers leave out upstream's check of
  ``/proc/modules`` for the nvidia module (the lab has no kernel module; upstream would run plain runc then) and its
  ``NVIDIA_CTK_CONFIG_FILE_PATH`` (the runtime then reads the toolkit's defaults, whose driver root is ``/``, where the
  lab's NVML double is); ``nvidia-container-runtime.cdi`` and ``.legacy`` wrap the same runtime.
- The driver container (``assets/state-driver/0500_daemonset.yaml``) mounts its root at ``/run/nvidia/driver`` and,
  once ready, leaves ``/run/nvidia/validations/.driver-ctr-ready`` (``cmd/nvidia-validator/main.go``).  The lab's
  driver is the NVML double of every lab node; ``/run/nvidia/driver`` holds only the tree that shows the driver
  container (an empty one is what the toolkit's DaemonSet leaves on every node, DirectoryOrCreate), written when the
  node starts (``/run`` is its own tmpfs then).
"""

from __future__ import annotations

import copy
from pathlib import Path

import tomlkit

TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
MAIN = "/etc/containerd/config.toml"
CRI_RUNTIME_PLUGIN = {2: "io.containerd.grpc.v1.cri"}  # any other version: io.containerd.cri.v1.runtime (containerd.go)
RUNTIMES = (("nvidia", "nvidia-container-runtime"), ("nvidia-cdi", "nvidia-container-runtime.cdi"),
            ("nvidia-legacy", "nvidia-container-runtime.legacy"))
# What the driver container's root shows on the node (its own root: the driver's userspace), and its ready file
DRIVER_ROOT_SCRIPT = ("mkdir -p /run/nvidia/driver/usr/bin /run/nvidia/driver/usr/lib/x86_64-linux-gnu /run/nvidia/validations"
                      " && : > /run/nvidia/validations/.driver-ctr-ready")


def with_import(main_config: str) -> str:
    """The main config with the import of the drop-in's directory, as the installer leaves it (config_drop_in.go
    ensureImports: ``<dir>/*.toml`` added to ``imports`` where missing; containerd 2.4's default config has it)."""
    document = tomlkit.parse(main_config)
    pattern = str(Path(DROP_IN).parent / "*.toml")
    imports = document.get("imports")
    if imports is None:
        document["imports"] = [pattern]
    elif pattern not in imports:
        imports.append(pattern)
    else:
        return main_config
    return tomlkit.dumps(document)


def drop_in(main_config: str) -> str:
    """The toolkit's drop-in for a node whose main containerd config is ``main_config``."""
    source = tomlkit.parse(main_config)
    version = int(source.get("version", 1))
    plugin = CRI_RUNTIME_PLUGIN.get(version, "io.containerd.cri.v1.runtime")
    section = copy.deepcopy(source["plugins"][plugin].unwrap())
    runtimes = section.setdefault("containerd", {}).setdefault("runtimes", {})
    base = runtimes.get(section["containerd"].get("default_runtime_name") or "runc") or {}
    for name, binary in RUNTIMES:
        runtime = copy.deepcopy(base)
        runtime.setdefault("options", {})["BinaryName"] = "%s/%s" % (TOOLKIT_DIR, binary)
        runtimes[name] = runtime
    section["enable_cdi"] = True
    document = tomlkit.document()
    document.add("version", version)
    document.add("plugins", {plugin: section})
    return tomlkit.dumps(document)


WRAPPER = """#! /bin/sh
# gpuharden lab: the GPU Operator's toolkit wrapper (nvidia-container-toolkit v1.20.0 toolkit/installer/executables.go),
# without its nvidia kernel module check and config file (operatornode.py)
PATH=%(dir)s:$PATH \\
\t%(dir)s/%(real)s \\
\t\t"$@"
"""


def toolkit_files(main_config: str, binaries: dict[str, Path]) -> dict[str, tuple[bytes | str, int]]:
    """{node path: (content, mode)} the toolkit container leaves: its executables, the drop-in and the main config with
    its import.  ``binaries``: the real toolkit's (realnode.container_toolkit_binaries)."""
    files: dict[str, tuple[bytes | str, int]] = {DROP_IN: (drop_in(main_config), 0o644), MAIN: (with_import(main_config), 0o644)}
    runtime = "nvidia-container-runtime"
    for name, binary in binaries.items():
        if name == "nvidia-cdi-hook":
            files["%s/%s" % (TOOLKIT_DIR, name)] = (binary.read_bytes(), 0o755)
            continue
        files["%s/%s.real" % (TOOLKIT_DIR, name)] = (binary.read_bytes(), 0o755)
        files["%s/%s" % (TOOLKIT_DIR, name)] = (WRAPPER % {"dir": TOOLKIT_DIR, "real": name + ".real"}, 0o755)
    for _runtime, name in RUNTIMES[1:]:
        files["%s/%s" % (TOOLKIT_DIR, name)] = (WRAPPER % {"dir": TOOLKIT_DIR, "real": runtime + ".real"}, 0o755)
    return files
