# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden drift`'s Prometheus textfile-collector output, from a report (and the file it replaces)."""

from __future__ import annotations

from gpuharden import coverage, drift_report


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


LAST_SUCCESS_METRIC = "gpuharden_last_success_timestamp_seconds"
CREDENTIAL_EXPIRY_METRIC = "gpuharden_credential_expiry_timestamp_seconds"


def previous_last_success(text):
    """The gpuharden_last_success_timestamp_seconds of an earlier textfile (its text, or None), or None."""
    for line in (text or "").splitlines():
        name, _sep, value = line.partition(" ")
        if name == LAST_SUCCESS_METRIC:
            try:
                return float(value.split()[0])
            except (ValueError, IndexError):
                return None
    return None


def check_coverage(report):
    """{(scope, check): nodes not checked} of the checks this run asked for: scope cluster (0 or 1) and node (the
    number of audited nodes where the check, or a part of it, did not run); a check no node ran is absent."""
    covered = {("cluster", check): int(entry.get("state") == coverage.NOT_CHECKED)
               for check, entry in (report.get("cluster") or {}).get("checks", {}).items()}
    for node in report["nodes"].values():
        for name, result in (node.get("checks") or {}).items():
            if (result or {}).get("status") not in (None, "skipped") or name in {part["check"] for part in node.get(coverage.NOT_CHECKED) or []}:
                covered.setdefault(("node", name), 0)
        for name in {part["check"] for part in node.get(coverage.NOT_CHECKED) or []}:
            covered[("node", name)] = covered.get(("node", name), 0) + 1
    return covered


