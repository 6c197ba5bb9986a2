# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""GPU inventory through NVML (pynvml from the nvidia-ml-py dist), as plain data.

Nothing here raises on a missing library, driver or permission: those are facts about the
node, returned as a structured ``reason`` so that callers can report them as data.
"""

from __future__ import annotations

import os
import traceback

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._host import cpu_list

try:
    import pynvml

    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError:
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()

# NVML return codes we classify (nvml.h); pynvml exposes the same numbers.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

GPU_INSTANCE_PROFILE_ENUMS = range(0x12)
MIG_MODE_NAMES = {0: "disabled", 1: "enabled"}

_REASONS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: (
        "library_not_found",
        "libnvidia-ml.so.1 is not on the loader path: install the NVIDIA driver's user-space libraries.",
    ),
    NVML_ERROR_DRIVER_NOT_LOADED: (
        "driver_not_loaded",
        "The nvidia kernel module is not loaded or /dev/nvidiactl is missing: load the driver (modprobe nvidia).",
    ),
    NVML_ERROR_NO_PERMISSION: (
        "no_permission",
        "The calling user cannot open /dev/nvidiactl or /dev/nvidia<N>: check owner/mode of the device nodes "
        "and the NVreg_DeviceFile* driver options (role gpuharden.k8s.device_permissions).",
    ),
    NVML_ERROR_FUNCTION_NOT_FOUND: (
        "function_not_found",
        "The installed driver's NVML lacks a call this tool needs: the driver is older than supported.",
    ),
}


def failure_reason(error):
    """An NVML error (or anything raised while talking to NVML) as a documented, structured reason."""
    value = getattr(error, "value", None)
    code, hint = _REASONS.get(value, ("nvml_error", "NVML returned an unexpected error; see message."))
    return {"code": code, "nvml_return": value, "message": str(error), "hint": hint}


def missing_pynvml_reason():
    return {
        "code": "pynvml_missing",
        "nvml_return": None,
        "message": "Python module pynvml (dist nvidia-ml-py) is not importable by the node's Python.",
        "hint": "Install nvidia-ml-py on the node (the bootstrap playbook ships the single-file wheel).",
    }


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _optional(call, *args, default=None):
    """The value of an NVML query, or ``default`` when the GPU does not support it."""
    try:
        return call(*args)
    except pynvml.NVMLError as error:
        if getattr(error, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
            return default
        raise


def _cuda_version(number):
    return "%d.%d" % (number // 1000, (number % 1000) // 10) if number else None


def _affinity_cpus(handle):
    words = (max(os.cpu_count() or 1, 1024) + 63) // 64
    bitmap = _optional(pynvml.nvmlDeviceGetCpuAffinity, handle, words, default=None)
    if bitmap is None:
        return None
    return [word_index * 64 + bit for word_index, word in enumerate(bitmap) for bit in range(64) if word >> bit & 1]


def profile_name(raw_name):
    """NVML profile names come as "MIG 1g.10gb" on some drivers and "1g.10gb" on others."""
    name = _text(raw_name) or ""
    return name[4:] if name.startswith("MIG ") else name


def gpu_instance_profiles(handle):
    """The GPU's MIG GPU-instance profiles, by profile id (not enum: see mig.md)."""
    profiles = {}
    for enum in GPU_INSTANCE_PROFILE_ENUMS:
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except pynvml.NVMLError:
            continue
        profiles[info.id] = {
            "enum": enum,
            "id": info.id,
            "name": profile_name(info.name),
            "slice_count": info.sliceCount,
            "instance_count": info.instanceCount,
            "memory_mib": info.memorySizeMB,
        }
    return profiles


