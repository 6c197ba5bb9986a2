# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Read the MIG state of a node and apply MIG plan steps through NVML (pynvml).

Reading never mutates.  ``apply_steps`` is the only place that calls NVML's mutating functions
(SetMigMode, Create/Destroy GPU and compute instances); it stops at the first failing step and raises
GpuhardenError carrying the step and the state reached on every GPU, so that a re-run converges.
"""

from __future__ import annotations

import os

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _safe_parse
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml._nvml import HAS_PYNVML, pynvml

# PyYAML: what config_file needs (core/_safe_parse.py imports it, guarded)
HAS_YAML = _safe_parse.HAS_YAML
YAML_IMPORT_ERROR = _safe_parse.YAML_IMPORT_ERROR

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
ACTIVATION_NAMES = {NVML_SUCCESS: "SUCCESS", NVML_ERROR_RESET_REQUIRED: "RESET_REQUIRED", NVML_ERROR_IN_USE: "IN_USE"}


class Session:
    """nvmlInit ... nvmlShutdown around a block; NVML failures become GpuhardenError."""

    def __enter__(self):
        if not HAS_PYNVML:
            reason = _nvml.missing_pynvml_reason()
            raise GpuhardenError(reason["message"], reason=reason)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            reason = _nvml.failure_reason(error)
            raise GpuhardenError("NVML could not be initialised: %s" % reason["message"], reason=reason) from error
        return self

    def __exit__(self, *exc):
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
        return False


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _placements(handle, profile_id):
    count = pynvml.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, pynvml.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, pynvml.byref(count))
    return [(array[i].start, array[i].size) for i in range(count.value)]


def profile_table(handle, profiles=None):
    """The GPU's profile table from NVML: {name: {id, enum, slices, size, instance_count, starts}}, from ``profiles``
    (``_nvml.gpu_instance_profiles``) when the caller has read them already."""
    table = {}
    for profile in (profiles if profiles is not None else _nvml.gpu_instance_profiles(handle)).values():
        placements = _placements(handle, profile["id"])
        table[profile["name"]] = {
            "id": profile["id"],
            "enum": profile["enum"],
            "slices": profile["slice_count"],
            "size": placements[0][1] if placements else profile["slice_count"],
            "instance_count": profile["instance_count"],
            "starts": sorted(start for start, _size in placements),
        }
    return table


def _gi_handle(handle, gi_id):
    return pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)


def _compute_instances(gi):
    found = []
    for ci_profile in range(9):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, 0)
        except pynvml.NVMLError:
            continue
        for instance in _nvml.instance_handles(pynvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, pynvml.c_nvmlComputeInstance_t,
                                               info.instanceCount):
            ci_info = pynvml.nvmlComputeInstanceGetInfo(instance)
            found.append({"id": ci_info.id, "profile_id": ci_info.profileId,
                          "start": ci_info.placement.start, "size": ci_info.placement.size})
    return sorted(found, key=lambda ci: ci["id"])


def read_gpu(index):
    """One GPU's identity, MIG mode, profile table, GPU/compute instances and processes."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    gpu = {
        "index": index,
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "pci_bus_id": _text(pci.busId),
        "pci_device_id": "0x%08X" % pci.pciDeviceId,
        "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
        "mig_capable": False,
        "mode_current": None,
        "mode_pending": None,
        "profile_table": None,
        "profile_table_source": None,
        "gpu_instances": [],
        "processes": _nvml.gpu_processes(handle),
    }
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as error:
        if getattr(error, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
            return gpu
        raise
    gpu.update(mig_capable=True, mode_current=current, mode_pending=pending)
    # A real driver (H200, 580.159.04) reports the table with MIG disabled too; where one reports none, or fails
    # part of it, the built-in table of the board stands in until MIG is enabled.
    profiles = _nvml.gpu_instance_profiles(handle)
    try:
        table = profile_table(handle, profiles)
    except pynvml.NVMLError:
        if current == 1:
            raise
        table = None
    if table or current == 1:
        gpu["profile_table"] = table
        gpu["profile_table_source"] = "nvml"
    else:
        gpu["profile_table"] = _mig.builtin_table(gpu["pci_device_id"])
        gpu["profile_table_source"] = "builtin" if gpu["profile_table"] else None
    if current == 1:
        by_id = {entry["id"]: name for name, entry in gpu["profile_table"].items()}
        instances = _nvml.gpu_instances(handle, profiles)
        for instance in instances:
            instance["profile"] = by_id.get(instance["profile_id"], instance["profile"])
            instance["compute_instances"] = _compute_instances(_gi_handle(handle, instance["id"]))
        gpu["gpu_instances"] = instances
    return gpu


def read_node():
    """Every GPU's MIG state, in NVML index order.  Call inside a Session."""
    return [read_gpu(index) for index in range(pynvml.nvmlDeviceGetCount())]


def public_state(gpu):
    """What a module returns about a GPU (no profile table)."""
    mode = _nvml.MIG_MODE_NAMES
    return {
        "index": gpu["index"],
        "uuid": gpu["uuid"],
        "name": gpu["name"],
        "pci_bus_id": gpu["pci_bus_id"],
        "minor": gpu["minor"],
        "mig_capable": gpu["mig_capable"],
        "mode_current": mode.get(gpu["mode_current"], gpu["mode_current"]),
        "mode_pending": mode.get(gpu["mode_pending"], gpu["mode_pending"]),
        "layout": _mig.current_layout(gpu),
        "gpu_instances": [
            dict({key: gi[key] for key in ("id", "profile_id", "profile", "start", "size")},
                 compute_instances=len(gi.get("compute_instances") or []))
            for gi in gpu["gpu_instances"]
        ],
        "processes": [proc["pid"] for proc in gpu["processes"]],
    }


def _find_gi(handle, profile_id, start):
    for instance in _nvml.gpu_instances(handle, _nvml.gpu_instance_profiles(handle)):
        if instance["profile_id"] == profile_id and instance["start"] == start:
            return _gi_handle(handle, instance["id"])
    raise GpuhardenError("no GPU instance of profile id %s at start %s" % (profile_id, start))


def _default_ci_profile(gi):
    """The full-size compute-instance profile of a GPU instance (the one nvidia-smi marks default)."""
    best = None
    for ci_profile in range(9):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, 0)
        except pynvml.NVMLError:
            continue
        if best is None or info.sliceCount > best.sliceCount:
            best = info
    if best is None:
        raise GpuhardenError("the GPU instance offers no compute-instance profile")
    return best.id


