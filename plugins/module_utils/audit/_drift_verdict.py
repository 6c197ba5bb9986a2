# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What drift_check.yml's run-data play records for a host and why it fails the host, decided once here (the
gpuharden.k8s.drift_verdict lookup calls it) instead of in Jinja: for ansible-playbook, AWX and AAP, which read the
run data and the failed hosts (`gpuharden drift` turns that play off and reads the results itself).

Could not check is neither clean nor drift: a check that could not run (on the node, or the cluster side's consistency
check, which every host's report needs) fails the host with its cause, before findings at or above the fail severity
do.  The severity scale is the catalogue's (core/_findings.py).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


def _consistency_answered(consistency):
    """The consistency check answered, or did not run (skipped, or not asked for: an empty result)."""
    return not consistency or "findings" in consistency or bool(consistency.get("skipped"))


def drift_verdict(node_plan, consistency, node, fail_severity="warning"):
    """{run_data, failure} of one host: ``run_data`` the host's entry of the run data (its Node name, node_audit's
    summary, checks and findings, and the consistency check's findings about its Node), ``failure`` why the host
    fails ("" where it does not).  ``node_plan``: the host's gpuharden_node_plan (node_audit's result); ``consistency``:
    the play's registered gpu_consistency result (None or {} where it did not run)."""
    if fail_severity not in _findings.SEVERITIES:
        raise GpuhardenError("gpuharden_drift_fail_severity=%r: give one of %s" % (fail_severity, ", ".join(_findings.SEVERITIES)))
    if not isinstance(node_plan, dict) or not isinstance(node_plan.get("findings"), list):
        raise GpuhardenError("gpuharden_node_plan of %s is %r, not node_audit's result" % (node, type(node_plan).__name__))
    consistency = consistency or {}
    mine = [entry for entry in consistency.get("findings") or [] if entry.get("node") == node]
    checks = node_plan.get("checks") or {}
    run_data = {"node": node, "summary": node_plan.get("summary"), "checks": checks, "findings": node_plan["findings"],
                "consistency_findings": mine}
    causes = [part.get("cause") for check in checks.values() for part in (check or {}).get("not_checked") or []]
    if not _consistency_answered(consistency):
        causes.append(consistency.get("msg") or "")
    if causes:
        return {"run_data": run_data, "failure": "%s not checked: %s" % (node, "; ".join(str(cause) for cause in causes))}
    failing = _findings.at_or_above(node_plan["findings"] + mine, fail_severity)
    if not failing:
        return {"run_data": run_data, "failure": ""}
    stages = (node_plan.get("summary") or {}).get("stages") or []
    return {"run_data": run_data, "failure": "%s drifted: %s (stages to run: %s)" % (
        node, ", ".join(dict.fromkeys(entry["id"] for entry in failing)), ", ".join(stages) or "none, not remediable")}
