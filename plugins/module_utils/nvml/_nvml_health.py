# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""NVML readings -> post-check findings.  Pure: no NVML, no files; the readers live in ``_nvml.py``.

A finding is a dict ``{id, severity, node, gpu, pod, expected, found, hint}`` (``gpu`` and ``pod`` may
be None).  Severities, lowest first: info, warning, error, critical.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding

NVML_NO_PERMISSION = 4
NVML_GPU_IS_LOST = 15
NVML_UNKNOWN = 999
RETURN_NAMES = {
    3: "NOT_SUPPORTED", 4: "NO_PERMISSION", 6: "NOT_FOUND", 9: "DRIVER_NOT_LOADED", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 15: "GPU_IS_LOST", 17: "OPERATING_SYSTEM", 999: "UNKNOWN",
}

# PCIe per-lane transfer rate (GT/s) and line-code efficiency by generation: 8b/10b for gen 1-2,
# 128b/130b for gen 3-5, and FLIT mode's 242/256 for gen 6 (FEC and CRC overhead of the 256-byte flit).
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}

_DENIED_HINTS = {
    NVML_NO_PERMISSION: "the kernel refused the open with EACCES: owner/mode of the device node or SELinux "
                        "(role gpuharden.k8s.device_permissions)",
    NVML_UNKNOWN: "NVML's UNKNOWN on a handle is what a devices-cgroup denial (EPERM) or a missing /dev/nvidia<minor> "
                  "looks like: check the device node exists and the cgroup's device rules",
}


def pcie_bandwidth_gbps(gen, width):
    """Usable bandwidth of a link in GB/s per direction, or None for an unknown generation/width."""
    if gen not in PCIE_GT_PER_S or not isinstance(width, int) or width <= 0:
        return None
    return round(PCIE_GT_PER_S[gen] * PCIE_ENCODING[gen] * width / 8, 3)


def pcie_link(pcie):
    """The PCIe readings plus bandwidth current/max and their ratio (None where a value is unknown)."""
    pcie = dict(pcie or {})
    current = pcie_bandwidth_gbps(pcie.get("gen_current"), pcie.get("width_current"))
    maximum = pcie_bandwidth_gbps(pcie.get("gen_max"), pcie.get("width_max"))
    pcie["bandwidth_gbps_current"] = current
    pcie["bandwidth_gbps_max"] = maximum
    pcie["bandwidth_ratio"] = round(current / maximum, 4) if current is not None and maximum else None
    return pcie


def return_name(value):
    return RETURN_NAMES.get(value, str(value))


def _gpu_label(gpu):
    """How a finding names a GPU: index, minor, UUID and bus id where known."""
    label = {key: gpu.get(key) for key in ("index", "minor", "uuid", "pci_bus_id")}
    if gpu.get("identified_by"):
        label["identified_by"] = gpu["identified_by"]
    return label


def _access_found(reason):
    return {"nvml_return": reason.get("nvml_return"), "return_name": return_name(reason.get("nvml_return")),
            "code": reason.get("code"), "message": reason.get("message")}


def _device_path(gpu):
    return "/dev/nvidia%d" % gpu["minor"] if gpu.get("minor") is not None else "/dev/nvidia<minor>"


def _init_findings(node, reading, probe, user):
    findings = []
    if not reading["available"]:
        reason = reading["reason"] or {}
        findings.append(finding(
            "nvml_init_failed", "critical", "NVML initialises as root", _access_found(reason),
            reason.get("hint") or "NVML cannot be used on this node", node=node, gpu=None, pod=None))
    if probe is not None and not probe["available"]:
        reason = probe["reason"] or {}
        value = reason.get("nvml_return")
        hint = "the unprivileged user cannot use NVML: "
        if value == NVML_NO_PERMISSION:
            hint += "/dev/nvidiactl is not open to it (owner/mode or SELinux; role gpuharden.k8s.device_permissions)"
        else:
            hint += reason.get("hint") or "see found.message"
        findings.append(finding(
            "nvml_unprivileged_init_failed", "error", "NVML initialises as %s" % user, _access_found(reason), hint, node=node, gpu=None, pod=None))
    return findings


