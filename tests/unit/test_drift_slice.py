# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift --slice K/N and gpuharden drift-merge (issue 15, item 6: fleet scale beyond one controller).

The partition: stable (sha256 of the host name, the same in every process) and total (each host in exactly one
slice).  --slice: validated before anything runs; the run's --limit is the slice's hosts only; a slice without hosts
is an empty report.  The merge: equal to the unsliced report but for the timings, Prometheus output as checked for a
run, cluster findings once, and every set of inputs that is not the slices of one run refused.  The sliced
CronJob: an Indexed Job whose pods run one slice each, and whose slice 1 merges (its shell run here with a fake
`gpuharden drift`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding as model_finding

from gpuharden import cli, drift, drift_metrics, drift_report, drift_run, drift_slices

REPO = Path(__file__).resolve().parents[2]
SLICED_CRONJOB = REPO / "deploy" / "kubernetes" / "drift-cronjob-sliced.yaml"
HOSTS = ["gpu-node-%02d" % number for number in range(1, 31)] + [
    "dgx-a100-01.gpu.example.com", "l4-inf-01.edge.example.com", "192.0.2.11", "h100_rack3_u12", "ÜberNode", "a", ""]
TIMINGS = ("generated_at", "timestamp", "duration_seconds")


def _finding(ident, check, severity, stage="device_permissions", remediable=True, **extra):
    return dict({"id": ident, "check": check, "stage": stage, "severity": severity, "expected": "e", "found": "f",
                 "hint": "h", "remediable": remediable}, **extra)


def _event(kind, host, action="gpuharden.k8s.node_stages", **res):
    return {"event": kind, "event_data": {"host": host, "task_action": action, "task": "Audit the node", "res": res}}


# A fleet with every kind of host and finding: clean, drift, attention, unreachable, failed, renamed nodes,
# consistency findings of nodes and of the cluster (node None), and a RuntimeClass finding.
FLEET = ["gpu-%s" % letter for letter in "abcdefghij"]
NODE_NAMES = {"gpu-b": "node-b", "gpu-g": "node-g"}


def _node_findings(host):
    return {
        "gpu-b": [_finding("device_node_permissions", "device_nodes", "error", path="/dev/nvidia0"),
                  _finding("kubelet_setting", "kubelet", "warning", stage="kubelet_topology", subject="topologyManagerPolicy")],
        "gpu-c": [_finding("pcie_link_degraded", "nvml", "warning", stage="postcheck", remediable=False, gpu=0)],
        "gpu-d": [_finding("gpu_access", "device_cgroups", "info", stage="postcheck", remediable=False)],
        "gpu-g": [_finding("containerd_nvidia_runtime", "containerd", "error", stage="container_runtime")],
    }.get(host, [])


CONSISTENCY = [
    model_finding("gpu_not_advertised", "error", 8, 0, "h", node="node-g", gpu=None, pod=None),
    model_finding("gpu_process_unattributed", "warning", "x", "y", "h", node="gpu-h", gpu={"index": 1}, pod=None),
    model_finding("requested_resource_not_advertised", "error", {"advertised": ["nvidia.com/gpu"]}, {"resource": "nvidia.com/gpus", "pods": ["ml/train"]}, "h",
                  node=None, gpu=None, pod=None, resource="nvidia.com/gpus"),
]
RUNTIME_CLASS = {"changed": True, "findings": [model_finding("runtime_class_handler_mismatch", "error", "nvidia", "runc", "the handler differs",
                                                             repair="patch", subject="RuntimeClass nvidia")]}


def _events(hosts):
    """The events of one drift run over ``hosts`` (a slice, or the whole FLEET): the cluster-side tasks run once,
    on the run's first host, and see the run's nodes and the cluster's pending pods."""
    hosts = sorted(hosts)
    names = [NODE_NAMES.get(host, host) for host in hosts]
    events = [_event("runner_on_start", host) for host in hosts]
    if hosts:
        events.append(_event("runner_on_ok", hosts[0], action="gpuharden.k8s.drift_play",
                             node_names={host: NODE_NAMES.get(host, host) for host in hosts}))
    for host in hosts:
        if host == "gpu-e":
            events.append(_event("runner_on_unreachable", host, msg="Failed to connect to the host via ssh: timed out"))
        elif host == "gpu-f":
            events.append(_event("runner_on_failed", host, action="gpuharden.k8s.node_lock", msg="locked by harden@ctl"))
        else:
            findings = _node_findings(host)
            events.append(_event("runner_on_ok", host, findings=findings, summary={"findings": len(findings)},
                                 checks={"device_nodes": {"status": "ok"}}, seconds=0.25))
    if hosts:
        seen = [entry for entry in CONSISTENCY if entry["node"] is None or entry["node"] in names]
        events.append(_event("runner_on_ok", hosts[0], action="gpuharden.k8s.gpu_consistency", findings=seen))
        events.append(_event("runner_on_ok", hosts[0], action="gpuharden.k8s.runtime_class", **RUNTIME_CLASS))
    events.append({"event": "playbook_on_stats", "event_data": {"processed": dict.fromkeys(hosts, 1)}})
    return events


def _report(hosts, started=1_700_000_000.0, finished=1_700_000_100.0):
    outcomes = drift_report.Outcomes()
    names = {}
    for event in _events(hosts):
        outcomes.feed(event)
        names.update((event["event_data"].get("res") or {}).get("node_names") or {})
    outcomes.close()
    return drift_report.build_report(outcomes, inventory="/inv/hosts.yml", limit=None, fail_severity="warning", started=started,
                              finished=finished, node_names=names)


def _slice_reports(count, fleet=FLEET):
    """The reports of --slice 1/count .. count/count over ``fleet``, as check_slice builds them."""
    reports = []
    for index in range(1, count + 1):
        hosts = drift_slices.slice_hosts(fleet, index, count)
        report = _report(hosts, started=1_700_000_000.0 + index, finished=1_700_000_050.0 + 10 * index)
        reports.append(dict(report, slice=drift_slices.slice_section(index, count, fleet, hosts)))
    return reports


def _without_timings(report):
    return {key: value for key, value in report.items() if key not in TIMINGS}


def _write(directory, reports):
    paths = []
    for report in reports:
        path = directory / ("slice-%d.json" % report["slice"]["index"])
        path.write_text(json.dumps(report))
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------------------------------------------
# The partition


@pytest.mark.parametrize("count", range(1, 9))
def test_every_host_is_in_exactly_one_slice(count):
    slices = [drift_slices.slice_hosts(HOSTS, index, count) for index in range(1, count + 1)]
    assert sorted(host for part in slices for host in part) == sorted(HOSTS)
    for index, part in enumerate(slices, start=1):
        assert part == sorted(part)
        assert all(drift_slices.slice_of(host, count) == index - 1 for host in part)


def test_slice_is_sha256_of_the_name_mod_n_and_fixed():
    """Not hash(): the same slices in every process, on every controller, in every later version."""
    for host in HOSTS:
        for count in range(1, 9):
            assert drift_slices.slice_of(host, count) == int(hashlib.sha256(host.encode()).hexdigest(), 16) % count
    # pinned, so a change of the function (which would move hosts between the pods of a running Job) fails here
    assert [drift_slices.slice_of("gpu-node-%02d" % number, 4) for number in range(1, 9)] == [
        int(hashlib.sha256(("gpu-node-%02d" % number).encode()).hexdigest(), 16) % 4 for number in range(1, 9)]
    assert drift_slices.slice_of("gpu-node-01", 1) == 0


def test_slices_are_the_same_in_another_process_with_another_hash_seed():
    code = "import json; from gpuharden import drift_slices; print(json.dumps([drift_slices.slice_of(h, 7) for h in %r]))" % (HOSTS,)
    mine = [drift_slices.slice_of(host, 7) for host in HOSTS]
    for seed in ("1", "4242"):
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True,
                             text=True, check=True).stdout
        assert json.loads(out) == mine


