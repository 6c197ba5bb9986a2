# SPDX-License-Identifier: GPL-3.0-or-later
"""What a drift run checked, could not check, or refused: the three states of every check (pure, report data in).

- **checked**: clean, or findings (drift, attention).
- **could not check** (``not_checked``): the cause and the fix.  Never counted as clean, never as drift: a drift run
  with one exits EXIT_NOT_CHECKED, its headline (the first line on the terminal) names the cause and the fix, and its
  metrics say which check is blind (``gpuharden_drift_checked`` 0) without advancing
  ``gpuharden_last_success_timestamp_seconds``.
- **refused** (``refused``): what a check found is outside what gpuharden changes safely (another installer owns
  it); named with why and the fix.  Reported, never counted as drift.

Where each comes from:
- node_audit names a check (or a part of one) it could not run or refused (``checks.<name>.not_checked`` and
  ``.refused``: plugins/module_utils/audit/_node_audit.py);
- the cluster side: the consistency check, the RuntimeClass dry run and the play's LIST of GPU pods (which the memory
  check of every node needs) fail with the API server's or the kubeconfig's error, and the collection's k8s layer
  names its kind and fix (``access``: plugins/module_utils/k8s/_k8s.py, ACCESS_FIXES);
- a host the run could not reach, or whose check failed, is not checked at all.
"""

from __future__ import annotations

NOT_CHECKED = "not_checked"
REFUSED = "refused"
CHECKED = "checked"
# The cluster side's checks, in the order a report lists them: the consistency check, the RuntimeClass dry run, and
# the play's one LIST of GPU pods (the nodes' memory.high check takes its pods from it).
CLUSTER_CHECKS = ("consistency", "runtime_class", "gpu_pods")
# The node check that needs the play's LIST of GPU pods: without it node_audit leaves it out (drift_check.yml).
POD_LIST_CHECK = "cgroup_memory"
GENERIC_FIX = "read the cause; the other checks of the run still ran"
UNREACHABLE_FIX = ("make the node reachable from the controller over SSH (address, user, key, known_hosts: "
                   "ansible -i INVENTORY NODE -m ping), then run again")
FAILED_FIX = "read the message: a node lock held by another run names its owner (a stale one is taken over after stale_after)"


def _entry(cause, fix, **context):
    return dict(context, cause=" ".join(str(cause or "no reason given").split()), fix=fix or GENERIC_FIX)


def _access_fix(access):
    return (access or {}).get("fix") if isinstance(access, dict) else None


def runtime_class_blind(result):
    """(cause, fix) when the RuntimeClass dry run's ``result`` is no answer, else None: the cluster could not be read
    (``access``), or the dry run failed (its ``failed`` from inside another module's run, or the task's ``msg``)
    without a finding or a change."""
    if result is None:
        return None
    answered = result.get("findings") or result.get("changed")
    # a refusal with its findings (a handler only a recreate changes) is an answer; a failed request never is
    if result.get("access") or ((result.get("failed") or result.get("msg")) and not answered):
        return result.get("msg") or "the RuntimeClass dry run failed", _access_fix(result.get("access"))
    return None


def cluster_checks(consistency_ran, consistency_error, consistency_access, runtime_class, pods_error):
    """{check: {"state": checked | not_checked, "cause", "fix"}} of the cluster side's checks that the run asked for
    (a check the run did not ask for is absent)."""
    checks = {}
    if consistency_error is not None:
        checks["consistency"] = _entry(consistency_error, _access_fix(consistency_access), state=NOT_CHECKED)
    elif consistency_ran:
        checks["consistency"] = {"state": CHECKED}
    blind = runtime_class_blind(runtime_class)
    if blind is not None:
        checks["runtime_class"] = _entry(blind[0], blind[1], state=NOT_CHECKED)
    elif runtime_class is not None:
        checks["runtime_class"] = {"state": CHECKED}
    if pods_error is not None:
        checks["gpu_pods"] = _entry(pods_error.get("cause"), _access_fix(pods_error.get("access")), state=NOT_CHECKED)
    return checks


def node_parts(checks, state, pods_blind=None):
    """The not_checked (or refused) parts of one node's checks, as [{check, what, cause | why, fix}].  ``pods_blind``:
    the cluster's gpu_pods entry when the play's LIST of GPU pods failed, so that the node's memory check, which
    node_audit then left out, is not checked rather than silently skipped."""
    parts = []
    for name, result in sorted((checks or {}).items()):
        for part in (result or {}).get(state) or []:
            parts.append(dict(part, check=name, what=part.get("what") or name))
        if state == NOT_CHECKED and name == POD_LIST_CHECK and pods_blind and (result or {}).get("status") == "skipped":
            parts.append({"check": name, "what": "memory.high of the node's GPU pods (the play's LIST of GPU pods failed)",
                          "cause": pods_blind["cause"], "fix": pods_blind["fix"]})
    return parts


def blind_spots(report):
    """Everything the run could not check, as [{scope, node, check, what, cause, fix}], cluster first: the report's
    not_checked list (and what its headline and exit code come from)."""
    spots = []
    for check, entry in sorted((report.get("cluster") or {}).get("checks", {}).items(), key=lambda item: _order(item[0])):
        if entry.get("state") == NOT_CHECKED:
            spots.append({"scope": "cluster", "node": None, "check": check, "what": check, "cause": entry["cause"], "fix": entry["fix"]})
    names = report.get("node_names") or {}
    for host, node in sorted(report.get("nodes", {}).items()):
        for part in node.get(NOT_CHECKED) or []:
            spots.append({"scope": "node", "node": node.get("node", host), "check": part["check"], "what": part["what"],
                          "cause": part["cause"], "fix": part["fix"]})
    for section, fix in (("unreachable", UNREACHABLE_FIX), ("failed", FAILED_FIX)):
        for host, message in sorted((report.get(section) or {}).items()):
            spots.append({"scope": "node", "node": names.get(host, host), "check": section, "what": "every check (%s)" % section,
                          "cause": message, "fix": fix})
    return spots


def _order(check):
    return CLUSTER_CHECKS.index(check) if check in CLUSTER_CHECKS else len(CLUSTER_CHECKS)


def headline(spots):
    """The one line that opens the terminal output of a run that could not check something: the first cause and its
    fix, and how many more there are."""
    if not spots:
        return None
    first = spots[0]
    where = ("the cluster side (%s)" % ", ".join(spot["check"] for spot in spots if spot["scope"] == "cluster")
             if first["scope"] == "cluster" else "%s on node %s" % (first["what"], first["node"]))
    others = len(spots) - (sum(1 for spot in spots if spot["scope"] == "cluster") if first["scope"] == "cluster" else 1)
    return "NOT CHECKED: %s: %s. Fix: %s%s" % (where, first["cause"].rstrip("."), first["fix"],
                                                "  (%d more not checked below)" % others if others else "")


def merge_cluster_checks(sections):
    """The cluster checks of several slices as one: not checked where any slice could not check it (each slice
    checks its own nodes), checked where every slice that asked for it did."""
    merged = {}
    for section in sections:
        for check, entry in (section.get("checks") or {}).items():
            known = merged.get(check)
            if known is None or (entry.get("state") == NOT_CHECKED and known.get("state") != NOT_CHECKED):
                merged[check] = dict(entry)
            elif entry.get("state") == NOT_CHECKED and entry.get("cause") not in known["cause"].split("; "):
                merged[check] = dict(known, cause="%s; %s" % (known["cause"], entry["cause"]))
    return merged
