# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The one wait loop of the collection: look, and look again after an interval, until a condition holds or a deadline.

Every wait of the modules goes through ``wait_until``: a Node Ready again, a DaemonSet rolled out, an object or a pod
gone, evictions a PodDisruptionBudget refused, a restarted service serving, a Node reporting a runtime handler, the
cluster settling, the node's run lock.  One place decides how a wait ends: the condition is asked first, then again
after each interval (multiplied by ``backoff`` after each look, up to ``max_interval``); an interval that would end past
the deadline is not slept (the wait ends, timed out), unless ``final_look`` asks to sleep until the deadline and look once
more.  The clock and the sleep are injectable (tests run no real time).  Nodes ship this file: the standard library only.
"""

from __future__ import annotations

import time
from collections import namedtuple

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

# done: the condition held (False: timed out); detail: what the last look saw; looks: how often the condition was asked;
# seconds: from the first look to the end, on the injected clock.
Waited = namedtuple("Waited", ("done", "detail", "looks", "seconds"))


def wait_until(what, condition, deadline, interval, backoff=1.0, max_interval=None, final_look=False, must=False,
               clock=time.monotonic, sleep=time.sleep):
    """Ask ``condition()`` until it returns (True, detail) or ``deadline`` (on ``clock``) comes: a ``Waited``.

    ``what`` names what is waited for, for the timeout error (``"DaemonSet kube-system/nvidia-device-plugin rolled out"``).
    ``condition()`` returns (done, detail): ``detail`` is the state it saw, kept for the caller and the error.  With
    ``must``, a timeout raises a GpuhardenError naming ``what``, the seconds waited and the last state seen; without, the
    caller reads ``Waited.done`` and reports (most waits here report a node still not Ready rather than fail).
    """
    if interval < 0 or backoff < 1:
        raise GpuhardenError("wait for %s: interval %r must be 0 or more seconds and backoff %r at least 1" % (what, interval, backoff))
    started = clock()
    looks = 0
    while True:
        looks += 1
        done, detail = condition()
        now = clock()
        if done:
            return Waited(True, detail, looks, now - started)
        pause = min(interval, max(deadline - now, 0)) if final_look else interval
        if now >= deadline or (not final_look and now + pause > deadline):
            break
        sleep(pause)
        interval = interval * backoff if max_interval is None else min(interval * backoff, max_interval)
    waited = Waited(False, detail, looks, now - started)
    if must:
        raise GpuhardenError(timeout_message(what, waited))
    return waited


def timeout_message(what, waited):
    """The one-line text of a wait that timed out: what it waited for, how long, how often it looked, what it saw last."""
    return "timed out after %.1f s (%d looks) waiting for %s; last seen: %s" % (waited.seconds, waited.looks, what, waited.detail)
