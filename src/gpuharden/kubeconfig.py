# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden kubeconfig`: a kubeconfig for the tool's ServiceAccount, with a bound token from the TokenRequest API;
and the expiry of the credential a kubeconfig holds, which `gpuharden drift` exports.

The token comes from POST /api/v1/namespaces/NS/serviceaccounts/SA/token (the API server's TokenRequest; kubernetes
v1.36.3 pkg/registry/core/serviceaccount/storage/token.go), sent with the ADMIN kubeconfig through the collection's
one request path (plugins/module_utils/k8s/_k8s.py ``endpoint``; a 403 is named by _k8s_access.failure).  What that
file does, and what this module relies on:
- spec.expirationSeconds below 600 or above 2^32 is refused as invalid (pkg/apis/authentication/validation
  ValidateTokenRequest); the server shortens a larger one to its --service-account-max-token-expiration, with a
  warning, and answers the duration it granted in status.expirationTimestamp (creation time + the granted seconds);
- spec.audiences left out are the API server's own audiences (--api-audiences, else its issuer): a token the API
  server itself accepts, which is what a kubeconfig needs;
- no boundObjectRef: the token is bound to the ServiceAccount only, and lives until its exp or the ServiceAccount's
  deletion (pkg/serviceaccount/claims.go puts exp = now + expirationSeconds into the JWT).

The file is written 0600 from its creation (O_CREAT|O_EXCL with mode 0600 in the target's directory, then renamed
into place), and an existing file is replaced only with --force.  The token's expiry is the JWT's ``exp`` claim,
readable without verifying the signature: ``credential_expiry`` reads it from any kubeconfig's token, not only the
ones this command writes (a client certificate: its notAfter).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime
import json
import os
import re
import sys
import time

import yaml

from gpuharden import cluster_side

DEFAULT_NAMESPACE = "gpuharden-system"  # deploy/rbac/gpuharden-rbac.yaml
DEFAULT_SERVICE_ACCOUNT = "gpuharden"
# 30 days: a monthly rotation, with GpuhardenCredentialExpiresSoon (deploy/monitoring) a week before the end.  The
# API server may grant less (its --service-account-max-token-expiration); the command says what it granted.
DEFAULT_DURATION = "720h"
MIN_SECONDS = 600  # ValidateTokenRequest: "may not specify a duration less than 10 minutes"
MAX_SECONDS = 1 << 32  # ValidateTokenRequest: "may not specify a duration larger than 2^32 seconds"
MAX_FILE_BYTES = 4 << 20  # a kubeconfig, token file or certificate larger than this is not one

EXIT_WRITTEN = 0
EXIT_USAGE = 2  # a bad option, no admin kubeconfig, the output file exists without --force: nothing asked, nothing written
EXIT_CLUSTER = 4  # the API server refused or could not be reached: no token, nothing written

K8S = "ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s"
K8S_ACCESS = "ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access"
K8S_RESOURCES = "ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._resources"
ERRORS = "ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors"
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"

DESCRIPTION = """\
Write a kubeconfig for gpuharden's own identity, the ServiceAccount deploy/rbac/gpuharden-rbac.yaml creates
(gpuharden-system/gpuharden), with a bound token from the API server's TokenRequest API, as `kubectl create token`
asks for one.  The server address and its CA come from the admin kubeconfig this command runs with (--admin-kubeconfig,
default $KUBECONFIG or ~/.kube/config); that identity needs "create" on "serviceaccounts/token" in the namespace.

The file is created with mode 0600 and renamed into place, so no other user ever reads the token; an existing file is
replaced only with --force.  The token expires: the command prints when (the API server may grant less than
--duration: its --service-account-max-token-expiration), `gpuharden drift --prometheus` exports that time as
gpuharden_credential_expiry_timestamp_seconds, and the GpuhardenCredentialExpiresSoon alert fires a week before.
Run the command again with --force to renew it.
"""
EPILOG = """\
examples:
  gpuharden kubeconfig -o /etc/gpuharden/kubeconfig
  gpuharden kubeconfig -o /etc/gpuharden/kubeconfig --force --duration 2160h      (renew, 90 days)

exit codes:
  0    written
  2    usage or environment error (a bad option, no admin kubeconfig, the output file exists without --force):
       nothing asked of the API server, nothing written
  4    the API server refused (RBAC, no such ServiceAccount, credentials) or could not be reached: nothing written
"""


