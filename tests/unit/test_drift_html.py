# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift --html (issue 16, item 7a): the fleet page, rendered and then looked at in a real browser.

The renderer is tested as a pure function (cells coloured by the worst severity, every node and check present,
everything escaped); then headless Chromium (Debian's `chromium`, installed by `make setup`) takes a screenshot that
is decoded here (zlib and the PNG row filters, no imaging library) to count the pixels of each state's colour, and
dumps the DOM after a script clicks a cell, to see its findings open and no markup from the report run."""

from __future__ import annotations

import base64
import collections
import hashlib
import html
import html.parser
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
import zlib

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding as model_finding

from gpuharden import cli, drift_report, drift_run, report_html

CHECKS = ("cgroup_memory", "containerd", "device_cgroups", "device_nodes", "kubelet", "mig", "nvml")  # as the grid sorts them
HOSTILE_NODE = '<img src=x onerror="document.documentElement.dataset.pwned=1">'
HOSTILE_HINT = "<script>document.documentElement.dataset.pwned='script'</script>"
BROWSER_TIMEOUT = 60


def _finding(ident, check, severity, stage="device_permissions", remediable=True, **extra):
    return dict({"id": ident, "check": check, "stage": stage, "severity": severity, "expected": "want-%s" % ident,
                 "found": "got-%s" % ident, "hint": "hint of %s" % ident, "remediable": remediable}, **extra)


def _event(kind, host, action="gpuharden.k8s.node_audit", **res):
    return {"event": kind, "event_data": {"host": host, "task_action": action, "task": "Audit the node", "res": res}}


def _audited(host, findings, **status):
    checks = {name: {"status": status.get(name, "ok")} for name in CHECKS}
    for name, value in status.items():
        if value == "not_checked":
            checks[name]["not_checked"] = [{"what": name, "cause": "%s: the check could not run" % name, "fix": "fix %s" % name}]
    return _event("runner_on_ok", host, findings=findings, summary={"findings": len(findings)}, checks=checks, seconds=0.1)


def _report(critical=True):
    """Five audited nodes with every severity, a skipped and a failed check, one unreachable and one failed host, a
    hostile node name and message, and a cluster finding.  ``critical=False``: the same without the critical finding."""
    outcomes = drift_report.Outcomes()
    outcomes.feed(_audited("gpu-a", [], mig="skipped"))
    outcomes.feed(_audited("gpu-b", [
        _finding("device_node_permissions", "device_nodes", "critical" if critical else "error", path="/dev/nvidia0"),
        _finding("device_char_link", "device_nodes", "warning", path="/dev/char/195:0"),
        _finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology", subject="topologyManagerPolicy"),
    ], device_nodes="drift", kubelet="drift"))
    # cgroup_memory says drift without a finding to show: not clean, not a severity either
    outcomes.feed(_audited("gpu-e", [_finding("containerd_nvidia_runtime", "containerd", "warning", stage="container_runtime")],
                           containerd="drift", cgroup_memory="drift"))
    outcomes.feed(_audited("gpu-f", [
        _finding("pcie_link_degraded", "device_nodes", "info", stage="postcheck", remediable=False, gpu={"index": 1, "uuid": "GPU-1"})],
        containerd="not_checked"))
    outcomes.feed(_audited(HOSTILE_NODE, [_finding("gpu_access", "device_cgroups", "info", stage="postcheck", remediable=False,
                                                   hint=HOSTILE_HINT, pod="default/" + HOSTILE_HINT)]))
    outcomes.feed(_event("runner_on_unreachable", "gpu-c", msg="ssh: connect to host gpu-c port 22: No route to host"))
    outcomes.feed(_event("runner_on_failed", "gpu-d", action="gpuharden.k8s.node_lock", msg="node_lock: the node is locked by harden@x"))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.gpu_consistency", findings=[
        model_finding("gpu_process_unattributed", "warning", "a pod's process", "pid 4242", "a process outside Kubernetes uses the GPU",
                      node="node-b", gpu={"index": 0}, pod=None),
        model_finding("requested_resource_not_advertised", "error", 1, 0, "pods wait for a resource no node advertises",
                      node=None, resource="nvidia.com/gpu")]))
    return drift_report.build_report(outcomes, inventory="inventories/prod.yml", limit="gpu_nodes", fail_severity="warning",
                              started=1_790_000_000.0, finished=1_790_000_042.5,
                              node_names={"gpu-b": "node-b"})


class _Grid(html.parser.HTMLParser):
    """The grid's rows: {row header text: [(class, colspan, text), ...]}, its column headers, and every tag seen."""

    def __init__(self):
        super().__init__()
        self.rows, self.columns, self.tags, self.attributes = {}, [], collections.Counter(), []
        self._in_grid, self._row, self._cell, self._text, self._depth = False, None, None, [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] += 1
        self.attributes.append((tag, attrs))
        if tag == "table" and attrs.get("class") == "grid":
            self._in_grid = True
        if not self._in_grid:
            return
        if tag == "tr":
            self._row = []
        elif tag in ("th", "td") and self._row is not None and self._cell is None:
            self._cell, self._text = (tag, attrs.get("class", ""), int(attrs.get("colspan", 1))), []

    def handle_endtag(self, tag):
        if tag == "table" and self._in_grid:
            self._in_grid = False
        if not self._in_grid or self._cell is None or tag != self._cell[0]:
            if tag == "tr" and self._row is not None and self._in_grid:
                kind, *cells = self._row
                if kind[0] == "th" and kind[1] == "" and self.columns:
                    self.rows[kind[3]] = [(cls, span, text) for _tag, cls, span, text in cells]
                elif not self.columns:
                    self.columns = [text for _tag, _cls, _span, text in self._row[2:]]
                self._row = None
            return
        self._row.append((*self._cell, "".join(self._text).strip()))
        self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._text.append(data)


def _parse(page):
    grid = _Grid()
    grid.feed(page)
    return grid


# ---------------------------------------------------------------------------------------------
# The renderer


def test_every_node_and_check_is_in_the_grid_coloured_by_the_worst_severity():
    report = _report()
    grid = _parse(report_html.render(report))
    assert grid.columns == [*CHECKS, "consistency"]
    hosts = ["gpu-a", "gpu-b (node-b)", "gpu-c", "gpu-d", "gpu-e", "gpu-f", HOSTILE_NODE]
    assert sorted(grid.rows) == sorted(hosts)
    cells = {host: [cls.split()[1] for cls, _span, _text in row[1:]] for host, row in grid.rows.items()}
    status = {host: row[0][2] for host, row in grid.rows.items()}
    # gpu-f's only finding is info (below the fail severity) and its containerd check could not run: not checked, not clean
    assert status == {"gpu-a": "clean", "gpu-b (node-b)": "drift", "gpu-c": "unreachable", "gpu-d": "failed", "gpu-e": "drift",
                      "gpu-f": "not checked", HOSTILE_NODE: "clean"}
    def row(**states):
        return [states.get(check, "sev-clean") for check in grid.columns]

    assert cells["gpu-a"] == row(mig="sev-unchecked")  # skipped
    # device_nodes: critical + warning -> critical; kubelet: error; consistency (from the controller): warning
    assert cells["gpu-b (node-b)"] == row(device_nodes="sev-critical", kubelet="sev-error", consistency="sev-warning")
    assert cells["gpu-e"] == row(containerd="sev-warning", cgroup_memory="sev-incomplete")
    assert cells["gpu-f"] == row(device_nodes="sev-info", containerd="sev-incomplete")  # could not run: not checked, no finding
    assert "not checked: containerd: containerd: the check could not run. Fix: fix containerd" in grid.rows["gpu-f"][1 + grid.columns.index("containerd")][2]
    assert cells[HOSTILE_NODE] == row(device_cgroups="sev-info")
    for host in ("gpu-c", "gpu-d"):  # one cell across every check: nothing was checked on the node
        assert [(cls.split()[1], span) for cls, span, _text in grid.rows[host][1:]] == [("sev-incomplete", len(CHECKS) + 1)]
    assert grid.rows["gpu-b (node-b)"][1 + grid.columns.index("device_nodes")][2].startswith("critical (2)")
    assert "No route to host" in grid.rows["gpu-c"][1][2] and "locked by harden@x" in grid.rows["gpu-d"][1][2]


def test_a_cell_holds_its_findings_worst_first_with_every_field():
    page = report_html.render(_report())
    cell = page[page.index('title="gpu-b / device_nodes'):]
    cell = cell[:cell.index("</td>")]
    assert cell.index("device_node_permissions") < cell.index("device_char_link")
    for text in ("<dt>message</dt><dd>hint of device_node_permissions</dd>", "<dt>observed</dt><dd>got-device_node_permissions</dd>",
                 "<dt>expected</dt><dd>want-device_node_permissions</dd>", "<dt>stage</dt><dd>device_permissions</dd>",
                 "<dt>remediable</dt><dd>yes: harden_gpu_nodes.yml&#x27;s device_permissions stage fixes it</dd>",
                 "<dt>path</dt><dd>/dev/nvidia0</dd>"):
        assert text in cell
    gpu = page[page.index('title="gpu-f / device_nodes'):]
    assert "<dt>GPU</dt><dd>{&quot;index&quot;: 1, &quot;uuid&quot;: &quot;GPU-1&quot;}</dd>" in gpu[:gpu.index("</td>")]
    assert "<dt>remediable</dt><dd>no: no playbook fixes it" in gpu[:gpu.index("</td>")]


def test_everything_from_the_report_is_escaped_and_nothing_can_run_or_load():
    page = report_html.render(_report())
    grid = _parse(page)
    # one script, the page's own filter, at the end; the report's <script> and <img> are text
    assert page.count("<script") == 1 and "<script>%s</script>\n</body>" % report_html.SCRIPT in page and "<img" not in page
    assert "&lt;script&gt;document.documentElement.dataset.pwned=&#x27;script&#x27;&lt;/script&gt;" in page
    assert HOSTILE_NODE in grid.rows  # the name shows as text
    assert set(grid.tags) <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "strong", "span", "dl", "dt",
                              "dd", "table", "thead", "tbody", "tr", "th", "td", "small", "details", "summary", "div", "i", "wbr",
                              "script", "label", "select", "option", "input"}
    assert grid.tags["script"] == 1
    assert not [attrs for _tag, attrs in grid.attributes if {"src", "href", "onerror", "onclick", "action"} & set(attrs)]
    assert not [attrs for _tag, attrs in grid.attributes if [name for name in attrs if name.startswith("on")]]
    csp = [attrs["content"] for tag, attrs in grid.attributes if tag == "meta" and attrs.get("http-equiv") == "Content-Security-Policy"]
    # the script runs by its hash: the sha256 of the exact text between <script> and </script>
    digest = base64.b64encode(hashlib.sha256(report_html.SCRIPT.encode()).digest()).decode()
    assert csp == ["default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-%s'; base-uri 'none'; form-action 'none'" % digest]
    assert "unsafe-inline" not in csp[0].split("script-src")[1] and "unsafe-eval" not in csp[0]
    assert "url(" not in page and "@import" not in page


