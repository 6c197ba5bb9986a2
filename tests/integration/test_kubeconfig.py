# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 46 item 1 on the lab's real API server (kube-apiserver v1.36.3): `gpuharden kubeconfig` asks the
TokenRequest API as the lab's admin and writes a 0600 kubeconfig for gpuharden-system/gpuharden with which the
ServiceAccount reads the cluster; a drift run with it checks the cluster side and exports the token's expiry; the
real server's 403 (an identity without create on serviceaccounts/token) writes nothing.  One fresh node: the
smallest lab with a drift run."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time

import pytest
import yaml
from gpuharden_lab import REPO_ROOT
from kubernetes import client, config

from gpuharden import kubeconfig
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
IDENTITY = "system:serviceaccount:gpuharden-system:gpuharden"


@pytest.fixture(scope="module")
def lab():
    # running_lab skips when the real kubelet and containerd this scenario runs are not built
    with running_lab("fresh-fleet", node_count=1) as state:
        yield state


def _gpuharden(*args):
    return subprocess.run([sys.executable, "-m", "gpuharden.cli", *args], cwd=REPO_ROOT, env=dict(os.environ, **ENV),
                          capture_output=True, text=True, check=False, timeout=900)


def test_a_kubeconfig_from_the_real_token_request_api_works_and_drift_exports_its_expiry(lab, tmp_path):
    output = tmp_path / "gpuharden.kubeconfig"
    asked = time.time()
    done = _gpuharden("kubeconfig", "--admin-kubeconfig", lab["cluster"]["admin_kubeconfig"], "-o", str(output), "--duration", "48h")
    assert done.returncode == 0, done.stdout + done.stderr
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    expires_at = kubeconfig.credential_expiry(str(output))["expires_at"]
    # the lab's API server has no --service-account-max-token-expiration: it grants the 48 hours asked
    assert asked + 48 * 3600 - 5 <= expires_at <= time.time() + 48 * 3600 + 5, (asked, expires_at)
    assert kubeconfig.iso(expires_at) in done.stdout and "granted" not in done.stdout
    # the server and its CA as the admin kubeconfig has them
    with open(lab["cluster"]["admin_kubeconfig"]) as handle:
        admin_cluster = yaml.safe_load(handle)["clusters"][0]["cluster"]
    written = yaml.safe_load(output.read_text())["clusters"][0]["cluster"]
    assert written == {"server": admin_cluster["server"], "certificate-authority-data": admin_cluster["certificate-authority-data"]}

    # the ServiceAccount, TLS verified against the CA the admin kubeconfig had: who it is, and that it reads Nodes
    api = config.new_client_from_config(config_file=str(output))
    review = client.AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == IDENTITY
    assert {node.metadata.name for node in client.CoreV1Api(api).list_node().items} >= {"fresh-0"}

    again = _gpuharden("kubeconfig", "--admin-kubeconfig", lab["cluster"]["admin_kubeconfig"], "-o", str(output))
    assert again.returncode == 2 and str(output) in again.stderr and "--force" in again.stderr
    assert kubeconfig.credential_expiry(str(output))["expires_at"] == expires_at

    report, metrics = tmp_path / "report.json", tmp_path / "gpuharden.prom"
    drift = _gpuharden("drift", "-i", lab["inventory"], "-q", "-e", "gpuharden_kubeconfig=%s" % output, "--report", str(report),
                       "--prometheus", str(metrics))
    assert drift.returncode in (0, 1), drift.stdout[-3000:] + drift.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["cluster"]["consistency_checked"] and data["cluster"]["consistency_error"] is None
    assert data["cluster"]["credential"]["kubeconfig"] == str(output)
    assert data["cluster"]["credential_expires_at"] == kubeconfig.iso(expires_at)
    match = re.search(r"^gpuharden_credential_expiry_timestamp_seconds (\S+)$", metrics.read_text(), re.M)
    assert match and float(match.group(1)) == pytest.approx(expires_at, abs=0.001)


def test_an_identity_without_create_on_serviceaccounts_token_gets_the_real_403_and_nothing_is_written(lab, tmp_path):
    # the lab's tool kubeconfig: the ServiceAccount itself, which the shipped RBAC does not let mint tokens
    output = tmp_path / "gpuharden.kubeconfig"
    done = _gpuharden("kubeconfig", "--admin-kubeconfig", lab["cluster"]["tool_kubeconfig"], "-o", str(output))
    assert done.returncode == kubeconfig.EXIT_CLUSTER, done.stdout + done.stderr
    assert IDENTITY in done.stderr and "serviceaccounts/token" in done.stderr and "create" in done.stderr, done.stderr
    assert os.listdir(tmp_path) == []
