# SPDX-License-Identifier: GPL-3.0-or-later
"""Slices (--slice K/N: one part of the fleet per run) and `gpuharden drift-merge`, which makes their reports one."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import sys

from gpuharden import coverage, drift_metrics, drift_report, drift_terminal, kubeconfig, report_html


class MergeError(Exception):
    """A set of reports drift-merge refuses to combine; the message names the file."""


def parse_slice(text):
    """--slice K/N as (K, N): K counts from 1, as AWX numbers its job slices; argparse shows the error."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise argparse.ArgumentTypeError("%r is not K/N (this run's slice K of N, whole numbers, 1 <= K <= N)" % text)
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise argparse.ArgumentTypeError("%r: K must be between 1 and N, and N at least 1 (slices are numbered 1..N)" % text)
    return index, count


def slice_of(host, count):
    """The 0-based slice of an inventory host name among ``count``.  sha256, not hash(): Python salts str hashes per
    process, and every pod of an Indexed Job (and every later run) must cut the fleet the same way.  A host keeps its
    slice while others come and go, so a slice's hosts change only by the hosts added or removed."""
    return int.from_bytes(hashlib.sha256(host.encode("utf-8")).digest(), "big") % count


def slice_hosts(hosts, index, count):
    """The hosts of slice ``index`` (1-based) of ``count``, sorted."""
    return sorted(host for host in hosts if slice_of(host, count) == index - 1)


def fleet_digest(hosts):
    """Names the host list a slice was cut from, so the merge can tell slices of different lists apart."""
    return hashlib.sha256("\n".join(sorted(hosts)).encode("utf-8")).hexdigest()


def slice_section(index, count, fleet, hosts):
    return {"index": index, "count": count, "hosts": list(hosts), "fleet_hosts": len(fleet), "fleet_sha256": fleet_digest(fleet)}


def _hosts_of(report):
    return set(report["nodes"]) | set(report["unreachable"]) | set(report["failed"])


def report_error(path, report):
    """The MergeError for what is not a drift report of this schema version, else None.  A report written without
    --slice is one: only drift-merge needs the slice section (to see every slice once), `gpuharden report` does not."""
    if not isinstance(report, dict) or "version" not in report or not all(
            isinstance(report.get(key), dict) for key in ("summary", "nodes", "unreachable", "failed")):
        return MergeError("%s is not a gpuharden drift report (no version, summary, nodes, unreachable and failed)" % path)
    if report["version"] != drift_report.REPORT_VERSION:
        return MergeError("%s has report schema version %r; this gpuharden reads version %d only" % (path, report["version"], drift_report.REPORT_VERSION))
    return None


def _check_mergeable(path, report, first):
    """The MergeError for a report that cannot join ``first`` (the first input's (path, report)), else None."""
    error = report_error(path, report)
    if error:
        return error
    if first is not None and report["version"] != first[1]["version"]:
        return MergeError("%s has report schema version %r, %s version %r" % (path, report["version"], first[0], first[1]["version"]))
    part = report.get("slice")
    if not isinstance(part, dict) or not {"index", "count", "hosts", "fleet_sha256"} <= set(part):
        return MergeError("%s is not a slice report (written without --slice): drift-merge combines the reports of "
                          "gpuharden drift --slice 1/N .. N/N" % path)
    if first is None:
        return None
    other = first[1]
    if part["count"] != other["slice"]["count"]:
        return MergeError("%s is slice %d/%d, %s is of %d slices" % (path, part["index"], part["count"], first[0], other["slice"]["count"]))
    if part["fleet_sha256"] != other["slice"]["fleet_sha256"]:
        return MergeError("%s was cut from another host list than %s (%d and %d hosts): the inventory, -l or "
                          "gpuharden_target_hosts changed between the slices" % (path, first[0], part.get("fleet_hosts", -1),
                                                                                    other["slice"].get("fleet_hosts", -1)))
    if report.get("fail_severity") != other.get("fail_severity"):
        return MergeError("%s was checked with --fail-severity %s, %s with %s" % (path, report.get("fail_severity"), first[0],
                                                                                  other.get("fail_severity")))
    return None


def merge_reports(inputs):
    """One report from the slice reports ``inputs`` [(path, report)]: what one unsliced run would have written, but
    for the timings.  Refuses (MergeError) anything else: not a drift report, another schema version, a report without
    --slice, slices of different N, fail severity or host lists, a slice twice or missing, a host in two reports.

    Every slice runs the cluster-side checks (the RuntimeClass dry run, pending pods asking for a resource no node
    advertises), against the same API server, so their cluster findings are kept once per identity (the finding's
    whole content); findings that differ (the cluster changed between the slices' runs) are all kept."""
    if not inputs:
        raise MergeError("no report to merge")
    first, seen_index, owner = None, {}, {}
    for path, report in inputs:
        error = _check_mergeable(path, report, first)
        if error:
            raise error
        first = first or (path, report)
        index = report["slice"]["index"]
        if index in seen_index:
            raise MergeError("%s is slice %d/%d again (also %s)" % (path, index, report["slice"]["count"], seen_index[index]))
        seen_index[index] = path
        for host in sorted(_hosts_of(report) | set(report["slice"]["hosts"])):
            if host in owner:
                raise MergeError("%s and %s both report host %s: slices must not overlap" % (owner[host], path, host))
            owner[host] = path
    count = first[1]["slice"]["count"]
    missing = [index for index in range(1, count + 1) if index not in seen_index]
    if missing:
        raise MergeError("slice(s) %s of %d missing: the merged report would leave their hosts out (given: %s)"
                         % (", ".join(map(str, missing)), count, ", ".join(path for path, _report in inputs)))
    reports = [report for _path, report in sorted(inputs, key=lambda item: item[1]["slice"]["index"])]
    merged = {key: value for key, value in json.loads(json.dumps(reports[0])).items() if key not in ("slice", "remediation")}
    for section in ("nodes", "unreachable", "failed", "node_names"):
        merged[section] = dict(sorted((host, value) for report in reports for host, value in report.get(section, {}).items()))
    merged["cluster"] = merge_cluster([report.get("cluster") or {} for report in reports])
    merged["summary"] = drift_report.summarize(merged["nodes"], merged["unreachable"], merged["failed"], merged["cluster"], merged["fail_severity"])
    merged[coverage.NOT_CHECKED] = coverage.blind_spots(merged)
    finished = max(report["timestamp"] for report in reports)
    started = min(report["timestamp"] - report["duration_seconds"] for report in reports)
    merged.update(timestamp=finished, generated_at=datetime.datetime.fromtimestamp(finished, datetime.UTC).isoformat(),
                  duration_seconds=round(finished - started, 3))
    remediated = [report for report in reports if "remediation" in report]
    if remediated:
        merged["remediation"] = {"runs": [run for report in remediated for run in report["remediation"]["runs"]],
                                 "before": _sum_summaries([report["remediation"]["before"] for report in remediated])}
    return merged


def merge_cluster(sections):
    """The cluster sections of the slices as one: findings once per identity, checked when any slice checked."""
    findings, seen = [], set()
    for section in sections:
        for entry in section.get("findings") or []:
            identity = json.dumps(entry, sort_keys=True)
            if identity not in seen:
                seen.add(identity)
                findings.append(entry)
    errors = list(dict.fromkeys(section["consistency_error"] for section in sections if section.get("consistency_error")))
    checks = coverage.merge_cluster_checks(sections)
    # every slice used the same kubeconfig, normally: the credential that expires first is the one to renew
    expiring = sorted((section for section in sections if (section.get("credential") or {}).get("expires_at") is not None),
                      key=lambda section: section["credential"]["expires_at"])
    credential = (expiring or [section for section in sections if section.get("credential")] or [{}])[0].get("credential")
    return {"credential": credential, "credential_expires_at": kubeconfig.iso((credential or {}).get("expires_at")),
            "consistency_checked": any(section.get("consistency_checked") for section in sections),
            "consistency_error": "; ".join(errors) or None,
            # each slice's requests sent again, added up
            "api_retries": sum(section.get("api_retries") or 0 for section in sections),
            # where each slice's consistency check ran: one place, normally (every slice ran the same command)
            "ran_in": ", ".join(sorted({section["ran_in"] for section in sections if section.get("ran_in")})) or None,
            "runtime_class_checked": checks.get("runtime_class", {}).get("state") == coverage.CHECKED,
            "checks": checks, "findings": findings}


def _sum_summaries(summaries):
    """The --remediate "before" summaries of the slices added up; the cluster's findings, which every slice counts,
    once (the largest count)."""
    total = {}
    for summary in summaries:
        for key, value in summary.items():
            if key == "cluster_findings":
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, list):
                total[key] = sorted(set(total.get(key, [])) | set(value))
            elif isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, number in value.items():
                    inner[name] = inner.get(name, 0) + number
            else:
                total[key] = total.get(key, 0) + value
    return total


