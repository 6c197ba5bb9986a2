# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpuharden command (issue 16, items 5 and 6): help that explains, failures that read.

Item 6: every command has a description, examples and its exit codes in --help.  Item 5: a run that fails says
why in ansible-playbook's own first error lines (no colour codes, a truthful exit status), and a run with no host
to work on fails and names the pattern or -l that matched nothing: `gpuharden drift` (exit 2), `gpuharden facts`
(exit 2), and harden_gpu_nodes.yml / bootstrap_gpu_node.yml themselves (ansible-playbook alone exits 0 there).

The output samples under fixtures/ansible_output are real ansible-core 2.19 runs through ansible-runner (coloured,
with this checkout's ansible.cfg); the last tests run ansible-playbook on throwaway inventories whose hosts are
unreachable (TEST-NET) or the controller itself in check mode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path

import ansible_runner
import pytest
import yaml

from gpuharden import ansible_output, cli, drift_report, drift_run

REPO = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "fixtures" / "ansible_output"
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
       "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


def sample(name):
    return (SAMPLES / ("%s.txt" % name)).read_text()


def help_text(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def subparser(name):
    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices[name]


# ---------------------------------------------------------------------------------------------------
# Item 6: help


def test_item6_top_level_help_describes_the_tool_with_examples_and_exit_codes(capsys):
    text = help_text(capsys)
    assert "The `gpuharden` command." not in text
    assert "harden the GPU nodes of a Kubernetes cluster" in text
    assert "examples:" in text and "gpuharden drift -i inventory/" in text and "gpuharden facts -i inventory/" in text
    assert "ansible-playbook -i inventory/ gpuharden.k8s.harden_gpu_nodes" in text
    assert "exit codes" in text and "128+N" in text


def test_item6_drift_help_has_description_examples_and_exit_codes(capsys):
    text = help_text(capsys, "drift")
    description = text.split("options:")[0]
    assert "read-only" in description and "gpuharden_target_hosts (default gpu_nodes)" in description
    examples = text.split("examples:")[1].split("exit codes:")[0]
    lines = [line.strip() for line in examples.splitlines()]
    assert "gpuharden drift -i inventory/" in lines  # the first survey
    cron = examples[examples.index("cron"):]
    assert "--report /" in cron and "--prometheus /" in cron
    assert any(line.startswith("gpuharden drift") and "-l " in line and "--remediate" in line for line in lines)
    codes = text.split("exit codes:")[1]
    for code in (drift_report.EXIT_CLEAN, drift_report.EXIT_DRIFT, drift_report.EXIT_USAGE, drift_report.EXIT_INCOMPLETE):
        assert re.search(r"^  %d\s+\S" % code, codes, re.M), code
    assert "%d+N" % drift_report.EXIT_SIGNAL_BASE in codes and "130 SIGINT" in codes and "143 SIGTERM" in codes


def test_item6_drift_help_separates_drift_from_incomplete(capsys):
    codes = " ".join(help_text(capsys, "drift").split("exit codes:")[1].split())
    drift_line = codes[codes.index("1 DRIFT"):codes.index("2 usage")]
    incomplete_line = codes[codes.index("3 INCOMPLETE"):codes.index("128+N")]
    assert "an answer" in drift_line and "differs from the desired state" in drift_line and "written" in drift_line
    assert "no answer" in incomplete_line and "could not finish" in incomplete_line
    assert "the fleet's state is unknown" in incomplete_line and "neither clean nor drifted" in incomplete_line
    assert "nothing written" in incomplete_line
    assert "no host to check" in codes[codes.index("2 usage"):codes.index("3 INCOMPLETE")]


def test_drift_help_explains_slices_and_their_merge(capsys):
    text = " ".join(help_text(capsys, "drift").split())
    assert "--slice K/N" in text and "sha256(inventory host name)" in text and "mod N is K-1" in text
    assert "gpuharden drift -i inventory/ --slice 2/3" in text
    assert "gpuharden drift-merge" in text and "not contacted" in text
    merge = help_text(capsys, "drift-merge")
    assert "--slice 1/N" in merge and "examples:" in merge
    codes = merge.split("exit codes:")[1]
    for code in (drift_report.EXIT_CLEAN, drift_report.EXIT_DRIFT, drift_report.EXIT_USAGE):
        assert re.search(r"^  %d\s+\S" % code, codes, re.M), code
    assert "gpuharden drift -i inventory/ --slice 2/3" in help_text(capsys)


def test_item6_facts_help_has_description_option_help_and_exit_codes(capsys):
    text = help_text(capsys, "facts")
    assert "Gather GPU facts from every host" in text and "read-only" in text
    assert '"-" when the platform gives none' in text and '"?" when sysfs could not be read' in text
    assert "examples:" in text and "gpuharden facts -i inventory/" in text
    codes = text.split("exit codes:")[1]
    for code in (0, 1, 2):
        assert re.search(r"^  %d\s+\S" % code, codes, re.M), code


@pytest.mark.parametrize("name", ["facts", "drift", "drift-merge"])
def test_item6_every_option_has_help(name):
    for action in subparser(name)._actions:
        if action.help == argparse.SUPPRESS:
            continue  # the hidden test hooks (--playbook, --harden-playbook)
        assert action.help, action.option_strings


# ---------------------------------------------------------------------------------------------------
# Item 5: reading ansible's output


def test_item5_yaml_syntax_error_excerpt_starts_at_the_error_with_its_context():
    excerpt = ansible_output.error_excerpt(sample("yaml"))
    assert "\x1b" not in excerpt and "\r" not in excerpt
    lines = excerpt.split("\n")
    assert lines[0] == "[ERROR]: YAML parsing failed: While parsing a block mapping did not find expected key."
    assert lines[1] == "Origin: /srv/gpuharden/bad_yaml.yml:8:8"
    assert "8        bad: indent" in lines and "         ^ column 8" in lines


def test_item5_undefined_variable_fatal_excerpt_names_the_variable_and_the_host():
    excerpt = ansible_output.error_excerpt(sample("undef"))
    assert "\x1b" not in excerpt
    first = excerpt.split("\n")[0]
    assert first.startswith("[ERROR]: Task failed:") and "'no_such_variable' is undefined" in first
    assert "Origin: /srv/gpuharden/undef.yml:5:7" in excerpt
    assert "fatal: [gpu-a -> localhost]: FAILED!" in excerpt  # the host, from the further errors
    assert "PLAY RECAP" not in excerpt and "ok=0" not in excerpt
    assert len(excerpt.split("\n")) <= 14 + 1 + 3


def test_item5_fatal_task_result_keeps_its_msg_lines():
    text = ("TASK [Take the node's run lock] ****\n\x1b[0;31mfatal: [gpu-b]: FAILED! => \x1b[0m\n\x1b[0;31m    changed: false\x1b[0m\n"
            "\x1b[0;31m    msg: lock held by harden@ci-1\x1b[0m\n\nPLAY RECAP ****\ngpu-b : ok=1 changed=0 unreachable=0 failed=1\n")
    assert ansible_output.error_excerpt(text) == "fatal: [gpu-b]: FAILED! =>\n    changed: false\n    msg: lock held by harden@ci-1"


def test_item5_pre_2_19_error_format_is_found_too():
    text = ("ERROR! We were unable to read either as JSON nor YAML, these are the errors we got from each:\n"
            "JSON: Expecting value: line 1 column 1 (char 0)\n\nSyntax Error while loading YAML.\n  did not find expected key\n\n"
            "The error appears to be in '/srv/pb.yml': line 8, column 8, but may\nbe elsewhere in the file depending on the exact syntax problem.\n")
    excerpt = ansible_output.error_excerpt("some banner\n" + text)
    assert excerpt.startswith("ERROR! We were unable to read") and "line 8, column 8" in excerpt


def test_item5_without_an_error_line_the_excerpt_is_the_last_lines_without_recap():
    text = "PLAY [x] ***\n\nTASK [y] ***\nok: [a]\nsomething went away\n\nPLAY RECAP ***\na : ok=1 changed=0 unreachable=0 failed=0\n"
    assert ansible_output.error_excerpt(text) == "ok: [a]\nsomething went away"
    assert ansible_output.error_excerpt("") == ""


def test_item5_ansi_codes_are_stripped():
    assert ansible_output.strip_ansi("\x1b[0;31m[ERROR]: x\x1b[0m\r\n\x1b[1;35mw\x1b[0m\x1b]8;;http://x\x07link\x1b]8;;\x07") == "[ERROR]: x\nwlink"


@pytest.mark.parametrize("status, rc, expected", [
    ("successful", 0, "exit code 0, success"),
    ("failed", 2, "exit code 2, a host failed"),
    ("failed", 4, "exit code 4, a host unreachable, or a parse error"),
    ("failed", 250, "exit code 250, an unexpected error"),
    ("failed", 17, "exit code 17, an error"),
    ("canceled", 254, "ansible-runner status canceled, exit code 254"),
    ("timeout", None, "ansible-runner status timeout"),
])
def test_item5_exit_status_wording_is_truthful(status, rc, expected):
    text = ansible_output.describe_exit(status, rc)
    assert text == expected
    assert "successful" not in text  # ansible-runner's word for rc 0 is never shown for anything


@pytest.mark.parametrize("name, limit, unmatched, kind, reason", [
    ("nogroup", None, ["nogroup"], "pattern",
     "the play's hosts pattern nogroup (gpuharden_target_hosts, default gpu_nodes) matches no host of the inventory hosts.yml; "
     "no group or host named nogroup"),
    ("limit_other", "cp1", ["gpu_nodes"], "pattern",
     "the play's hosts pattern gpu_nodes (gpuharden_target_hosts, default gpu_nodes) matches no host of the inventory hosts.yml within -l cp1"),
    ("nolimit", "nosuch", [], "limit", "-l nosuch matches no host of the inventory hosts.yml; no group or host named nosuch"),
    ("empty", None, ["gpu_nodes"], "inventory", "the inventory hosts.yml has no hosts; no group or host named gpu_nodes"),
])
def test_item5_no_hosts_names_the_pattern_or_the_limit(name, limit, unmatched, kind, reason):
    assert ansible_output.no_hosts(sample(name), inventory="hosts.yml", limit=limit, unmatched_plays=unmatched,
                                   pattern_variable=drift_run.TARGET_VARIABLE) == (kind, reason)


@pytest.mark.parametrize("name", ["yaml", "undef"])
def test_item5_errors_that_are_not_about_hosts_are_not_taken_for_no_hosts(name):
    assert ansible_output.no_hosts(sample(name), inventory="hosts.yml") is None


# ---------------------------------------------------------------------------------------------------
# Item 5: gpuharden drift (ansible-runner replaced by a fake that feeds events and output)


@pytest.fixture
def site(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    playbook = tmp_path / "drift_check.yml"
    playbook.write_text("---\n")
    report, metrics = tmp_path / "report.json", tmp_path / "gpuharden.prom"
    report.write_text("previous\n")
    metrics.write_text("previous\n")
    return {"inventory": inventory, "playbook": playbook, "report": report, "metrics": metrics}


def fake_runs(monkeypatch, *runs):
    """run_playbook replaced: each call takes the next (events, status, rc, stdout)."""
    queue, calls = list(runs), []

    def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
        calls.append({"playbook": playbook, "limit": limit, "tags": tags})
        events, status, rc, stdout = queue.pop(0)
        for event in events:
            event_handler(event)
        return status, rc, {}, stdout

    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)
    monkeypatch.setattr(drift_run, "play_hosts", lambda *args, **kwargs: set())
    return calls


def play(pattern, matched=True):
    events = [{"event": "playbook_on_play_start", "event_data": {"play": "P", "play_pattern": pattern, "name": "P"}}]
    if not matched:
        events.append({"event": "playbook_on_no_hosts_matched", "event_data": {"play": "P", "play_pattern": pattern}})
    return events


STATS = {"event": "playbook_on_stats", "event_data": {"processed": {}, "ok": {}, "failures": {}, "dark": {}}}


def audited(host, findings=()):
    return [{"event": "runner_on_start", "event_data": {"host": host}},
            {"event": "runner_on_ok", "event_data": {"host": host, "task": "Audit", "task_action": "gpuharden.k8s.node_audit",
                                                       "res": {"findings": list(findings), "summary": {"findings": len(findings)},
                                                               "checks": {}, "seconds": 0.1}}}]


def run_drift(site, *extra):
    return cli.main(["drift", "-i", str(site["inventory"]), "--playbook", str(site["playbook"]), "--report", str(site["report"]),
                     "--prometheus", str(site["metrics"]), *extra])


def untouched(site):
    assert site["report"].read_text() == "previous\n" and site["metrics"].read_text() == "previous\n"


def test_item5_drift_with_no_host_in_the_group_exits_2_naming_the_group(site, monkeypatch, capsys):
    fake_runs(monkeypatch, (play("gpu_nodes", matched=False) + [STATS], "successful", 0, sample("limit_other")))
    assert run_drift(site, "-l", "cp1") == drift_report.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    untouched(site)
    assert ("gpuharden drift: no host to run the drift check on: the play's hosts pattern gpu_nodes (gpuharden_target_hosts, "
            "default gpu_nodes) matches no host of the inventory %s within -l cp1." % site["inventory"]) in err
    assert "-e gpuharden_target_hosts=GROUP" in err and "widen -l" in err
    assert "successful" not in err and "rc 0" not in err


def test_item5_drift_with_a_limit_matching_nothing_exits_2_naming_the_limit(site, monkeypatch, capsys):
    fake_runs(monkeypatch, ([], "failed", 1, sample("nolimit")))
    assert run_drift(site, "-l", "nosuch") == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    untouched(site)
    assert "no host to run the drift check on: -l nosuch matches no host of the inventory" in err
    assert "give -l hosts or groups of the inventory" in err


def test_item5_drift_on_a_playbook_that_does_not_parse_shows_the_yaml_error(site, monkeypatch, capsys):
    fake_runs(monkeypatch, ([], "failed", 4, sample("yaml")))
    assert run_drift(site) == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    untouched(site)
    assert "\x1b" not in err
    assert err.startswith("gpuharden drift: ansible-playbook ran the drift check on no host (exit code 4, a host unreachable, "
                          "or a parse error):\n  [ERROR]: YAML parsing failed: While parsing a block mapping did not find expected key.\n"
                          "  Origin: /srv/gpuharden/bad_yaml.yml:8:8\n")
    assert "  8        bad: indent\n" in err


def test_item5_drift_that_ran_nothing_with_rc_0_does_not_say_successful(site, monkeypatch, capsys):
    fake_runs(monkeypatch, ([STATS], "successful", 0, ""))
    assert run_drift(site) == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ran the drift check on no host (exit code 0, success), and printed nothing" in err
    assert "(successful, rc 0)" not in err


def test_item5_drift_cut_short_shows_ansible_playbooks_error(site, monkeypatch, capsys):
    fake_runs(monkeypatch, (audited("gpu-a"), "failed", 250, "PLAY [Drift]\n\x1b[0;31m[ERROR]: Unexpected Exception: boom\x1b[0m\n"
                                                               "the full traceback was:\n  File x\n"))
    assert run_drift(site) == drift_report.EXIT_INCOMPLETE
    err = capsys.readouterr().err
    untouched(site)
    assert "INCOMPLETE, ansible-playbook stopped before the end of the play (exit code 250, an unexpected error)" in err
    assert "gpuharden drift: ansible-playbook said:\n  [ERROR]: Unexpected Exception: boom\n" in err


def test_item5_remediate_with_no_host_exits_2_before_any_harden_run(site, monkeypatch, capsys):
    calls = fake_runs(monkeypatch, (play("gpu_nodes", matched=False) + [STATS], "successful", 0, sample("limit_other")))
    assert run_drift(site, "-l", "cp1", "--remediate", "--harden-playbook", str(site["playbook"])) == drift_report.EXIT_USAGE
    assert len(calls) == 1  # the check only
    assert "no host to run the drift check on" in capsys.readouterr().err
    untouched(site)


DRIFTED = [{"id": "x", "check": "device_nodes", "stage": "device_permissions", "severity": "error", "remediable": True}]


def test_item5_remediate_whose_harden_matches_no_host_exits_2(site, monkeypatch, capsys):
    harden_output = ("PLAY [Harden GPU nodes, every node at once] ***\nskipping: no hosts matched\n"
                     "fatal: [gpu-a]: FAILED! => \n    msg: 'No GPU node to harden: ...'\n")
    fake_runs(monkeypatch, (audited("gpu-a", DRIFTED) + [STATS], "successful", 0, ""),
              (play("gpu_nodes", matched=False) + play("[]", matched=False), "failed", 2, harden_output))
    assert run_drift(site, "--remediate", "--harden-playbook", str(site["playbook"])) == drift_report.EXIT_USAGE
    err = capsys.readouterr().err
    untouched(site)
    assert ("no host to run harden_gpu_nodes.yml (--remediate) on: the play's hosts pattern gpu_nodes (gpuharden_target_hosts, "
            "default gpu_nodes) matches no host of the inventory %s within -l gpu-a." % site["inventory"]) in err


def test_item5_remediate_harden_failure_is_shown_and_reported(site, monkeypatch, capsys):
    harden_output = ("PLAY [Harden] ***\nTASK [Take the node's run lock] ***\nfatal: [gpu-a]: FAILED! => \n    changed: false\n"
                     "    msg: lock held by drift@other\n\nPLAY RECAP ***\ngpu-a : ok=3 changed=0 unreachable=0 failed=1\n")
    fake_runs(monkeypatch, (audited("gpu-a", DRIFTED) + [STATS], "successful", 0, ""),
              (play("gpu_nodes") + [STATS], "failed", 2, harden_output),
              (audited("gpu-a", DRIFTED) + [STATS], "successful", 0, ""))
    assert run_drift(site, "--remediate", "--harden-playbook", str(site["playbook"]), "--json") == drift_report.EXIT_DRIFT
    out, err = capsys.readouterr()
    assert ("gpuharden drift: harden_gpu_nodes.yml on gpu-a failed (exit code 2, a host failed):\n"
            "  fatal: [gpu-a]: FAILED! =>\n      changed: false\n      msg: lock held by drift@other\n") in err
    run = json.loads(out)["remediation"]["runs"][0]
    assert run["rc"] == 2 and run["error"].endswith("msg: lock held by drift@other")


def test_remediate_is_one_harden_run_over_the_drifted_hosts_with_the_stages_any_of_them_needs(site, monkeypatch, capsys):
    """One run keeps harden's order across the nodes (the disruptive steps, then the device plugin): runs per set of
    stages rolled the plugin out over every GPU node before another run repaired a stopped kubelet (real kubelet)."""
    runtime = [dict(DRIFTED[0], check="containerd", stage="container_runtime")]
    kubelet = [dict(DRIFTED[0], check="kubelet", stage="kubelet_topology"), dict(DRIFTED[0], check="consistency", stage="device_plugin")]
    calls = fake_runs(monkeypatch, (audited("gpu-a", runtime) + audited("gpu-b", kubelet) + audited("gpu-c") + [STATS], "successful", 0, ""),
                      (play("gpu_nodes") + [STATS], "successful", 0, ""),
                      (audited("gpu-a") + audited("gpu-b") + [STATS], "successful", 0, ""))
    assert run_drift(site, "--remediate", "--harden-playbook", str(site["playbook"]), "--json") == drift_report.EXIT_CLEAN
    check, harden, recheck = calls  # the drift check, one harden run, the drift check of the remediated hosts
    assert (harden["limit"], harden["tags"]) == ("gpu-a,gpu-b", ["container_runtime", "device_plugin", "kubelet_topology"])
    assert check["tags"] is None and recheck["limit"] == "gpu-a,gpu-b"
    [run] = json.loads(capsys.readouterr().out)["remediation"]["runs"]
    assert run["stages_by_host"] == {"gpu-a": ["container_runtime"], "gpu-b": ["device_plugin", "kubelet_topology"]}


# ---------------------------------------------------------------------------------------------------
# Item 5: no colour, for drift and facts


def test_item5_runner_env_turns_colour_off_even_when_forced(monkeypatch):
    monkeypatch.setenv("ANSIBLE_FORCE_COLOR", "1")
    env = drift_run.runner_env()
    assert env["ANSIBLE_NOCOLOR"] == "1" and env["ANSIBLE_FORCE_COLOR"] == "0"


class FakeRunner:
    def __init__(self, events, stdout="", status="successful", rc=0):
        self.events, self.status, self.rc, self.stats = events, status, rc, {}
        self.stdout = types.SimpleNamespace(read=lambda: stdout)


def test_item5_run_playbook_hands_the_no_colour_env_to_ansible_runner(monkeypatch, tmp_path):
    seen = {}

    def run(**kwargs):
        seen.update(kwargs)
        return FakeRunner([])

    monkeypatch.setattr(ansible_runner, "run", run)
    drift_run.run_playbook(str(tmp_path / "p.yml"), str(tmp_path / "hosts.yml"), limit=None, forks=1, extravars={})
    assert seen["envvars"]["ANSIBLE_NOCOLOR"] == "1" and seen["envvars"]["ANSIBLE_FORCE_COLOR"] == "0"
    assert drift_run.RUN_MARKER in seen["envvars"]


def gpu(index, numa):
    return {"index": index, "name": "NVIDIA H100", "pci_bus_id": "00000000:1%d:00.0" % index, "numa_node": numa,
            "mig": {"capable": index == 0, "mode_current": "disabled"}}


def test_item5_facts_shows_numa_meaningfully_and_runs_without_colour(monkeypatch, tmp_path, capsys):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    seen = {}
    facts = {"nvml": {"available": True}, "gpus": [gpu(0, 0), gpu(1, -1), gpu(2, None)]}

    def run(**kwargs):
        seen.update(kwargs)
        return FakeRunner([{"event": "runner_on_ok", "event_data": {"host": "gpu-a", "res": {"ansible_facts": {"gpuharden": facts}}}}])

    monkeypatch.setattr(ansible_runner, "run", run)
    assert cli.main(["facts", "-i", str(inventory)]) == 0
    out = capsys.readouterr().out
    assert seen["envvars"]["ANSIBLE_NOCOLOR"] == "1" and seen["envvars"]["ANSIBLE_FORCE_COLOR"] == "0"
    assert "None" not in out
    rows = [line.split("\t") for line in out.strip().split("\n")]
    assert [row[4] for row in rows] == ["NUMA 0", "NUMA -", "NUMA ?"]
    assert [row[5] for row in rows] == ["MIG disabled", "MIG n/a", "MIG n/a"]


@pytest.mark.parametrize("stdout, status, rc, expected", [
    ("\x1b[1;35m[WARNING]: Could not match supplied host pattern, ignoring: nosuch\x1b[0m\n"
     "\x1b[1;35m[WARNING]: No hosts matched, nothing to do\x1b[0m\n", "successful", 0,
     "gpuharden facts: no host to gather facts from: -l nosuch matches no host of the inventory %s; no group or host named nosuch\n"),
    ("\x1b[0;31m[ERROR]: Unable to parse x\x1b[0m\n", "failed", 1,
     "gpuharden facts: ansible ran gpu_facts on no host (exit code 1, an error):\n  [ERROR]: Unable to parse x\n"),
])
def test_item5_facts_that_ran_on_no_host_says_why(monkeypatch, tmp_path, capsys, stdout, status, rc, expected):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    monkeypatch.setattr(ansible_runner, "run", lambda **kwargs: FakeRunner([], stdout, status, rc))
    assert cli.main(["facts", "-i", str(inventory), "-l", "nosuch"]) == 2
    assert capsys.readouterr().err == expected.replace("%s", str(inventory))


# ---------------------------------------------------------------------------------------------------
# Item 5: real ansible-playbook runs of the playbooks on throwaway inventories


def throwaway_inventory(tmp_path):
    """Two GPU nodes and a control-plane host on TEST-NET-1 (a task that tried them would report them unreachable),
    and gpu-local, the controller itself."""
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {"gpu-a": {"ansible_host": "192.0.2.10"}, "gpu-b": {"ansible_host": "192.0.2.11"},
                                "gpu-local": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
                      "vars": {"ansible_ssh_common_args": "-o ConnectTimeout=1"}},
        "control_plane": {"hosts": {"cp-1": {"ansible_host": "192.0.2.20"}}}}}}))
    return str(path)


