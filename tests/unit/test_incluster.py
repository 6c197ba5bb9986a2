# SPDX-License-Identifier: GPL-3.0-or-later
"""The in-cluster drift runs from the artifacts: the image recipe (deploy/kubernetes/Containerfile) that ships in the
collection tarball, the push of the metrics to a Pushgateway, and the Job's exit status against the systemd unit's.

The CronJobs' shell runs here under /bin/sh with a stand-in for the `gpuharden` command that exits with each of drift's
codes, writing the metrics (tools/monitoring_sample.py: the real prometheus_text() of a sample fleet) when the real
drift writes them. The metrics go to the real Pushgateway (Debian's prometheus-pushgateway) with the real curl. The
whole image is built by tools/image_rootfs_check.py (`make image-check`); its recipe parser is tested here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KUBE = REPO / "deploy" / "kubernetes"
CONTAINERFILE = KUBE / "Containerfile"
CRONJOB = KUBE / "drift-cronjob.yaml"
SLICED = KUBE / "drift-cronjob-sliced.yaml"
README = KUBE / "README.md"
SERVICE = REPO / "deploy" / "systemd" / "gpuharden-drift.service"
# Every code `gpuharden drift` and `drift-merge` exit with (src/gpuharden/drift.py: EXIT_*, 128 + SIGINT/SIGTERM).
DRIFT_CODES = (0, 1, 2, 3, 4, 130, 143)
# The codes after which drift has written its report and metrics (a complete run); the others write nothing.
WRITES = {0, 1, 4}
CLUSTER = "test-cluster"


def _load_tool(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / ("%s.py" % name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_check = _load_tool("image_rootfs_check")


def _listing(path):
    (listing,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert listing["apiVersion"] == "v1" and listing["kind"] == "List"
    return {item["kind"]: item for item in listing["items"]}


def _job(path):
    return _listing(path)["CronJob"]["spec"]["jobTemplate"]["spec"]


def _container(path):
    (container,) = _job(path)["template"]["spec"]["containers"]
    return container


def _fail_job_codes(path):
    rules = _job(path)["podFailurePolicy"]["rules"]
    (rule,) = [rule for rule in rules if "onExitCodes" in rule]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "In"
    return set(rule["onExitCodes"]["values"])


# ---------------------------------------------------------------------------------------------------
# The recipe


def _versions():
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return galaxy, python


def test_containerfile_ships_in_the_collection_tarball(tmp_path):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(REPO)],
                   env=env, capture_output=True, check=True)
    (tarball,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    assert {"deploy/kubernetes/Containerfile", "deploy/kubernetes/README.md", "deploy/kubernetes/drift-cronjob.yaml",
            "deploy/kubernetes/drift-cronjob-sliced.yaml"} <= names


def test_containerfile_copies_the_two_artifacts_make_dist_builds():
    galaxy, version = _versions()
    instructions = image_check.parse_containerfile(CONTAINERFILE.read_text())
    assert CONTAINERFILE.read_text().startswith("# SPDX-License-Identifier: GPL-3.0-or-later\n")
    (reference,) = [arguments for _, keyword, arguments in instructions if keyword == "FROM"]
    assert image_check.base_of(reference, "Containerfile") == ("bookworm", "minbase")
    (copy,) = [arguments for _, keyword, arguments in instructions if keyword == "COPY"]
    *sources, destination = copy.split()
    dist = {"gpuharden-%s-py3-none-any.whl" % version, "gpuharden-%s.tar.gz" % version,
            "%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])}
    copied = {name for name in dist for source in sources if Path(name).match(source)}
    assert copied == dist - {"gpuharden-%s.tar.gz" % version}, "the wheel and the collection, never the sdist"
    assert destination.endswith("/")


def test_containerfile_user_is_the_pods_user():
    instructions = image_check.parse_containerfile(CONTAINERFILE.read_text())
    users = [arguments for _, keyword, arguments in instructions if keyword == "USER"]
    uid, gid = users[-1].split(":")
    for path in (CRONJOB, SLICED):
        context = _job(path)["template"]["spec"]["securityContext"]
        assert (str(context["runAsUser"]), str(context["runAsGroup"])) == (uid, gid), path.name
        assert _container(path)["image"].endswith("/gpuharden-drift:%s" % _versions()[0]["version"]), path.name
    runs = "\n".join(arguments for _, keyword, arguments in instructions if keyword == "RUN")
    assert "--uid %s --gid %s" % (uid, gid) in runs and "--home-dir /tmp" in runs, "ssh needs a passwd entry for the uid"


def _install_step():
    instructions = image_check.parse_containerfile(CONTAINERFILE.read_text())
    (step,) = [arguments for _, keyword, arguments in instructions if keyword == "RUN" and "pip install" in arguments]
    return step


@pytest.mark.parametrize(("files", "message"), [
    (["gpuharden-0.1.0-py3-none-any.whl", "gpuharden-k8s-0.2.0.tar.gz"],
     "gpuharden-0.1.0-py3-none-any.whl is version 0.1.0 but gpuharden-k8s-0.2.0.tar.gz is 0.2.0"),
    (["gpuharden-0.1.0-py3-none-any.whl", "gpuharden-0.2.0-py3-none-any.whl", "gpuharden-k8s-0.1.0.tar.gz"],
     "one gpuharden-*-py3-none-any.whl wanted"),
    (["gpuharden-0.1.0-py3-none-any.whl", "gpuharden-k8s-0.1.0.tar.gz", "gpuharden-k8s-0.2.0.tar.gz"],
     "one gpuharden-k8s-*.tar.gz wanted"),
])
def test_install_step_refuses_a_mixed_context_before_installing(tmp_path, files, message):
    """The RUN step as /bin/sh runs it, in a copy of the context: it stops before the venv exists."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    for name in files:
        (artifacts / name).write_text("")
    script = _install_step().replace("cd /tmp/artifacts", "cd %s" % artifacts).replace("/opt/gpuharden/venv", str(tmp_path / "venv"))
    completed = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 1 and message in completed.stderr, completed.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize(("text", "message"), [
    ("FROM docker.io/library/debian:bookworm-slim\nADD x /x\n", "Containerfile:2: instruction ADD is not one this check runs"),
    ("FROM docker.io/library/debian:bookworm-slim\nRUN [\"true\"]\n", "only the shell form"),
    ("FROM docker.io/library/debian:bookworm-slim\nRUN --mount=type=cache,target=/c true\n", "only the shell form"),
    ("RUN true\n", "the first instruction must be FROM"),
    ("FROM debian:bookworm-slim AS a\nFROM debian:bookworm-slim\n", "one FROM"),
    ("FROM debian:bookworm-slim\nRUN true \\\n", "ends with a line continuation"),
])
def test_recipe_parser_refuses_what_the_check_would_not_run(text, message):
    with pytest.raises(image_check.RecipeError, match=re.escape(message)):
        image_check.parse_containerfile(text)