def _rows(page):
    """The grid's rows in page order: (data-status, data-checks, data-name, hidden) of every node."""
    return [(status, checks, html.unescape(name), "hidden" in rest) for status, checks, name, rest in re.findall(
        r'<tr data-status="([^"]*)" data-checks="([^"]*)" data-name="([^"]*)"([^>]*)>', page)]


def test_problems_first_then_clean_nodes_collapsed_with_their_count():
    page = report_html.render(_report())
    rows = _rows(page)
    # drifted, then not checked (the node with a blind check, the unreachable and the failed one), each by name; clean last
    assert [(status, name.split()[0]) for status, _checks, name, _hidden in rows] == [
        ("drift", "gpu-b"), ("drift", "gpu-e"), ("not_checked", "gpu-c"), ("not_checked", "gpu-d"), ("not_checked", "gpu-f"),
        ("clean", "<img"), ("clean", "gpu-a")]
    # a filter by check keeps a node where that check has a finding or could not run; unreachable and failed: every check
    checks = {name.split()[0]: value.split() for _status, value, name, _hidden in rows}
    assert checks["gpu-b"] == ["device_nodes", "kubelet", "consistency"] and checks["gpu-e"] == ["cgroup_memory", "containerd"]
    assert checks["gpu-f"] == ["containerd", "device_nodes"] and checks["gpu-c"] == [*CHECKS, "consistency"]
    assert checks["gpu-a"] == [] and checks["<img"] == ["device_cgroups"]
    assert "gpu-b node-b" in [name for _status, _checks, name, _hidden in rows]  # the search sees the node name too
    clean = page[page.index('<tbody class="clean-toggle">'):]
    assert '<details id="clean-nodes"><summary>2 clean node(s): nothing at or above the fail severity' in clean
    assert clean.index("</details>") < clean.index('<tbody class="clean"><tr data-status="clean"')
    assert ".grid tbody.clean{display:none}" in page and ".grid:has(#clean-nodes[open]) tbody.clean{display:table-row-group}" in page
    assert not [row for row in rows if row[3]]  # nothing hidden until the script applies a filter
    # the filter: its controls hidden until the script runs, one option per status group and per check
    controls = page[page.index('<div class="filter" id="filter" hidden>'):]
    controls = controls[:controls.index("</div>")]
    assert re.findall(r'<option value="([^"]*)"', controls) == ["", "drift", "attention", "not_checked", "clean", "all", "",
                                                                 *CHECKS, "consistency"]
    assert '<input type="search" id="f-q"' in controls
    # a fleet of clean nodes only: no problem rows, the clean ones collapsed
    only_clean = drift_report.Outcomes()
    only_clean.feed(_audited("gpu-z", []))
    page = report_html.render(drift_report.build_report(only_clean, inventory="i", limit=None, fail_severity="warning", started=1.0, finished=2.0))
    assert "<summary>1 clean node(s)" in page and [row[0] for row in _rows(page)] == ["clean"]


