# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden drift`'s cluster side, in its own Python: the collection's consistency check (with the RuntimeClass dry
run folded into it) run from the options drift_check.yml hands over and the node reports node_audit returned, once
the play is over.

drift_check.yml, given gpuharden_drift_cluster_in_process=true, runs no gpu_consistency module: its cluster step (the
collection's drift_play action, step=cluster: the one place the options are mapped from the roles' variables, in
module_utils/audit/_drift_play.py) returns the module's options (consistency_options) and the node reports
(node_reports), which reach this process in the runner's events.  The check itself is the one function the module runs too, in the collection's module_utils
(plugins/module_utils/cluster/_consistency_run.py, consistency_check_of_options: the module's argument_spec
validates the options, as AnsibleModule does); its result says where it ran (ran_in, "controller process" here,
"module" in the module run), and the report carries it as cluster.ran_in.  `gpuharden drift --cluster-check module`
runs the module instead (tests/integration/test_drift_parity.py compares the two).  This path saves the module's run
through Ansible: a worker process, a payload and a Python that imports Ansible and the kubernetes client again
(measured on the lab machine: about 0.6 s of wall time and 0.5 CPU-s per drift run, docs/benchmarks.md).  The pods
are the play's one LIST (the snapshot gpu_pods_info left), as in the module run.

