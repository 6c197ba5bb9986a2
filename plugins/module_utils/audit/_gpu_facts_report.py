# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What playbooks/audit_node.yml prints of a node's gpu_facts (the gpuharden.k8s.gpu_facts_report lookup calls it),
decided here instead of in Jinja: NVML's state, a line per GPU, the /dev/nvidia* nodes whose owner or mode differ
from the driver's settings (its DeviceFileUID, DeviceFileGID and DeviceFileMode parameters, or their defaults
0, 0 and 0666), and the PCIe links trained below their maximum.  Pure: the facts in, the lines out."""

from __future__ import annotations

import re

# the nodes the driver creates with its DeviceFile* settings: one per GPU, and the control device
DRIVER_NODE = re.compile(r"^/dev/nvidia([0-9]+|ctl)$")
# the driver's defaults for DeviceFileUID, DeviceFileGID and DeviceFileMode (0666)
DRIVER_DEFAULTS = {"DeviceFileUID": 0, "DeviceFileGID": 0, "DeviceFileMode": 438}


def nvml_line(facts):
    nvml = facts["nvml"]
    if nvml.get("available"):
        return "NVML %s, driver %s, CUDA %s, %s GPUs" % (
            nvml.get("version"), facts.get("driver_version"), facts.get("cuda_driver_version"), facts.get("gpu_count"))
    reason = nvml.get("reason") or {}
    return "NVML unusable: %s - %s" % (reason.get("code"), reason.get("hint"))


def gpu_line(gpu):
    if gpu.get("error"):
        return "GPU%d: %s (%s)" % (gpu["index"], gpu["error"].get("code"), gpu["error"].get("message"))
    pcie, mig = gpu.get("pcie") or {}, gpu.get("mig") or {}
    return "GPU%d %s %s NUMA %s PCIe gen%sx%s (max gen%sx%s) MIG %s" % (
        gpu["index"], gpu.get("name"), gpu.get("pci_bus_id"), gpu.get("numa_node"), pcie.get("gen_current"), pcie.get("width_current"),
        pcie.get("gen_max"), pcie.get("width_max"), mig.get("mode_current") if mig.get("capable") else "n/a")


def device_nodes_line(facts):
    params = dict(DRIVER_DEFAULTS, **(facts.get("driver_params") or {}))
    mode = "%04o" % int(params["DeviceFileMode"])
    wrong = []
    for path, node in (facts.get("device_nodes") or {}).items():
        if DRIVER_NODE.match(path) and (node.get("mode") != mode or node.get("uid") != params["DeviceFileUID"]
                                        or node.get("gid") != params["DeviceFileGID"]):
            wrong.append("%s is %s:%s %s, driver wants uid %s gid %s mode %s" % (
                path, node.get("owner"), node.get("group"), node.get("mode"), params["DeviceFileUID"], params["DeviceFileGID"], mode))
    return "; ".join(wrong) if wrong else "all /dev/nvidia* nodes match the driver settings"


def pcie_line(facts):
    slow = []
    for gpu in facts.get("gpus") or []:
        pcie = gpu.get("pcie") or {}
        if gpu.get("error") or not pcie.get("gen_max"):
            continue
        if pcie.get("gen_current") < pcie["gen_max"] or pcie.get("width_current") < pcie.get("width_max"):
            slow.append("GPU%s %s: gen%sx%s of gen%sx%s" % (
                gpu["index"], gpu.get("pci_bus_id"), pcie.get("gen_current"), pcie.get("width_current"), pcie["gen_max"], pcie.get("width_max")))
    return "; ".join(slow) if slow else "all PCIe links at their maximum"


def gpu_facts_report(facts):
    """{nvml, gpus, device_nodes, pcie}: the lines audit_node.yml prints (gpus: one per GPU)."""
    return {"nvml": nvml_line(facts), "gpus": [gpu_line(gpu) for gpu in facts.get("gpus") or []],
            "device_nodes": device_nodes_line(facts), "pcie": pcie_line(facts)}


def report_lines(report):
    """The report as the lines audit_node.yml prints, in its order: NVML, each GPU, the device nodes, the PCIe links."""
    return [report["nvml"], *report["gpus"], report["device_nodes"], report["pcie"]]