def test_past_ten_the_not_checked_list_keeps_the_rest_one_click_away():
    report = _fleet(300)
    spots = report["not_checked"]
    assert len(spots) > report_html.NOT_CHECKED_SHOWN + 5
    page = report_html.render(report)
    top = page[page.index('<table class="list notchecked">'):page.index("<h2>Findings by id</h2>")]
    shown, rest = top.split('<details class="more">')
    assert shown.count("<tr><td>") == report_html.NOT_CHECKED_SHOWN
    assert rest.startswith("<summary>%d more not checked, each with its cause and fix" % (len(spots) - report_html.NOT_CHECKED_SHOWN))
    assert rest.count("<tr><td>") == len(spots) - report_html.NOT_CHECKED_SHOWN
    # every blind spot is there, in coverage's order, each with its cause and fix
    assert re.findall(r"<tr><td>([^<]*)</td>", top) == [spot["node"] for spot in spots]
    assert top.count("<td>not checked: ") == len(spots)
    assert all("<td>not checked: %s</td><td>%s</td>" % (html.escape(spot["cause"]), html.escape(spot["fix"])) in top for spot in spots)


def test_findings_by_id_count_the_nodes_worst_severity_first():
    report = _report()
    twice = report["nodes"]["gpu-e"]["findings"]
    twice.append(_finding("device_node_permissions", "device_nodes", "warning", path="/dev/nvidia1"))
    twice.append(_finding("device_node_permissions", "device_nodes", "warning", path="/dev/nvidia2"))
    page = report_html.render(report)
    table = page[page.index('<table class="list byid">'):]
    table = table[:table.index("</table>")]
    rows = [[cell for cell in re.split(r"<[^>]+>", row) if cell] for row in re.findall(r"<tr>(.*?)</tr>", table)][1:]
    assert rows == [["device_node_permissions", "device_nodes", "critical", "2", "3", "yes"],
                    ["kubelet_setting", "kubelet", "error", "1", "1", "yes"],
                    ["containerd_nvidia_runtime", "containerd", "warning", "1", "1", "yes"],
                    ["device_char_link", "device_nodes", "warning", "1", "1", "yes"],
                    ["gpu_process_unattributed", "consistency", "warning", "1", "1", "no"],
                    ["gpu_access", "device_cgroups", "info", "1", "1", "no"],
                    ["pcie_link_degraded", "device_nodes", "info", "1", "1", "no"]]
    assert page.index("<h2>Findings by id</h2>") < page.index("<h2>Nodes x checks</h2>")
    assert "No node findings." in report_html.render(dict(report, nodes={}))


