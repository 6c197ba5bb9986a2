# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Device-cgroup isolation audit (pure): who can open which GPU, against what was allocated.

Input: the node's container cgroups (from the kubelet's layout, both cgroup drivers), the BPF
programs that apply to each (its effective BPF_CGROUP_DEVICE list, as translated instructions), the
v1 ``devices.list`` where a v1 devices hierarchy exists (hybrid hosts enforce both layers), the device
nodes of interest and, optionally, the cluster's allocation.  Each (cgroup, device, access) is decided
by the interpreter in ``_ebpf``: the AND over the effective programs, AND the v1 list.

Findings are dicts ``{id, severity, node, pod, pod_name, container, container_id, cgroup, gpu,
gpu_uuid, device, expected, found, hint}``:

* ``isolation_breach`` (critical): a container can open a GPU it was not allocated;
* ``broken_allocation`` (error): a container cannot open a GPU it was allocated (or nvidiactl /
  nvidia-uvm, which every CUDA process needs);
* ``privileged_container`` (error): the device cgroup allows every device; reported instead of one
  breach per GPU;
* ``unauditable_program`` (warning): a program (or devices.list) the audit cannot decide for a device
  it needs; those cells are left undecided, never guessed;
* ``allocation_unmatched`` (warning): an allocation entry that names no container cgroup on the node,
  or a GPU UUID the node does not have;
* ``gpu_access`` (info): without ``allocations``, which GPUs each container can open.
"""

from __future__ import annotations

import re

from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _ebpf
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import SEVERITIES, finding

DEFAULT_SEVERITY = {
    "isolation_breach": "critical",
    "broken_allocation": "error",
    "privileged_container": "error",
    "unauditable_program": "warning",
    "allocation_unmatched": "warning",
    "gpu_access": "info",
}
ACCESSES = ("r", "w", "m", "rw")
OPEN_ACCESSES = ("r", "w", "rw")
NVIDIA_MAJOR = 195
# A device no container rule names: allowed read-write for both types only when the cgroup lets
# everything through (privileged containers: `a *:* rwm`).
SENTINELS = (("c", 4095, 1048575), ("b", 4095, 1048575))

_V1_LINE = re.compile(r"^([abc]) (\*|\d+):(\*|\d+) ([rwm]{1,3})$")


# ---------------------------------------------------------------------------------------------
# cgroup v1 devices.list


def parse_devices_list(text, source):
    """``devices.list`` lines -> [(type, major, minor, access)] with None for ``*``.

    Raises GpuhardenError naming the file, the line and the value for anything else.
    """
    rules = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        match = _V1_LINE.match(line)
        if not match or len(set(match.group(4))) != len(match.group(4)):
            raise GpuhardenError("%s line %d: %r is not a devices.list entry (TYPE MAJOR:MINOR ACCESS)" % (source, number, line))
        kind, major, minor, access = match.groups()
        rules.append((kind, None if major == "*" else int(major), None if minor == "*" else int(minor), frozenset(access)))
    return rules


def v1_decide(rules, dev_type, major, minor, access):
    """The v1 devices controller's answer: an entry must match type, numbers and hold every access bit."""
    wanted = set(access)
    for kind, rmajor, rminor, raccess in rules:
        if kind != "a" and kind != dev_type:
            continue
        if (rmajor is not None and rmajor != major) or (rminor is not None and rminor != minor):
            continue
        if wanted <= raccess:
            return _ebpf.Verdict(_ebpf.ALLOW, "devices.list allows")
    return _ebpf.Verdict(_ebpf.DENY, "devices.list has no entry")


# ---------------------------------------------------------------------------------------------
# Devices


def classify_device(path, dev_type, major, minor):
    """("gpu", minor) for /dev/nvidia<N>; ("ctl"|"uvm"|"uvm-tools"|"caps"|"other", None) otherwise."""
    name = path.rsplit("/", 1)[-1]
    if dev_type == "c" and major == NVIDIA_MAJOR and name.startswith("nvidia") and name[6:].isdigit():
        return "gpu", minor
    role = {"nvidiactl": "ctl", "nvidia-uvm": "uvm", "nvidia-uvm-tools": "uvm-tools"}.get(name)
    if role:
        return role, None
    if path.startswith("/dev/nvidia-caps/"):
        return "caps", None
    return "other", None


