# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden drift --html` and `gpuharden report --html`: the drift report as one self-contained page (pure: report
dict in, HTML string out).

The page is a grid of nodes x checks, problems first: the drifted nodes, then those needing attention, then those not
checked (unreachable, failed, or a check that could not run), each group by name; the clean nodes come last, collapsed
under a <details> with their count (CSS opens them: no script needed).  Each cell is coloured by the worst severity of
its findings (info, warning, error, critical), green when the check ran and found nothing, light grey when the check
was not asked for on the node (skipped), dark grey "not checked: <cause>" when it could not run (never counted as
clean), and purple "refused: <why>" where it found something outside what gpuharden changes safely.  Clicking a
coloured cell opens its findings (message, observed value, expected value, stage, remediable, GPU/pod/path): native
<details>.  Above the grid: the exit code and its meaning, what could not be checked (cause and fix), the counts, and
the findings by id (worst severity, nodes affected, count): at a thousand nodes, what to fix first.  Below it the run,
the cluster's findings and the --remediate runs.

A filter by status and by check and a search by node name hide rows (their `hidden` attribute); they live in the URL
fragment (#status=drift&check=kubelet&q=gpu-0), so a link opens the page filtered.  Everything from the report (node
names, messages, values) is escaped; the page's Content-Security-Policy loads nothing and runs one script, the filter's,
by its sha256: no markup from the report could run even if an escape were missed.
"""


from __future__ import annotations

import base64
import datetime
import hashlib
import html
import json

from gpuharden import coverage
from gpuharden.drift_report import EXIT_CLEAN, EXIT_DRIFT, EXIT_NOT_CHECKED, exit_code
from gpuharden.severity import SEVERITIES, counted

# state -> (background, text colour); the severities' colours grow from blue to red
COLOURS = {
    "info": ("#74c0fc", "#000000"),
    "warning": ("#fcc419", "#000000"),
    "error": ("#f76707", "#000000"),
    "critical": ("#c92a2a", "#ffffff"),
    "clean": ("#2f9e44", "#ffffff"),
    "incomplete": ("#868e96", "#ffffff"),
    "refused": ("#7048e8", "#ffffff"),
    "unchecked": ("#e9ecef", "#495057"),
}
STATE_TEXT = {"clean": "no findings", "incomplete": "not checked: the check could not run (cause and fix on click)",
              "refused": "refused: outside what gpuharden changes safely (why on click)",
              "unchecked": "skipped: not asked for in this run"}
EXIT_MEANING = {
    EXIT_CLEAN: "the run finished: every node answered and is clean, and there are no cluster findings",
    EXIT_DRIFT: "the run finished and found something: drift, attention or a cluster finding",
    EXIT_NOT_CHECKED: "the run finished, but could not check everything it was asked to (see NOT CHECKED): the answer is "
                      "partial, neither clean nor drifted where it is blind",
}
# a finding's fields in the order the page shows them, with their labels; the others follow, sorted
FIELDS = (("hint", "message"), ("found", "observed"), ("expected", "expected"), ("stage", "stage"),
          ("remediable", "remediable"), ("gpu", "GPU"), ("pod", "pod"), ("path", "path"), ("subject", "subject"))
HIDDEN = ("id", "check", "severity")

STYLE = """
:root{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:14px;color:#212529;background:#fff}
body{margin:16px 20px}
h1{font-size:1.35em;margin:0 0 .4em}
h2{font-size:1.1em;margin:1.4em 0 .4em}
.verdict{margin:.3em 0 .8em;padding:.45em .7em;border-left:4px solid #495057;background:#f8f9fa}
.counts{margin:.2em 0 .8em}
.counts span{display:inline-block;margin-right:1.2em}
table{border-collapse:collapse}
.grid th,.grid td{border:2px solid #fff;padding:0}
.grid thead th{padding:.35em .6em;text-align:left;vertical-align:bottom;background:#f1f3f5;font-weight:600}
.grid tbody th{padding:.35em .6em;text-align:left;background:#f8f9fa;font-weight:600;max-width:18em;overflow-wrap:anywhere;position:sticky;left:0;z-index:2}
.grid tbody th small{font-weight:400;color:#495057}
.grid td.status{padding:.35em .6em;background:#f8f9fa;white-space:nowrap}
.cell{position:relative;min-width:6.5em}
.cell>span,.cell summary{display:block;padding:.6em .6em;white-space:nowrap}
.cell summary{cursor:pointer;list-style:none}
.cell summary::-webkit-details-marker{display:none}
.cell details[open]>summary{outline:3px solid #212529;outline-offset:-3px}
.panel{position:absolute;top:100%;left:0;z-index:5;width:38em;max-width:90vw;padding:.5em .8em;background:#fff;color:#212529;
border:1px solid #adb5bd;box-shadow:0 4px 14px rgba(0,0,0,.3);white-space:normal;font-weight:400}
.flip .panel{left:auto;right:0}
.finding{border-left:5px solid #adb5bd;padding:.1em .6em;margin:.5em 0}
.finding h3{font-size:1em;margin:.2em 0}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:.15em .8em;margin:.3em 0}
dl.fields dt{color:#495057}
dl.fields dd{margin:0;white-space:pre-wrap;overflow-wrap:anywhere;font-family:ui-monospace,monospace}
.badge{display:inline-block;padding:0 .4em;border-radius:3px;font-size:.85em;font-weight:600}
.legend{margin:.6em 0;color:#495057}
.legend span{display:inline-block;margin-right:1em}
.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:-.05em;border:1px solid #ced4da}
.list th,.list td{border:1px solid #dee2e6;padding:.3em .5em;text-align:left;vertical-align:top}
.list td{overflow-wrap:anywhere}
dl.run{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}
dl.run dt{color:#495057}
dl.run dd{margin:0}
.filter{margin:.4em 0 .6em}
.filter label{margin-right:1em}
.grid tbody.clean{display:none}
.grid:has(#clean-nodes[open]) tbody.clean{display:table-row-group}
.clean-toggle td{padding:.45em .6em;background:#ebfbee}
.clean-toggle summary,details.more>summary{cursor:pointer}
details.more{margin:.3em 0 .6em}
"""


# The page's one script: the filter.  It reads the URL fragment (#status=drift&check=kubelet&q=gpu-0) on load and on
# every change of it, and the controls only rewrite the fragment (location.replace: no history entry per keystroke),
# so a link, a reload and a click take the same path.  It reads the rows' data attributes and sets their `hidden`
# attribute; it never builds markup from the report.  The CSP allows this exact text only (its sha256), nothing else.
SCRIPT = """
(function () {
  "use strict";
  var grid = document.querySelector("table.grid"), controls = document.getElementById("filter");
  if (!grid || !controls) { return; }
  var status = document.getElementById("f-status"), check = document.getElementById("f-check");
  var search = document.getElementById("f-q"), shown = document.getElementById("f-shown");
  var clean = document.getElementById("clean-nodes"), rows = grid.querySelectorAll("tr[data-status]");
  function read() {
    var state = {status: "", check: "", q: ""};
    location.hash.replace(/^#/, "").split("&").forEach(function (pair) {
      var at = pair.indexOf("=");
      if (at < 0) { return; }
      try {
        var key = decodeURIComponent(pair.slice(0, at)), value = decodeURIComponent(pair.slice(at + 1).replace(/[+]/g, " "));
        if (Object.prototype.hasOwnProperty.call(state, key)) { state[key] = value; }
      } catch (error) { /* a malformed escape: that part is no filter */ }
    });
    return state;
  }
  function apply() {
    var state = read(), words = state.q.toLowerCase(), count = 0;
    status.value = state.status;
    check.value = state.check;
    search.value = state.q;
    rows.forEach(function (row) {
      var visible = (state.status === "" || state.status === "all" || row.dataset.status === state.status) &&
        (state.check === "" || (" " + row.dataset.checks + " ").indexOf(" " + state.check + " ") >= 0) &&
        (words === "" || row.dataset.name.toLowerCase().indexOf(words) >= 0);
      row.hidden = !visible;
      count += visible ? 1 : 0;
    });
    if (clean && (state.status === "clean" || state.status === "all" || words !== "")) { clean.open = true; }
    shown.textContent = count + " of " + rows.length + " node(s) match";
  }
  function write() {
    var parts = [];
    [["status", status.value], ["check", check.value], ["q", search.value]].forEach(function (pair) {
      if (pair[1]) { parts.push(pair[0] + "=" + encodeURIComponent(pair[1])); }
    });
    location.replace("#" + parts.join("&"));
  }
  status.addEventListener("change", write);
  check.addEventListener("change", write);
  search.addEventListener("input", write);
  window.addEventListener("hashchange", apply);
  controls.hidden = false;
  apply();
}());
"""
# default-src 'none': nothing is loaded; inline style; the script above and no other (a hash, not 'unsafe-inline');
# no <base> and no form submission, even if an escape were missed
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src '%s'; base-uri 'none'; form-action 'none'" % (
    "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii"))


def _e(value):
    """Any value as escaped text: strings as they are, everything else as JSON."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return html.escape(text, quote=True)


def _rank(severity):
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


def _state(severity):
    """The cell state of a severity; one outside the scale is not guessed: the cell says it has no usable answer."""
    return severity if severity in SEVERITIES else "incomplete"


def _class(state):
    return "sev-%s" % state if state in COLOURS else "sev-incomplete"


def _badge(severity):
    return '<span class="badge %s">%s</span>' % (_class(_state(severity)), _e(severity))


def _when(timestamp):
    if not isinstance(timestamp, int | float):
        return "-"
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")


def _worst_first(findings):
    return sorted(findings, key=lambda entry: -_rank(entry.get("severity")))


def checks_of(report):
    """The grid's columns: every check a node reported or a finding names, sorted (the JSON report sorts its keys, so
    a page rendered from it is the same), then the controller's consistency check when it ran."""
    names = set()
    for node in report["nodes"].values():
        names.update(node.get("checks") or {})
        names.update(entry.get("check") or "-" for entry in node["findings"])
    cluster = report.get("cluster") or {}
    last = ["consistency"] if "consistency" in names or cluster.get("consistency_checked") or cluster.get("consistency_error") else []
    return sorted(names - set(last)) + last


def _not_checked_text(parts):
    return "; ".join("not checked: %s: %s. Fix: %s" % (part.get("what"), part.get("cause"), part.get("fix")) for part in parts)


def cell_state(node, check, cluster):
    """(state, findings worst first, why) of one audited node's check.  A check (or a part of it) that could not run
    is "not checked: <cause>", even beside findings of the part that ran: never shown as clean."""
    findings = _worst_first(entry for entry in node["findings"] if (entry.get("check") or "-") == check)
    result = (node.get("checks") or {}).get(check) or {}
    status = result.get("status")
    blind = [part for part in node.get(coverage.NOT_CHECKED) or [] if part.get("check") == check]
    refused = [part for part in node.get(coverage.REFUSED) or [] if part.get("check") == check]
    if check == "consistency" and not result:
        entry = (cluster.get("checks") or {}).get("consistency") or {}
        if entry.get("state") == coverage.NOT_CHECKED:
            blind = [{"what": "consistency (cluster side)", "cause": entry.get("cause"), "fix": entry.get("fix")}]
        status = "ok" if entry.get("state") == coverage.CHECKED or cluster.get("consistency_checked") else None
    if blind:
        return "incomplete", findings, _not_checked_text(blind)
    if findings:
        return _state(findings[0].get("severity")), findings, None
    if refused:
        return "refused", [], "; ".join("refused: %s: %s. Fix: %s" % (part.get("what"), part.get("why"), part.get("fix")) for part in refused)
    if status in ("ok", "findings"):
        return "clean", [], None
    if status == "drift":  # a stage would change something, yet no finding says what: never shown as clean
        return "incomplete", [], "not checked: the check reports drift without a finding"
    return "unchecked", [], "skipped: not asked for in this run" if status == "skipped" else None


def _fields(entry):
    labels = dict(FIELDS)
    keys = [key for key in labels if key in entry] + sorted(key for key in entry if key not in labels and key not in HIDDEN)
    out = []
    for key in keys:
        if key == "remediable":
            text = ("yes: harden_gpu_nodes.yml's %s stage fixes it" % entry.get("stage") if entry[key]
                    else "no: no playbook fixes it (hardware, workloads or a setting to choose)")
            out.append("<dt>remediable</dt><dd>%s</dd>" % _e(text))
        elif entry[key] is not None:
            out.append("<dt>%s</dt><dd>%s</dd>" % (_e(labels.get(key, key)), _e(entry[key])))
    return '<dl class="fields">%s</dl>' % "".join(out)


def _finding(entry):
    colour = COLOURS[_state(entry.get("severity"))][0]
    return '<div class="finding" style="border-left-color:%s"><h3>%s %s</h3>%s</div>' % (
        colour, _badge(entry.get("severity")), _e(entry.get("id")), _fields(entry))


def _label(state, findings, why):
    if state == "incomplete":
        return "not checked" + (" (%d finding(s) of what ran)" % len(findings) if findings else "")
    if findings:
        return "%s%s" % (_e(state), " (%d)" % len(findings) if len(findings) > 1 else "")
    return {"clean": "clean", "refused": "refused"}.get(state, "skipped" if (why or "").startswith("skipped") else "not checked")


def _cell(host, check, state, findings, why, flip):
    title = "%s / %s: %s" % (host, check, "%d finding(s), worst %s" % (len(findings), findings[0].get("severity"))
                             if findings else (why or STATE_TEXT[state]))
    attrs = 'class="cell %s%s" title="%s"' % (_class(state), " flip" if flip else "", _e(title))
    if not findings and not why:
        return "<td %s><span>%s</span></td>" % (attrs, _label(state, findings, why))
    body = ("<p>%s</p>" % _e(why) if why else "") + "".join(_finding(entry) for entry in findings)
    return '<td %s><details><summary>%s</summary><div class="panel"><strong>%s</strong> / %s%s</div></details></td>' % (
        attrs, _label(state, findings, why), _e(host), _e(check), body)


# What could not be checked, listed above the grid: the first ones in view, the others one click away.
NOT_CHECKED_SHOWN = 10
# A row's filter group: the node's status, one "not checked" for every node without a usable answer (unreachable,
# failed, a status this gpuharden does not know: never clean), in the order the grid shows them: problems first.
GROUPS = ("drift", "attention", "not_checked", "clean")
GROUP_TEXT = {"drift": "drifted", "attention": "attention", "not_checked": "not checked", "clean": "clean"}
# cell states that are no problem of the check: a filter by check leaves such rows out
QUIET_STATES = ("clean", "unchecked")


def _group(node):
    status = (node or {}).get("status")
    return status if status in GROUPS else "not_checked"


def _row(host, node, report, checks, cluster, names):
    """(group, <tr>) of one host: its cells, and the data the page's filter reads (group, checks with a problem, names)."""
    name = (node or {}).get("node") or names.get(host, host)
    failing = [pod for pod in ((report.get("explanations") or {}).get("pods") or []) if (pod.get("target") or {}).get("node") == name]
    pods_link = ' <small><a href="#%s">%d failing GPU pod%s</a></small>' % (
        _pod_anchor(failing[0]), len(failing), "" if len(failing) == 1 else "s") if failing else ""
    header = "<th>%s%s%s</th>" % (_e(host), " <small>(%s)</small>" % _e(name) if name != host else "", pods_link)
    if node is None:
        status = "unreachable" if host in (report.get("unreachable") or {}) else "failed"
        message = (report.get("unreachable") or {}).get(host) or (report.get("failed") or {}).get(host)
        fix = coverage.UNREACHABLE_FIX if status == "unreachable" else coverage.FAILED_FIX
        data = '<tr data-status="not_checked" data-checks="%s" data-name="%s">' % (_e(" ".join(checks)), _e("%s %s" % (host, name)))
        return "not_checked", ('%s%s<td class="status">%s</td><td class="cell sev-incomplete" colspan="%d" title="%s"><details><summary>'
                               'not checked: %s</summary><div class="panel"><strong>%s</strong>: %s Fix: %s</div></details></td></tr>' % (
                                   data, header, status, max(len(checks), 1), _e("%s: %s" % (host, message)), status, _e(host),
                                   _e(message), _e(fix)))
    stages = ", ".join(node.get("remediable_stages") or [])
    status = '<td class="status" title="%s">%s</td>' % (_e("stages to run: %s" % (stages or "none")),
                                                        _e((node.get("status") or "").replace("_", " ")))
    states = [cell_state(node, check, cluster) for check in checks]
    cells = [_cell(host, check, *state, flip=2 * index >= len(checks)) for index, (check, state) in enumerate(zip(checks, states, strict=True))]
    loud = [check for check, state in zip(checks, states, strict=True) if state[0] not in QUIET_STATES]
    group = _group(node)
    return group, '<tr data-status="%s" data-checks="%s" data-name="%s">%s%s%s</tr>' % (
        group, _e(" ".join(loud)), _e("%s %s" % (host, name)), header, status, "".join(cells))


def grid(report):
    """The nodes x checks table: drifted nodes first, then attention, then not checked, each sorted by name; the clean
    nodes after them, collapsed under a <details> with their count (CSS opens them, script or not)."""
    checks = checks_of(report)
    cluster = report.get("cluster") or {}
    names = report.get("node_names") or {}
    # a check's name may break after its underscores (escaping never makes an underscore)
    head = "<tr><th>node</th><th>status</th>%s</tr>" % "".join("<th>%s</th>" % _e(check).replace("_", "_<wbr>") for check in checks)
    hosts = sorted(set(report["nodes"]) | set(report.get("unreachable") or {}) | set(report.get("failed") or {}))
    rows = sorted((_row(host, report["nodes"].get(host), report, checks, cluster, names) for host in hosts),
                  key=lambda row: GROUPS.index(row[0]))  # stable: by name within a group
    problems = [text for group, text in rows if group != "clean"]
    clean = [text for group, text in rows if group == "clean"]
    span = len(checks) + 2
    body = "<tbody>%s</tbody>" % "".join(problems) if problems else ""
    if clean:
        body += ('<tbody class="clean-toggle"><tr><td colspan="%d"><details id="clean-nodes"><summary>%d clean node(s): nothing at or '
                 'above the fail severity, every check asked for ran (click to show)</summary></details></td></tr></tbody><tbody class="clean">%s</tbody>'
                 % (span, len(clean), "".join(clean)))
    if not hosts:
        body = '<tbody><tr><td colspan="%d">no hosts in this run</td></tr></tbody>' % span
    legend = "".join('<span><i class="%s"></i>%s</span>' % (_class(state), _e(state if state in SEVERITIES else STATE_TEXT[state]))
                     for state in [*reversed(SEVERITIES), "clean", "incomplete", "refused", "unchecked"])
    return ('%s<table class="grid"><thead>%s</thead>%s</table>\n<p class="legend">%s</p><p>Click a cell for its findings.</p>'
            % (filter_controls(checks), head, body, legend))


def filter_controls(checks):
    """The filter by status and check and the search by node name; hidden until the page's script shows them (they do
    nothing without it).  They write the URL fragment (#status=drift&check=kubelet&q=gpu-0), which the script applies."""
    statuses = "".join('<option value="%s">%s</option>' % (group, GROUP_TEXT[group]) for group in GROUPS)
    options = "".join('<option value="%s">%s</option>' % (_e(check), _e(check)) for check in checks)
    return ('<div class="filter" id="filter" hidden><label>status <select id="f-status"><option value="">problems (clean collapsed)</option>'
            '%s<option value="all">all (clean expanded)</option></select></label> <label>check with a problem <select id="f-check">'
            '<option value="">any</option>%s</select></label> <label>node <input type="search" id="f-q" placeholder="name contains">'
            '</label> <span id="f-shown"></span></div>\n' % (statuses, options))


def finding_summary(report):
    """Every finding id of the nodes, worst severity first, with its check(s), the nodes it affects and its count: at a
    thousand nodes, what to fix first.  The cluster's findings are under Cluster."""
    by_id = {}
    for host, node in (report.get("nodes") or {}).items():
        for entry in node.get("findings") or []:
            ident = by_id.setdefault(entry.get("id"), {"checks": set(), "nodes": set(), "findings": 0, "severity": None, "remediable": False})
            ident["checks"].add(entry.get("check") or "-")
            ident["nodes"].add(host)
            ident["findings"] += 1
            ident["remediable"] = ident["remediable"] or bool(entry.get("remediable"))
            if ident["severity"] is None or _rank(entry.get("severity")) > _rank(ident["severity"]):
                ident["severity"] = entry.get("severity")
    if not by_id:
        return "<p>No node findings.</p>"
    order = sorted(by_id.items(), key=lambda item: (-_rank(item[1]["severity"]), -len(item[1]["nodes"]), str(item[0])))
    rows = "".join("<tr><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%s</td></tr>" % (
        _e(ident), _e(", ".join(sorted(entry["checks"]))), _badge(entry["severity"]), len(entry["nodes"]), entry["findings"],
        "yes" if entry["remediable"] else "no") for ident, entry in order)
    return ('<table class="list byid"><thead><tr><th>finding</th><th>check</th><th>worst severity</th><th>nodes</th><th>findings</th>'
            "<th>remediable</th></tr></thead><tbody>%s</tbody></table>" % rows)


def run_summary(report):
    """The verdict (the exit code and what it means) and the counts, above the grid."""
    summary = report.get("summary") or {}
    code = exit_code(report)
    counts = [("nodes", summary.get("nodes")), ("clean", summary.get("clean")), ("drifted", summary.get("drifted")),
              ("attention", summary.get("attention")), ("not checked", summary.get("not_checked")),
              ("unreachable", summary.get("unreachable")), ("failed", summary.get("failed")),
              ("findings", summary.get("findings")), ("cluster findings", summary.get("cluster_findings"))]
    return ('<p class="verdict"><strong>exit %d</strong>: %s. A run that did not complete (exit 3, 130, 143) writes no page: '
            'this one is the last complete run.</p>\n%s<p class="counts">%s</p>' % (
                code, _e(EXIT_MEANING.get(code, "")), not_checked_list(report),
                "".join("<span><strong>%s</strong> %s</span>" % (_e(count), _e(name)) for name, count in counts)))


def not_checked_list(report):
    """What the run could not check, each with its cause and fix, before anything else: never read as clean.  The
    first NOT_CHECKED_SHOWN are always in view; past them (a fleet with many unreachable nodes), the rest sit in a
    <details> that says how many they are, so the grid is not pushed a screen away."""
    spots = coverage.blind_spots(report)
    if not spots:
        return ""
    rows = ["<tr><td>%s</td><td>%s</td><td>not checked: %s</td><td>%s</td></tr>" % (
        _e("cluster" if spot["scope"] == "cluster" else spot["node"]), _e(spot["what"]), _e(spot["cause"]), _e(spot["fix"]))
        for spot in spots]
    head = "<thead><tr><th>where</th><th>check</th><th>cause</th><th>fix</th></tr></thead>"
    more = rows[NOT_CHECKED_SHOWN:]
    rest = ('<details class="more"><summary>%d more not checked, each with its cause and fix (click to show; the grid '
            'marks them too)</summary><table class="list notchecked">%s<tbody>%s</tbody></table></details>\n'
            % (len(more), head, "".join(more))) if more else ""
    return '<table class="list notchecked">%s<tbody>%s</tbody></table>\n%s' % (head, "".join(rows[:NOT_CHECKED_SHOWN]), rest)


def run_facts(report):
    """Inventory, limit, when, fail severity and the findings by severity and check, below the grid."""
    summary = report.get("summary") or {}
    timestamp, duration = report.get("timestamp"), report.get("duration_seconds")
    started = timestamp - duration if isinstance(timestamp, int | float) and isinstance(duration, int | float) else None
    by_severity = summary.get("by_severity") or {}
    severities = [s for s in reversed(SEVERITIES) if s in by_severity] + sorted(s for s in by_severity if s not in SEVERITIES)
    facts = [
        ("inventory", _e(report.get("inventory"))),
        ("limit", _e(report.get("limit") or "none (the playbook's hosts)")),
        ("started", _e(_when(started))),
        ("finished", _e(_when(timestamp))),
        ("duration", _e("%.1f s" % duration if isinstance(duration, int | float) else None)),
        ("fail severity", _e("%s: findings at or above it make a node drifted or in need of attention" % report.get("fail_severity"))),
        ("findings by severity", ", ".join("%s %s" % (_badge(s), _e(by_severity[s])) for s in severities) or "none"),
        ("findings by check", _e(", ".join("%s %s" % (check, count) for check, count in sorted((summary.get("by_check") or {}).items()))
                                 or "none")),
    ]
    return '<dl class="run">%s</dl>' % "".join("<dt>%s</dt><dd>%s</dd>" % (_e(name), value) for name, value in facts)


def cluster_section(report):
    cluster = report.get("cluster") or {}
    checks = cluster.get("checks") or {}

    def state(check, checked):
        entry = checks.get(check) or {}
        if entry.get("state") == coverage.NOT_CHECKED:
            return "not checked: %s" % entry.get("cause")
        return "checked" if entry.get("state") == coverage.CHECKED or checked else "not asked for"

    notes = "GPU consistency (device plugin, pods, processes): %s; RuntimeClass: %s." % (
        state("consistency", cluster.get("consistency_checked")), state("runtime_class", cluster.get("runtime_class_checked")))
    if "gpu_pods" in checks:
        notes += " The GPU pods' LIST (for the nodes' memory check): %s." % state("gpu_pods", False)
    findings = _worst_first(cluster.get("findings") or [])
    if not findings:
        return "<p>%s No cluster findings.</p>" % _e(notes)
    rows = "".join("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
        _badge(entry.get("severity")), _e(entry.get("check")), _e(entry.get("subject")), _finding(entry)) for entry in findings)
    failing = len(counted(findings, report.get("fail_severity") or SEVERITIES[0]))
    return ('<p>%s %d finding(s), %d at or above the fail severity.</p><table class="list"><thead><tr><th>severity</th><th>check</th>'
            "<th>subject</th><th>finding</th></tr></thead><tbody>%s</tbody></table>" % (_e(notes), len(findings), failing, rows))


def _pod_anchor(document):
    """The id of a pod's explanation in the page: letters, digits and dashes only (a Kubernetes name and namespace are
    DNS labels already; anything else is replaced, so that the id never needs escaping)."""
    name = (document.get("target") or {}).get("name") or ""
    return "pod-" + "".join(char if char.isalnum() or char == "-" else "-" for char in name.replace("/", "--"))


EXPLANATION_STATES = {"cause": "error", "undecided": "incomplete", "healthy": "clean"}


def explanations_section(report):
    """The failing GPU pods, each with its explanation (gpuharden explain --failing over this run's node audits): the
    verdict, then the evidence and the fix under a <details>; each pod has an id the grid's node rows link to."""
    document = report.get("explanations")
    if not document:
        return ""
    lines = ['<h2 id="failing-pods">Failing GPU pods</h2>']
    for entry in document.get("not_checked") or []:
        lines.append('<p class="verdict">not checked: %s: %s. Fix: %s</p>' % (_e(entry.get("what")), _e(entry.get("cause")), _e(entry.get("fix"))))
    pods = document.get("pods") or []
    if not pods and not document.get("not_checked"):
        return "\n".join(lines + ["<p>No failing GPU pod on the run's nodes, and none the node audits flag.</p>"])
    rows = []
    for pod in pods:
        verdict = pod.get("verdict") or {}
        evidence = "".join("<dt>%s</dt><dd>%s <small>[%s]</small></dd>" % (
            _e(item.get("what")), _e(item.get("value") if isinstance(item.get("value"), str) else json.dumps(item.get("value"), sort_keys=True)),
            _e(item.get("where"))) for item in pod.get("evidence") or [])
        missing = "".join("<dt>not checked</dt><dd>%s: %s. Fix: %s</dd>" % (_e(item.get("what")), _e(item.get("cause")), _e(item.get("fix")))
                          for item in pod.get("not_checked") or [])
        fix = "".join("<dd>%s</dd>" % _e(line) for line in pod.get("fix") or [])
        state = EXPLANATION_STATES.get(pod.get("state"), "incomplete")
        rows.append('<tr id="%s"><td><span class="badge sev-%s">%s</span></td><td>%s<br><small>%s</small></td><td>%s'
                    '<details class="more"><summary>evidence and fix</summary><dl class="fields">%s%s%s</dl></details></td></tr>' % (
                        _pod_anchor(pod), state, _e(pod.get("state")), _e((pod.get("target") or {}).get("name")),
                        _e((pod.get("target") or {}).get("node") or "not bound"), _e(verdict.get("summary")), evidence, missing,
                        ("<dt>fix</dt>" + fix) if fix else ""))
    lines.append('<table class="list"><thead><tr><th>state</th><th>pod (node)</th><th>cause</th></tr></thead><tbody>%s</tbody></table>'
                 % "".join(rows))
    return "\n".join(lines)


def remediation_section(report):
    remediation = report.get("remediation")
    if not remediation:
        return ""
    rows = "".join("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
        _e(", ".join(run.get("hosts") or [])), _e(", ".join(run.get("stages") or [])), _e(run.get("status")), _e(run.get("rc")),
        _e(", ".join(run.get("failures") or []) or "none")) for run in remediation.get("runs") or [])
    before = remediation.get("before") or {}
    return ('<h2>--remediate</h2><p>Before: %s drifted, %s need attention. The drifted hosts were hardened (only the stages with '
            'findings), then checked again: the grid shows them after.</p><table class="list"><thead><tr><th>hosts</th><th>stages</th>'
            "<th>status</th><th>rc</th><th>failed hosts</th></tr></thead><tbody>%s</tbody></table>" % (
                _e(before.get("drifted")), _e(before.get("attention")), rows or '<tr><td colspan="5">no runs</td></tr>'))


def render(report):
    """The report as one HTML page, nothing loaded from anywhere."""
    colours = "".join(".sev-%s{background:%s;color:%s}\n" % (state, back, fore) for state, (back, fore) in COLOURS.items())
    title = "gpuharden drift: %s, %s" % (report.get("inventory"), _when(report.get("timestamp")))
    return """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="%s">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%s</title>
<style>%s%s</style>
</head>
<body>
<h1>gpuharden drift</h1>
%s
<h2>Findings by id</h2>
%s
<h2>Nodes x checks</h2>
%s
<h2>Run</h2>
%s
<h2>Cluster</h2>
%s
%s
%s
<script>%s</script>
</body>
</html>
""" % (_e(CSP), _e(title), STYLE, colours, run_summary(report), finding_summary(report), grid(report), run_facts(report),
       cluster_section(report), explanations_section(report), remediation_section(report), SCRIPT)