def test_run_summary_and_cluster_findings():
    report = _report()
    page = report_html.render(report)
    assert "<strong>exit 4</strong>: the run finished, but could not check everything it was asked to" in page
    # what could not be checked comes first, each with its cause and its fix
    blind = page[page.index('<table class="list notchecked">'):page.index("<h2>Nodes x checks</h2>")]
    assert "not checked: containerd: the check could not run" in blind and "fix containerd" in blind
    assert "not checked: ssh: connect to host gpu-c port 22: No route to host" in blind
    for text in ("<dt>inventory</dt><dd>inventories/prod.yml</dd>", "<dt>limit</dt><dd>gpu_nodes</dd>",
                 "<dt>started</dt><dd>2026-09-21T14:13:20+00:00</dd>", "<dt>finished</dt><dd>2026-09-21T14:14:02+00:00</dd>",
                 "<dt>duration</dt><dd>42.5 s</dd>", "<strong>7</strong> nodes", "<strong>2</strong> drifted",
                 "<strong>0</strong> attention", "<strong>1</strong> not checked", "<strong>1</strong> unreachable", "<strong>1</strong> failed",
                 "<strong>1</strong> cluster findings"):
        assert text in page, text
    cluster = page[page.index("<h2>Cluster</h2>"):]
    assert "GPU consistency (device plugin, pods, processes): checked; RuntimeClass: not asked for. 1 finding(s)" in cluster
    assert "requested_resource_not_advertised" in cluster and "nvidia.com/gpu" in cluster and "pods wait for a resource no node advertises" in cluster
    clean = drift_report.build_report(drift_report.Outcomes(), inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    page = report_html.render(clean)
    assert "<strong>exit 0</strong>: the run finished: every node answered and is clean" in page
    assert "no hosts in this run" in page and "No cluster findings." in page and "none (the playbook&#x27;s hosts)" in page


def test_the_json_report_renders_the_same_and_unknown_states_never_look_clean():
    report = _report()
    assert _parse(report_html.render(json.loads(json.dumps(report, sort_keys=True)))).rows == _parse(report_html.render(report)).rows
    node = {"node": "n", "status": "drift", "checks": {"a": {"status": "drift"}, "b": {"status": "not_checked"}},
            "not_checked": [{"check": "b", "what": "b", "cause": "boom", "fix": "mend"}], "findings": [_finding("x", "c", "bogus<b>")]}
    assert report_html.cell_state(node, "a", {})[0] == "incomplete"
    assert report_html.cell_state(node, "b", {}) == ("incomplete", [], "not checked: b: boom. Fix: mend")
    assert report_html.cell_state(node, "c", {})[0] == "incomplete"  # a severity outside the scale is not guessed
    blind_cluster = {"checks": {"consistency": {"state": "not_checked", "cause": "no API", "fix": "reach it"}}}
    assert report_html.cell_state(node, "consistency", blind_cluster) == (
        "incomplete", [], "not checked: consistency (cluster side): no API. Fix: reach it")
    assert report_html.cell_state(node, "consistency", {})[0] == "unchecked"
    page = report_html.render(dict(report, nodes={"h": node}, unreachable={}, failed={}))
    assert "bogus&lt;b&gt;" in page and "sev-bogus" not in page


def _fake_run(monkeypatch, events, signum=None):
    monkeypatch.setattr(drift_run, "play_hosts", lambda *args, **kwargs: {"gpu-a", "gpu-b"})

    def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
        for event in events:
            event_handler(event)
        if signum is not None:
            os.kill(os.getpid(), signum)
            return "canceled", 254, {}, ""
        return "successful", 0, {}, "PLAY RECAP"

    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)


