# SPDX-License-Identifier: GPL-3.0-or-later
"""Scenarios: YAML files under scenarios/ that say which nodes a lab has and what is wrong with them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuharden_lab import nodefiles
from gpuharden_lab.node import NodeSpec
from gpuharden_lab.system import LabError

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


@dataclass
class Scenario:
    name: str
    description: str
    nodes: list[NodeSpec]
    pods: list[dict] = field(default_factory=list)
    cluster: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)
    # The harden run that brings the fleet to the scenario's state (`harden:` in its file): the extra variables of
    # playbooks/harden_gpu_nodes.yml, or None where the scenario is the state the nodes are written in.
    harden: dict | None = None


def available() -> list[str]:
    return sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml"))


def _node_spec(entry: dict, defaults: dict, source: Path, where: str) -> NodeSpec:
    merged = {**defaults, **entry}
    unknown = set(merged) - {"name", "fixture", "devices", "driver_params", "files", "labels", "count", "kubelet", "containerd",
                                  "unschedulable", "taints", "python_missing", "real", "numa"}
    if unknown:
        raise LabError("%s: %s: unknown keys %s" % (source, where, sorted(unknown)))
    if not isinstance(merged.get("name"), str):
        raise LabError("%s: %s: 'name' must be a string, got %r" % (source, where, merged.get("name")))
    if merged.get("fixture") is not None and not isinstance(merged["fixture"], str):
        raise LabError("%s: %s: 'fixture' must be an NVML fixture name or null (CPU-only), got %r" % (source, where, merged["fixture"]))
    labels = {**(defaults.get("labels") or {}), **(entry.get("labels") or {})}
    devices = {}
    for path, attrs in (merged.get("devices") or {}).items():
        if attrs is None:
            devices[path] = None
            continue
        devices[path] = {key: (int(str(value), 8) if key == "mode" else value) for key, value in attrs.items()}
    kubelet = {**(defaults.get("kubelet") or {}), **(entry.get("kubelet") or {})}
    kubelet["config"] = {**((defaults.get("kubelet") or {}).get("config") or {}), **((entry.get("kubelet") or {}).get("config") or {})}
    containerd = {**(defaults.get("containerd") or {}), **(entry.get("containerd") or {})}
    taints = merged.get("taints") or []
    if not isinstance(taints, list) or not all(isinstance(t, dict) and t.get("key") and t.get("effect") for t in taints):
        raise LabError("%s: %s: 'taints' must be a list of {key, value, effect}, got %r" % (source, where, taints))
    python_missing = merged.get("python_missing") or []
    if not isinstance(python_missing, list) or not all(isinstance(name, str) for name in python_missing):
        raise LabError("%s: %s: 'python_missing' must be a list of distribution names, got %r" % (source, where, python_missing))
    real = merged.get("real")
    if real is not None and (not isinstance(real, dict) or set(real) - {"containerd", "nvidia_runtime"}
                             or str(real.get("containerd")) not in ("2", "1.7") or real.get("nvidia_runtime") not in (None, "default", "operator")):
        raise LabError("%s: %s: 'real' must be {containerd: \"2\" or \"1.7\", nvidia_runtime: default or operator (optional)}, got %r"
                       % (source, where, real))
    if real is not None and real.get("nvidia_runtime") and merged.get("fixture") is None:
        raise LabError("%s: %s: 'real.nvidia_runtime' needs a GPU node (a fixture): the toolkit is installed only there" % (source, where))
    numa = merged.get("numa")
    if numa is not None and (not isinstance(numa, dict) or set(numa) - {"nodes", "cpu_nodes", "gpu_memory_nodes"}
                             or not isinstance(numa.get("nodes"), int) or numa["nodes"] < 1):
        raise LabError("%s: %s: 'numa' must be {nodes: N, cpu_nodes: [ids], gpu_memory_nodes: [ids]}, got %r"
                       % (source, where, numa))
    seeded_after_join: dict[str, str] = {}
    if real is not None:
        # A fresh install: kubeadm v1.36 passes nothing in kubeadm-flags.env that the config file can carry (and the
        # real kubelet v1.36 rejects --pod-infra-container-image, which the stand-in nodes still get); containerd's
        # config is the release's own default, written when the lab starts (realnode.default_containerd_config).
        kubelet.setdefault("kubeadm_flags", "")
        files = nodefiles.kubelet_files(kubelet)
        # The real kubelet writes its own CPU Manager checkpoint when it first starts.  A checkpoint the scenario names
        # is a seed: written after the Node joined, then the kubelet restarts on it (a stale one stops it there).
        checkpoint = files.pop(nodefiles.CPU_MANAGER_STATE, None)
        if kubelet.get("cpu_manager_state") is not None and checkpoint is not None:
            seeded_after_join[nodefiles.CPU_MANAGER_STATE] = checkpoint
    else:
        files = {**nodefiles.kubelet_files(kubelet), **nodefiles.containerd_files(containerd)}
    files.update(defaults.get("files") or {})
    files.update(entry.get("files") or {})
    return NodeSpec(
        name=merged["name"],
        fixture=merged.get("fixture"),
        device_overrides=devices,
        driver_params=merged.get("driver_params") or {},
        files=files,
        labels={key: str(value) for key, value in labels.items() if value is not None},
        kubelet_unit=nodefiles.kubelet_unit(kubelet),
        unschedulable=bool(merged.get("unschedulable", False)),
        taints=[dict(taint) for taint in taints],
        python_missing=list(python_missing),
        real_containerd=str(real["containerd"]) if real is not None else None,
        real_nvidia_runtime=real.get("nvidia_runtime") if real is not None else None,
        seeded_after_join=seeded_after_join,
        numa=numa,
    )


def load(name: str, *, node_count: int | None = None, stand_ins: bool = False) -> Scenario:
    """The scenario's nodes, pods and cluster objects.  ``stand_ins`` runs every node on the stand-in kubelet and
    containerd, its ``real`` keys dropped: for the test modules that still read what only the stand-ins give (each
    says why), until the real parts carry them too."""
    source = SCENARIO_DIR / (name + ".yaml")
    if not source.exists():
        raise LabError("unknown scenario %r: choose one of %s" % (name, ", ".join(available())))
    try:
        data = yaml.safe_load(source.read_text())
    except yaml.YAMLError as error:
        raise LabError("%s: invalid YAML: %s" % (source, error)) from None
    defaults = data.get("node_defaults") or {}
    entries = data.get("nodes") or []
    if stand_ins:
        defaults = {key: value for key, value in defaults.items() if key != "real"}
        entries = [{key: value for key, value in entry.items() if key != "real"} for entry in entries]
    nodes: list[NodeSpec] = []
    for position, entry in enumerate(entries):
        count = entry.get("count")
        if count is None:
            nodes.append(_node_spec(entry, defaults, source, "nodes[%d]" % position))
            continue
        total = node_count if node_count is not None else int(count)
        for number in range(total):
            expanded = {k: v for k, v in entry.items() if k != "count"}
            expanded["name"] = entry["name"].format(n=number)
            nodes.append(_node_spec(expanded, defaults, source, "nodes[%d]" % position))
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        raise LabError("%s: node names must be unique: %s" % (source, names))
    if not nodes:
        raise LabError("%s: no nodes" % source)
    harden = data.get("harden")
    if harden is not None and not isinstance(harden, dict):
        raise LabError("%s: 'harden' must be a mapping of the harden playbook's extra variables, got %r" % (source, harden))
    if harden is not None and any(node.real_containerd is None for node in nodes):
        # A harden run on the stand-ins would only confirm what they were written to accept.
        raise LabError("%s: 'harden' needs every node real ('real: {containerd: ...}'), not %s"
                       % (source, [node.name for node in nodes if node.real_containerd is None]))
    return Scenario(
        name=name,
        description=data.get("description", ""),
        nodes=nodes,
        pods=data.get("pods") or [],
        cluster=data.get("cluster") or {},
        raw=data,
        harden=harden,
    )