def _handle_findings(node, gpu, label, reason, who, severity):
    value = reason.get("nvml_return")
    if value == NVML_GPU_IS_LOST:
        return []  # reported once, as gpu_lost
    hint = _DENIED_HINTS.get(value, reason.get("hint") or "see found.message")
    return [finding(
        "nvml_%s_gpu_denied" % who, severity, "%s opens %s and gets a handle for GPU %d" % (
            "root" if who == "root" else "the unprivileged user", _device_path(gpu), gpu["index"]),
        _access_found(reason), hint, gpu=label, node=node, pod=None)]


def _count_findings(node, reading, driver_gpus, expected_gpus, expected_mig, driver_mig):
    findings = []
    count = reading["gpu_count"]
    if driver_gpus is not None and count is not None and count != len(driver_gpus):
        seen = {gpu.get("pci_bus_id", "")[4:].lower() for gpu in reading["gpus"] if gpu.get("pci_bus_id")}
        findings.append(finding(
            "gpu_count_driver_mismatch", "error", {"gpus": len(driver_gpus), "source": "/proc/driver/nvidia/gpus"},
            {"gpus": count, "source": "NVML", "not_seen_by_nvml": sorted(set(driver_gpus) - seen) if seen else None},
            "NVML does not count the GPUs the driver knows: a GPU fell off the bus, its /dev/nvidia<minor> node is missing "
            "(the library skips the GPUs whose node it cannot find), or the driver and library disagree", node=node, gpu=None, pod=None))
    if expected_gpus is not None and count is not None and count != expected_gpus:
        findings.append(finding(
            "gpu_count_unexpected", "error", {"gpus": expected_gpus, "source": "inventory"},
            {"gpus": count, "source": "NVML"},
            "the node has another number of GPUs than the inventory says: a GPU is missing (lost, disabled in "
            "firmware, unseated) or the inventory is out of date", node=node, gpu=None, pod=None))
    mig_count = sum(len((gpu.get("mig") or {}).get("devices") or []) for gpu in reading["gpus"])
    if expected_mig is not None and reading["available"] and mig_count != expected_mig:
        findings.append(finding(
            "mig_device_count_unexpected", "error", {"mig_devices": expected_mig, "source": "inventory"},
            {"mig_devices": mig_count, "source": "NVML"},
            "the MIG layout on the node is not the expected one (role gpuharden.k8s.mig or the MIG manager)", node=node, gpu=None, pod=None))
    if driver_mig is not None and reading["available"] and mig_count != driver_mig:
        findings.append(finding(
            "mig_device_count_driver_mismatch", "error",
            {"mig_devices": driver_mig, "source": "/proc/driver/nvidia/capabilities"},
            {"mig_devices": mig_count, "source": "NVML"},
            "NVML and the driver's MIG capability tree disagree on the compute instances", node=node, gpu=None, pod=None))
    return findings