def test_a_host_keeps_its_slice_when_others_join_or_leave():
    before = {host: drift_slices.slice_of(host, 5) for host in HOSTS[:20]}
    after = {host: drift_slices.slice_of(host, 5) for host in HOSTS[5:]}
    assert all(before[host] == after[host] for host in set(before) & set(after))


# ---------------------------------------------------------------------------------------------------
# --slice K/N: validation


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("3/8", (3, 8)), ("8/8", (8, 8)), (" 2/4 ", (2, 4))])
def test_slice_argument_accepts_k_of_n(text, expected):
    assert drift_slices.parse_slice(text) == expected


@pytest.fixture
def nothing_runs(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("nothing may run after a refused --slice")

    monkeypatch.setattr(drift_run, "run_playbook", refuse)
    monkeypatch.setattr(drift_run, "list_hosts", refuse)
    monkeypatch.setattr(drift, "run", refuse)


@pytest.mark.parametrize("value", ["0/3", "4/3", "1/0", "0/0", "-1/3", "1.5/3", "a/b", "2", "1/", "/3", "", "1/3/5"])
def test_slice_argument_refused_with_exit_2_naming_option_and_value(value, tmp_path, nothing_runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["drift", "-i", str(tmp_path), "--slice=" + value])
    assert exit_info.value.code == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --slice: %r" % value in err, err


# ---------------------------------------------------------------------------------------------------
# --slice K/N: the run


@pytest.fixture
def site(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    playbook = tmp_path / "drift_check.yml"
    playbook.write_text("---\n")
    return {"inventory": inventory, "playbook": playbook, "report": tmp_path / "report.json", "metrics": tmp_path / "gpuharden.prom"}


def _listing(hosts):
    return "\nplaybook: drift_check.yml\n\n  play #1 (gpu_nodes): Drift check (read-only)\tTAGS: []\n    pattern: ['gpu_nodes']\n" \
           "    hosts (%d):\n%s\n" % (len(hosts), "".join("      %s\n" % host for host in hosts))


def _fake(monkeypatch, fleet, listed_rc=0, stderr=""):
    """list_hosts answers ``fleet``; run_playbook runs the drift check on the hosts its --limit file names."""
    calls = {"listed": [], "limits": []}

    def list_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=None):
        calls["listed"].append(limit)
        return listed_rc, _listing(fleet), stderr

    def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
        assert limit.startswith("@"), limit
        hosts = Path(limit[1:]).read_text().split()
        calls["limits"].append(hosts)
        for event in _events(hosts):
            event_handler(event)
        return "failed", 2, {}, ""

    monkeypatch.setattr(drift_run, "list_hosts", list_hosts)
    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)
    return calls