class KubeconfigError(Exception):
    """A failure with its exit code; the message is one line, naming the file, option or object at fault."""

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# Durations and expiries (pure)

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|m|s)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text):
    """``--duration`` (Go's duration syntax in the units that make sense here: ``720h``, ``1h30m``, ``600s``) as whole
    seconds, within what the API server accepts (ValidateTokenRequest: 10 minutes to 2^32 seconds)."""
    value = (text or "").strip()
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if not value or position != len(value):
        raise KubeconfigError("--duration %r is not a duration such as 720h, 90m or 1h30m (units h, m, s)" % text)
    if total != int(total):
        raise KubeconfigError("--duration %s is not a whole number of seconds" % text)
    if not MIN_SECONDS <= total <= MAX_SECONDS:
        raise KubeconfigError("--duration %s is %d s: the API server accepts 600 s (10m) to 2^32 s" % (text, total))
    return int(total)


def jwt_claims(token):
    """The claims of a JWT (its middle part, base64url JSON), read WITHOUT verifying the signature: enough to know when
    it expires, never to trust it.  None when ``token`` is not a JWT (a static token, for example)."""
    parts = token.strip().split(".") if isinstance(token, str) else []
    if len(parts) != 3 or not parts[1]:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None


def token_expiry(token):
    """The JWT ``exp`` of a token (Unix time), or None: not a JWT, or a JWT without a numeric exp."""
    exp = (jwt_claims(token) or {}).get("exp")
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


def certificate_expiry(pem):
    """The notAfter of the first PEM certificate in ``pem`` (bytes, Unix time), or None where it cannot be read."""
    try:
        from cryptography import x509  # noqa: PLC0415 (a dependency of ansible-core; only needed for certificates)

        certificate = x509.load_pem_x509_certificate(pem)
    except Exception:  # noqa: BLE001 (no cryptography, not a certificate: no expiry known)
        return None
    after = getattr(certificate, "not_valid_after_utc", None)
    if after is None:  # cryptography before 42: a naive datetime in UTC
        after = certificate.not_valid_after.replace(tzinfo=datetime.UTC)
    return after.timestamp()


def iso(timestamp):
    """A Unix time as the report writes times (ISO 8601, UTC), or None."""
    return None if timestamp is None else datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat()


# ---------------------------------------------------------------------------------------------
# The credential of a kubeconfig, for gpuharden drift


def _read(path, binary=False):
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError("larger than %d bytes" % MAX_FILE_BYTES)
    return data if binary else data.decode("utf-8")


def _named(entries, name):
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def _default_paths(environ):
    listed = [path for path in environ.get("KUBECONFIG", "").split(os.pathsep) if path]
    return listed or [os.path.join(os.path.expanduser("~"), ".kube", "config")]


def credential_expiry(kubeconfig=None, context=None, environ=None):
    """When the credential of ``kubeconfig`` (a path; None: $KUBECONFIG's files merged, first one wins, as kubectl
    merges them, or ~/.kube/config, or the in-cluster account) expires: {kubeconfig, kind, expires_at (Unix time or
    None), note}.  ``kind``: token, client_certificate, exec, auth_provider, basic_auth, in_cluster or unknown.  A token
    that is a JWT expires at its exp; a static token, an exec plugin or an auth provider has no expiry the client
    can read (note says why).  Never raises: the cluster side reports a kubeconfig it cannot use."""
    environ = os.environ if environ is None else environ
    paths = [os.path.expanduser(kubeconfig)] if kubeconfig else _default_paths(environ)
    present = [path for path in paths if os.path.isfile(path)]
    result = {"kubeconfig": os.pathsep.join(paths), "kind": "unknown", "expires_at": None, "note": None}
    if not present:
        if not kubeconfig and environ.get(IN_CLUSTER_ENV) and context is None:
            return dict(result, kubeconfig=None, kind="in_cluster",
                        note="the pod's ServiceAccount token, which the kubelet renews before it expires")
        return dict(result, note="no kubeconfig at %s" % result["kubeconfig"])
    documents = []
    for path in present:
        try:
            document = yaml.safe_load(_read(path))
        except (OSError, ValueError, yaml.YAMLError) as error:
            return dict(result, note="cannot read %s: %s" % (path, " ".join(str(error).split())[:200]))
        documents.append((path, document if isinstance(document, dict) else {}))
    context = context or next((document.get("current-context") for _path, document in documents if document.get("current-context")), None)
    user_name = next(((entry.get("context") or {}).get("user") for entry in (_named(document.get("contexts"), context) for _p, document in documents)
                      if isinstance(entry, dict) and isinstance(entry.get("context"), dict)), None)
    found = next(((path, entry.get("user")) for path, entry in ((path, _named(document.get("users"), user_name)) for path, document in documents)
                  if entry is not None and isinstance(entry.get("user"), dict)), None)
    if found is None:
        return dict(result, note="context %r names no user of %s" % (context, result["kubeconfig"]))
    return dict(result, **user_expiry(found[1], os.path.dirname(os.path.abspath(found[0]))))