def _health_findings(node, gpu, label):
    findings = []
    health = gpu.get("health") or {}
    ecc = health.get("ecc") or {}
    if ecc.get("volatile_uncorrected"):
        findings.append(finding(
            "ecc_uncorrectable", "error", {"volatile_uncorrected": 0},
            {"volatile_uncorrected": ecc["volatile_uncorrected"], "aggregate_uncorrected": ecc.get("aggregate_uncorrected")},
            "uncorrectable ECC errors since the last driver load: the GPU's memory is corrupt for the running "
            "work; drain the node and reset the GPU (nvidia-smi -r), replace it if they come back", gpu=label, node=node, pod=None))
    rows = health.get("remapped_rows") or {}
    if rows.get("failure"):
        findings.append(finding(
            "remapped_rows_failure", "critical", {"failure": False}, rows,
            "row remapping failed (no spare rows left): the GPU needs replacing", gpu=label, node=node, pod=None))
    elif rows.get("pending"):
        findings.append(finding(
            "remapped_rows_pending", "error", {"pending": False}, rows,
            "a row remapping waits for a GPU reset: drain the node and reset the GPU", gpu=label, node=node, pod=None))
    pcie = gpu.get("pcie") or {}
    width_low = None not in (pcie.get("width_current"), pcie.get("width_max")) and pcie["width_current"] < pcie["width_max"]
    gen_low = None not in (pcie.get("gen_current"), pcie.get("gen_max")) and pcie["gen_current"] < pcie["gen_max"]
    if width_low or gen_low:
        findings.append(finding(
            "pcie_link_degraded", "error" if width_low else "warning",
            {"gen": pcie.get("gen_max"), "width": pcie.get("width_max"), "bandwidth_gbps": pcie.get("bandwidth_gbps_max")},
            {"gen": pcie.get("gen_current"), "width": pcie.get("width_current"),
             "bandwidth_gbps": pcie.get("bandwidth_gbps_current"), "bandwidth_ratio": pcie.get("bandwidth_ratio")},
            "the PCIe link trained below its maximum (%s of the bandwidth): %s" % (
                "%.0f%%" % (100 * pcie["bandwidth_ratio"]) if pcie.get("bandwidth_ratio") is not None else "unknown share",
                "a narrow link is a seating, riser or slot fault; reseat the card or move it"
                if width_low else "an idle GPU may lower its generation to save power; check again under load"),
            gpu=label, node=node, pod=None))
    nvlink = health.get("nvlink")
    if nvlink and nvlink.get("down"):
        findings.append(finding(
            "nvlink_down", "error", {"links": nvlink["links"], "down": []},
            {"links": nvlink["links"], "down": nvlink["down"]},
            "NVLink links are down: peer traffic falls back to PCIe; check the NVLink bridge/NVSwitch and fabric manager",
            gpu=label, node=node, pod=None))
    if health.get("errors"):
        findings.append(finding(
            "gpu_health_unreadable", "warning", "every health reading available",
            {name: _access_found(reason) for name, reason in sorted(health["errors"].items())},
            "NVML refused some health readings; they were not checked", gpu=label, node=node, pod=None))
    mig = gpu.get("mig") or {}
    if mig.get("capable") and mig.get("mode_current") != mig.get("mode_pending"):
        findings.append(finding(
            "mig_mode_pending", "warning", {"mode": mig.get("mode_pending")}, {"mode": mig.get("mode_current")},
            "a MIG mode change waits for a GPU reset", gpu=label, node=node, pod=None))
    return findings


def processes(reading):
    """Every GPU process with its GPU, memory and MIG instance (and MIG device UUID where it runs on one)."""
    found = []
    for gpu in reading["gpus"]:
        devices = {(dev["gpu_instance_id"], dev["compute_instance_id"]): dev["uuid"]
                   for dev in (gpu.get("mig") or {}).get("devices") or []}
        for proc in gpu.get("processes") or []:
            found.append(dict(proc, gpu=gpu["index"], gpu_uuid=gpu.get("uuid"),
                              mig_device_uuid=devices.get((proc.get("gpu_instance_id"), proc.get("compute_instance_id")))))
    return found


def _gpu_summary(gpu, probe_gpu):
    if gpu.get("error"):
        summary = {key: gpu[key] for key in ("index", "minor", "pci_bus_id", "identified_by", "error") if key in gpu}
    else:
        summary = {key: gpu.get(key) for key in (
            "index", "minor", "uuid", "name", "pci_bus_id", "numa_node", "cpu_affinity", "memory_total_mib",
            "memory_used_mib", "mig", "error")}
        summary["pcie"] = gpu.get("pcie")
        health = gpu.get("health") or {}
        summary.update(ecc=health.get("ecc"), remapped_rows=health.get("remapped_rows"), nvlink=health.get("nvlink"))
    summary["unprivileged_error"] = None if probe_gpu is None else probe_gpu.get("error")
    return summary