def _run_slice(site, value, *extra):
    return cli.main(["drift", "-i", str(site["inventory"]), "--playbook", str(site["playbook"]), "--report", str(site["report"]),
                     "--prometheus", str(site["metrics"]), "--slice", value, *extra])


def test_slice_runs_only_its_hosts_and_records_the_slice(site, monkeypatch, capsys):
    calls = _fake(monkeypatch, FLEET)
    index = drift_slices.slice_of("gpu-b", 3) + 1
    mine = drift_slices.slice_hosts(FLEET, index, 3)
    # its hosts include unreachable and failed ones: not checked
    assert _run_slice(site, "%d/3" % index, "-l", "gpu_nodes") == drift_report.EXIT_NOT_CHECKED
    assert calls["listed"] == ["gpu_nodes"]
    assert calls["limits"] == [mine]
    report = json.loads(site["report"].read_text())
    assert set(report["nodes"]) | set(report["unreachable"]) | set(report["failed"]) == set(mine)
    assert report["limit"] == "gpu_nodes"
    assert report["slice"] == {"index": index, "count": 3, "hosts": mine, "fleet_hosts": len(FLEET),
                               "fleet_sha256": drift_slices.fleet_digest(FLEET)}
    assert "slice %d/3: %d of %d host(s)" % (index, len(mine), len(FLEET)) in capsys.readouterr().err


def test_empty_slice_is_an_empty_valid_report_exit_0(site, monkeypatch, capsys):
    fleet = ["gpu-a"]
    empty = next(index for index in (1, 2) if not drift_slices.slice_hosts(fleet, index, 2))
    calls = _fake(monkeypatch, fleet)
    assert _run_slice(site, "%d/2" % empty) == drift_report.EXIT_CLEAN
    assert calls["limits"] == []
    err = capsys.readouterr().err
    assert "slice %d/2 has no host (the fleet has 1): an empty report, nothing checked" % empty in err
    report = json.loads(site["report"].read_text())
    assert report["nodes"] == {} and report["summary"]["nodes"] == 0 and report["slice"]["hosts"] == []
    assert "gpuharden_last_success_timestamp_seconds" in site["metrics"].read_text()