The module_utils are imported from the installed collection the playbooks come from (the first gpuharden.k8s below
Ansible's collections paths, then sys.path, as drift_run.resolve_playbook finds them), in a thread that starts with
the play, so the import overlaps the node audits.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback

from gpuharden import __version__, drift_run

# the collection is where its gpu_consistency module is; the check itself is its module_utils' (the module's too)
MODULE_FILE = os.path.join("ansible_collections", "gpuharden", "k8s", "plugins", "modules", "gpu_consistency.py")
CHECK = "ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._consistency_run"
CHECK_FILE = os.path.join("ansible_collections", "gpuharden", "k8s", "plugins", "module_utils", "cluster", "_consistency_run.py")
ERRORS = "ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors"


class ClusterSideError(Exception):
    """The consistency check could not run here (the collection not found or not importable, bad options, a failed
    LIST); the message says why, and becomes the report's consistency_error.  ``access``: why the cluster could not be
    read and the fix, as the collection's k8s layer names it (None where the cause is not the cluster's access)."""

    def __init__(self, message, access=None):
        super().__init__(message)
        self.access = access


class CollectionError(Exception):
    """A command that needs the gpuharden.k8s collection cannot run: it is not installed where Ansible looks, or its
    version does not go with this CLI's.  The message says which to install or upgrade, with the command (exit 2)."""


MISSING = ("the gpuharden.k8s collection is not installed where Ansible looks for collections (searched: %s); install the "
           "release of this CLI, %s: ansible-galaxy collection install gpuharden-k8s-%s.tar.gz (from make dist), or "
           "ansible-galaxy collection install 'gpuharden.k8s:==%s'")


def collection_version(base):
    """The version of the collection below ``base``: its MANIFEST.json's (an installed collection) or galaxy.yml's (a
    source checkout linked in, as `make setup` links this one); None where neither says."""
    root = os.path.join(base, "ansible_collections", "gpuharden", "k8s")
    try:
        with open(os.path.join(root, "MANIFEST.json")) as manifest:
            return str(json.load(manifest)["collection_info"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        import yaml  # noqa: PLC0415 (only where there is no MANIFEST.json)

        with open(os.path.join(root, "galaxy.yml")) as galaxy:
            return str(yaml.safe_load(galaxy)["version"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def version_mismatch(cli_version, collection, base):
    """(refuse, message) when ``cli_version`` (this wheel's) and ``collection`` (the installed collection's) differ,
    else None.  They are released together from one source, and the CLI reads what the collection's playbooks and
    modules return (facts, node reports, findings): a different major or minor release is refused (in 0.x a minor
    release may change those), a different patch release only warned about.  The fix names the older of the two."""
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415 (packaging comes with ansible-core)

    where = os.path.join(base, "ansible_collections", "gpuharden", "k8s")
    try:
        cli, installed = Version(cli_version), Version(collection)
    except InvalidVersion:
        return True, "the gpuharden.k8s collection at %s has version %r, which is no version: reinstall it, ansible-galaxy " \
                     "collection install --force 'gpuharden.k8s:==%s'" % (where, collection, cli_version)
    if cli == installed:
        return None
    if cli < installed:
        fix = "upgrade the CLI to the collection's release: pip install --upgrade 'gpuharden==%s'" % installed
    else:
        fix = ("upgrade the collection to the CLI's release: ansible-galaxy collection install --force gpuharden-k8s-%s.tar.gz "
               "(from make dist), or ansible-galaxy collection install --force 'gpuharden.k8s:==%s'" % (cli, cli))
    refuse = cli.release[:2] != installed.release[:2]
    return refuse, "gpuharden %s and the gpuharden.k8s collection %s at %s are %s: %s" % (
        cli, installed, where, "different releases" if refuse else "different patch releases", fix)


def require_collection(bases=None, cli_version=__version__):
    """The base of the gpuharden.k8s collection a command uses (as collection_base finds it among Ansible's
    collections paths) and a warning (None, or a patch-release mismatch); CollectionError when it is missing, its
    version unknown, or another major or minor release than this CLI's.  The one check every command that needs the
    collection makes (cli.NEEDS_COLLECTION), so each says the same."""
    if bases is None:
        bases = drift_run.collection_bases()
    base = collection_base(bases)
    if base is None:
        # Ansible's collections paths, where an install goes (sys.path, searched after them, only where nothing else is)
        searched = list(dict.fromkeys(base for base in bases if base and base not in sys.path)) or list(dict.fromkeys(filter(None, bases)))
        shown = ", ".join(searched[:3]) + (" and %d more" % (len(searched) - 3) if len(searched) > 3 else "")
        raise CollectionError(MISSING % (shown or "nowhere", cli_version, cli_version, cli_version))
    version = collection_version(base)
    if version is None:
        raise CollectionError("the gpuharden.k8s collection at %s has no MANIFEST.json or galaxy.yml that gives its version; "
                              "reinstall it: ansible-galaxy collection install --force 'gpuharden.k8s:==%s'" % (
                                  os.path.join(base, "ansible_collections", "gpuharden", "k8s"), cli_version))
    mismatch = version_mismatch(cli_version, version, base)
    if mismatch and mismatch[0]:
        raise CollectionError(mismatch[1])
    return base, mismatch[1] if mismatch else None


def collection_base(bases):
    """The first of ``bases`` (directories that may hold ``ansible_collections/``) with the collection's
    gpu_consistency module, or None."""
    for base in bases:
        if base and os.path.isfile(os.path.join(os.path.expanduser(base), MODULE_FILE)):
            return os.path.expanduser(base)
    return None


def import_collection(names):
    """{key: module} for ``names`` ({key: dotted module name}), imported from the gpuharden.k8s collection the
    playbooks come from (found where Ansible looks, as gpuharden drift finds it); None when it is not installed there.
    Any failure of the import is a ClusterSideError naming the module."""
    base = collection_base(drift_run.collection_bases())
    if base is None:
        return None
    if base not in sys.path:
        sys.path.insert(0, base)
    modules = {}
    for key, name in names.items():
        try:
            modules[key] = importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 (whatever the import raised, the command cannot run here: say why)
            raise ClusterSideError("cannot import %s from %s: %s: %s" % (name, base, type(error).__name__, error)) from None
    return modules


def import_check(base):
    """The collection's consistency check (module_utils/cluster/_consistency_run) and its error type, imported from the
    collection below ``base``."""
    if base not in sys.path:
        sys.path.insert(0, base)
    try:
        check_module, errors = importlib.import_module(CHECK), importlib.import_module(ERRORS)
    except Exception as error:  # noqa: BLE001 (whatever the import raised, the check cannot run here: say why)
        raise ClusterSideError("cannot import %s from %s: %s: %s" % (CHECK, base, type(error).__name__, error)) from None
    expected = os.path.realpath(os.path.join(base, CHECK_FILE))
    if os.path.realpath(check_module.__file__) != expected:
        # another copy of the collection was imported first: it need not be the code the playbook runs
        raise ClusterSideError("%s was imported from %s, not from %s, the collection the playbooks come from" % (
            CHECK, check_module.__file__, expected))
    return check_module, errors.GpuhardenError


def check(check_module, error_type, options, node_reports):
    """The consistency check's result for ``options`` (the module's options but node_reports; a None value is an
    omitted option, as the playbook's ``omit``) and ``node_reports``, run here (ran_in "controller process"): what the
    module run would return but for ran_in, or ClusterSideError."""
    try:
        return check_module.consistency_check_of_options(options, node_reports, check_module.RAN_IN_CONTROLLER)
    except error_type as error:
        raise ClusterSideError(error.msg, access=error.result.get("access")) from None
    except Exception as error:  # noqa: BLE001 (as a module crash would be: reported, the rest of the report kept)
        raise ClusterSideError("gpu_consistency crashed: %s" % traceback.format_exception_only(error)[-1].strip()) from None


class Runner:
    """Imports the check in a thread as soon as it is made (the play runs meanwhile); ``run`` waits for it."""

    def __init__(self, base):
        self.base = base
        self._loaded = None
        self._thread = threading.Thread(target=self._load, name="gpuharden-cluster-side-import", daemon=True)
        self._thread.start()

    def _load(self):
        try:
            self._loaded = import_check(self.base)
        except ClusterSideError as error:
            self._loaded = error

    def run(self, options, node_reports):
        self._thread.join()
        if isinstance(self._loaded, ClusterSideError):
            raise self._loaded
        check_module, error_type = self._loaded
        return check(check_module, error_type, options, node_reports)