def instance_handles(list_call, parent, profile_id, element_type, capacity):
    """The MIG instances of one profile under ``parent`` (a GPU's GPU instances, a GPU instance's compute instances),
    as ``list_call`` fills them in; none where NVML says the profile is not supported or has none."""
    count = pynvml.c_uint(0)
    array = (element_type * max(capacity, 1))()
    try:
        list_call(parent, profile_id, array, pynvml.byref(count))
    except pynvml.NVMLError as error:
        if getattr(error, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
            return []
        raise
    return [array[index] for index in range(count.value)]


def gpu_instances(handle, profiles):
    """The GPU instances that exist now: [{id, profile_id, profile, start, size}]."""
    found = []
    for profile in profiles.values():
        for instance in instance_handles(pynvml.nvmlDeviceGetGpuInstances, handle, profile["id"], pynvml.c_nvmlGpuInstance_t,
                                         profile["instance_count"]):
            info = pynvml.nvmlGpuInstanceGetInfo(instance)
            found.append(
                {
                    "id": info.id,
                    "profile_id": info.profileId,
                    "profile": profile["name"],
                    "start": info.placement.start,
                    "size": info.placement.size,
                }
            )
    return sorted(found, key=lambda gi: (gi["start"], gi["id"]))


def _mig_devices(handle):
    devices = []
    limit = _optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0
    for index in range(limit):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError as error:
            if getattr(error, "value", None) == NVML_ERROR_NOT_FOUND:
                continue
            raise
        memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
        devices.append(
            {
                "index": index,
                "uuid": _text(pynvml.nvmlDeviceGetUUID(mig)),
                "name": _text(pynvml.nvmlDeviceGetName(mig)),
                "gpu_instance_id": pynvml.nvmlDeviceGetGpuInstanceId(mig),
                "compute_instance_id": pynvml.nvmlDeviceGetComputeInstanceId(mig),
                "memory_total_mib": memory.total // (1024 * 1024),
            }
        )
    return devices


def _mig_facts(handle):
    modes = _optional(pynvml.nvmlDeviceGetMigMode, handle)
    if modes is None:
        return {"capable": False, "mode_current": None, "mode_pending": None, "layout": None}
    current, pending = modes
    facts = {
        "capable": True,
        "mode_current": MIG_MODE_NAMES.get(current, current),
        "mode_pending": MIG_MODE_NAMES.get(pending, pending),
        "layout": {},
        "gpu_instances": [],
        "devices": [],
    }
    if current == 1:
        profiles = gpu_instance_profiles(handle)
        instances = gpu_instances(handle, profiles)
        for instance in instances:
            facts["layout"][instance["profile"]] = facts["layout"].get(instance["profile"], 0) + 1
        facts["gpu_instances"] = instances
        facts["devices"] = _mig_devices(handle)
    return facts


def _gpu_facts(index, handle, read_numa_node):
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    bus_id = _text(pci.busId)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    cpus = _affinity_cpus(handle)
    return {
        "index": index,
        "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "pci_bus_id": bus_id,
        "pci_device_id": "0x%08X" % pci.pciDeviceId,
        "memory_total_mib": memory.total // (1024 * 1024),
        "memory_used_mib": memory.used // (1024 * 1024),
        "numa_node": read_numa_node(bus_id),
        "cpu_affinity": None if cpus is None else cpu_list(cpus),
        "pcie": {
            "gen_current": _optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            "gen_max": _optional(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            "width_current": _optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
            "width_max": _optional(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        },
        "mig": _mig_facts(handle),
        "error": None,
    }


def _init(inventory):
    """nvmlInit(); on failure the reason goes into ``inventory`` and the answer is False."""
    if not HAS_PYNVML:
        inventory["reason"] = missing_pynvml_reason()
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        inventory["reason"] = failure_reason(error)
        return False
    return True


def _in_session(report, read):
    """``read(report)`` between nvmlInit and nvmlShutdown; returns ``report``, and no NVML error escapes.

    ``report["available"]`` becomes True when ``read`` finishes; an NVML error that ``read`` does not record on one GPU
    (init, the GPU count) goes into ``report["reason"]`` instead.
    """
    if not _init(report):
        return report
    try:
        read(report)
        report["available"] = True
    except pynvml.NVMLError as error:
        report["reason"] = failure_reason(error)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return report


def collect_inventory(read_numa_node):
    """Everything NVML says about the node's GPUs.

    Returns ``{"available", "reason", "driver_version", "cuda_driver_version", "nvml_version",
    "gpu_count", "gpus"}``.  A failure to initialise is a ``reason``; a failure on one GPU (no
    permission on its device node, GPU lost) is recorded on that GPU and the others are still read.
    ``read_numa_node(bus_id)`` supplies the NUMA node, which NVML does not report on x86.
    """
    inventory = {
        "available": False,
        "reason": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "gpu_count": None,
        "gpus": [],
    }

    def read(inventory):
        inventory["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        inventory["nvml_version"] = _text(pynvml.nvmlSystemGetNVMLVersion())
        inventory["cuda_driver_version"] = _cuda_version(
            _optional(pynvml.nvmlSystemGetCudaDriverVersion_v2, default=0)
        )
        count = pynvml.nvmlDeviceGetCount()
        inventory["gpu_count"] = count
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                inventory["gpus"].append(_gpu_facts(index, handle, read_numa_node))
            except pynvml.NVMLError as error:
                inventory["gpus"].append({"index": index, "error": failure_reason(error)})

    return _in_session(inventory, read)


# ---------------------------------------------------------------------------------------------
# Post-check readings (gpuharden.k8s.nvml_check).  Added for the post-check; the inventory
# functions above are unchanged.

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_UNKNOWN = 999
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
TOPOLOGY_LEVELS = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}


def load_library():
    """Load libnvidia-ml.so.1 into this process without initialising NVML; None or a structured reason.

    A process that later drops its privileges calls this first: the library is then mapped before the
    uid changes, and only ``nvmlInit`` (which opens the device nodes) runs as the unprivileged user.
    """
    if not HAS_PYNVML:
        return missing_pynvml_reason()
    try:
        pynvml._LoadNvmlLibrary()
    except pynvml.NVMLError as error:
        return failure_reason(error)
    return None


def probe_access():
    """What the calling identity can open: NVML init, the GPU count and each GPU's handle.

    Returns ``{"available", "reason", "gpu_count", "gpus": [{"index", "uuid", "error"}]}``; nothing raises.
    """
    def read(probe):
        count = pynvml.nvmlDeviceGetCount()
        probe["gpu_count"] = count
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                probe["gpus"].append({"index": index, "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)), "error": None})
            except pynvml.NVMLError as error:
                probe["gpus"].append({"index": index, "uuid": None, "error": failure_reason(error)})

    return _in_session({"available": False, "reason": None, "gpu_count": None, "gpus": []}, read)


def _reading(errors, name, call, *args):
    """One health reading: its value, None when unsupported, or None plus an entry in ``errors``."""
    try:
        return _optional(call, *args)
    except pynvml.NVMLError as error:
        errors[name] = failure_reason(error)
        return None


def _nvlink_states(handle, errors):
    """{"links": n, "down": [...]} for a GPU with NVLink, None without (or when unreadable)."""
    links, down = 0, []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as error:
            value = getattr(error, "value", None)
            if value == NVML_ERROR_INVALID_ARGUMENT:
                break  # past the GPU's last link
            if value in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
                continue  # this link does not exist on this board
            errors["nvlink"] = failure_reason(error)
            return None
        links += 1
        if not active:
            down.append(link)
    return {"links": links, "down": down} if links else None


def gpu_health(handle):
    """ECC, row remapping and NVLink readings of one full GPU; None where the GPU does not support them."""
    errors = {}
    ecc = None
    volatile = _reading(errors, "ecc", pynvml.nvmlDeviceGetTotalEccErrors, handle, 1, 0)
    if volatile is not None:
        ecc = {
            "volatile_uncorrected": volatile,
            "aggregate_uncorrected": _reading(errors, "ecc", pynvml.nvmlDeviceGetTotalEccErrors, handle, 1, 1),
            "volatile_corrected": _reading(errors, "ecc", pynvml.nvmlDeviceGetTotalEccErrors, handle, 0, 0),
        }
    rows = _reading(errors, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, handle)
    remapped = None
    if rows is not None:
        remapped = {"correctable": rows[0], "uncorrectable": rows[1], "pending": bool(rows[2]), "failure": bool(rows[3])}
    return {
        "ecc": ecc,
        "remapped_rows": remapped,
        "nvlink": _nvlink_states(handle, errors),
        "errors": errors,
    }


def gpu_processes(handle):
    """Compute processes on one GPU: [{pid, used_memory_mib, gpu_instance_id, compute_instance_id}]."""
    found = []
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(proc, "usedGpuMemory", None)
        gi = getattr(proc, "gpuInstanceId", NO_INSTANCE)
        ci = getattr(proc, "computeInstanceId", NO_INSTANCE)
        found.append({
            "pid": proc.pid,
            "used_memory_mib": None if used is None else used // (1024 * 1024),
            "gpu_instance_id": None if gi in (None, NO_INSTANCE) else gi,
            "compute_instance_id": None if ci in (None, NO_INSTANCE) else ci,
        })
    return sorted(found, key=lambda entry: entry["pid"])


def _common_ancestors(handles):
    pairs = []
    indexes = sorted(handles)
    for position, first in enumerate(indexes):
        for second in indexes[position + 1:]:
            try:
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[first], handles[second])
            except pynvml.NVMLError:
                continue
            pairs.append({"gpus": [first, second], "level": TOPOLOGY_LEVELS.get(level, str(level))})
    return pairs


def collect_health(read_numa_node):
    """``collect_inventory`` plus, per readable GPU, ``health`` and ``processes``, and the GPU pairs' PCIe paths.

    Returns the inventory dict with ``topology_pairs`` ([{gpus: [a, b], level}], level as nvml.h names it:
    SINGLE/MULTIPLE = PCIe switch, HOSTBRIDGE, NODE = same NUMA node, SYSTEM = across sockets).
    """
    inventory = {
        "available": False, "reason": None, "driver_version": None, "nvml_version": None,
        "gpu_count": None, "gpus": [], "topology_pairs": [],
    }

    def read(inventory):
        inventory["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        inventory["nvml_version"] = _text(pynvml.nvmlSystemGetNVMLVersion())
        count = pynvml.nvmlDeviceGetCount()
        inventory["gpu_count"] = count
        handles = {}
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpu = _gpu_facts(index, handle, read_numa_node)
            except pynvml.NVMLError as error:
                inventory["gpus"].append({"index": index, "error": failure_reason(error)})
                continue
            gpu["health"] = gpu_health(handle)
            try:
                gpu["processes"] = gpu_processes(handle)
            except pynvml.NVMLError as error:
                gpu["processes"] = None
                gpu["health"]["errors"]["processes"] = failure_reason(error)
            handles[index] = handle
            inventory["gpus"].append(gpu)
        inventory["topology_pairs"] = _common_ancestors(handles)

    return _in_session(inventory, read)
