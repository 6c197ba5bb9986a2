# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden report FILE.json (issue 46, item 4): the table and the page of a report already written, whatever wrote it
(drift with or without --slice, drift-merge), with drift's exit code for it; a file it cannot render is exit 2 with
one line naming it, and nothing written.  The reports here are written by `gpuharden drift` itself, its Ansible run
replaced by the events of the tests' fake runners (tests/unit/test_drift_html.py, test_drift_slice.py)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from gpuharden import cli, drift_report, drift_slices, drift_terminal, report_cli, report_html
from tests.unit import test_drift_html, test_drift_slice

WIDTH = 100


@pytest.fixture(autouse=True)
def _width(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))


@pytest.fixture
def site(tmp_path):
    pytest.importorskip("ansible_runner")
    inventory, playbook = tmp_path / "hosts.yml", tmp_path / "drift_check.yml"
    inventory.write_text("all: {}\n")
    playbook.write_text("---\n")
    return {"inventory": inventory, "playbook": playbook, "report": tmp_path / "report.json", "html": tmp_path / "drift.html",
            "metrics": tmp_path / "gpuharden.prom", "tmp": tmp_path}


def _drift(site, *extra):
    return cli.main(["drift", "-i", str(site["inventory"]), "--playbook", str(site["playbook"]), "--report", str(site["report"]),
                     "-q", *extra])


def _report(path, *extra):
    return cli.main(["report", str(path), *extra])


def test_a_report_drift_wrote_without_slice_renders_as_drift_showed_it(site, monkeypatch, capsys):
    """drift-merge refuses this file (no slice section: it cannot tell which slices it has); report renders it: the
    same table drift printed, the same page drift --html wrote, the same exit code."""
    events = [test_drift_html._audited("gpu-a", []),
              test_drift_html._audited("gpu-b", [test_drift_html._finding("device_node_permissions", "device_nodes", "critical")]),
              {"event": "playbook_on_stats", "event_data": {"processed": {"gpu-a": 1, "gpu-b": 1}}}]
    test_drift_html._fake_run(monkeypatch, events)
    code = _drift(site, "--html", str(site["html"]))
    printed = capsys.readouterr().out
    assert code == drift_report.EXIT_DRIFT
    with pytest.raises(drift_slices.MergeError, match="is not a slice report"):
        drift_slices.merge_reports([(str(site["report"]), drift_slices.read_report(site["report"]))])
    page = site["tmp"] / "out" / "again.html"
    assert _report(site["report"], "--html", str(page), "--table") == code
    assert capsys.readouterr().out == printed
    assert page.read_text() == site["html"].read_text() and oct(os.stat(page).st_mode & 0o777) == "0o644"
    # --html alone writes the page and prints nothing; no option prints the table
    assert _report(site["report"], "--html", str(page)) == code and capsys.readouterr().out == ""
    assert _report(site["report"]) == code and capsys.readouterr().out == printed
    assert _report(site["report"], "--wide") == code
    assert capsys.readouterr().out == drift_terminal.table(drift_slices.read_report(site["report"]), None) + "\n"


def test_a_slice_report_renders_with_the_exit_code_of_its_run(site, monkeypatch, capsys):
    test_drift_slice._fake(monkeypatch, test_drift_slice.FLEET)
    index = drift_slices.slice_of("gpu-b", 3) + 1
    code = _drift(site, "--slice", "%d/3" % index, "--prometheus", str(site["metrics"]))
    printed = capsys.readouterr().out
    assert code == drift_report.EXIT_NOT_CHECKED  # its hosts include unreachable and failed ones
    report = json.loads(site["report"].read_text())
    assert report["slice"]["index"] == index
    assert _report(site["report"], "--table", "--html", str(site["html"])) == code
    assert capsys.readouterr().out == printed
    assert site["html"].read_text() == report_html.render(report)


def test_the_merge_of_every_slice_and_an_empty_slice_render(site, monkeypatch, capsys):
    """drift-merge's report (no slice section any more) and a slice that got no host (an empty report, exit 0)."""
    test_drift_slice._fake(monkeypatch, test_drift_slice.FLEET)
    paths = []
    for index in (1, 2, 3):
        paths.append(site["tmp"] / ("slice-%d.json" % index))
        _drift(dict(site, report=paths[-1]), "--slice", "%d/3" % index)
    merged = site["tmp"] / "merged.json"
    capsys.readouterr()
    code = cli.main(["drift-merge", *map(str, paths), "--report", str(merged)])
    printed = capsys.readouterr().out
    assert code == drift_report.EXIT_NOT_CHECKED and "slice" not in json.loads(merged.read_text())
    assert _report(merged, "--html", str(site["html"]), "--table") == code and capsys.readouterr().out == printed
    assert site["html"].read_text().count("<tr data-status=") == len(test_drift_slice.FLEET)
    test_drift_slice._fake(monkeypatch, ["gpu-a"])
    empty = next(index for index in (1, 2) if not drift_slices.slice_hosts(["gpu-a"], index, 2))
    assert _drift(site, "--slice", "%d/2" % empty) == drift_report.EXIT_CLEAN
    assert json.loads(site["report"].read_text())["slice"]["hosts"] == []
    assert _report(site["report"], "--html", str(site["html"])) == drift_report.EXIT_CLEAN
    assert "no hosts in this run" in site["html"].read_text()


