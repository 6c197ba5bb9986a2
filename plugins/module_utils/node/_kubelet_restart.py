# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Restart the kubelet after kubelet_config wrote its files, and wait for its healthz, in the same module run.

The restart and the quarter-second poll are _service_restart's; the probe here is a local HTTP GET of the kubelet's
healthz. A kubelet that does not come back, or a restart that fails, is reported in the result; with ``rollback``
kubelet_config puts the files back itself (their undo, but the checkpoints a disruptive change removed), restarts the
kubelet on them, waits for it again, and fails with the kubelet's own reason (``rollback_failure``): the stop, write,
start, health wait and rollback of roles/kubelet_topology are one module run.
"""

from __future__ import annotations

import http.client
import os
import re
import time
import urllib.error
import urllib.request

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _service_restart

RESTART_SPEC = {
    # never: only write (the caller restarts); if_required: restart when the write changed what the kubelet reads
    # (restart_required) or removed a checkpoint; always: (re)start even without a change (the caller stopped it)
    "restart": {"type": "str", "default": "never", "choices": ["never", "if_required", "always"]},
    # The kubelet's defaults: healthzBindAddress 127.0.0.1, healthzPort 10248 (kubernetes pkg/kubelet/apis/config/
    # v1beta1/defaults.go); /healthz answers 200 once its checks pass, among them "syncloop" (pkg/kubelet/server/server.go)
    "health_url": {"type": "str", "default": "http://127.0.0.1:10248/healthz"},
    "health_timeout": {"type": "int", "default": 120},
    # stop the kubelet before the write (a CPU or Memory Manager policy change, a stale checkpoint: its checkpoints go
    # while it is stopped); a write that then fails starts it again
    "stop_first": {"type": "bool", "default": False},
    # a kubelet that is not healthy after the restart: put the files back, restart, wait, and fail with its reason
    "rollback": {"type": "bool", "default": False},
    # where the kubelet's reason is read: this file's last log_lines lines, else /var/log/<service>.log, else the journal
    "log_file": {"type": "str", "default": ""},
    "log_lines": {"type": "int", "default": 15},
}
# The kubelet's checkpoints (cpu_manager_state, memory_manager_state): a rollback leaves a removed stale one removed
# (the kubelet writes a new one for the policy it starts with).
CHECKPOINT_SUFFIX = "_manager_state"
# The log lines that say why: klog's error lines (E<mmdd> ...) and Go errors.
ERROR_LINE = re.compile(r"^E\d{4} |rror")
REQUEST_SECONDS = 5.0


def wanted(params, changed, restart_required, check_mode):
    """Whether this run restarts the kubelet."""
    if check_mode or params["restart"] == "never":
        return False
    return params["restart"] == "always" or (changed and restart_required)


def _get(url, timeout):
    """The HTTP status of GET ``url``; no proxy (the kubelet's healthz is the node's own loopback port)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def restart_and_wait(run_command, service, url, timeout, clock=time.monotonic, sleep=time.sleep, get=_get):
    """``systemctl restart service``, then GET ``url`` until it answers 200 or ``timeout`` seconds have passed.

    Returns {"status": the last HTTP status or None, "seconds": from the restart, "attempts": GETs made,
    "error": why it is not healthy, or None, "restarted_at": the node's clock just before the restart (epoch seconds)}.
    """

    def healthz(deadline):
        try:
            status = get(url, min(REQUEST_SECONDS, max(deadline - clock(), 0.1)))
        except (OSError, ValueError, http.client.HTTPException) as problem:  # URLError, socket timeouts: OSErrors
            return False, None, "%s: %s" % (url, getattr(problem, "reason", problem)), False
        return status == 200, status, None if status == 200 else "%s answered HTTP %s" % (url, status), False

    waited = _service_restart.restart_and_wait(run_command, service, healthz, timeout, clock, sleep)
    error = waited["error"]
    if waited["timed_out"]:
        error = "not healthy %d s after the restart: %s" % (timeout, error)
    return {"status": waited["status"], "seconds": waited["seconds"], "attempts": waited["attempts"], "error": error,
            "restarted_at": waited["restarted_at"]}


def stop(run_command, service):
    """``systemctl stop service``; a failure raises (nothing was written yet)."""
    _systemctl(run_command, "stop", service)


def start(run_command, service):
    """``systemctl start service``: after a failed write that followed a stop."""
    _systemctl(run_command, "start", service)


def _systemctl(run_command, verb, service):
    try:
        rc, out, err = run_command(["systemctl", verb, service])
    except OSError as error:
        rc, out, err = 1, "", str(error)
    if rc != 0:
        raise GpuhardenError("systemctl %s %s failed (rc %d): %s" % (verb, service, rc, (err or out).strip()),
                             fix="see the unit's state with systemctl status %s" % service)


def unit_result(run_command, service):
    """{Result, ExecMainStatus} of the unit, "?" where systemd does not say."""
    found = {"Result": "?", "ExecMainStatus": "?"}
    try:
        rc, out, _err = run_command(["systemctl", "show", "-p", "Result", "-p", "ExecMainStatus", service])
    except OSError:
        return found
    for line in (out or "").splitlines() if rc == 0 else ():
        key, _sep, value = line.partition("=")
        if key in found and value:
            found[key] = value
    return found


def log_reason(run_command, service, log_file, lines):
    """The kubelet's own reason: the error lines among the last ``lines`` of its log file (``log_file``, else
    /var/log/<service>.log) or of its journal, joined with " | ", else all of those lines."""
    path = log_file or "/var/log/%s.log" % service
    argv = ["tail", "-n", str(lines), path] if os.path.exists(path) else ["journalctl", "--no-pager", "-n", str(lines), "-u", service]
    try:
        _rc, out, _err = run_command(argv)
    except OSError as error:
        return "(%s: %s)" % (argv[0], error)
    errors = [line for line in (out or "").splitlines() if ERROR_LINE.search(line)]
    return " | ".join(errors) or (out or "").strip()


def rollback_paths(changed_paths):
    """Of the paths a write changed, those a rollback puts back: not the checkpoints."""
    return [path for path in changed_paths if not path.endswith(CHECKPOINT_SUFFIX)]


def rollback_failure(service, timeout, unit, restored, reason, health_after):
    """The one-line failure of a rolled-back write."""
    after = ("and the kubelet is healthy again" if health_after["error"] is None
             else "but the kubelet is still not healthy (%s)" % health_after["error"])
    text = ("kubelet (%s) did not become healthy within %ss after the configuration change (systemd Result=%s, ExecMainStatus=%s); "
            "restored %s %s. Kubelet log: %s")
    return text % (service, timeout, unit["Result"], unit["ExecMainStatus"], ", ".join(restored) or "nothing", after, reason)