@pytest.mark.parametrize("listed", [(0, _listing([]), ""),
                                    (1, "", "[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no hosts to target.\n")])
def test_slice_of_an_empty_fleet_is_the_usual_no_host_error(site, monkeypatch, capsys, listed):
    monkeypatch.setattr(drift_run, "list_hosts", lambda *args, **kwargs: listed)
    ran = []

    def run_playbook(playbook, inventory, *, limit, **_kwargs):
        ran.append(limit)
        return "failed", 1, {}, (Path(__file__).parent / "fixtures" / "ansible_output" / "nolimit.txt").read_text()

    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)
    monkeypatch.setattr(drift_run, "play_hosts", lambda *args, **kwargs: set())
    assert _run_slice(site, "1/2", "-l", "nosuch") == drift_report.EXIT_USAGE
    assert ran == ["nosuch"]
    assert "no host to run the drift check on" in capsys.readouterr().err
    assert not site["report"].exists()


def test_slice_whose_host_list_fails_exits_2_with_ansibles_error(site, monkeypatch, capsys):
    _fake(monkeypatch, [], listed_rc=1, stderr="ERROR! the playbook: drift_check.yml could not be found\n")
    assert _run_slice(site, "1/2") == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--slice 1/2: ansible-playbook --list-hosts could not list the hosts to slice (exit 1)" in err
    assert "could not be found" in err
    assert not site["report"].exists()


# ---------------------------------------------------------------------------------------------------
# drift-merge


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 12])
def test_merged_slices_equal_the_unsliced_report_but_for_timings(count):
    whole = _report(FLEET)
    slices = _slice_reports(count)
    merged = drift_slices.merge_reports([("slice-%d.json" % report["slice"]["index"], report) for report in reversed(slices)])
    assert _without_timings(merged) == _without_timings(whole)
    assert drift_report.exit_code(merged) == drift_report.exit_code(whole)
    assert merged["timestamp"] == max(report["timestamp"] for report in slices)
    assert merged["duration_seconds"] == round(merged["timestamp"] - 1_700_000_001.0, 3)


def test_cluster_findings_every_slice_carries_appear_once():
    slices = _slice_reports(3)
    assert all(report["cluster"]["findings"] for report in slices if report["slice"]["hosts"])
    merged = drift_slices.merge_reports([(str(index), report) for index, report in enumerate(slices)])
    ids = [entry["id"] for entry in merged["cluster"]["findings"]]
    assert sorted(ids) == ["requested_resource_not_advertised", "runtime_class_handler_mismatch"]
    assert merged["summary"]["cluster_findings"] == 2


def test_cluster_findings_that_differ_between_slices_are_all_kept():
    slices = _slice_reports(2)
    slices[1]["cluster"]["findings"].append(dict(slices[1]["cluster"]["findings"][0], found="changed meanwhile"))
    merged = drift_slices.merge_reports([("a", slices[0]), ("b", slices[1])])
    assert len(merged["cluster"]["findings"]) == 3


def test_merge_prometheus_is_the_unsliced_one_and_passes_promtool(tmp_path):
    whole = drift_metrics.prometheus_text(_report(FLEET))
    merged = drift_metrics.prometheus_text(drift_slices.merge_reports([(str(index), report) for index, report in enumerate(_slice_reports(3))]))

    def timeless(text):
        return [line for line in text.splitlines() if not re.match(r"gpuharden_last_\w+ ", line)]

    assert timeless(merged) == timeless(whole)
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool not found: install the Debian package prometheus (make system-deps)")
    result = subprocess.run([promtool, "check", "metrics"], input=merged, capture_output=True, text=True)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_drift_merge_command_writes_report_metrics_and_html(tmp_path, capsys):
    paths = _write(tmp_path, _slice_reports(3))
    out = {name: tmp_path / "out" / name for name in ("merged.json", "merged.prom", "merged.html")}
    code = cli.main(["drift-merge", *paths, "--report", str(out["merged.json"]), "--prometheus", str(out["merged.prom"]),
                     "--html", str(out["merged.html"])])
    assert code == drift_report.EXIT_NOT_CHECKED  # the fleet has unreachable and failed hosts
    merged = json.loads(out["merged.json"].read_text())
    assert _without_timings(merged) == _without_timings(_report(FLEET))
    assert out["merged.prom"].read_text() == drift_metrics.prometheus_text(merged)
    assert "<!DOCTYPE html>" in out["merged.html"].read_text()
    assert re.search(r"^%d node\(s\): " % len(FLEET), capsys.readouterr().out, re.M)


