# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Restart the kubelet after kubelet_config wrote its files, and wait for its healthz, in the same module run.

The restart and the quarter-second poll are _service_restart's; the probe here is a local HTTP GET of the kubelet's
healthz. A kubelet that does not come back, or a restart that fails, is reported in the result, and the caller rolls
the configuration back (roles/kubelet_topology/tasks/rollback.yml).
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request

from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _service_restart

RESTART_SPEC = {
    # never: only write (the caller restarts); if_required: restart when the write changed what the kubelet reads
    # (restart_required) or removed a checkpoint; always: (re)start even without a change (the caller stopped it)
    "restart": {"type": "str", "default": "never", "choices": ["never", "if_required", "always"]},
    # The kubelet's defaults: healthzBindAddress 127.0.0.1, healthzPort 10248 (kubernetes pkg/kubelet/apis/config/
    # v1beta1/defaults.go); /healthz answers 200 once its checks pass, among them "syncloop" (pkg/kubelet/server/server.go)
    "health_url": {"type": "str", "default": "http://127.0.0.1:10248/healthz"},
    "health_timeout": {"type": "int", "default": 120},
}
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
