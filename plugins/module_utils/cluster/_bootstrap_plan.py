# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The bootstrap's decisions, in Python since issue 45 (playbooks/bootstrap_gpu_node.yml made them in Jinja): the play's
settings and their checks, the run's lock owner and the lock's arguments, the device plugin's toleration of the bootstrap
taint, whether the node is a GPU node, whether pynvml.py is shipped and where, how a node that passed goes into service,
and the report of a node that failed.  The action gpuharden.k8s.bootstrap_node calls these; the playbook only calls it and registers.

Pure: no Ansible but its boolean parser, no I/O.  Every function takes plain values and returns plain values, or raises GpuhardenError with
one line naming the variable and its value.
"""

from __future__ import annotations

import re

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import check_label_key, check_labels, passes
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import ROLES, playbook_default, playbook_variable
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._vocabulary import SEVERITIES

PLAYBOOK = "bootstrap_gpu_node.yml"
# The run's custom stats (the action returns them as ansible_stats): the nodes put into service, and the failed ones' reports.
READY_STAT = "gpuharden_bootstrap_ready"
FAILED_STAT = "gpuharden_bootstrap_failed"
# The defaults of the play's own variables: the settings table's, for this playbook (meta/variables.yml documents them;
# check_variables checks their types).
DEFAULTS = {name: playbook_default(name, PLAYBOOK[: -len(".yml")]) for name in (
    "gpuharden_bootstrap_connect_timeout", "gpuharden_bootstrap_connect_delay", "gpuharden_bootstrap_node_venv",
    "gpuharden_bootstrap_ship_pynvml", "gpuharden_bootstrap_pynvml_source", "gpuharden_bootstrap_pynvml_dest",
    "gpuharden_bootstrap_taint_key", "gpuharden_bootstrap_taint_effect", "gpuharden_bootstrap_labels", "gpuharden_bootstrap_uncordon",
    "gpuharden_kubeconfig", "gpuharden_lock_path", "gpuharden_lock_timeout", "gpuharden_postcheck_settle_seconds",
    "gpuharden_allow_non_gpu_nodes")}
# The variables the bootstrap reads besides DEFAULTS' (no default of the play's own).
READ = tuple(DEFAULTS) + ("gpuharden_k8s_node_name", "gpuharden_run_owner", "gpuharden_device_plugin_tolerations")
TAINT_EFFECTS = tuple(playbook_variable("gpuharden_bootstrap_taint_effect")["choices"])
PYNVML_FILE = re.compile(r"^/.*/pynvml\.py$")
# How pynvml.py lands in the node Python's site-packages (ansible.builtin.copy's arguments besides src and dest).
PYNVML_COPY = {"owner": "root", "group": "root", "mode": "0644"}
# A failed node's report names its findings of these severities (core/_vocabulary.py's scale, error and above).
REPORTED_SEVERITIES = SEVERITIES[SEVERITIES.index("error"):]


def _refuse(name, value, what):
    raise GpuhardenError("%s: %s must be %s, got %r" % (PLAYBOOK, name, what, value))


def _boolean(name, value):
    # Ansible's own strict reading, as check_variables validates a bool variable (its argument spec's type bool)
    try:
        return boolean(value, strict=True)
    except TypeError:
        _refuse(name, value, "a boolean (true or false)")


def _seconds(name, value, positive):
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", str(value).strip()) or (positive and int(str(value).strip()) == 0):
        _refuse(name, value, "a positive number of seconds" if positive else "a number of seconds")
    return int(str(value).strip())


def _string(name, value, pattern=None, what="a string"):
    if not isinstance(value, str) or (value and pattern is not None and not pattern.search(value)):
        _refuse(name, value, what)
    return value


def settings(values, inventory_hostname, check_mode=False):
    """The play's settings from the host's variables (``values``: name -> value, those of READ that are defined)."""
    given = dict(DEFAULTS, **{name: value for name, value in values.items() if value is not None})
    node_name = given.get("gpuharden_k8s_node_name", inventory_hostname)
    if not isinstance(node_name, str) or not node_name:
        _refuse("gpuharden_k8s_node_name", node_name, "a Node name")
    taint_key = given["gpuharden_bootstrap_taint_key"]
    # the taint key is a label key, checked as the cluster-side modules check one (_node_labels)
    if not passes(check_label_key, taint_key):
        _refuse("gpuharden_bootstrap_taint_key", taint_key, "a label key (prefix/name)")
    taint_effect = given["gpuharden_bootstrap_taint_effect"]
    if taint_effect not in TAINT_EFFECTS:
        _refuse("gpuharden_bootstrap_taint_effect", taint_effect, "one of %s" % ", ".join(TAINT_EFFECTS))
    labels = given["gpuharden_bootstrap_labels"]
    if not isinstance(labels, dict) or not labels or not all(isinstance(value, str) for value in labels.values()):
        _refuse("gpuharden_bootstrap_labels", labels, 'a non-empty mapping of strings (quote "true")')
    # each key and value as the API server takes them: checked here, before the run changes any node
    check_labels(labels, "%s: gpuharden_bootstrap_labels" % PLAYBOOK)
    settle = _seconds("gpuharden_postcheck_settle_seconds", given["gpuharden_postcheck_settle_seconds"], positive=False)
    return {
        "connect_timeout": _seconds("gpuharden_bootstrap_connect_timeout", given["gpuharden_bootstrap_connect_timeout"], positive=True),
        "connect_delay": _seconds("gpuharden_bootstrap_connect_delay", given["gpuharden_bootstrap_connect_delay"], positive=False),
        "node_venv": _boolean("gpuharden_bootstrap_node_venv", given["gpuharden_bootstrap_node_venv"]),
        "ship_pynvml": _boolean("gpuharden_bootstrap_ship_pynvml", given["gpuharden_bootstrap_ship_pynvml"]),
        "pynvml_source": _string("gpuharden_bootstrap_pynvml_source", given["gpuharden_bootstrap_pynvml_source"], PYNVML_FILE,
                                 'an absolute path to a pynvml.py or ""'),
        "pynvml_dest": _string("gpuharden_bootstrap_pynvml_dest", given["gpuharden_bootstrap_pynvml_dest"], re.compile("^/"),
                               'an absolute directory or ""'),
        "taint_key": taint_key,
        "taint_effect": taint_effect,
        # the budget's out-of-service taints (role node_maintenance): a node that still has the bootstrap taint needs no slot
        "out_of_service_taints": [taint_key],
        "labels": labels,
        "uncordon": _boolean("gpuharden_bootstrap_uncordon", given["gpuharden_bootstrap_uncordon"]),
        "node_name": node_name,
        "kubeconfig": _string("gpuharden_kubeconfig", given["gpuharden_kubeconfig"]),
        "lock_path": _string("gpuharden_lock_path", given["gpuharden_lock_path"], re.compile("^/"), "an absolute path"),
        "lock_timeout": _seconds("gpuharden_lock_timeout", given["gpuharden_lock_timeout"], positive=False),
        # the plugin and the kubelet were just set up: the post-check lets the node's advertised resources settle
        "postcheck_settle_seconds": 0 if check_mode else settle,
        "allow_non_gpu_nodes": _boolean("gpuharden_allow_non_gpu_nodes", given["gpuharden_allow_non_gpu_nodes"]),
    }


def run_owner(given, stamp, number):
    """This run's name in the nodes' run locks: gpuharden_run_owner, else one made up of the UTC time and a random number."""
    return given if given else "bootstrap@%s-%d" % (stamp, number)


def _role_default(role, name):
    return next(entry["default"] for entry in ROLES[role]["settings"] if entry["name"] == name)


def device_plugin_tolerations(given, taint_key, taint_effect):
    """The plugin's tolerations (gpuharden_device_plugin_tolerations, else the role's default) and the bootstrap taint's:
    the DaemonSet must run on the tainted node for the post-check to see its GPUs allocatable."""
    base = list(given) if given is not None else list(_role_default("device_plugin", "device_plugin_tolerations"))
    if not all(isinstance(toleration, dict) for toleration in base):
        _refuse("gpuharden_device_plugin_tolerations", given, "a list of tolerations (mappings)")
    return base + [{"key": taint_key, "operator": "Exists", "effect": taint_effect}]


def gpu_node_refusal(host, gpuharden_facts, allow_non_gpu_nodes):
    """Why this host is refused as no GPU node (None: it is one, or the run allows it): gpu_facts' driver_gpus and gpu_count."""
    facts = gpuharden_facts or {}
    try:
        gpu_count = int(facts.get("gpu_count") or 0)
    except (TypeError, ValueError):
        gpu_count = 0
    if facts.get("driver_gpus") or gpu_count > 0 or allow_non_gpu_nodes:
        return None
    reason = ((facts.get("nvml") or {}).get("reason") or {}).get("code") or "no GPUs"
    return ("%s shows no NVIDIA GPU (no /proc/driver/nvidia/gpus, NVML: %s). Set gpuharden_allow_non_gpu_nodes=true to run anyway."
            % (host, reason))