def test_drift_merge_of_a_clean_fleet_exits_0(tmp_path, capsys):
    clean = ["gpu-a", "gpu-h", "gpu-i", "gpu-j"]
    reports = []
    for index in (1, 2):
        hosts = drift_slices.slice_hosts(clean, index, 2)
        outcomes = drift_report.Outcomes()
        for event in _events(hosts):
            if event["event_data"].get("task_action") in drift_report.AUDIT_ACTIONS or event["event"] in ("runner_on_start", "playbook_on_stats"):
                outcomes.feed(event)
        outcomes.close()
        report = drift_report.build_report(outcomes, inventory="i", limit=None, fail_severity="warning", started=1.0, finished=2.0)
        reports.append(dict(report, slice=drift_slices.slice_section(index, 2, clean, hosts)))
    assert cli.main(["drift-merge", *_write(tmp_path, reports), "--json"]) == drift_report.EXIT_CLEAN
    assert json.loads(capsys.readouterr().out)["summary"]["clean"] == len(clean)


def test_merge_includes_an_empty_slice():
    fleet = ["gpu-a", "gpu-b"]
    reports = _slice_reports(6, fleet)
    assert any(not report["slice"]["hosts"] for report in reports)
    merged = drift_slices.merge_reports([(str(index), report) for index, report in enumerate(reports)])
    assert _without_timings(merged) == _without_timings(_report(fleet))


def _refused(tmp_path, capsys, paths, *expected):
    target = tmp_path / "out.json"
    target.write_text("previous\n")
    assert cli.main(["drift-merge", *paths, "--report", str(target), "--prometheus", str(tmp_path / "out.prom")]) == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert err.startswith("gpuharden drift-merge: ") and "nothing written" in err
    assert target.read_text() == "previous\n" and not (tmp_path / "out.prom").exists()


def test_merge_refuses_overlapping_hosts(tmp_path, capsys):
    reports = _slice_reports(2)
    stolen = reports[0]["slice"]["hosts"][0]
    reports[1]["nodes"][stolen] = reports[0]["nodes"].get(stolen) or {"node": stolen, "status": "clean", "findings": []}
    paths = _write(tmp_path, reports)
    _refused(tmp_path, capsys, paths, "%s and %s both report host %s" % (paths[0], paths[1], stolen))


def test_merge_refuses_another_schema_version(tmp_path, capsys):
    reports = _slice_reports(2)
    reports[1]["version"] = 2
    paths = _write(tmp_path, reports)
    _refused(tmp_path, capsys, paths, "%s has report schema version 2" % paths[1])


@pytest.mark.parametrize("content", ["not json at all", "[1, 2]", '{"hello": "world"}', '{"version": 1, "nodes": {}}'])
def test_merge_refuses_what_is_not_a_drift_report(tmp_path, capsys, content):
    paths = _write(tmp_path, _slice_reports(2))
    stranger = tmp_path / "stranger.json"
    stranger.write_text(content)
    _refused(tmp_path, capsys, [*paths, str(stranger)], "%s is not a gpuharden drift report" % stranger)


def test_merge_refuses_an_unsliced_report(tmp_path, capsys):
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(_report(FLEET)))
    _refused(tmp_path, capsys, [str(whole)], "%s is not a slice report (written without --slice)" % whole)


def test_merge_refuses_a_missing_file(tmp_path, capsys):
    _refused(tmp_path, capsys, [str(tmp_path / "nosuch.json")], "%s: No such file or directory" % (tmp_path / "nosuch.json"))


def test_merge_refuses_a_missing_or_repeated_slice(tmp_path, capsys):
    paths = _write(tmp_path, _slice_reports(3))
    _refused(tmp_path, capsys, paths[:2], "slice(s) 3 of 3 missing")
    copy = tmp_path / "again.json"
    shutil.copy(paths[0], copy)
    _refused(tmp_path, capsys, [*paths, str(copy)], "%s is slice 1/3 again (also %s)" % (copy, paths[0]))