def is_default_device(path):
    """The default device set: /dev/nvidia<N>, nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-caps/*."""
    name = path[len("/dev/") :] if path.startswith("/dev/") else None
    if name is None:
        return False
    return (name.startswith("nvidia") and name[6:].isdigit()) or name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools") or name.startswith("nvidia-caps/")


# ---------------------------------------------------------------------------------------------
# Options


def check_options(accesses, severity_overrides, allocations):
    """Validate what the module's argument spec cannot; raise GpuhardenError naming option and value."""
    for access in accesses:
        if access not in ACCESSES:
            raise GpuhardenError("device_cgroup_audit: accesses: %r is not one of %s" % (access, ", ".join(ACCESSES)))
    for key, value in (severity_overrides or {}).items():
        if key not in DEFAULT_SEVERITY:
            raise GpuhardenError("device_cgroup_audit: severity_overrides: unknown finding id %r (known: %s)" % (key, ", ".join(sorted(DEFAULT_SEVERITY))))
        if value not in SEVERITIES:
            raise GpuhardenError("device_cgroup_audit: severity_overrides.%s: %r is not one of %s" % (key, value, ", ".join(SEVERITIES)))
    for index, entry in enumerate(allocations or []):
        where = "device_cgroup_audit: allocations[%d]" % index
        uid = entry.get("pod_uid")
        if not isinstance(uid, str) or not re.match(r"^[0-9a-fA-F-]{36}$", uid):
            raise GpuhardenError("%s.pod_uid: %r is not a pod UID" % (where, uid))
        for minor in entry.get("gpu_minors") or []:
            if isinstance(minor, bool) or not isinstance(minor, int) or not 0 <= minor <= 1048575:
                raise GpuhardenError("%s.gpu_minors: %r is not a device minor number" % (where, minor))
        for uuid in entry.get("gpu_uuids") or []:
            if not isinstance(uuid, str) or not uuid.startswith(("GPU-", "MIG-")):
                raise GpuhardenError("%s.gpu_uuids: %r is not a GPU UUID (GPU-...)" % (where, uuid))


# ---------------------------------------------------------------------------------------------
# The audit


class _Evaluator:
    """Verdict matrices per (effective program list, v1 list), memoised: containers share programs."""

    def __init__(self, programs, cells):
        self.cells = cells  # [(key, ctx, dev_type, major, minor, access)]
        self._programs = {}
        self._by_bytes = {}
        for prog_id, record in programs.items():
            self._programs[prog_id] = self._program(prog_id, record)
        self._matrices = {}
        self._by_content = {}

    def _program(self, prog_id, record):
        xlated = record.get("xlated")
        if xlated is None:
            return _Stub("program %d: %s" % (prog_id, record.get("unauditable") or "not readable"))
        program = self._by_bytes.get(xlated)
        if program is None:
            try:
                program = _ebpf.Program(_ebpf.decode(xlated))
            except GpuhardenError as error:
                program = _Stub("program %d: %s" % (prog_id, error.msg))
            self._by_bytes[xlated] = program
        return _Named(prog_id, program)

    def matrix(self, prog_ids, v1_rules, v1_key):
        key = (tuple(prog_ids), v1_key)
        found = self._matrices.get(key)
        if found is not None:
            return found
        programs = [self._programs.get(pid) or _Stub("program %d: vanished while the audit ran" % pid) for pid in prog_ids]
        # runc loads one program per container, byte-identical for the same allocation shape: the verdicts are
        # shared by content, except where one is unauditable (its reason names the program ID).
        content = (tuple(program.content_key for program in programs), v1_key)
        matrix = self._by_content.get(content)
        if matrix is None:
            matrix = {}
            for cell_key, ctx, dev_type, major, minor, access in self.cells:
                verdict = _ebpf.combine([program.run(ctx) for program in programs])
                if v1_rules is not None and verdict.decision != _ebpf.DENY:
                    v1 = v1_decide(v1_rules, dev_type, major, minor, access)
                    if v1.decision == _ebpf.DENY:
                        verdict = v1
                matrix[cell_key] = verdict
            if all(verdict.decision != _ebpf.UNAUDITABLE for verdict in matrix.values()):
                self._by_content[content] = matrix
        self._matrices[key] = matrix
        return matrix