def pynvml_plan(ship, probe, source, controller_file, dest):
    """Whether pynvml.py goes to the node, from where and to where.

    ship: gpuharden_bootstrap_ship_pynvml; probe: the node Python's answer ({pynvml: its file or None, purelib}), None
    when it was not asked; source: gpuharden_bootstrap_pynvml_source; controller_file: the file the controller's Python
    imports (asked only when source is ""); dest: gpuharden_bootstrap_pynvml_dest."""
    if not ship:
        return {"ship": False, "why": "gpuharden_bootstrap_ship_pynvml is false"}
    if (probe or {}).get("pynvml"):
        return {"ship": False, "why": "the node's Python imports pynvml (%s)" % probe["pynvml"]}
    chosen = source or controller_file or ""
    if not PYNVML_FILE.match(chosen):
        raise GpuhardenError("the controller's pynvml is %s, not nvidia-ml-py's pure-Python pynvml.py: install nvidia-ml-py on the "
                             "controller or set gpuharden_bootstrap_pynvml_source" % (chosen or "not importable"))
    return {"ship": True, "src": chosen, "dest": "%s/pynvml.py" % (dest or probe["purelib"]),
            "why": "the node's Python cannot import pynvml"}


def lock_args(settings, release):
    """gpuharden.k8s.node_lock's arguments: take the node's run lock as this run's owner, or give it back."""
    args = {"owner": settings["owner"], "path": settings["lock_path"]}
    if release:
        return dict(args, state="released")
    return dict(args, timeout=settings["lock_timeout"])