def run_step(handle, gpu, step):
    """Execute one plan step; returns the SetMigMode activation status for set_mode, else None."""
    action = step["action"]
    if action == "destroy_ci":
        gi = _gi_handle(handle, step["gi_id"])
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, step["ci_id"])
        pynvml.nvmlComputeInstanceDestroy(ci)
    elif action == "destroy_gi":
        pynvml.nvmlGpuInstanceDestroy(_gi_handle(handle, step["gi_id"]))
    elif action == "set_mode":
        return pynvml.nvmlDeviceSetMigMode(handle, step["mode"])
    elif action == "create_gi":
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = step["start"], step["size"]
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, step["profile_id"], pynvml.byref(placement))
    elif action == "create_ci":
        table = gpu["profile_table"]
        gi = _find_gi(handle, table[step["profile"]]["id"], step["start"])
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, _default_ci_profile(gi))
    else:  # pragma: no cover - the planner makes no other step
        raise GpuhardenError("unknown MIG step %r" % action)
    return None


def _failure(step, error, gpus_state, done):
    reason = _nvml.failure_reason(error) if hasattr(error, "value") else {"code": "error", "message": str(error)}
    return GpuhardenError(
        "MIG step %s on GPU %s failed: %s; stopped there, a re-run continues from the state reached"
        % (step_text(step), step["gpu"], reason["message"]),
        failed_step=dict(step, error=reason),
        steps_done=done,
        gpus=gpus_state,
    )


def step_text(step):
    action = step["action"]
    if action == "set_mode":
        return "set_mode(%s)" % _nvml.MIG_MODE_NAMES.get(step["mode"], step["mode"])
    if action in ("destroy_ci",):
        return "destroy_ci(gi %s, ci %s)" % (step["gi_id"], step["ci_id"])
    if action == "destroy_gi":
        return "destroy_gi(%s id %s @%s)" % (step["profile"], step["gi_id"], step["start"])
    return "%s(%s @%s)" % (action, step["profile"], step["start"])