def test_recipe_parser_joins_continuations_and_drops_comment_lines():
    text = "# c\nFROM debian:bookworm-slim\nRUN a \\\n# inside\n    && b\nENV A=1 B=\"two words\"\n"
    assert image_check.parse_containerfile(text) == [(2, "FROM", "debian:bookworm-slim"), (3, "RUN", "a && b"),
                                                     (6, "ENV", 'A=1 B="two words"')]
    assert image_check.assignments('A=1 B="two words"') == {"A": "1", "B": "two words"}
    with pytest.raises(image_check.RecipeError, match="FROM alpine:3: this check makes only"):
        image_check.base_of("alpine:3", "Containerfile")


# ---------------------------------------------------------------------------------------------------
# The CronJobs' shell against a real Pushgateway (the `pushgateway` fixture of tests/unit/conftest.py)


def _pushed(url):
    """The gpuharden series the Pushgateway exposes for this test's group."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith("gpuharden_") and 'instance="%s"' % CLUSTER in line]


def _forget(url):
    request = urllib.request.Request(url + "/metrics/job/gpuharden_drift/instance/" + CLUSTER, method="DELETE")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202
    # 202: the Pushgateway queues a delete (handler/delete.go), so it is seen a moment later; a push waits for its check.
    deadline = time.monotonic() + 10
    while _pushed(url):
        assert time.monotonic() < deadline, "the Pushgateway still has the group 10 s after its delete"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def sample_metrics(tmp_path_factory):
    path = tmp_path_factory.mktemp("sample") / "sample.prom"
    path.write_text(subprocess.run([sys.executable, str(REPO / "tools" / "monitoring_sample.py")], capture_output=True, text=True,
                                   check=True).stdout)
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool not found: install the Debian package prometheus (make system-deps)")
    checked = subprocess.run([promtool, "check", "metrics"], stdin=path.open(), capture_output=True, text=True, check=False)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked.stdout + checked.stderr
    return path


# A stand-in for the `gpuharden` command: `drift --slice` writes its slice report and exits 0; `drift` (unsliced)
# and `drift-merge` exit with $CODE, writing the report and metrics first where the real ones do (a complete run;
# SAMPLE empty: no metrics, which the real ones never do).
FAKE = """#!/bin/sh
echo "$*" >> "$CALLS"
command=$1
shift
slice=""
while [ $# -gt 0 ]; do
  case $1 in --report) report=$2; shift ;; --prometheus) prom=$2; shift ;; --slice) slice=$2; shift ;; esac
  shift
