# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Restart a node service and wait until it is ready, in the module run that changed its configuration.

A restart and a readiness wait used to be more tasks after the write, each a trip to the node. Here the module that
wrote the files restarts the service and polls a probe every quarter second, so the run learns the moment the service
is back. Nothing here raises: a restart that fails, or a service that does not come back, is reported in the result
and the caller decides (roll back, or fail the host).
"""

from __future__ import annotations

import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._waiter import wait_until

POLL_SECONDS = 0.25


def restart_and_wait(run_command, service, probe, timeout, clock=time.monotonic, sleep=time.sleep, wall=time.time):
    """``systemctl restart service``, then ``probe(deadline)`` until it says ready or final, or ``timeout`` seconds
    have passed.  ``probe`` returns (ready, status, error, final): ``final`` when waiting longer cannot help (the
    service exited).

    Returns {"ready": bool, "status": the probe's last status or None, "seconds": from the restart, "attempts": probes
    made, "error": why it is not ready (None when it is), "timed_out": bool, "restarted_at": the node's clock (epoch
    seconds) just before the restart}.  ``restarted_at`` tells what the restarted daemon did from what the old one did:
    the post-check trusts a Node status only when the kubelet posted it after that moment (module_utils/cluster/
    _consistency.py status_posted_after), on the same node clock.
    """
    restarted_at = round(wall(), 3)
    started = clock()
    try:
        rc, out, err = run_command(["systemctl", "restart", service])
    except OSError as error:  # no systemctl: reported like a failed restart
        rc, out, err = getattr(error, "errno", None) or 1, "", str(error)
    if rc != 0:
        return {"ready": False, "status": None, "seconds": round(clock() - started, 3), "attempts": 0, "timed_out": False,
                "restarted_at": restarted_at, "error": "systemctl restart %s failed (rc %d): %s" % (service, rc, (err or out).strip())}
    deadline = started + timeout

    def serving():
        answer = probe(deadline)  # (ready, status, error, final)
        return answer[0] or answer[3], answer

    waited = wait_until("%s serving after its restart" % service, serving, deadline, POLL_SECONDS, clock=clock, sleep=sleep)
    ready, status, error, _final = waited.detail
    return {"ready": ready, "status": status, "seconds": round(clock() - started, 3), "attempts": waited.looks,
            "error": None if ready else error, "timed_out": not waited.done, "restarted_at": restarted_at}