def test_drift_html_option_writes_the_page_and_an_incomplete_run_leaves_it(tmp_path, monkeypatch, capsys):
    pytest.importorskip("ansible_runner")
    inventory, playbook, page = tmp_path / "hosts.yml", tmp_path / "drift_check.yml", tmp_path / "out" / "fleet.html"
    inventory.write_text("all: {}\n")
    playbook.write_text("---\n")
    events = [_audited("gpu-a", []), _audited("gpu-b", [_finding("device_node_permissions", "device_nodes", "critical")]),
              {"event": "playbook_on_stats", "event_data": {"processed": {"gpu-a": 1, "gpu-b": 1}}}]
    _fake_run(monkeypatch, events)
    argv = ["drift", "-i", str(inventory), "--playbook", str(playbook), "--html", str(page), "-q"]
    assert cli.main(argv) == drift_report.EXIT_DRIFT
    written = page.read_text()
    assert 'class="cell sev-critical"' in written and oct(os.stat(page).st_mode & 0o777) == "0o644"
    assert os.listdir(page.parent) == ["fleet.html"]
    _fake_run(monkeypatch, events[:1], signum=signal.SIGTERM)
    before = os.stat(page).st_mtime_ns
    assert cli.main(argv) == 143
    assert page.read_text() == written and os.stat(page).st_mtime_ns == before
    assert os.listdir(page.parent) == ["fleet.html"]


# ---------------------------------------------------------------------------------------------
# In a real browser


def _browser():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Chromium is missing: `make setup` installs Debian's chromium package (apt-get install chromium)")
    return path