def user_expiry(user, base):
    """{kind, expires_at, note} of a kubeconfig ``user`` entry; relative file names are relative to ``base``, the
    kubeconfig's directory (as kubectl resolves them)."""
    expiries, kinds, notes = [], [], []
    try:
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = _read(os.path.join(base, os.path.expanduser(user["tokenFile"]))).strip()
        if token:
            kinds.append("token")
            expiry = token_expiry(token)
            expiries.append(expiry)
            if expiry is None:
                notes.append("the token is not a JWT with an exp claim (a static token): no expiry the client can read")
        pem = None
        if user.get("client-certificate-data"):
            pem = base64.b64decode(user["client-certificate-data"])
        elif user.get("client-certificate"):
            pem = _read(os.path.join(base, os.path.expanduser(user["client-certificate"])), binary=True)
        if pem is not None:
            kinds.append("client_certificate")
            expiries.append(certificate_expiry(pem))
    except (OSError, ValueError, TypeError, binascii.Error) as error:
        return {"kind": "unknown", "expires_at": None, "note": "cannot read the credential: %s" % " ".join(str(error).split())[:200]}
    for key, kind, note in (("exec", "exec", "an exec plugin makes the credential and renews it"),
                            ("auth-provider", "auth_provider", "an auth provider makes the credential and renews it"),
                            ("username", "basic_auth", "a user name and password do not expire on the client's side")):
        if user.get(key) and not kinds:
            kinds.append(kind)
            notes.append(note)
    known = [expiry for expiry in expiries if expiry is not None]
    return {"kind": "+".join(kinds) or "unknown", "expires_at": min(known) if known else None,
            "note": "; ".join(notes) or (None if known else "no credential in the kubeconfig's user")}


# ---------------------------------------------------------------------------------------------
# The TokenRequest, through the collection's request path


def collection_modules():
    """(_k8s, _k8s_access, _resources, GpuhardenError) from the installed gpuharden.k8s collection, as gpuharden drift
    finds it."""
    try:
        modules = cluster_side.import_collection({"k8s": K8S, "access": K8S_ACCESS, "resources": K8S_RESOURCES, "errors": ERRORS})
    except cluster_side.ClusterSideError as error:
        raise KubeconfigError("the collection's Kubernetes client code: %s" % error) from None
    if modules is None:
        raise KubeconfigError("the gpuharden.k8s collection is not installed (its Kubernetes client code is not below "
                              "Ansible's collections paths); install it with ansible-galaxy collection install")
    return modules["k8s"], modules["access"], modules["resources"], modules["errors"].GpuhardenError