@pytest.mark.parametrize(("findings", "status", "code"), [
    ([], {}, drift_report.EXIT_CLEAN),
    ([test_drift_html._finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology")], {"kubelet": "drift"}, drift_report.EXIT_DRIFT),
    ([test_drift_html._finding("pcie_link_degraded", "device_nodes", "warning", stage="postcheck", remediable=False)], {}, drift_report.EXIT_DRIFT),
    ([], {"containerd": "not_checked"}, drift_report.EXIT_NOT_CHECKED),
], ids=["clean", "drift", "attention", "not-checked"])
def test_the_exit_code_is_drifts_for_the_reports_state(tmp_path, capsys, findings, status, code):
    outcomes = drift_report.Outcomes()
    outcomes.feed(test_drift_html._audited("gpu-a", findings, **status))
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
    assert drift_report.exit_code(report) == code
    assert _report(path, "--html", str(tmp_path / "page.html")) == code
    assert capsys.readouterr().err == ""


def test_a_thousand_node_report_renders(tmp_path, capsys):
    report = test_drift_html._fleet()
    path, page = tmp_path / "fleet.json", tmp_path / "fleet.html"
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
    assert _report(path, "--html", str(page)) == drift_report.EXIT_NOT_CHECKED
    written = page.read_text()
    assert len(written.encode()) < test_drift_html.MAX_PAGE_BYTES
    assert written.count("<tr data-status=") == test_drift_html.FLEET and capsys.readouterr().out == ""


NOT_A_REPORT = [
    ("missing.json", None, "missing.json: No such file or directory"),
    ("text.json", "not json {", "text.json is not a gpuharden drift report (not JSON: Expecting value: line 1 column 1 (char 0))"),
    ("list.json", "[1, 2]", "list.json is not a gpuharden drift report (no version, summary, nodes, unreachable and failed)"),
    ("version.json", json.dumps({"version": 99, "summary": {}, "nodes": {}, "unreachable": {}, "failed": {}}),
     "version.json has report schema version 99; this gpuharden reads version 1 only"),
    ("node.json", "NODE", "node.json: nodes.gpu-a.findings is missing"),
    ("summary.json", "SUMMARY", "summary.json: summary.clean is missing"),
    ("count.json", "COUNT", 'count.json: summary.drifted is "2", not a number'),
    ("findings.json", "FINDINGS", 'findings.json: nodes.gpu-a.findings[0] is "text", not an object'),
    ("severity.json", "SEVERITY", "severity.json: nodes.gpu-b.findings[1].severity is null, not a string"),
    ("stages.json", "STAGES", "stages.json: nodes.gpu-b.remediable_stages is true, not a list"),
]


@pytest.mark.parametrize(("name", "content", "message"), NOT_A_REPORT, ids=[name for name, _content, _message in NOT_A_REPORT])
def test_a_file_that_is_no_report_is_exit_2_with_one_line_naming_it_and_nothing_written(tmp_path, capsys, name, content, message):
    good = json.loads(json.dumps(test_drift_html._report()))
    broken = {"NODE": dict(good, nodes=dict(good["nodes"], **{"gpu-a": {"status": "clean"}})),
              "SUMMARY": dict(good, summary={"nodes": 1}),
              "COUNT": dict(good, summary=dict(good["summary"], drifted="2")),
              "FINDINGS": dict(good, nodes=dict(good["nodes"], **{"gpu-a": dict(good["nodes"]["gpu-a"], findings=["text"])})),
              "SEVERITY": json.loads(json.dumps(good).replace('"severity": "warning"', '"severity": null')),
              "STAGES": dict(good, nodes=dict(good["nodes"], **{"gpu-b": dict(good["nodes"]["gpu-b"], remediable_stages=True)}))}
    path, page = tmp_path / name, tmp_path / "page.html"
    if content is not None:
        path.write_text(json.dumps(broken[content]) if content in broken else content)
    page.write_text("the last page")
    for extra in ([], ["--html", str(page)], ["--html", str(page), "--table"]):
        assert _report(path, *extra) == drift_report.EXIT_USAGE
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured
        assert captured.err.startswith("gpuharden report: %s" % tmp_path) and message in captured.err, captured.err
        assert captured.err.endswith("; nothing written\n")
        assert page.read_text() == "the last page" and sorted(os.listdir(tmp_path)) == sorted({name, "page.html"} - ({name} if content is None else set()))


def test_an_html_path_that_cannot_be_written_is_exit_2(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(test_drift_html._report()))
    (tmp_path / "file").write_text("")
    assert _report(path, "--html", str(tmp_path / "file" / "page.html")) == drift_report.EXIT_USAGE
    error = capsys.readouterr().err
    assert error.startswith("gpuharden report: [Errno 17] File exists: ") and str(tmp_path / "file") in error and error.count("\n") == 1


def test_report_is_a_subcommand_with_its_exit_codes_in_its_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    text = capsys.readouterr().out
    for line in ("0    the report is clean", "1    a node drifted or needs attention", "4    the run could not check", "2    the file could not be read"):
        assert line in text
    assert report_cli.MALFORMED and "FILE.json" in text


def test_every_report_option_has_help():
    commands = next(action for action in cli.build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    actions = [action for action in commands.choices["report"]._actions if action.dest != "help"]
    assert {action.dest for action in actions} == {"report", "html", "table", "wide"}
    assert all(action.help for action in actions)