def run_playbook(tmp_path, playbook, inventory, *, limit=None, extravars=None, cmdline=None):
    events = []
    private = tempfile.mkdtemp(prefix="runner-", dir=tmp_path)
    runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=inventory, playbook=str(REPO / "playbooks" / playbook),
                                limit=limit, extravars=extravars or {}, cmdline=cmdline, quiet=True,
                                event_handler=lambda event: events.append(event) or True)
    results = [(event["event"], event["event_data"].get("host"), event["event_data"].get("task"), event["event_data"].get("res") or {})
               for event in events if event["event"].startswith("runner_on_") and event["event"] != "runner_on_start"]
    return runner, results


@pytest.mark.parametrize("playbook, what", [("harden_gpu_nodes.yml", "harden"), ("bootstrap_gpu_node.yml", "bootstrap")])
def test_item5_playbook_whose_limit_leaves_no_gpu_node_fails(tmp_path, playbook, what):
    runner, results = run_playbook(tmp_path, playbook, throwaway_inventory(tmp_path), limit="cp-1")
    assert runner.rc != 0 and runner.status == "failed"
    # one failure, from the controller (the task contacts no host: no runner_on_unreachable)
    assert [(event, host) for event, host, _task, _res in results] == [("runner_on_failed", "cp-1")]
    assert results[0][3]["msg"] == (
        "No GPU node to %s: the hosts pattern 'gpu_nodes' (gpuharden_target_hosts, default gpu_nodes) matched no host of "
        "the inventory within --limit 'cp-1'. Put the %sGPU nodes in that group, or set gpuharden_target_hosts to their group "
        "or pattern." % (what, "new " if what == "bootstrap" else ""))