done
mkdir -p "$(dirname "$report")"
if [ "$command" = drift ] && [ -n "$slice" ]; then echo '{}' > "$report"; exit 0; fi
case $CODE in
  0|1|4) echo '{}' > "$report"; [ -n "$SAMPLE" ] && cp "$SAMPLE" "$prom" ;;
esac
exit $CODE
"""


def _pod(path, tmp_path, url, code, sample, **overrides):
    container = _container(path)
    assert container["command"][:2] == ["/bin/sh", "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gpuharden").write_text(FAKE)
    (bin_dir / "gpuharden").chmod(0o755)
    reports = tmp_path / "reports"
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    assert env["PUSHGATEWAY_URL"].startswith("http") and env["CLUSTER_NAME"]
    env.update(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), REPORTS=str(reports), PUSHGATEWAY_URL=url, CLUSTER_NAME=CLUSTER,
               CODE=str(code), SAMPLE=str(sample), CALLS=str(tmp_path / "calls"), JOB_NAME="drift-1", JOB_COMPLETION_INDEX="0",
               MERGE_POLL_SECONDS="0.1")
    env.update(overrides)
    if path == SLICED:  # the other slices' reports are there already: slice 1's pod merges at once
        run = reports / "slices" / "drift-1"
        run.mkdir(parents=True, exist_ok=True)
        for index in range(2, int(env["SLICES"]) + 1):
            (run / ("slice-%d.json" % index)).write_text("{}")
    script = container["command"][2].replace("/etc/gpuharden/inventory", str(tmp_path / "inventory"))
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False)


def _systemd_success_codes():
    text = SERVICE.read_text()
    values = re.findall(r"^SuccessExitStatus=(.*)$", text, re.M)
    assert values, "no SuccessExitStatus= in %s" % SERVICE.name
    return {0} | {int(word) for value in values for word in value.split() if word.isdigit()}


def _readme_table():
    """{code: (systemd column, Job column)} from deploy/kubernetes/README.md's exit status table."""
    rows = {}
    for line in README.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+(, \d+)*", cells[0]):
            for code in cells[0].split(", "):
                rows[int(code)] = (cells[2], cells[3])
    return rows


@pytest.mark.parametrize("path", [CRONJOB, SLICED], ids=["cronjob", "sliced"])
@pytest.mark.parametrize("code", DRIFT_CODES)
def test_job_counts_each_exit_as_the_systemd_unit_and_the_table_say(path, code, tmp_path, pushgateway, sample_metrics):
    _forget(pushgateway)
    pod = _pod(path, tmp_path, pushgateway, code, sample_metrics)
    unit_succeeds = code in _systemd_success_codes()
    # A pod that exits non-zero fails (restartPolicy Never); 0 completes the Job.
    assert (pod.returncode == 0) == unit_succeeds, (code, pod.returncode, pod.stderr)
    if not unit_succeeds:
        assert pod.returncode == code, "the Job shows drift's own code"
    pushed = _pushed(pushgateway)
    assert bool(pushed) == (code in WRITES), (code, pod.stderr)
    if pushed:
        assert any(line.startswith('gpuharden_drift_node_drifted{instance="%s",job="gpuharden_drift",node="node-b"}' % CLUSTER)
                   for line in pushed), pushed
    fail_job = _fail_job_codes(path)
    systemd, job = _readme_table()[code]
    assert systemd.startswith("succeeds" if unit_succeeds else "fails"), systemd
    assert job.startswith("container exits %s" % (0 if unit_succeeds else "")), job
    assert ("metrics pushed" in job) == (code in WRITES) and ("nothing pushed" in job) == (code not in WRITES), job
    assert ("textfile rewritten" in systemd) == (code in WRITES) != ("textfile left as it was" in systemd), systemd
    if pod.returncode:
        assert ("fails at once" in job) == (pod.returncode in fail_job), (code, job, fail_job)
        assert ("retried" in job) == (pod.returncode not in fail_job), (code, job, fail_job)
    else:
        assert "the Job succeeds" in job