def _identify_unreadable(reading, driver_gpus):
    """Name the GPUs NVML gives no handle for by the driver's list: NVML enumerates GPUs in PCI bus order.

    Only when the driver lists exactly as many GPUs as NVML counts; the entry gets ``identified_by``.
    """
    if not driver_gpus or reading["gpu_count"] != len(driver_gpus):
        return
    bdfs = sorted(driver_gpus)
    for position, gpu in enumerate(sorted(reading["gpus"], key=lambda entry: entry["index"])):
        if position >= len(bdfs):
            break
        bdf = bdfs[position]
        if gpu.get("error") and gpu.get("pci_bus_id") is None:
            gpu["pci_bus_id"] = "0000" + bdf.upper() if len(bdf) == 12 else bdf
            gpu["minor"] = driver_gpus[bdf].get("minor")
            gpu["identified_by"] = "pci_bus_order"


def evaluate(node, reading, probe=None, user="nobody", driver_gpus=None, expected_gpus=None,
             expected_mig_devices=None, driver_mig_devices=None):
    """Findings and a summary from the root reading (``_nvml.collect_health``) and the unprivileged probe.

    ``driver_gpus`` is the driver's GPU list (or None when the driver shows none), ``driver_mig_devices``
    the driver's MIG device count (or None when unknown).
    """
    if expected_gpus is not None and expected_gpus < 0:
        raise GpuhardenError("nvml_check: option expected_gpus=%r must be 0 or more" % expected_gpus)
    if expected_mig_devices is not None and expected_mig_devices < 0:
        raise GpuhardenError("nvml_check: option expected_mig_devices=%r must be 0 or more" % expected_mig_devices)
    for gpu in reading["gpus"]:
        if not gpu.get("error"):
            gpu["pcie"] = pcie_link(gpu.get("pcie"))
    _identify_unreadable(reading, driver_gpus)
    findings = _init_findings(node, reading, probe, user)
    root_by_index = {gpu["index"]: gpu for gpu in reading["gpus"]}
    for gpu in reading["gpus"]:
        error = gpu.get("error")
        label = _gpu_label(gpu)
        if error and error.get("nvml_return") == NVML_GPU_IS_LOST:
            findings.append(finding(
                "gpu_lost", "critical", "GPU %d answers" % gpu["index"], _access_found(error),
                "the GPU fell off the bus (Xid 79): drain the node, reset or power-cycle it; check power and cooling",
                gpu=label, node=node, pod=None))
        elif error:
            findings.extend(_handle_findings(node, gpu, label, error, "root", "error"))
        else:
            findings.extend(_health_findings(node, gpu, label))
    probe_by_index = {}
    if probe is not None and probe["available"]:
        for probe_gpu in probe["gpus"]:
            probe_by_index[probe_gpu["index"]] = probe_gpu
            root_gpu = root_by_index.get(probe_gpu["index"], {"index": probe_gpu["index"]})
            if probe_gpu["error"] and not root_gpu.get("error"):
                findings.extend(_handle_findings(
                    node, root_gpu, _gpu_label(root_gpu), probe_gpu["error"], "unprivileged", "error"))
    findings.extend(_count_findings(node, reading, driver_gpus, expected_gpus, expected_mig_devices, driver_mig_devices))
    gpus = [_gpu_summary(gpu, probe_by_index.get(gpu["index"])) for gpu in reading["gpus"]]
    return {
        "findings": findings,
        "gpus": gpus,
        "processes": processes(reading),
        "gpu_count": reading["gpu_count"],
        "driver_gpu_count": None if driver_gpus is None else len(driver_gpus),
        "mig_device_count": sum(len((gpu.get("mig") or {}).get("devices") or []) for gpu in reading["gpus"]),
        "topology": topology(reading),
    }


def topology(reading):
    """GPUs per NUMA node (sysfs; -1 = no hint), PCIe paths between GPU pairs and active NVLinks per GPU."""
    numa = {}
    nvlink_active = {}
    for gpu in reading["gpus"]:
        if gpu.get("error"):
            continue
        key = "unknown" if gpu.get("numa_node") is None else str(gpu["numa_node"])
        numa.setdefault(key, []).append(gpu["index"])
        link = (gpu.get("health") or {}).get("nvlink")
        if link:
            nvlink_active[str(gpu["index"])] = link["links"] - len(link["down"])
    return {"numa_nodes": numa, "pairs": reading.get("topology_pairs") or [], "nvlink_active": nvlink_active}