def test_item5_harden_whose_target_group_is_missing_fails_naming_it(tmp_path):
    runner, results = run_playbook(tmp_path, "harden_gpu_nodes.yml", throwaway_inventory(tmp_path),
                                   extravars={"gpuharden_target_hosts": "gpu_nodez"}, cmdline="--tags device_permissions")
    assert runner.rc != 0
    assert [(event, host) for event, host, _task, _res in results] == [("runner_on_failed", "localhost")]
    assert "the hosts pattern 'gpu_nodez' (gpuharden_target_hosts, default gpu_nodes) matched no host of the inventory." in results[0][3]["msg"]
    assert "Could not match supplied host pattern, ignoring: gpu_nodez" in runner.stdout.read()


def test_item5_harden_that_matched_a_node_passes_the_last_play(tmp_path):
    """The controller as a GPU node, in check mode and with a tag no stage has: only the tasks tagged always run
    (the variable check, gpu_facts, the lock in check mode); the last play's check is skipped and the run passes.
    Also: --tags without kubelet_topology (as --remediate runs harden) no longer trips on the kubelet apply stage."""
    runner, results = run_playbook(tmp_path, "harden_gpu_nodes.yml", throwaway_inventory(tmp_path), limit="gpu-local",
                                   extravars={"gpuharden_allow_non_gpu_nodes": True, "gpuharden_lock_path": str(tmp_path / "run.lock")},
                                   cmdline="--check --tags gpuharden_no_such_stage")
    assert runner.rc == 0, runner.stdout.read()[-3000:]
    assert not [entry for entry in results if entry[0] in ("runner_on_failed", "runner_on_unreachable")]
    assert results[-1][:3] == ("runner_on_skipped", "gpu-local", "Fail when the first play matched no host")
    assert not (tmp_path / "run.lock").exists()


def test_item5_gpuharden_drift_on_a_real_run_with_no_gpu_node_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANSIBLE_CONFIG", ENV["ANSIBLE_CONFIG"])
    monkeypatch.setenv("ANSIBLE_FORCE_COLOR", "1")  # turned off for the run
    inventory = throwaway_inventory(tmp_path)
    assert cli.main(["drift", "-i", inventory, "-l", "cp-1", "--playbook", str(REPO / "playbooks" / "drift_check.yml")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert ("no host to run the drift check on: the play's hosts pattern gpu_nodes (gpuharden_target_hosts, default gpu_nodes) "
            "matches no host of the inventory %s within -l cp-1." % inventory) in err
    assert cli.main(["drift", "-i", inventory, "-l", "gpu-z*", "--playbook", str(REPO / "playbooks" / "drift_check.yml")]) == 2
    assert "no host to run the drift check on: -l gpu-z* matches no host of the inventory" in capsys.readouterr().err