def read_report(path):
    """A JSON file for drift-merge, or the MergeError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise MergeError("%s: %s" % (path, error.strerror or error)) from None
    except ValueError as error:
        raise MergeError("%s is not a gpuharden drift report (not JSON: %s)" % (path, error)) from None


MERGE_DESCRIPTION = """\
Combine the JSON reports of `gpuharden drift --slice 1/N` .. `N/N` into the report one unsliced run would have
written (only the timings differ: the merged run started with the earliest slice and finished with the latest), and
write it as JSON, Prometheus textfile-collector metrics and HTML, as gpuharden drift does.

The cluster-side findings (the RuntimeClass, pods asking for a resource no node advertises), which every slice
checks against the same API server, appear once: findings with the same content are one finding.

Refused, with nothing written: a file that is not a gpuharden drift report or was written without --slice, reports
of another schema version, slices of different N, --fail-severity or host lists (the inventory or -l changed
between the slices), a slice given twice or missing, a host in two reports.
"""
MERGE_EPILOG = """\
examples:
  the slices of an Indexed Job, on a shared volume, as one report and one metrics file:
    gpuharden drift-merge /var/lib/gpuharden/slices/*.json --report /var/lib/gpuharden/drift-report.json \\
        --prometheus /var/lib/gpuharden/gpuharden.prom

exit codes:
  0    merged: every node of every slice answered and is clean, no cluster finding
  1    merged: some node drifted or needs attention, or a cluster finding (as for gpuharden drift)
  4    merged: something was not checked in some slice (a blind cluster side, a node check, a node unreachable or
       failed), as for gpuharden drift
  2    refused (the message names the file and why) or a file could not be read or written: nothing written
"""


def add_merge_parser(commands):
    parser = commands.add_parser("drift-merge", help="merge the JSON reports of gpuharden drift --slice runs into one report",
                                 description=MERGE_DESCRIPTION, epilog=MERGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", metavar="REPORT.json", help="the --report files of every slice, 1/N to N/N")
    parser.add_argument("--report", metavar="FILE.json", help="write the merged JSON report here")
    parser.add_argument("--prometheus", metavar="FILE.prom", help="write the merged Prometheus textfile-collector metrics here")
    parser.add_argument("--html", metavar="FILE.html", help="write the merged report as a self-contained HTML page here")
    parser.add_argument("--json", action="store_true", help="print the merged JSON report instead of the table")
    parser.add_argument("--wide", action="store_true", help="do not wrap the table to the terminal's width (COLUMNS)")
    parser.set_defaults(handler=merge_main)
    return parser


def merge_main(args, out=None):
    out = out or sys.stdout
    try:
        merged = merge_reports([(path, read_report(path)) for path in args.reports])
        # every output rendered before the first is written: a refusal or a rendering error leaves all as they were
        outputs = [(args.report, lambda: json.dumps(merged, indent=2, sort_keys=True) + "\n"),
                   (args.prometheus, lambda: drift_metrics.prometheus_text(merged, drift_metrics.read_previous(args.prometheus)))]
        if args.html:
            outputs.append((args.html, lambda: report_html.render(merged)))
        texts = [(path, render()) for path, render in outputs if path]
        for path, text in texts:
            drift_report.write_atomically(path, text)
    except MergeError as error:
        print("gpuharden drift-merge: %s; nothing written" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
    except OSError as error:
        print("gpuharden drift-merge: %s" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
    drift_terminal.show(merged, args, out, sys.stderr)
    return drift_report.exit_code(merged)