def test_readme_table_names_every_code():
    assert set(_readme_table()) == set(DRIFT_CODES)
    assert _fail_job_codes(CRONJOB) == _fail_job_codes(SLICED) == {2, 4}


def test_push_replaces_the_group(tmp_path, pushgateway, sample_metrics):
    """PUT replaces the cluster's whole group (handler/push.go, replace=true): a node missing from the next run has no
    series left, nor has a metric family the next run no longer writes (a release that drops or renames one). A POST
    would keep that family's old series."""
    _forget(pushgateway)
    assert _pod(CRONJOB, tmp_path, pushgateway, 1, sample_metrics).returncode == 0
    pushed = _pushed(pushgateway)
    assert any('node="node-b"' in line for line in pushed)
    assert any(line.startswith("gpuharden_drift_node_attention{") for line in pushed)
    fewer = tmp_path / "fewer.prom"
    fewer.write_text("".join(line + "\n" for line in sample_metrics.read_text().splitlines()
                             if 'node="node-b"' not in line and "gpuharden_drift_node_attention" not in line))
    assert _pod(CRONJOB, tmp_path, pushgateway, 0, fewer).returncode == 0
    pushed = _pushed(pushgateway)
    assert pushed and not any('node="node-b"' in line for line in pushed)
    assert not any(line.startswith("gpuharden_drift_node_attention{") for line in pushed)


@pytest.mark.parametrize("path", [CRONJOB, SLICED], ids=["cronjob", "sliced"])
def test_a_refused_push_fails_the_job_with_2(path, tmp_path, pushgateway):
    """The Pushgateway answers 400 to metrics with timestamps: curl's error and the pod's message, exit 2 (FailJob)."""
    _forget(pushgateway)
    stamped = tmp_path / "stamped.prom"
    stamped.write_text("# TYPE gpuharden_drift_not_checked gauge\ngpuharden_drift_not_checked 0 1700000000000\n")
    pod = _pod(path, tmp_path, pushgateway, 1, stamped)
    assert pod.returncode == 2 and 2 in _fail_job_codes(path), pod.stderr
    assert "must not have timestamps" in pod.stderr and "gpuharden-drift: pushing" in pod.stderr and "failed" in pod.stderr
    assert not _pushed(pushgateway)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"PUSHGATEWAY_URL": "prometheus-pushgateway:9091"}, "PUSHGATEWAY_URL=prometheus-pushgateway:9091 is not an http(s) URL"),
    ({"PUSHGATEWAY_URL": ""}, "PUSHGATEWAY_URL= is not an http(s) URL"),
    ({"CLUSTER_NAME": "a/b"}, "CLUSTER_NAME=a/b: letters, digits"),
    ({"CLUSTER_NAME": ""}, "CLUSTER_NAME=: letters, digits"),
])
@pytest.mark.parametrize("path", [CRONJOB, SLICED], ids=["cronjob", "sliced"])
def test_bad_push_settings_end_the_pod_with_2_before_the_run(path, overrides, message, tmp_path, sample_metrics):
    pod = _pod(path, tmp_path, "http://127.0.0.1:9", 0, sample_metrics, **overrides)
    assert pod.returncode == 2 and message in pod.stderr, pod.stderr
    assert not (tmp_path / "calls").exists(), "gpuharden ran"


@pytest.mark.parametrize("path", [CRONJOB, SLICED], ids=["cronjob", "sliced"])
def test_a_missing_metrics_file_is_a_failed_push_never_an_empty_one(path, tmp_path, pushgateway, sample_metrics):
    """An empty PUT would wipe the cluster's group; curl --upload-file refuses a missing file instead."""
    _forget(pushgateway)
    assert _pod(path, tmp_path, pushgateway, 1, sample_metrics).returncode == 0
    before = _pushed(pushgateway)
    (tmp_path / "reports" / "gpuharden.prom").unlink()
    pod = _pod(path, tmp_path, pushgateway, 1, "")
    assert pod.returncode == 2 and "gpuharden-drift: pushing" in pod.stderr, pod.stderr
    assert _pushed(pushgateway) == before