def test_merge_refuses_slices_of_different_runs(tmp_path, capsys):
    three, two = _slice_reports(3), _slice_reports(2)
    (tmp_path / "three").mkdir()
    (tmp_path / "two").mkdir()
    _refused(tmp_path, capsys, [_write(tmp_path / "three", three)[0], _write(tmp_path / "two", two)[1]], "is of 3 slices")
    other = _slice_reports(2, FLEET + ["gpu-new"])
    (tmp_path / "other").mkdir()
    _refused(tmp_path, capsys, [_write(tmp_path / "two", two)[0], _write(tmp_path / "other", other)[1]],
             "was cut from another host list", "changed between the slices")
    strict = [dict(report, fail_severity="error") for report in two]
    (tmp_path / "strict").mkdir()
    _refused(tmp_path, capsys, [_write(tmp_path / "two", two)[0], _write(tmp_path / "strict", strict)[1]], "--fail-severity error")


def test_merge_combines_remediation_runs():
    reports = _slice_reports(2)
    for report in reports:
        report["remediation"] = {"runs": [{"hosts": report["slice"]["hosts"][:1], "stages": ["x"], "rc": 0}],
                                 "before": dict(report["summary"])}
    merged = drift_slices.merge_reports([("a", reports[0]), ("b", reports[1])])
    assert [run["hosts"] for run in merged["remediation"]["runs"]] == [report["slice"]["hosts"][:1] for report in reports]
    before = merged["remediation"]["before"]
    assert before["nodes"] == len(FLEET) and before["cluster_findings"] == reports[0]["summary"]["cluster_findings"]


# ---------------------------------------------------------------------------------------------------
# The sliced CronJob


@pytest.fixture(scope="module")
def sliced():
    (listing,) = [doc for doc in yaml.safe_load_all(SLICED_CRONJOB.read_text()) if doc]
    assert listing["apiVersion"] == "v1" and listing["kind"] == "List"
    return {doc["kind"]: doc for doc in listing["items"]}