def apply_gpu(gpu, want, steps, done, tracker):
    """Run one GPU's steps.  Returns "applied", or "reset_required" when the mode change is pending.

    After a mode change that took effect, the GPU is read again (minor number, NVML's own profile
    table), validated, and its creation steps planned from NVML's table.  ``tracker["step"]`` is the
    step running now, for the failure report.
    """
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu["index"])
    queue = list(steps)
    while queue:
        step = queue.pop(0)
        tracker["step"] = step
        status = run_step(handle, gpu, step)
        done.append(dict(step))
        tracker["step"] = None
        if step["action"] != "set_mode":
            continue
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        if (status not in (None, NVML_SUCCESS)) or current != step["mode"]:
            done[-1]["activation_status"] = ACTIVATION_NAMES.get(status, status)
            return "reset_required"
        if step["mode"] == 1 and pending == 1:
            fresh = read_gpu(gpu["index"])  # minor numbers may change after activation; the table is NVML's now
            gpu.clear()
            gpu.update(fresh)
            want = _mig.spelled(want, gpu["profile_table"])
            _mig.validate(gpu, want, gpu["profile_table"])
            queue = _mig.plan_gpu(gpu, want, gpu["profile_table"])["steps"]
    return "applied"


def apply(gpus, desired, plans):
    """Apply every GPU's plan in index order.  Returns {index: "applied" | "reset_required"}.

    Raises GpuhardenError at the first failing step with ``failed_step``, ``steps_done`` and ``gpus``
    (the state read back from NVML after the failure, per GPU).
    """
    done, results = [], {}
    for gpu in gpus:
        outcome = plans.get(gpu["index"])
        if not outcome or not outcome["steps"]:
            continue
        tracker = {"step": None}
        try:
            results[gpu["index"]] = apply_gpu(gpu, desired[gpu["index"]], outcome["steps"], done, tracker)
        except (pynvml.NVMLError, GpuhardenError) as error:
            try:
                state = [public_state(read_gpu(other["index"])) for other in gpus]
            except pynvml.NVMLError as read_error:
                state = {"error": _nvml.failure_reason(read_error)}
            if tracker["step"] is None:  # validation after the mode change
                result = dict(getattr(error, "result", {}), steps_done=done, gpus=state)
                raise GpuhardenError(getattr(error, "msg", str(error)), **result) from error
            raise _failure(tracker["step"], error, state, done) from error
    return results


# ---------------------------------------------------------------------------------------------
# Options and the desired layout, shared by mig_layout and node_audit

OPTION_RULES = {
    "mutually_exclusive": [("config", "config_file", "layout")],
    "required_one_of": [("config", "config_file", "layout")],
    "required_by": {"config": "selected", "config_file": "selected"},
}


def argument_spec():
    return {
        "config": {"type": "dict"},
        "config_file": {"type": "path"},
        "selected": {"type": "str"},
        "layout": {"type": "dict"},
        "force": {"type": "bool", "default": False},
        "strategy": {"type": "str", "choices": list(_mig.STRATEGIES), "default": "mixed"},
        "root": {"type": "path", "default": "/"},
    }


def load_config_file(root, path):
    """A mig-parted file from the node, parsed once; errors name the file (one line: file, line, column, problem).

    The path is resolved inside ``root`` (links and ``..`` never leave it); only a regular UTF-8 file of at most
    ``_safe_parse.MAX_BYTES`` is read, and YAML that nests too deep, expands aliases too far or repeats a key is
    refused.  A repeated config name is one such key: mig-parted v0.15.0 (sigs.k8s.io/yaml v1.6.0 Unmarshal, not
    strict) silently keeps the last one, which applies a layout the file's reader did not expect.
    """
    full = os.path.join(root, path.lstrip("/")) if root != "/" else path
    try:
        text = _files.read_text(full, root=root, max_bytes=_safe_parse.MAX_BYTES)
        if text is None:
            raise GpuhardenError("%s: no such file" % _files.shown(full), fix="point config_file at the mig-parted config")
        data = _safe_parse.safe_load(text, _files.shown(full))
    except GpuhardenError as error:
        raise GpuhardenError("config_file %s" % error.msg, file=full, **error.result) from None
    return data, full


def entries_from_params(params):
    if params["layout"] is not None:
        return _mig.parse_short(params["layout"], "layout")
    if params["config"] is not None:
        return _mig.parse_mig_parted(params["config"], params["selected"], "config")
    if params["config_file"] is None:  # given as null: ansible-core's required_one_of counts it as given
        raise GpuhardenError("give one of the options config, config_file or layout (config_file is null)", field="config_file",
                             value=None)
    data, path = load_config_file(params["root"], params["config_file"])
    return _mig.parse_mig_parted(data, params["selected"], path)
