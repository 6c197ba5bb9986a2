# SPDX-License-Identifier: GPL-3.0-or-later
"""deploy/monitoring: the alerting rules and the Grafana dashboard against what `gpuharden drift --prometheus` writes.

promtool (Debian package prometheus, installed by `make system-deps`) checks the rules, runs their unit tests, lints
the real prometheus_text() output of a sample fleet (tools/monitoring_sample.py) and evaluates the alert and
dashboard expressions over that output.  Every metric and label name the rules and the dashboard use must be one
prometheus_text() writes, so renaming a metric there fails here."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit

from gpuharden import severity

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "gpuharden-alerts.yml"
RULES_TESTS = MONITORING / "tests" / "alerts-test.yml"
DASHBOARD = MONITORING / "gpuharden-dashboard.json"
# The placeholder make dist replaces with the project URL (tools/dist.py), where the README renders.
RUNBOOK = re.compile(r"^https://gpuharden\.invalid#troubleshooting$")
# Labels every scraped series gets besides its own, and node_exporter's own textfile-collector metrics.
TARGET_LABELS = {"job", "instance"}
NODE_EXPORTER_METRICS = {"node_textfile_mtime_seconds": {"file"}, "node_textfile_scrape_error": set()}
CHECKS = set(_node_audit.CHECK_NAMES) | {"consistency", "runtime_class"}
JOB = 'job="node",instance="ctl-a:9100"'
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def _load_sample():
    spec = importlib.util.spec_from_file_location("monitoring_sample", REPO / "tools" / "monitoring_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAMPLE = _load_sample()


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: install the Debian package prometheus (make system-deps)")
    return path


@pytest.fixture(scope="module")
def text():
    return SAMPLE.sample_text()


def _emitted(text):
    """{metric name: label names} of an exposition, families without samples included."""
    names = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            names.setdefault(name, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', line.split(" ")[0]))
    return names


def _rules():
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def _dashboard_exprs(dashboard=None):
    """(panel title, expression) of every panel target and query variable."""
    dashboard = dashboard or _dashboard()
    exprs = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            exprs.append(("$" + variable["name"], re.fullmatch(r"label_values\((.*), *\w+\)", query).group(1)))
    return exprs


def _concrete(expr):
    """A dashboard expression as Prometheus sees it with every variable at All."""
    return expr.replace("$instance", ".*").replace("$node", ".*")


def _series(text):
    """promtool input_series for an exposition: every sample constant for four hours, as scraped from ctl-a."""
    series = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if "{" in name_labels:
            name_labels = name_labels[:-1] + "," + JOB + "}"
        else:
            name_labels += "{" + JOB + "}"
        series.append({"series": name_labels, "values": "%sx240" % value})
    return series


def _promtool_test(promtool, tmp_path, expr_tests, series):
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": expr_tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _samples(rows):
    return [{"labels": "{%s}" % ",".join('%s="%s"' % item for item in sorted(labels.items())), "value": value}
            for labels, value in rows]


def test_promtool_check_rules(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: %d rules found" % len(_rules()) in result.stdout


def test_promtool_rules_unit_tests(promtool):
    result = subprocess.run([promtool, "test", "rules", RULES_TESTS.name], cwd=RULES_TESTS.parent, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # every alert has at least one case where it fires and one where it does not
    cases = [case for test in yaml.safe_load(RULES_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in _rules():
        if "alert" in rule:
            assert any(case["alertname"] == rule["alert"] and case["exp_alerts"] for case in cases), rule["alert"]
            assert any(case["alertname"] == rule["alert"] and not case["exp_alerts"] for case in cases), rule["alert"]


def test_promtool_check_metrics_on_the_real_textfile(promtool, text):
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_monitoring_check_tool_prints_that_textfile(text):
    result = subprocess.run([sys.executable, str(REPO / "tools" / "monitoring_sample.py")],
                            capture_output=True, text=True, check=True)
    assert result.stdout == text


def test_rules_shape():
    names = [rule["alert"] for rule in _rules() if "alert" in rule]
    assert len(names) == len(set(names))
    for rule in _rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert set(rule["annotations"]) >= {"summary", "description", "runbook_url"}, rule["alert"]
        assert RUNBOOK.match(rule["annotations"]["runbook_url"]), rule["alert"]
        # critical pages at once; warnings wait, except the threshold alerts whose condition is itself a duration
        if rule["labels"]["severity"] == "critical" and "NoCompleteRun" not in rule["alert"]:
            assert "for" not in rule, rule["alert"]


def _check_names(where, expr, emitted):
    metrics = set(emitted) | set(NODE_EXPORTER_METRICS)
    labels = set(TARGET_LABELS).union(*emitted.values(), *NODE_EXPORTER_METRICS.values())
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    used = set(re.findall(r"\b(?:gpuharden|node)_[a-zA-Z0-9_:]+", stripped))
    assert used, (where, expr)
    assert used <= metrics, (where, sorted(used - metrics))
    for name, matchers in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        allowed = TARGET_LABELS | emitted.get(name, NODE_EXPORTER_METRICS.get(name, set()))
        for label, _op, value in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', matchers):
            assert label in allowed, (where, name, label)
            if label == "severity" and not value.startswith("$"):
                assert set(value.split("|")) <= set(severity.SEVERITIES), (where, value)
            if label == "check" and not value.startswith("$"):
                assert set(value.split("|")) <= CHECKS, (where, value)
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", stripped):
        for label in filter(None, (item.strip() for item in group.split(","))):
            assert label in labels, (where, label)
    # any other metric (kube-state-metrics, up...): a word with an underscore that is no function, label or keyword
    words = set(re.findall(r"\b[a-z_][a-z0-9_:]*\b(?!\s*\()", re.sub(r"\{[^}]*\}", "", stripped)))
    assert not {word for word in words - PROMQL_WORDS - labels - metrics if "_" in word}, (where, expr)


def test_rules_and_dashboard_use_only_metrics_prometheus_text_writes(text):
    emitted = _emitted(text)
    assert {"gpuharden_drift_findings", "gpuharden_drift_node_drifted", "gpuharden_last_success_timestamp_seconds"} <= set(emitted)
    for rule in _rules():
        _check_names(rule["alert"], rule["expr"], emitted)
        for annotation in rule["annotations"].values():
            for name in re.findall(r"\bgpuharden_[a-z0-9_]+", annotation):
                assert name in emitted, (rule["alert"], name)
    exprs = _dashboard_exprs()
    assert len(exprs) > 10
    for title, expr in exprs:
        _check_names(title, expr, emitted)


def test_name_check_catches_a_renamed_metric(text):
    emitted = _emitted(text)
    with pytest.raises(AssertionError):
        _check_names("renamed", "sum(gpuharden_drift_findings_total)", emitted)
    with pytest.raises(AssertionError):
        _check_names("label", 'gpuharden_drift_findings{host="x"}', emitted)
    with pytest.raises(AssertionError):
        _check_names("check", 'gpuharden_drift_findings{check="isolation"}', emitted)
    with pytest.raises(AssertionError):
        _check_names("by", "sum by (hostname) (gpuharden_drift_node_drifted)", emitted)
    with pytest.raises(AssertionError):
        _check_names("other", "gpuharden_drift_node_failed > 0 and on () kube_job_status_failed > 0", emitted)
    _check_names("fine", 'sum by (instance) (gpuharden_drift_node_failed{node=~"gpu-.*"}) > 0', emitted)


def test_dashboard_shape():
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] and "__inputs" not in dashboard
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))

    # no hard-coded data source: every reference is the variable (or Grafana's built-in annotations)
    def references(node):
        if isinstance(node, dict):
            if "datasource" in node:
                yield node["datasource"]
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    refs = list(references(dashboard))
    assert refs
    for ref in refs:
        assert ref in ({"type": "prometheus", "uid": "${datasource}"}, {"type": "grafana", "uid": "-- Grafana --"}), ref
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Fleet status (last complete run)", "Findings by severity", "Worst severity by node and check (last complete run)",
            "Last complete run", "Run duration"} <= titles
    # panels do not overlap
    cells = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & area, panel["title"]
        assert grid["x"] + grid["w"] <= 24
        cells |= area


def test_dashboard_expressions_parse(promtool, tmp_path):
    """promtool check rules as the PromQL parser: every dashboard expression as a recording rule."""
    rules = [{"record": "gpuharden:dashboard_%d" % index, "expr": _concrete(expr)}
             for index, (_title, expr) in enumerate(_dashboard_exprs())]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_expressions_over_the_real_textfile(promtool, tmp_path, text):
    """The alert expressions over what prometheus_text() writes for the sample fleet: the right nodes each."""
    exprs = {rule["alert"]: rule["expr"] for rule in _rules()}
    base = {"job": "node", "instance": "ctl-a:9100"}
    expected = {
        "GpuhardenGpuIsolationBreach": [(dict(base, node="gpu-c"), 1)],
        "GpuhardenDriftCritical": [],
        "GpuhardenNodeDrifted": [(dict(base, node="node-b"), 1)],
        # gpu-c has a critical finding: its isolation breach alert says more
        "GpuhardenNodeNeedsAttention": [(dict(base, node="gpu-d"), 1)],
        "GpuhardenClusterDriftCritical": [],
        "GpuhardenClusterDrift": [(dict(base, check="runtime_class"), 1)],
        "GpuhardenNodeUnreachable": [(dict(base, node="gpu-e"), 1)],
        "GpuhardenNodeCheckFailed": [(dict(base, node="gpu-f"), 1)],
        "GpuhardenDriftFleetUnchecked": [],
        "GpuhardenDriftRunSlow": [],
        "GpuhardenDriftMetricsAbsent": [],
        "GpuhardenDriftClusterNotChecked": [],
        "GpuhardenDriftNodeCheckNotChecked": [],
    }
    shifted = {"GpuhardenDriftNoCompleteRun", "GpuhardenDriftNoCompleteRunCritical", "GpuhardenCredentialExpiresSoon",
               "GpuhardenCredentialExpiresSoonCritical"}
    assert set(expected) | shifted == set(exprs)
    tests = [{"expr": exprs[name], "eval_time": "5m", "exp_samples": _samples(rows)} for name, rows in expected.items()]
    # promtool's clock starts at 0: the sample run finished at SAMPLE.FINISHED, so its age at that time plus 3h
    # the sample run could not check two nodes: its success time is the earlier run's, an hour older
    age = 3 * 3600
    tests.append({"expr": exprs["GpuhardenDriftNoCompleteRun"].replace("time()", "(time() + %r)" % SAMPLE.FINISHED),
                  "eval_time": "%ds" % age, "exp_samples": _samples([(base, age + SAMPLE.FINISHED - SAMPLE.PREVIOUS_SUCCESS)])})
    tests.append({"expr": exprs["GpuhardenDriftNoCompleteRun"].replace("time()", "(time() + %r)" % SAMPLE.FINISHED),
                  "eval_time": "5m", "exp_samples": []})
    # the sample's token expires 20 days after the run: no alert then, the warning (and not the critical one) 14 days on
    for name, eval_days, rows in (("GpuhardenCredentialExpiresSoon", 0, []), ("GpuhardenCredentialExpiresSoonCritical", 14, []),
                                  ("GpuhardenCredentialExpiresSoon", 14, [(base, SAMPLE.CREDENTIAL_EXPIRES_AT - SAMPLE.FINISHED - 14 * 86400)])):
        tests.append({"expr": exprs[name].replace("time()", "(time() + %r)" % (SAMPLE.FINISHED + eval_days * 86400 - 300)), "eval_time": "5m",
                      "exp_samples": _samples(rows)})
    _promtool_test(promtool, tmp_path, tests, _series(text))


def test_dashboard_expressions_over_the_real_textfile(promtool, tmp_path, text):
    """Fleet status, node status and the worst-severity table over the sample fleet's textfile."""
    exprs = {}
    for title, expr in _dashboard_exprs():
        exprs.setdefault(title, []).append(_concrete(expr))
    fleet = exprs["Fleet status (last complete run)"]
    status_table = exprs["Nodes not in a clean state (last complete run)"][0]
    worst = exprs["Worst severity by node and check (last complete run)"][0]
    timeline = exprs["Node status over time"][0]
    base = {"job": "node", "instance": "ctl-a:9100"}
    # clean, drifted, attention, unreachable, check failed
    tests = [{"expr": expr, "eval_time": "5m", "exp_samples": _samples([({}, value)])}
             for expr, value in zip(fleet, (1, 1, 2, 1, 1), strict=True)]
    status = {"gpu-a": 0, "node-b": 2, "gpu-c": 1, "gpu-d": 1, "gpu-e": 4, "gpu-f": 3}
    tests.append({"expr": timeline, "eval_time": "5m", "exp_samples": _samples([(dict(base, node=node), value)
                                                                                for node, value in status.items()])})
    tests.append({"expr": status_table, "eval_time": "5m", "exp_samples": _samples(
        [(dict(base, node=node), value) for node, value in status.items() if value])})
    tests.append({"expr": worst, "eval_time": "5m", "exp_samples": _samples([
        ({"node": "gpu-a", "check": "device_cgroups"}, 1), ({"node": "node-b", "check": "device_nodes"}, 3),
        ({"node": "node-b", "check": "kubelet"}, 2), ({"node": "node-b", "check": "consistency"}, 3),
        ({"node": "gpu-c", "check": "device_cgroups"}, 4), ({"node": "gpu-d", "check": "nvml"}, 2)])})
    tests.append({"expr": exprs["Findings by severity"][0], "eval_time": "5m", "exp_samples": _samples([
        ({"severity": "critical"}, 1), ({"severity": "error"}, 3), ({"severity": "warning"}, 3), ({"severity": "info"}, 1)])})
    tests.append({"expr": exprs["Run duration"][0], "eval_time": "5m", "exp_samples": _samples(
        [({"instance": "ctl-a:9100"}, SAMPLE.FINISHED - SAMPLE.STARTED)])})
    _promtool_test(promtool, tmp_path, tests, _series(text))