def test_sliced_cronjob_is_an_indexed_job_of_n_slices(sliced):
    assert SLICED_CRONJOB.read_text().startswith("# SPDX-License-Identifier: GPL-3.0-or-later\n")
    cronjob = sliced["CronJob"]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    job = cronjob["jobTemplate"]["spec"]
    assert job["completionMode"] == "Indexed"
    count = job["completions"]
    assert count >= 2 and 1 <= job["parallelism"] <= count
    (container,) = job["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["SLICES"]["value"] == str(count)
    assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/job-name']"
    script = container["command"][2]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert "slice=$((JOB_COMPLETION_INDEX + 1))" in script
    drift_line = re.search(r"^gpuharden drift .*?(?<!\\)$", script, re.M | re.S).group(0).replace("\\\n", " ")
    assert '--slice "$slice/$SLICES"' in drift_line
    words = drift_line.replace('"$slice/$SLICES"', "2/%d" % count).replace('"$run/slice-$slice.json"', "/r/slice-2.json").split()
    parsed = cli.build_parser().parse_args(words[1:])
    assert parsed.slice == (2, count) and parsed.report == "/r/slice-2.json" and not parsed.remediate
    assert "gpuharden drift-merge" in script
    # the slices and the merge share one volume across nodes, which outlives the pods
    volumes = {volume["name"]: volume for volume in job["template"]["spec"]["volumes"]}
    (reports,) = [mount for mount in container["volumeMounts"] if mount["mountPath"] == env["REPORTS"]["value"]]
    claim = volumes[reports["name"]]["persistentVolumeClaim"]["claimName"]
    assert sliced["PersistentVolumeClaim"]["metadata"]["name"] == claim
    assert sliced["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    rules = job["podFailurePolicy"]["rules"]
    # drift (1) leaves the pod with 0 as in drift-cronjob.yaml (tests/unit/test_incluster.py runs every code)
    assert set(next(rule for rule in rules if "onExitCodes" in rule)["onExitCodes"]["values"]) == {2, 4}


def _pod(script, env, index):
    return subprocess.run(["/bin/sh", "-c", script], env=dict(env, JOB_COMPLETION_INDEX=str(index)), capture_output=True, text=True,
                          timeout=60, check=False)


def test_sliced_cronjob_pods_check_their_slice_and_slice_1_merges(sliced, tmp_path, pushgateway):
    """The pods' shell with a fake `gpuharden drift` that writes this module's slice reports: the other slices exit
    0 on drift, slice 1 waits for them, merges with the real drift-merge, pushes the merged metrics to a real
    Pushgateway and exits with the merge's status."""
    job = sliced["CronJob"]["spec"]["jobTemplate"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    count = job["completions"]
    reports = {report["slice"]["index"]: report for report in _slice_reports(count)}
    for index, report in reports.items():
        (tmp_path / ("given-%d.json" % index)).write_text(json.dumps(report))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gpuharden"
    fake.write_text("""#!/bin/sh
if [ "$1" = drift-merge ]; then exec %s -m gpuharden.cli "$@"; fi
while [ $# -gt 0 ]; do
  case $1 in --slice) slice=${2%%%%/*}; shift ;; --report) report=$2; shift ;; esac
  shift
done
cp %s/given-$slice.json "$report"
exit 1
""" % (sys.executable, tmp_path))
    fake.chmod(0o755)
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    env.update(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), REPORTS=str(tmp_path / "reports"), JOB_NAME="drift-123",
               MERGE_POLL_SECONDS="0.1", PUSHGATEWAY_URL=pushgateway, CLUSTER_NAME="sliced-test")
    (tmp_path / "reports" / "slices" / "drift-100").mkdir(parents=True)  # an earlier Job's
    script = container["command"][2]
    for index in range(1, count):
        assert _pod(script, env, index).returncode == 0
    leader = _pod(script, env, 0)
    assert leader.returncode == drift_report.EXIT_NOT_CHECKED, leader.stderr  # unreachable and failed hosts
    merged = json.loads((tmp_path / "reports" / "drift-report.json").read_text())
    assert _without_timings(merged) == _without_timings(_report(FLEET))
    assert (tmp_path / "reports" / "gpuharden.prom").read_text() == drift_metrics.prometheus_text(merged)
    assert sorted(os.listdir(tmp_path / "reports" / "slices")) == ["drift-123"]
    with urllib.request.urlopen(pushgateway + "/metrics", timeout=10) as answer:
        exposed = answer.read().decode()
    assert 'gpuharden_drift_not_checked{instance="sliced-test",job="gpuharden_drift"} 1' in exposed


def test_real_slices_contact_only_their_hosts(tmp_path, monkeypatch, capsys):
    """ansible-playbook itself: --list-hosts read, the --limit file honoured.  The hosts are on TEST-NET-1, so each
    host a slice tried is reported unreachable, and exactly the slice's hosts are."""
    monkeypatch.setenv("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
    fleet = ["gpu-%d" % number for number in range(5)]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {host: {"ansible_host": "192.0.2.%d" % (10 + number)} for number, host in enumerate(fleet)},
                      "vars": {"ansible_ssh_common_args": "-o ConnectTimeout=1"}},
        "control_plane": {"hosts": {"cp-1": {"ansible_host": "192.0.2.20"}}}}}}))
    paths = []
    for index in (1, 2):
        paths.append(str(tmp_path / ("slice-%d.json" % index)))
        code = cli.main(["drift", "-i", str(inventory), "--playbook", str(REPO / "playbooks" / "drift_check.yml"), "-q",
                         "--slice", "%d/2" % index, "--report", paths[-1]])
        assert code == drift_report.EXIT_NOT_CHECKED, capsys.readouterr().err  # every host it tried is unreachable
        report = json.loads(Path(paths[-1]).read_text())
        assert sorted(report["unreachable"]) == drift_slices.slice_hosts(fleet, index, 2) == report["slice"]["hosts"]
        assert report["limit"] is None and report["slice"]["fleet_hosts"] == len(fleet)
    capsys.readouterr()
    assert cli.main(["drift-merge", *paths, "--json"]) == drift_report.EXIT_NOT_CHECKED
    assert sorted(json.loads(capsys.readouterr().out)["unreachable"]) == fleet