def token_request_body(resources, seconds):
    """The TokenRequest this command sends: the duration only (no audiences: the API server's own; no bound object)."""
    return {"apiVersion": resources.api_version("TokenRequest"), "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}}


def _parse_time(text):
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def request_token(modules, admin_params, namespace, service_account, seconds):
    """(token, cluster) for the ServiceAccount: ``cluster`` = {server, ca_pem, insecure, tls_server_name, expires_at,
    granted_seconds} from the admin kubeconfig's configuration and the server's answer; KubeconfigError otherwise."""
    k8s, k8s_access, resources, error_type = modules
    target = k8s_access.Target.of("create", "TokenRequest", namespace, service_account)
    try:
        api = k8s.api_client(admin_params)
        send = k8s.endpoint(api, "POST", *resources.template("TokenRequest"))  # the keys: name, then namespace
        status, answer = k8s_access.call("gpuharden kubeconfig", api, send, target, service_account, namespace,
                                         token_request_body(resources, seconds), accept=(404,))
    except error_type as error:
        access = error.result.get("access") or {}
        code = EXIT_USAGE if access.get("kind") in ("kubeconfig", "client", None) else EXIT_CLUSTER
        # the collection's fixes speak of the tool's own identity; here the identity is the admin's
        fix = {"kubeconfig": "name a readable admin kubeconfig with --admin-kubeconfig (default $KUBECONFIG, else ~/.kube/config)",
               "credentials": "the admin kubeconfig's credentials were refused (HTTP 401): renew them, or name another with --admin-kubeconfig",
               "forbidden": "the admin kubeconfig's identity needs verb create on serviceaccounts/token in namespace %s (cluster-admin has "
                            "it); run this with such a kubeconfig (--admin-kubeconfig)" % namespace,
               }.get(access.get("kind"), access.get("fix"))
        fix = (". Fix: %s" % fix) if fix else ""
        raise KubeconfigError(" ".join(error.msg.split()).rstrip(".") + fix, code) from None
    if status == 404:
        raise KubeconfigError("gpuharden kubeconfig: no ServiceAccount %s in namespace %s (the API server said: %s); apply "
                              "deploy/rbac/gpuharden-rbac.yaml, which creates it, or name yours with --namespace and "
                              "--service-account" % (service_account, namespace, (answer or {}).get("message")), EXIT_CLUSTER)
    token = ((answer or {}).get("status") or {}).get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token.strip():
        raise KubeconfigError("gpuharden kubeconfig: the API server's TokenRequest answer has no status.token", EXIT_CLUSTER)
    conf = api.configuration
    ca_pem = None
    if conf.ssl_ca_cert:
        ca_pem = _read(conf.ssl_ca_cert, binary=True)
    claims = jwt_claims(token) or {}
    expires_at = token_expiry(token) or _parse_time(answer["status"].get("expirationTimestamp"))
    issued = claims.get("iat") if isinstance(claims.get("iat"), (int, float)) else None
    return token.strip(), {
        "server": conf.host, "ca_pem": ca_pem, "insecure": not conf.verify_ssl,
        "tls_server_name": getattr(conf, "tls_server_name", None), "expires_at": expires_at,
        "granted_seconds": int(expires_at - issued) if expires_at is not None and issued is not None else None,
    }


# ---------------------------------------------------------------------------------------------
# The file


def render(cluster, namespace, service_account, token, asked_seconds):
    """The kubeconfig's text: one cluster, one user (the token), one context, and a comment saying when it expires."""
    entry = {"server": cluster["server"]}
    if cluster.get("ca_pem"):
        entry["certificate-authority-data"] = base64.b64encode(cluster["ca_pem"]).decode("ascii")
    if cluster.get("insecure"):
        entry["insecure-skip-tls-verify"] = True
    if cluster.get("tls_server_name"):
        entry["tls-server-name"] = cluster["tls_server_name"]
    name = "gpuharden"
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": entry}],
        "users": [{"name": "%s/%s" % (namespace, service_account), "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "%s/%s" % (namespace, service_account), "namespace": namespace}}],
    }
    header = ("# Written by gpuharden kubeconfig: ServiceAccount %s/%s, a bound token (TokenRequest, %d s asked) that expires "
              "at %s.\n# Renew: gpuharden kubeconfig --force -o THIS_FILE (gpuharden drift exports the expiry as "
              "gpuharden_credential_expiry_timestamp_seconds).\n"
              % (namespace, service_account, asked_seconds, iso(cluster["expires_at"]) or "an unknown time"))
    return header + yaml.safe_dump(document, default_flow_style=False, sort_keys=False)


def check_output(path, force):
    """Refuse before any request: an existing file without --force, a directory, a missing parent directory."""
    if os.path.isdir(path):
        raise KubeconfigError("gpuharden kubeconfig: %s is a directory; name the file to write with --output" % path)
    if os.path.lexists(path) and not force:
        raise KubeconfigError("gpuharden kubeconfig: %s exists; nothing written (add --force to replace it)" % path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise KubeconfigError("gpuharden kubeconfig: directory %s of --output does not exist" % directory)


def write_private(path, text, force):
    """``text`` at ``path``, mode 0600 from the start: a new file (O_CREAT|O_EXCL, 0600) in the same directory, synced,
    then linked into place (without --force: fails if the file appeared meanwhile) or renamed over it (--force).  A
    file replaced keeps its owner and group, so that a renewal stays readable by whoever read it (the drift service's
    user): a run that cannot give them (not root) writes nothing.  Nothing is left behind on failure."""
    directory = os.path.dirname(os.path.abspath(path))
    previous = os.stat(path) if force and os.path.isfile(path) else None
    temp = os.path.join(directory, ".%s.%d.%d.tmp" % (os.path.basename(path), os.getpid(), time.monotonic_ns()))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask: 0600 exactly
            if previous is not None and (previous.st_uid, previous.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(fd, previous.st_uid, previous.st_gid)
                except PermissionError:
                    raise KubeconfigError("gpuharden kubeconfig: cannot give the new %s the owner of the one it replaces (uid %d, gid "
                                          "%d); nothing written: run it as root or as that user" % (path, previous.st_uid, previous.st_gid)) from None
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if force:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)
            except FileExistsError:
                raise KubeconfigError("gpuharden kubeconfig: %s exists; nothing written (add --force to replace it)" % path) from None
            os.unlink(temp)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise


# ---------------------------------------------------------------------------------------------
# The command


def admin_params(args):
    """The collection's auth options for the admin identity: --admin-kubeconfig (else the client's default: $KUBECONFIG,
    ~/.kube/config) and --context."""
    params = {"context": args.context}
    if args.admin_kubeconfig:
        params["kubeconfig"] = args.admin_kubeconfig
    return params


def apply_overrides(cluster, args):
    """--server and --certificate-authority win over the admin kubeconfig's."""
    cluster = dict(cluster)
    if args.server:
        cluster["server"] = args.server.rstrip("/")
    if args.certificate_authority:
        try:
            cluster["ca_pem"] = _read(args.certificate_authority, binary=True)
        except (OSError, ValueError) as error:
            raise KubeconfigError("gpuharden kubeconfig: --certificate-authority %s: %s"
                                  % (args.certificate_authority, getattr(error, "strerror", None) or error)) from None
        cluster["insecure"] = False
    return cluster


def run(args, out=None, modules=None):
    """Write the kubeconfig; returns the exit code, KubeconfigError for a refusal."""
    out = out or sys.stdout
    seconds = parse_duration(args.duration)
    if args.server and not re.match(r"^https?://[^/]", args.server):
        raise KubeconfigError("gpuharden kubeconfig: --server %r is not an http(s) URL" % args.server)
    if args.admin_kubeconfig and not os.path.isfile(os.path.expanduser(args.admin_kubeconfig)):
        raise KubeconfigError("gpuharden kubeconfig: --admin-kubeconfig %s: no such file" % args.admin_kubeconfig)
    check_output(args.output, args.force)
    token, cluster = request_token(modules or collection_modules(), admin_params(args), args.namespace, args.service_account, seconds)
    cluster = apply_overrides(cluster, args)
    write_private(args.output, render(cluster, args.namespace, args.service_account, token, seconds), args.force)
    granted = cluster["granted_seconds"]
    shortened = granted is not None and granted < seconds
    out.write("gpuharden kubeconfig: wrote %s (mode 0600) for ServiceAccount %s/%s on %s; the token expires at %s "
              "(%s asked%s)\n" % (args.output, args.namespace, args.service_account, cluster["server"], iso(cluster["expires_at"]) or "an unknown time",
                                  args.duration, ", %d s granted: the API server's --service-account-max-token-expiration is lower" % granted
                                  if shortened else ""))
    return EXIT_WRITTEN


def main(args):
    try:
        return run(args)
    except KubeconfigError as error:
        message = str(error)
        print(message if message.startswith("gpuharden kubeconfig") else "gpuharden kubeconfig: %s" % message, file=sys.stderr)
        return error.code


def add_parser(commands):
    parser = commands.add_parser("kubeconfig", help="write a kubeconfig for gpuharden's ServiceAccount, with an expiring bound token",
                                 description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the kubeconfig to write (mode 0600)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists (to renew the token)")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the ServiceAccount's namespace (default %s)" % DEFAULT_NAMESPACE)
    parser.add_argument("--service-account", default=DEFAULT_SERVICE_ACCOUNT,
                        help="the ServiceAccount (default %s, as deploy/rbac/gpuharden-rbac.yaml creates it)" % DEFAULT_SERVICE_ACCOUNT)
    parser.add_argument("--duration", default=DEFAULT_DURATION,
                        help="how long the token lives, 10m to 2^32 s (default %s: 30 days, renewed monthly; the API server may "
                             "grant less)" % DEFAULT_DURATION)
    parser.add_argument("--admin-kubeconfig", metavar="FILE",
                        help="the kubeconfig that asks for the token and gives the server address and CA (default: $KUBECONFIG, "
                             "else ~/.kube/config); its identity needs create on serviceaccounts/token")
    parser.add_argument("--context", help="the admin kubeconfig's context (default: its current-context)")
    parser.add_argument("--server", metavar="URL", help="the API server address to write (default: the admin kubeconfig's)")
    parser.add_argument("--certificate-authority", metavar="FILE",
                        help="the API server's CA certificate (PEM) to embed (default: the admin kubeconfig's)")
    parser.set_defaults(handler=main)
    return parser