class _Stub:
    def __init__(self, reason):
        self.verdict = _ebpf.Verdict(_ebpf.UNAUDITABLE, reason)
        self.content_key = id(self)

    def run(self, ctx):
        return self.verdict


class _Named:
    """Prefixes unauditable reasons with the program ID."""

    def __init__(self, prog_id, program):
        self.prog_id = prog_id
        self.program = program
        self.content_key = id(program)  # programs are shared by their bytes (_Evaluator._by_bytes)

    def run(self, ctx):
        verdict = self.program.run(ctx)
        if verdict.decision == _ebpf.UNAUDITABLE and not verdict.reason.startswith("program "):
            return _ebpf.Verdict(_ebpf.UNAUDITABLE, "program %d: %s" % (self.prog_id, verdict.reason))
        return verdict


def _merge_any(matrices):
    """A container's subtree: a cell is allowed if any cgroup in it allows (any process may sit there)."""
    if len(matrices) == 1:
        return matrices[0]
    merged = {}
    for key in matrices[0]:
        verdicts = [m[key] for m in matrices]
        merged[key] = (
            next((v for v in verdicts if v.decision == _ebpf.ALLOW), None)
            or next((v for v in verdicts if v.decision == _ebpf.UNAUDITABLE), None)
            or verdicts[0]
        )
    return merged


class _Summary:
    """What one container's matrices say, for every container that has the same ones.

    ``anywhere``: the subtree's merged matrix (a process may sit in any nested cgroup); ``own``: the container's own
    cgroup, which decides whether its allocation is reachable.
    """

    def __init__(self, matrices, roles, accesses):
        own, anywhere = matrices[0], _merge_any(matrices)
        self.sentinels_open = all(anywhere[("%s %d:%d" % s, "rw")].decision == _ebpf.ALLOW for s in SENTINELS)
        self.gpu_opens = [(path, gpu, _opens(anywhere, path, accesses)) for path, (role, gpu) in sorted(roles.items()) if role == "gpu"]
        self.gpus_open = sorted(gpu for _path, gpu, opened in self.gpu_opens if opened)
        self.allowed, self.unauditable, reasons = {}, {}, {}
        for path in roles:
            allowed = _with(anywhere, path, accesses, _ebpf.ALLOW)
            undecided = _with(anywhere, path, accesses, _ebpf.UNAUDITABLE)
            if allowed:
                self.allowed[path] = allowed
            if undecided:
                self.unauditable[path] = undecided
            for access in accesses:
                verdict = anywhere[(path, access)]
                if verdict.decision == _ebpf.UNAUDITABLE:
                    reasons.setdefault(verdict.reason, []).append("%s %s" % (path, access))
        self.reasons = sorted(reasons.items())
        self.denied_own = {path: [a for a in accesses if a in ("r", "w", "rw") and own[(path, a)].decision == _ebpf.DENY] for path in roles}


def _with(matrix, path, accesses, decision):
    return [a for a in accesses if matrix[(path, a)].decision == decision]


def _opens(matrix, path, accesses):
    return [a for a in accesses if a in OPEN_ACCESSES and matrix[(path, a)].decision == _ebpf.ALLOW]