def admit_args(settings):
    """What puts a node that passed the post-check into service: gpu_node_labels' arguments (its labels, and the bootstrap
    taint removed where gpuharden_bootstrap_uncordon) and node_maintenance's uncordon (None: the node stays cordoned)."""
    node = settings["node_name"]
    labels = {"nodes": [node], "labels": settings["labels"], "taint": "absent" if settings["uncordon"] else "ignore",
              "taint_key": settings["taint_key"], "taint_effect": settings["taint_effect"]}
    return {"labels": labels, "uncordon": {"nodes": [node], "state": "uncordoned"} if settings["uncordon"] else None}


def failure_report(node, failed_task, failed_result, postcheck_findings, kept_tainted, kept_cordoned):
    """The report of a node that failed (the custom stat gpuharden_bootstrap_failed): the step that failed, why, the
    post-check's findings of severity error and above, and whether it was kept tainted and cordoned (their results)."""
    findings = []
    for finding in postcheck_findings or []:
        if isinstance(finding, dict) and finding.get("severity") in REPORTED_SEVERITIES and finding.get("id") not in findings:
            findings.append(finding.get("id"))
    return {
        "node": node,
        "stage": (failed_task or {}).get("name") or "unknown",
        "reason": (failed_result or {}).get("msg") or "failed",
        "findings": findings,
        "kept_cordoned": not (kept_cordoned or {"failed": True}).get("failed", False),
        "kept_tainted": not (kept_tainted or {"failed": True}).get("failed", False),
    }


def failure_message(report, taint_key):
    """The message the failed node fails with."""
    return "%s stays cordoned with the %s taint: %s failed: %s" % (report["node"], taint_key, report["stage"], report["reason"])


def no_target_message(pattern, limit):
    """Why a run that matched no host fails (ansible-playbook alone exits 0 then)."""
    within = " within --limit '%s'" % limit if limit is not None else ""
    return ("No GPU node to bootstrap: the hosts pattern '%s' (gpuharden_target_hosts, default gpu_nodes) matched no host of the "
            "inventory%s. Put the new GPU nodes in that group, or set gpuharden_target_hosts to their group or pattern." % (pattern, within))