def prometheus_text(report, previous=None):
    """The textfile-collector exposition: findings per node/check/severity, per-node totals, what was checked, run
    metadata.  ``previous``: the text of the file this replaces; a run that could not check something keeps its
    gpuharden_last_success_timestamp_seconds (none if it had none), so that the age of that series says how long
    gpuharden has not seen everything it was asked to."""
    lines = [
        "# HELP gpuharden_drift_findings Findings of the last gpuharden drift run, by node, check and severity.",
        "# TYPE gpuharden_drift_findings gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        counts = {}
        for entry in node["findings"]:
            key = (entry["check"], entry["severity"])
            counts[key] = counts.get(key, 0) + 1
        for (check, severity), count in sorted(counts.items()):
            lines.append('gpuharden_drift_findings{node="%s",check="%s",severity="%s"} %d'
                         % (_label(node["node"]), _label(check), _label(severity), count))
    lines += [
        "# HELP gpuharden_drift_cluster_findings Findings of the last drift run about cluster objects (the RuntimeClass).",
        "# TYPE gpuharden_drift_cluster_findings gauge",
    ]
    cluster_counts = {}
    for entry in report.get("cluster", {}).get("findings", []):
        key = (entry["check"], entry["severity"])
        cluster_counts[key] = cluster_counts.get(key, 0) + 1
    for (check, severity), count in sorted(cluster_counts.items()):
        lines.append('gpuharden_drift_cluster_findings{check="%s",severity="%s"} %d' % (_label(check), _label(severity), count))
    lines += [
        "# HELP gpuharden_drift_node_drifted 1 when the node has findings at or above the run's fail severity, else 0.",
        "# TYPE gpuharden_drift_node_drifted gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        lines.append('gpuharden_drift_node_drifted{node="%s"} %d' % (_label(node["node"]), node["status"] == "drift"))
    lines += [
        "# HELP gpuharden_drift_node_attention 1 when the node's only findings at or above the fail severity are ones no "
        "playbook fixes (hardware, workloads), else 0.",
        "# TYPE gpuharden_drift_node_attention gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        lines.append('gpuharden_drift_node_attention{node="%s"} %d' % (_label(node["node"]), node["status"] == "attention"))
    # Every host of the run gets a 0/1 sample, so an unreachable or failed node keeps a per-node series to alert on.
    others = {host: report.get("node_names", {}).get(host, host) for host in list(report["unreachable"]) + list(report["failed"])}
    labels = sorted({node["node"] for node in report["nodes"].values()} | set(others.values()))
    for metric, section, text in (
            ("gpuharden_drift_node_unreachable", "unreachable", "1 when the last complete drift run could not reach the node, else 0."),
            ("gpuharden_drift_node_failed", "failed", "1 when the node's drift check failed in the last complete run (for example "
                                                      "locked by another run, or no result), else 0.")):
        hit = {others[host] for host in report[section]}
        lines += ["# HELP %s %s" % (metric, text), "# TYPE %s gauge" % metric]
        lines += ['%s{node="%s"} %d' % (metric, _label(label), label in hit) for label in labels]
    lines += [
        "# HELP gpuharden_drift_node_not_checked 1 when a check of the node, or a part of one, could not run in the last "
        "complete drift run (the report names the cause and the fix), else 0.",
        "# TYPE gpuharden_drift_node_not_checked gauge",
    ]
    lines += ['gpuharden_drift_node_not_checked{node="%s"} %d' % (_label(node["node"]), bool(node.get(coverage.NOT_CHECKED)))
              for _host, node in sorted(report["nodes"].items())]
    covered = check_coverage(report)
    lines += [
        "# HELP gpuharden_drift_checked 1 when the check ran wherever the last complete drift run asked for it, 0 when it "
        "could not run somewhere (scope cluster: the cluster side; scope node: on at least one audited node).",
        "# TYPE gpuharden_drift_checked gauge",
    ]
    lines += ['gpuharden_drift_checked{scope="%s",check="%s"} %d' % (_label(scope), _label(check), not blind)
              for (scope, check), blind in sorted(covered.items())]
    lines += [
        "# HELP gpuharden_drift_check_nodes_not_checked Audited nodes where the check, or a part of it, could not run in "
        "the last complete drift run.",
        "# TYPE gpuharden_drift_check_nodes_not_checked gauge",
    ]
    lines += ['gpuharden_drift_check_nodes_not_checked{check="%s"} %d' % (_label(check), blind)
              for (scope, check), blind in sorted(covered.items()) if scope == "node"]
    blind = drift_report.exit_code(report) == drift_report.EXIT_NOT_CHECKED
    lines += [
        "# HELP gpuharden_drift_not_checked 1 when the last complete drift run could not check something it was asked to "
        "(a blind cluster side, a node check that could not run, an unreachable or failed node), else 0.",
        "# TYPE gpuharden_drift_not_checked gauge",
        "gpuharden_drift_not_checked %d" % blind,
        "# HELP gpuharden_nodes_unreachable Nodes the last drift run could not reach.",
        "# TYPE gpuharden_nodes_unreachable gauge",
        "gpuharden_nodes_unreachable %d" % report["summary"]["unreachable"],
        "# HELP gpuharden_nodes_failed Nodes whose drift check failed (for example locked by another run).",
        "# TYPE gpuharden_nodes_failed gauge",
        "gpuharden_nodes_failed %d" % report["summary"]["failed"],
        "# HELP gpuharden_last_run_timestamp_seconds When the last complete drift run finished (Unix time); runs that "
        "do not finish write nothing.",
        "# TYPE gpuharden_last_run_timestamp_seconds gauge",
        "gpuharden_last_run_timestamp_seconds %.3f" % report["timestamp"],
        "# HELP %s When the last drift run that completed and checked everything it was asked to finished (Unix time). "
        "An interrupted, timed-out or canceled run leaves this file as it was, and a run that could not check something "
        "keeps the earlier value, so this stops advancing: alert on its age." % LAST_SUCCESS_METRIC,
        "# TYPE %s gauge" % LAST_SUCCESS_METRIC,
    ]
    last_success = previous_last_success(previous) if blind else report["timestamp"]
    if last_success is not None:
        lines.append("%s %.3f" % (LAST_SUCCESS_METRIC, last_success))
    lines += [
        "# HELP gpuharden_last_run_duration_seconds How long the last drift run took.",
        "# TYPE gpuharden_last_run_duration_seconds gauge",
        "gpuharden_last_run_duration_seconds %.3f" % report["duration_seconds"],
        "# HELP %s When the credential of the kubeconfig the drift run's cluster side used expires (Unix time): its "
        "token's JWT exp, or its client certificate's notAfter. Absent when it has none the client can read (a static "
        "token, an exec plugin, the in-cluster ServiceAccount the kubelet renews)." % CREDENTIAL_EXPIRY_METRIC,
        "# TYPE %s gauge" % CREDENTIAL_EXPIRY_METRIC,
    ]
    expires_at = ((report.get("cluster") or {}).get("credential") or {}).get("expires_at")
    if expires_at is not None:
        lines.append("%s %.3f" % (CREDENTIAL_EXPIRY_METRIC, expires_at))
    return "\n".join(lines) + "\n"


def read_previous(path):
    """The text of the metrics file a run is about to replace, or None (none yet, unreadable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None