def audit(node, containers, programs, devices, accesses=("r", "w", "m"), allocations=None, uuid_to_minor=None, severity_overrides=None):
    """The findings and per-container view.

    ``containers``: [{cgroup, pod_uid, container_id, driver, qos, name, sandbox, cgroups: [{path, programs: [ids],
    v1: text or None, v1_file}]}] (the container's own cgroup first, then the cgroups nested in it);
    ``programs``: {id: {xlated: bytes or None, unauditable: reason}}; ``devices``: [{path, type, major, minor,
    uuid}]; ``allocations``: None (no comparison) or [{pod_uid, container, gpu_minors, gpu_uuids, privileged, pod}].
    """
    severity = dict(DEFAULT_SEVERITY, **(severity_overrides or {}))
    uuid_to_minor = uuid_to_minor or {}
    minor_to_uuid = {minor: uuid for uuid, minor in uuid_to_minor.items()}
    accesses = list(dict.fromkeys(accesses))
    cells = []
    roles = {}
    for device in devices:
        role, gpu = classify_device(device["path"], device["type"], device["major"], device["minor"])
        roles[device["path"]] = (role, gpu)
        for access in accesses:
            ctx = _ebpf.make_ctx(device["type"], device["major"], device["minor"], access)
            cells.append(((device["path"], access), ctx, device["type"], device["major"], device["minor"], access))
    for dev_type, major, minor in SENTINELS:
        key = "%s %d:%d" % (dev_type, major, minor)
        cells.append(((key, "rw"), _ebpf.make_ctx(dev_type, major, minor, "rw"), dev_type, major, minor, "rw"))
    evaluator = _Evaluator(programs, cells)
    findings = []
    views = []

    def add(fid, container, expected, found, hint, gpu=None, device=None, alloc=None):
        findings.append(
            finding(
                fid,
                severity[fid],
                expected,
                found,
                hint,
                node=node,
                pod=container["pod_uid"] if container else (alloc or {}).get("pod_uid"),
                pod_name=(alloc or {}).get("pod") or (container or {}).get("pod_name"),
                container=(container.get("name") or container["container_id"]) if container else (alloc or {}).get("container"),
                container_id=container["container_id"] if container else None,
                cgroup=container["cgroup"] if container else None,
                gpu=gpu,
                gpu_uuid=minor_to_uuid.get(gpu) if gpu is not None else None,
                device=device,
            )
        )

    # Allocation -> containers.
    allocated = {}  # container_id -> {"minors": set, "privileged": bool, "pod": name}
    if allocations is not None:
        by_pod = {}
        for container in containers:
            by_pod.setdefault(container["pod_uid"], []).append(container)
        for entry in allocations:
            uid = entry["pod_uid"].lower()
            candidates = by_pod.get(uid, [])
            wanted = entry.get("container")
            workload = [c for c in candidates if not c.get("sandbox")]
            if wanted:
                wanted_l = wanted.lower()
                match = [c for c in candidates if len(wanted_l) >= 12 and c["container_id"].startswith(wanted_l)]
                match = match or [c for c in candidates if c.get("name") == wanted]
                if not match and len(workload) == 1 and not workload[0].get("name"):
                    match = workload
            else:
                match = workload if len(workload) == 1 else []
            if not match:
                why = (
                    "no container cgroup of pod %s on this node" % uid
                    if not candidates
                    else ("pod %s has %d containers here and none is %r (pass the container ID, or bundle_dirs to read names)" % (uid, len(workload), wanted))
                )
                add(
                    "allocation_unmatched", None, "a container cgroup for the allocation", why,
                    "Check that the allocation list is for this node and current; pods that are not running hold no cgroup.",
                    alloc=entry,
                )  # fmt: skip
                continue
            minors = set(entry.get("gpu_minors") or [])
            for uuid in entry.get("gpu_uuids") or []:
                if uuid in uuid_to_minor:
                    minors.add(uuid_to_minor[uuid])
                else:
                    add(
                        "allocation_unmatched", match[0], "GPU %s on this node" % uuid,
                        "no GPU with UUID %s in /proc/driver/nvidia/gpus" % uuid,
                        "MIG device UUIDs are not mapped; pass the parent GPU's minor in gpu_minors.",
                        alloc=entry,
                    )  # fmt: skip
            for container in match:
                slot = allocated.setdefault(container["container_id"], {"minors": set(), "privileged": False, "pod": None})
                slot["minors"] |= minors
                slot["privileged"] = slot["privileged"] or bool(entry.get("privileged"))
                slot["pod"] = slot["pod"] or entry.get("pod")

    summaries = {}
    for container in containers:
        matrices, key = [], []
        for cgroup in container["cgroups"]:
            v1_rules, v1_key, v1_error = None, None, None
            if cgroup.get("v1") is not None:
                v1_key = cgroup["v1"]
                try:
                    v1_rules = parse_devices_list(cgroup["v1"], cgroup.get("v1_file") or "devices.list")
                except GpuhardenError as error:
                    v1_rules, v1_key = None, None  # unparseable: only the BPF layer's denials are certain
                    v1_error = error.msg
            prog_ids = tuple(cgroup.get("programs") or ())
            matrix = evaluator.matrix(prog_ids, v1_rules, v1_key)
            key.append((id(matrix), v1_error))  # the evaluator keeps its matrices: their ids stay unique
            if v1_error:
                matrix = {k: v if v.decision == _ebpf.DENY else _ebpf.Verdict(_ebpf.UNAUDITABLE, v1_error) for k, v in matrix.items()}
            matrices.append(matrix)
        # Containers share their programs (runc emits one per allocation shape), so what a set of matrices says is
        # derived once per distinct set, not once per container.
        summary = summaries.get(tuple(key))
        if summary is None:
            summary = summaries[tuple(key)] = _Summary(matrices, roles, accesses)
        alloc = allocated.get(container["container_id"])
        if alloc and alloc.get("pod"):
            container = dict(container, pod_name=alloc["pod"])
        privileged = summary.sentinels_open or bool(alloc and alloc["privileged"])
        gpus_open = summary.gpus_open
        views.append(
            {
                "cgroup": container["cgroup"],
                "pod_uid": container["pod_uid"],
                "container_id": container["container_id"],
                "container": container.get("name"),
                "driver": container.get("driver"),
                "qos": container.get("qos"),
                "sandbox": bool(container.get("sandbox")),
                "privileged": privileged,
                "programs": list(container["cgroups"][0].get("programs") or []),
                "v1": container["cgroups"][0].get("v1") is not None,
                "nested": [c["path"] for c in container["cgroups"][1:]],
                "gpus": list(gpus_open),
                "allowed": dict(summary.allowed),
                "unauditable": dict(summary.unauditable),
            }
        )

        # Unauditable cells that matter: one finding per distinct reason.
        for reason, where in summary.reasons:
            add(
                "unauditable_program", container, "a decidable device program",
                "%s (undecided: %s)" % (reason, ", ".join(where[:6]) + (", ..." if len(where) > 6 else "")),
                "The kernel's answer for these devices could not be derived; check net.core.bpf_jit_harden and the program's "
                "generator, and probe the device from the container.",
            )  # fmt: skip

        gpu_names = ", ".join("nvidia%d" % m for m in gpus_open) or "none"
        if privileged:
            add(
                "privileged_container", container, "a device cgroup limited to the container's allocation",
                "the device cgroup allows every device (GPUs it can open: %s)" % gpu_names,
                "A privileged container bypasses GPU isolation; run it unprivileged, or accept it with severity_overrides.",
            )  # fmt: skip
            continue
        if allocations is None:
            if gpus_open:
                add(
                    "gpu_access", container, "(no allocation given)", "can open %s" % gpu_names,
                    "Pass allocations to compare with what the device plugin allocated.",
                )  # fmt: skip
            continue
        minors = alloc["minors"] if alloc else set()
        for path, gpu, opened in summary.gpu_opens:
            if gpu not in minors and opened:
                add(
                    "isolation_breach", container, "no access to %s (not allocated)" % path,
                    "%s allowed" % "+".join(opened),
                    "The container can open a GPU the device plugin did not give it: check NVIDIA_VISIBLE_DEVICES handling "
                    "(accept-nvidia-visible-devices-envvar-when-unprivileged = false) and the device plugin's deviceListStrategy.",
                    gpu=gpu, device=path,
                )  # fmt: skip
        if not minors:
            continue
        required = [(path, gpu) for path, (role, gpu) in sorted(roles.items()) if (role == "gpu" and gpu in minors) or role in ("ctl", "uvm")]
        for path, gpu in required:
            denied = summary.denied_own[path]
            if denied:
                add(
                    "broken_allocation", container, "%s access to %s (allocated)" % ("+".join(a for a in accesses if a in OPEN_ACCESSES), path),
                    "%s denied by the device cgroup" % "+".join(denied),
                    "The container lost access to its GPU (for example a systemd daemon-reload re-applied the unit's DeviceAllow= "
                    "list); restart the pod, and keep the container runtime from using the systemd cgroup driver's device rules.",
                    gpu=gpu, device=path,
                )  # fmt: skip
        present = {gpu for _path, (role, gpu) in roles.items() if role == "gpu"}
        for gpu in sorted(minors - present):
            add(
                "allocation_unmatched", container, "/dev/nvidia%d on this node" % gpu, "no such device node among the audited devices",
                "The allocation names a GPU the node does not expose.", gpu=gpu,
            )  # fmt: skip
    order = {name: index for index, name in enumerate(reversed(SEVERITIES))}
    findings.sort(key=lambda f: (order[f["severity"]], f["id"], f["pod"] or "", f["container"] or "", -1 if f["gpu"] is None else f["gpu"], f["device"] or ""))
    return {"findings": findings, "containers": views}
