# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden kubeconfig` against a fake API server (the TokenRequest of kubernetes v1.36.3
pkg/registry/core/serviceaccount/storage/token.go: the request body, the granted duration, a 403 and a 404), the
file it writes (0600 from the start, no overwrite without --force, nothing left on failure), and the credential
expiry drift exports (JWT exp, client certificate notAfter, none for a static token or an exec plugin)."""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import re
import stat
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
import yaml

from gpuharden import cli, drift_check, drift_metrics, drift_report, drift_slices, kubeconfig
from tests.unit.conftest import UNPRIVILEGED_UID, JsonHandler, run_as

NAMESPACE, ACCOUNT = "gpuharden-system", "gpuharden"
TOKEN_PATH = "/api/v1/namespaces/%s/serviceaccounts/%s/token" % (NAMESPACE, ACCOUNT)


def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_jwt(claims):
    """A JWT-shaped token (unsigned: the client never verifies it, it only reads exp)."""
    return ".".join([_b64url(b'{"alg":"RS256","kid":"k"}'), _b64url(json.dumps(claims).encode()), _b64url(b"signature")])


class TokenApi:
    """POST TOKEN_PATH as the API server answers it: the token's exp is the asked expirationSeconds, capped by
    ``max_seconds`` (--service-account-max-token-expiration); ``status`` 403 or 404 answers a Status instead."""

    def __init__(self, status=201, max_seconds=None):
        self.requests, self.status, self.max_seconds = [], status, max_seconds
        api = self

        class Handler(JsonHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append({"path": self.path, "body": body, "authorization": self.headers.get("Authorization"),
                                     "content_type": self.headers.get("Content-Type")})
                if self.path != TOKEN_PATH or api.status == 404:
                    return self.send_json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                                                "message": 'serviceaccounts "%s" not found' % ACCOUNT})
                if api.status == 403:
                    return self.send_json(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                                                "message": 'serviceaccounts "gpuharden" is forbidden: User "alice" cannot create '
                                                           'resource "serviceaccounts/token" in API group "" in the namespace '
                                                           '"gpuharden-system"'})
                seconds = body["spec"]["expirationSeconds"]
                if api.max_seconds and seconds > api.max_seconds:
                    seconds = api.max_seconds
                now = int(time.time())
                api.exp = now + seconds
                token = make_jwt({"aud": ["https://kubernetes.default.svc"], "exp": api.exp, "iat": now,
                                  "sub": "system:serviceaccount:%s:%s" % (NAMESPACE, ACCOUNT)})
                expires = datetime.datetime.fromtimestamp(api.exp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                return self.send_json(201, dict(body, status={"token": token, "expirationTimestamp": expires}))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api():
    servers = []

    def start(**kwargs):
        servers.append(TokenApi(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def admin_kubeconfig(directory, server):
    path = directory / "admin.conf"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "lab", "cluster": {"server": server}}],
        "users": [{"name": "admin", "user": {"token": "admin-secret"}}],
        "contexts": [{"name": "admin", "context": {"cluster": "lab", "user": "admin"}}]}))
    return path


def run_cli(tmp_path, server, *extra):
    admin = admin_kubeconfig(tmp_path, server.url)
    return cli.main(["kubeconfig", "--admin-kubeconfig", str(admin), *extra])


def test_it_asks_the_token_request_api_and_writes_a_0600_kubeconfig(api, tmp_path, capsys):
    server = api()
    output = tmp_path / "gpuharden.conf"
    old = os.umask(0)  # the mode must not depend on the umask
    try:
        assert run_cli(tmp_path, server, "-o", str(output)) == 0
    finally:
        os.umask(old)
    (request,) = server.requests
    # the duration only: no audiences (the API server's own), no bound object; 720h by default
    assert request["body"] == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 720 * 3600}}
    assert request["path"] == TOKEN_PATH and request["authorization"] == "Bearer admin-secret"
    assert request["content_type"] == "application/json"
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    written = yaml.safe_load(output.read_text())
    (user,) = written["users"]
    (cluster,) = written["clusters"]
    assert cluster["cluster"] == {"server": server.url} and written["current-context"] == "gpuharden"
    assert kubeconfig.token_expiry(user["user"]["token"]) == server.exp
    assert kubeconfig.iso(server.exp) in output.read_text().splitlines()[0]
    # what drift reads back from the file: the token's exp
    assert kubeconfig.credential_expiry(str(output)) == {"kubeconfig": str(output), "kind": "token", "expires_at": server.exp, "note": None}
    out = capsys.readouterr().out
    assert str(output) in out and kubeconfig.iso(server.exp) in out and "granted" not in out
    assert sorted(os.listdir(tmp_path)) == ["admin.conf", "gpuharden.conf"]


def test_server_and_certificate_authority_options_win_over_the_admin_kubeconfig(api, tmp_path):
    # (the admin kubeconfig's own CA is embedded where its server is https: the lab test checks that over TLS)
    server = api()
    other_ca = b"-----BEGIN CERTIFICATE-----\nother\n-----END CERTIFICATE-----\n"
    (tmp_path / "other.crt").write_bytes(other_ca)
    output = tmp_path / "gpuharden.conf"
    assert run_cli(tmp_path, server, "-o", str(output), "--server", "https://api.example:6443/", "--certificate-authority", str(tmp_path / "other.crt")) == 0
    (cluster,) = yaml.safe_load(output.read_text())["clusters"]
    assert cluster["cluster"] == {"server": "https://api.example:6443", "certificate-authority-data": base64.b64encode(other_ca).decode()}
    assert len(server.requests) == 1  # the token was still asked of the admin kubeconfig's server


def test_a_shorter_grant_is_reported(api, tmp_path, capsys):
    server = api(max_seconds=3600)
    output = tmp_path / "gpuharden.conf"
    assert run_cli(tmp_path, server, "-o", str(output), "--duration", "48h") == 0
    assert server.requests[0]["body"]["spec"]["expirationSeconds"] == 48 * 3600
    assert "3600 s granted" in capsys.readouterr().out
    assert kubeconfig.credential_expiry(str(output))["expires_at"] == server.exp


def test_an_existing_file_is_refused_without_force_and_replaced_with_it(api, tmp_path, capsys):
    server = api()
    output = tmp_path / "gpuharden.conf"
    output.write_text("precious\n")
    output.chmod(0o644)
    assert run_cli(tmp_path, server, "-o", str(output)) == 2
    error = capsys.readouterr().err
    assert str(output) in error and "--force" in error and error.count("\n") == 1
    # refused before asking: no token minted, the file untouched
    assert server.requests == [] and output.read_text() == "precious\n"
    assert run_cli(tmp_path, server, "-o", str(output), "--force") == 0
    assert len(server.requests) == 1 and "precious" not in output.read_text()
    assert stat.S_IMODE(output.stat().st_mode) == 0o600


def test_a_file_that_appears_meanwhile_is_not_overwritten_and_nothing_is_left(tmp_path):
    output = tmp_path / "gpuharden.conf"
    output.write_text("written by someone else\n")
    with pytest.raises(kubeconfig.KubeconfigError, match="exists"):
        kubeconfig.write_private(str(output), "token\n", force=False)
    assert output.read_text() == "written by someone else\n" and os.listdir(tmp_path) == ["gpuharden.conf"]


def test_a_renewal_keeps_the_owner_of_the_file_it_replaces(tmp_path):
    output = tmp_path / "gpuharden.conf"
    output.write_text("old\n")
    os.chown(output, UNPRIVILEGED_UID, UNPRIVILEGED_UID)  # the tests run as root: the drift service's user, say
    kubeconfig.write_private(str(output), "new\n", force=True)
    assert output.read_text() == "new\n" and (output.stat().st_uid, output.stat().st_gid) == (UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    assert stat.S_IMODE(output.stat().st_mode) == 0o600 and os.listdir(tmp_path) == ["gpuharden.conf"]


def _renew_as_another_user(path):
    try:
        kubeconfig.write_private(path, "new\n", force=True)
    except kubeconfig.KubeconfigError as error:
        return str(error)
    return None


def test_a_renewal_that_cannot_keep_the_owner_writes_nothing(world_tmp):
    shared = world_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    output = shared / "gpuharden.conf"
    output.write_text("old\n")  # root's
    message = run_as(UNPRIVILEGED_UID, _renew_as_another_user, str(output))
    assert message and str(output) in message and "uid 0" in message and "nothing written" in message
    assert output.read_text() == "old\n" and os.listdir(shared) == ["gpuharden.conf"]


@pytest.mark.parametrize(("status", "needles"), [
    (403, ["alice", "create", "serviceaccounts/token", "gpuharden-system", "Fix: the admin kubeconfig's identity needs verb create"]),
    (404, ["no ServiceAccount gpuharden in namespace gpuharden-system", "deploy/rbac/gpuharden-rbac.yaml"]),
])
def test_a_refusal_by_the_api_server_writes_nothing(api, tmp_path, capsys, status, needles):
    server = api(status=status)
    output = tmp_path / "gpuharden.conf"
    assert run_cli(tmp_path, server, "-o", str(output)) == kubeconfig.EXIT_CLUSTER
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and all(needle in error for needle in needles), error
    assert os.listdir(tmp_path) == ["admin.conf"]


def test_an_unreachable_api_server_writes_nothing(tmp_path, capsys):
    admin = admin_kubeconfig(tmp_path, "http://127.0.0.1:9")
    output = tmp_path / "gpuharden.conf"
    assert cli.main(["kubeconfig", "--admin-kubeconfig", str(admin), "-o", str(output)]) == kubeconfig.EXIT_CLUSTER
    assert "cannot reach the API server" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["admin.conf"]


@pytest.mark.parametrize(("extra", "needle"), [
    (["--duration", "5m"], "600 s"),
    (["--duration", "3d"], "not a duration"),
    (["--duration", "1.5s"], "whole number"),
    (["--admin-kubeconfig", "/nonexistent/admin.conf"], "/nonexistent/admin.conf"),
    (["--server", "ftp://x"], "--server"),
])
def test_bad_options_are_refused_before_any_request(api, tmp_path, capsys, extra, needle):
    server = api()
    assert run_cli(tmp_path, server, "-o", str(tmp_path / "out.conf"), *extra) == 2
    assert needle in capsys.readouterr().err and server.requests == []
    assert not (tmp_path / "out.conf").exists()


def test_an_unusable_admin_kubeconfig_names_the_option_to_fix(tmp_path, capsys):
    admin = tmp_path / "admin.conf"
    admin.write_text("clusters: []\n")
    assert cli.main(["kubeconfig", "--admin-kubeconfig", str(admin), "-o", str(tmp_path / "out.conf")]) == 2
    error = capsys.readouterr().err
    assert str(admin) in error and "Fix: name a readable admin kubeconfig with --admin-kubeconfig" in error and error.count("\n") == 1
    assert os.listdir(tmp_path) == ["admin.conf"]


@pytest.mark.parametrize(("text", "seconds"), [("720h", 2592000), ("1h30m", 5400), ("600s", 600), ("10m", 600), ("2.5h", 9000)])
def test_durations(text, seconds):
    assert kubeconfig.parse_duration(text) == seconds


@pytest.mark.parametrize(("token", "expiry"), [
    (make_jwt({"exp": 1900000000, "iat": 1}), 1900000000.0),
    (make_jwt({"iat": 1}), None),
    (make_jwt({"exp": "soon"}), None),
    (make_jwt({"exp": True}), None),
    ("static-token-from-a-token-file", None),
    ("a.!!!.c", None),
    ("a.%s.c" % _b64url(b"[1, 2]"), None),
])
def test_the_jwt_exp_is_read_without_verification(token, expiry):
    assert kubeconfig.token_expiry(token) == expiry


def _kubeconfig_with(path, user, context="c"):
    path.write_text(yaml.safe_dump({"current-context": context, "contexts": [{"name": "c", "context": {"user": "u", "cluster": "k"}}],
                                    "users": [{"name": "u", "user": user}]}))
    return str(path)


def _certificate_pem(not_after):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuharden")])
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
                   .not_valid_before(not_after - datetime.timedelta(days=1)).not_valid_after(not_after).sign(key, hashes.SHA256()))
    return certificate.public_bytes(serialization.Encoding.PEM)


def test_the_credential_expiry_of_each_kind_of_kubeconfig_user(tmp_path):
    exp = 1900000000
    (tmp_path / "token").write_text(make_jwt({"exp": exp}) + "\n")
    assert kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "a", {"tokenFile": "token"}))["expires_at"] == exp
    static = kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "b", {"token": "s3cret"}))
    assert static["expires_at"] is None and static["kind"] == "token" and "static" in static["note"]
    not_after = datetime.datetime(2031, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    pem = _certificate_pem(not_after)
    cert = kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "c", {"client-certificate-data": base64.b64encode(pem).decode()}))
    assert cert["expires_at"] == not_after.timestamp() and cert["kind"] == "client_certificate"
    (tmp_path / "client.crt").write_bytes(pem)
    assert kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "d", {"client-certificate": "client.crt"}))["expires_at"] == not_after.timestamp()
    plugin = kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "e", {"exec": {"command": "aws"}}))
    assert plugin["kind"] == "exec" and plugin["expires_at"] is None and "renews" in plugin["note"]
    assert kubeconfig.credential_expiry(_kubeconfig_with(tmp_path / "f", {"token": "x"}, context="other"))["note"].startswith("context 'other'")
    missing = kubeconfig.credential_expiry(str(tmp_path / "nope"))
    assert missing["expires_at"] is None and "no kubeconfig" in missing["note"]
    (tmp_path / "bad").write_text("users: [unclosed\n")
    assert "cannot read" in kubeconfig.credential_expiry(str(tmp_path / "bad"))["note"]


def test_the_default_kubeconfig_merges_kubeconfig_paths_and_in_cluster_has_no_expiry(tmp_path):
    exp = 1900000000
    users = tmp_path / "users"
    users.write_text(yaml.safe_dump({"users": [{"name": "u", "user": {"token": make_jwt({"exp": exp})}}]}))
    contexts = tmp_path / "contexts"
    contexts.write_text(yaml.safe_dump({"current-context": "c", "contexts": [{"name": "c", "context": {"user": "u"}}]}))
    merged = kubeconfig.credential_expiry(environ={"KUBECONFIG": "%s:%s" % (contexts, users)})
    assert merged["expires_at"] == exp
    pod = kubeconfig.credential_expiry(environ={"KUBECONFIG": str(tmp_path / "none"), "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert pod["kind"] == "in_cluster" and pod["expires_at"] is None


def _report(credential):
    outcomes = drift_report.Outcomes()
    outcomes.credential = credential
    outcomes.feed({"event": "playbook_on_stats", "event_data": {}})
    return drift_report.build_report(outcomes, inventory="i", limit=None, fail_severity="warning", started=1.0, finished=2.0)


def test_drift_reports_and_exports_the_credential_expiry():
    report = _report({"kubeconfig": "/etc/gpuharden/kubeconfig", "kind": "token", "expires_at": 1900000000.0, "note": None})
    assert report["cluster"]["credential_expires_at"] == "2030-03-17T17:46:40+00:00"
    lines = drift_metrics.prometheus_text(report).splitlines()
    assert "gpuharden_credential_expiry_timestamp_seconds 1900000000.000" in lines
    assert "# TYPE gpuharden_credential_expiry_timestamp_seconds gauge" in lines
    # no expiry known (a static token, an exec plugin, no cluster side): no sample, nothing for the alert to fire on
    for credential in ({"kubeconfig": "k", "kind": "token", "expires_at": None, "note": "static"}, None):
        report = _report(credential)
        assert report["cluster"]["credential_expires_at"] is None
        assert not [line for line in drift_metrics.prometheus_text(report).splitlines() if line.startswith("gpuharden_credential_expiry")]


def test_drift_reads_the_kubeconfig_the_cluster_side_used(tmp_path):
    exp = 1900000000
    path = _kubeconfig_with(tmp_path / "k", {"token": make_jwt({"exp": exp})})
    handed_over = drift_report.Outcomes()
    handed_over.consistency_options = {"kubeconfig": path, "context": None}
    assert drift_check.cluster_credential(handed_over)["expires_at"] == exp
    module_run = drift_report.Outcomes()
    module_run.feed({"event": "runner_on_ok", "event_data": {"host": "a", "task_action": "gpuharden.k8s.gpu_consistency", "task": "t",
                                                             "res": {"findings": [], "invocation": {"module_args": {"kubeconfig": path}}}}})
    assert drift_check.cluster_credential(module_run)["kubeconfig"] == path
    assert drift_check.cluster_credential(drift_report.Outcomes()) is None


def test_merged_slices_keep_the_credential_that_expires_first():
    early = {"kubeconfig": "k", "kind": "token", "expires_at": 1800000000.0, "note": None}
    late = dict(early, expires_at=1900000000.0)
    merged = drift_slices.merge_cluster([{"credential": late}, {"credential": early}, {}])
    assert merged["credential"] == early and merged["credential_expires_at"] == kubeconfig.iso(1800000000.0)


def test_the_help_explains_every_option_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["kubeconfig", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "720h" in text and "0600" in text and "--force" in text and "gpuharden_credential_expiry_timestamp_seconds" in text
    codes = text.split("exit codes:")[1]
    assert [int(code) for code in re.findall(r"^  (\d)\s", codes, re.M)] == [0, 2, 4]
    parser = kubeconfig.add_parser(argparse.ArgumentParser().add_subparsers())
    assert all(action.help for action in parser._actions)