def _chromium(tmp_path, *args):
    """Headless Chromium with a profile of its own (runs in parallel do not share one); root needs --no-sandbox."""
    profile = tmp_path / ("profile-%d" % time.monotonic_ns())
    command = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-extensions", "--user-data-dir=%s" % profile, *args]
    done = subprocess.run(command, capture_output=True, timeout=BROWSER_TIMEOUT, check=False, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


def decode_png(data):
    """(width, height, channels, rows) of an 8-bit RGB or RGBA, non-interlaced PNG, as Chromium writes them."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _compression, _filter, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * channels
    rows, prior = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, data = raw[start], raw[start + 1:start + 1 + stride]
        if kind == 0:
            line = bytearray(data)
        elif kind == 2:  # Up
            line = bytearray((x + b) & 0xFF for x, b in zip(data, prior, strict=True))
        else:  # Sub, Average, Paeth: the bytes on the left come from this row, so one at a time, after a pixel of zeros
            line, up = bytearray(channels) + data, bytes(channels) + prior
            if kind == 1:
                for i in range(channels, stride + channels):
                    line[i] = (line[i] + line[i - channels]) & 0xFF
            elif kind == 3:
                for i in range(channels, stride + channels):
                    line[i] = (line[i] + ((line[i - channels] + up[i]) >> 1)) & 0xFF
            else:
                assert kind == 4, "unknown PNG filter %d" % kind
                for i in range(channels, stride + channels):
                    a, b, c = line[i - channels], up[i], up[i - channels]
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - c - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            del line[:channels]
        rows.append(bytes(line))
        prior = rows[-1]
    return width, height, channels, rows


def colour_counts(png):
    """Pixels of each state's background colour, exactly: Chromium paints a solid fill in its sRGB value."""
    _width, _height, channels, rows = decode_png(png)
    counts = {}
    for state, (background, _text) in report_html.COLOURS.items():
        pixel = bytes.fromhex(background[1:]) + b"\xff" * (channels - 3)
        counts[state] = sum(row.count(pixel) for row in rows)
    return counts


def _screenshot(tmp_path, report, name, fragment="#status=all"):
    """The page's pixels; by default with every node shown (#status=all opens the clean nodes)."""
    page, shot = tmp_path / ("%s.html" % name), tmp_path / ("%s.png" % name)
    page.write_text(report_html.render(report), encoding="utf-8")
    _chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=1280,1400", page.as_uri() + fragment)
    return colour_counts(shot.read_bytes())


def _with_probe(page, probe):
    """The page with a test's script before </body>, its hash added to the page's CSP (which stays as it is else)."""
    digest = base64.b64encode(hashlib.sha256(probe.encode()).digest()).decode()
    csp = html.escape(report_html.CSP, quote=True)
    assert page.count(csp) == 1
    allowed = html.escape(report_html.CSP.replace("script-src ", "script-src 'sha256-%s' " % digest), quote=True)
    return page.replace(csp, allowed).replace("</body>", '<script id="probe">%s</script></body>' % probe)


def test_browser_shows_each_state_in_its_colour(tmp_path):
    """A cell is about 6.5 x 2.5 em (over 2,500 pixels); the legend's swatch of each state and the summary's severity
    badges stay well under 1,500, so a colour only passes where the grid has a cell of it.  The second page, the
    same fleet without its one critical finding, shows that the count falls when the cell is gone."""
    counts = _screenshot(tmp_path, _report(), "fleet")
    cell = 1500
    for state in ("critical", "error", "warning", "info", "incomplete", "unchecked"):
        assert counts[state] > cell, (state, counts)
    assert counts["clean"] > 20 * cell, counts  # most cells of the fleet
    without = _screenshot(tmp_path, _report(critical=False), "without-critical")
    assert without["critical"] < cell < counts["critical"] - without["critical"], (counts, without)
    assert without["error"] > counts["error"]
    # without a fragment the clean nodes (gpu-a and the hostile name: 13 clean cells) are collapsed under their count
    collapsed = _screenshot(tmp_path, _report(), "collapsed", fragment="")
    assert counts["clean"] - collapsed["clean"] > 10 * cell, (counts, collapsed)
    # the clean nodes' skipped (gpu-a's mig) and info (the hostile node's) cells go with them; the problems stay
    assert collapsed["unchecked"] < cell < counts["unchecked"] and counts["info"] - collapsed["info"] > cell, (counts, collapsed)
    assert collapsed["critical"] > cell and collapsed["incomplete"] > cell, collapsed


def test_browser_opens_a_cells_findings_on_click_and_runs_nothing_from_the_report(tmp_path):
    """The DOM after a click on the critical cell: its <details> open, the findings visible; the report's <script>
    and <img onerror> stayed text.  The page's CSP blocks any script but its own, the test's click too, so the copy
    the browser gets allows the probe's hash as well: the page's script and the probe run, and nothing else."""
    page = report_html.render(_report())
    probe = """
var cell = document.querySelector("td.sev-critical"), details = cell.querySelector("details");
var panel = details.querySelector(".panel"), result = {before: panel.checkVisibility(), open_before: details.open};
cell.querySelector("summary").click();
var box = panel.getBoundingClientRect();
result.after = panel.checkVisibility(); result.open_after = details.open; result.height = box.height; result.text = panel.innerText;
result.pwned = document.documentElement.dataset.pwned || null;
result.scripts = Array.prototype.map.call(document.scripts, function (script) { return script.id; });
result.images = document.images.length;
document.body.setAttribute("data-probe", JSON.stringify(result));
"""
    copy = tmp_path / "probe.html"
    copy.write_text(_with_probe(page, probe), encoding="utf-8")
    dom = _chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000", copy.as_uri())
    probe_dom = _parse(dom)
    result = json.loads([attrs for tag, attrs in probe_dom.attributes if tag == "body"][0]["data-probe"])
    assert result["before"] is False and result["open_before"] is False
    assert result["after"] is True and result["open_after"] is True and result["height"] > 100, result
    for text in ("device_node_permissions", "got-device_node_permissions", "want-device_node_permissions", "/dev/nvidia0",
                 "device_char_link", "device_permissions"):
        assert text in result["text"], text
    assert result["pwned"] is None and result["scripts"] == ["", "probe"] and result["images"] == 0, result
    assert HOSTILE_NODE in probe_dom.rows  # still text in the grid, as rendered


# ---------------------------------------------------------------------------------------------
# A thousand nodes (issue 46, item 4)

FLEET = 1000
MAX_PAGE_BYTES = 2 * 1024 * 1024
MAX_LOAD_SECONDS = 2.0
LOAD_ATTEMPTS = 3


def _fleet(size=FLEET):
    """``size`` nodes as a run reports them: about 10% drifted (a critical and an error finding), 7% needing attention
    (a warning no playbook fixes), 3% with a check that could not run, 2% unreachable, 1% failed, the rest clean (a
    third with a skipped check)."""
    outcomes = drift_report.Outcomes()
    for index in range(size):
        host = "gpu-node-%04d" % index
        if index % 50 == 7:
            outcomes.feed(_event("runner_on_unreachable", host, msg="ssh: connect to host %s port 22: No route to host" % host))
        elif index % 97 == 3:
            outcomes.feed(_event("runner_on_failed", host, action="gpuharden.k8s.node_lock", msg="node_lock: the node is locked by harden@x"))
        elif index % 10 == 1:
            outcomes.feed(_audited(host, [
                _finding("device_node_permissions", "device_nodes", "critical", path="/dev/nvidia%d" % (index % 8)),
                _finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology", subject="topologyManagerPolicy")],
                device_nodes="drift", kubelet="drift"))
        elif index % 13 == 2:
            outcomes.feed(_audited(host, [_finding("pcie_link_degraded", "device_nodes", "warning", stage="postcheck", remediable=False,
                                                   gpu={"index": index % 8})]))
        elif index % 29 == 5:
            outcomes.feed(_audited(host, [], containerd="not_checked"))
        else:
            outcomes.feed(_audited(host, [], mig="skipped") if index % 3 == 0 else _audited(host, []))
    return drift_report.build_report(outcomes, inventory="inventories/prod.yml", limit=None, fail_severity="warning",
                              started=1_790_000_000.0, finished=1_790_000_300.0)


def _dom_rows(dom):
    """(data-status, node name, hidden) of every row of a DOM Chromium dumped (it writes hidden="" where set)."""
    return [(status, html.unescape(name).split()[0], " hidden" in rest or rest.startswith("hidden"))
            for status, name, rest in re.findall(r'<tr data-status="([^"]*)" data-checks="[^"]*" data-name="([^"]*)"([^>]*)>', dom)]


@pytest.fixture(scope="module")
def fleet_page(tmp_path_factory):
    report = _fleet()
    summary = report["summary"]
    # the mix the page must sort and filter: every group present, most nodes clean
    assert summary["nodes"] == FLEET and summary["drifted"] > 50 and summary["attention"] > 50 and summary["not_checked"] > 20
    assert summary["unreachable"] > 10 and summary["failed"] > 5 and summary["clean"] > 700
    page = tmp_path_factory.mktemp("fleet") / "fleet.html"
    page.write_text(report_html.render(report), encoding="utf-8")
    return report, page


def _statuses(report):
    """host -> the filter group the page gives it: the node's status, not_checked for unreachable and failed hosts."""
    groups = {host: node["status"] for host, node in report["nodes"].items()}
    return dict(groups, **dict.fromkeys([*report["unreachable"], *report["failed"]], "not_checked"))


def test_a_thousand_nodes_page_stays_under_2_mb_and_opens_in_under_2_s(tmp_path, fleet_page):
    """Measured two ways, both must hold.  In the page: performance.now() in the load event's handler, after forcing
    the layout of every row (getBoundingClientRect), is the time from the start of navigation to a laid-out page
    (parse, style, the filter script, layout).  Outside: the wall time of `chromium --headless --dump-dom` on the page
    minus the same on an empty page (the browser's own start-up, which no page can change).  Both from one try, the
    first of up to LOAD_ATTEMPTS that meets both (each printed, with -s)."""
    report, page = fleet_page
    assert page.stat().st_size < MAX_PAGE_BYTES, page.stat().st_size
    probe = """
window.addEventListener("load", function () {
  var height = document.documentElement.getBoundingClientRect().height;
  document.body.setAttribute("data-probe", JSON.stringify({loaded_ms: performance.now(), height: height,
    rows: document.querySelectorAll("tr[data-status]").length}));
});
"""
    timed = tmp_path / "timed.html"
    timed.write_text(_with_probe(page.read_text(encoding="utf-8"), probe), encoding="utf-8")
    empty = tmp_path / "empty.html"
    empty.write_text("<!DOCTYPE html><title>empty</title><p>empty</p>", encoding="utf-8")
    tries = []
    for _attempt in range(LOAD_ATTEMPTS):  # a few tries: the machine is shared, and a busy moment is not the page's time
        started = time.monotonic()
        _chromium(tmp_path, "--dump-dom", empty.as_uri())
        baseline = time.monotonic() - started
        started = time.monotonic()
        dom = _chromium(tmp_path, "--dump-dom", timed.as_uri())
        wall = time.monotonic() - started
        result = json.loads(html.unescape(re.search(r'<body data-probe="([^"]*)"', dom).group(1)))
        tries.append((result["loaded_ms"], wall, baseline))
        print("1,000-node page: %d bytes; load and layout in the page %.0f ms; chromium --dump-dom %.2f s, an empty page %.2f s"
              % (page.stat().st_size, result["loaded_ms"], wall, baseline))
        if result["loaded_ms"] < MAX_LOAD_SECONDS * 1000 and wall - baseline < MAX_LOAD_SECONDS:
            break
    assert result["rows"] == FLEET and result["height"] > 1000, result  # laid out, the problem rows at least
    assert result["loaded_ms"] < MAX_LOAD_SECONDS * 1000 and wall - baseline < MAX_LOAD_SECONDS, tries
    assert len(_dom_rows(dom)) == FLEET and not any(hidden for _status, _name, hidden in _dom_rows(dom))


def test_a_thousand_nodes_page_applies_the_filter_of_its_url_fragment(tmp_path, fleet_page):
    """The page as written, under its own CSP (a wrong script hash would block the filter and leave every row shown):
    #status=drift shows exactly the drifted nodes; #status=not_checked&check=containerd&q=... narrows by all three."""
    report, page = fleet_page
    groups = _statuses(report)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#status=drift")
    rows = _dom_rows(dom)
    assert len(rows) == FLEET
    assert sorted(name for _status, name, hidden in rows if not hidden) == sorted(host for host, group in groups.items() if group == "drift")
    assert 'id="f-shown">%d of %d node(s) match<' % (report["summary"]["drifted"], FLEET) in dom
    assert '<div class="filter" id="filter">' in dom  # the script showed the controls
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#status=not_checked&check=containerd&q=GPU-NODE-01")
    shown = sorted(name for _status, name, hidden in _dom_rows(dom) if not hidden)
    expected = sorted(host for host, group in groups.items() if group == "not_checked" and host.startswith("gpu-node-01")
                      and (host not in report["nodes"] or "containerd" in [part["check"] for part in report["nodes"][host]["not_checked"]]))
    assert shown == expected and len(expected) >= 2, (shown, expected)


def test_a_thousand_nodes_page_filters_on_a_click_and_a_search(tmp_path, fleet_page):
    """A user's choice in the status list (a change event, as a click on an option fires) and then typing in the
    search box: each rewrites the fragment, and the page applies it (the same path as a link).  The probe runs under
    the page's CSP with its own hash added; --virtual-time-budget lets the hashchange events run before the dump."""
    report, page = fleet_page
    groups = _statuses(report)
    probe = """
window.addEventListener("load", function () {
  var status = document.getElementById("f-status"), search = document.getElementById("f-q"), steps = [];
  function visible() {
    return Array.prototype.filter.call(document.querySelectorAll("tr[data-status]"), function (row) { return !row.hidden; })
      .map(function (row) { return row.dataset.name.split(" ")[0]; });
  }
  window.addEventListener("hashchange", function () {
    steps.push({hash: location.hash, visible: visible(), clean_open: document.getElementById("clean-nodes").open});
    if (steps.length === 2) {
      status.value = "clean";
      status.dispatchEvent(new Event("change"));
    } else if (steps.length === 3) {
      search.value = "gpu-node-000";
      search.dispatchEvent(new Event("input"));
    } else {
      document.body.setAttribute("data-probe", JSON.stringify(steps));
    }
  });
  steps.push({hash: location.hash, visible: visible().length, clean_open: document.getElementById("clean-nodes").open});
  status.value = "attention";
  status.dispatchEvent(new Event("change"));
});
"""
    clicked = tmp_path / "clicked.html"
    clicked.write_text(_with_probe(page.read_text(encoding="utf-8"), probe), encoding="utf-8")
    dom = _chromium(tmp_path, "--dump-dom", "--virtual-time-budget=5000", clicked.as_uri())
    steps = json.loads(html.unescape(re.search(r'<body data-probe="([^"]*)"', dom).group(1)))
    assert steps[0] == {"hash": "", "visible": FLEET, "clean_open": False}
    assert steps[1]["hash"] == "#status=attention" and not steps[1]["clean_open"]
    assert sorted(steps[1]["visible"]) == sorted(host for host, group in groups.items() if group == "attention")
    assert steps[2]["hash"] == "#status=clean" and steps[2]["clean_open"]
    assert sorted(steps[2]["visible"]) == sorted(host for host, group in groups.items() if group == "clean")
    assert steps[3]["hash"] == "#status=clean&q=gpu-node-000" and steps[3]["clean_open"]
    assert steps[3]["visible"] == sorted(host for host, group in groups.items() if group == "clean" and host.startswith("gpu-node-000"))
    assert steps[3]["visible"]


def test_the_failing_gpu_pods_are_embedded_with_their_explanation_and_the_node_rows_link_to_them():
    report = _report()
    hostile = "<script>document.documentElement.dataset.pwned='pod'</script>"
    report["explanations"] = {"schema": 1, "state": "cause", "not_checked": [], "pods": [
        {"target": {"kind": "pod", "name": "ml/train-0", "node": "node-b"}, "state": "cause",
         "verdict": {"cause": "device_permissions", "summary": "the GPU device nodes on gpu-b do not let the container open them %s" % hostile},
         "evidence": [{"what": "device_node_permissions", "where": "node gpu-b", "value": {"found": "0600"}}],
         "fix": ["ansible-playbook -i INVENTORY gpuharden.k8s.harden_gpu_nodes --tags device_permissions -l gpu-b"], "not_checked": []},
        {"target": {"kind": "pod", "name": "ml/typo", "node": None}, "state": "undecided",
         "verdict": {"summary": "could not decide"}, "evidence": [], "fix": [],
         "not_checked": [{"what": "node side", "cause": "no audit", "fix": "run drift"}]}]}
    page = report_html.render(report)
    grid = _parse(page)
    assert 'id="failing-pods"' in page and 'id="pod-ml--train-0"' in page and 'id="pod-ml--typo"' in page
    # gpu-b's row links to its pod's explanation; the only links of the page are such anchors
    assert '<a href="#pod-ml--train-0">1 failing GPU pod</a>' in page
    assert {attrs["href"] for tag, attrs in grid.attributes if "href" in attrs} == {"#pod-ml--train-0"}
    assert "--tags device_permissions -l gpu-b" in page and "not bound" in page
    assert hostile not in page and html.escape(hostile) in page
    # a report without explanations (--no-explain, drift-merge) has no such section
    assert 'id="failing-pods"' not in report_html.render(_report())
