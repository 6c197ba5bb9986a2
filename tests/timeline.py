# SPDX-License-Identifier: GPL-3.0-or-later
"""Where the lab stream's wall time goes: with GPUHARDEN_TEST_TIMELINE set to a file, each test appends one line
(worker, start and end in epoch seconds, the CPU time its worker's waited children used, node id), so that the two
workers' queues can be laid side by side with the machine's CPU after a run.  junit gives durations only, and not
which worker ran a test, which is what balancing UNIT_SECONDS (tests/xdist_shared_lab.py) needs.

A child counts when it is waited for: a lab's daemons are, when the lab comes down, so their whole CPU lands on the
test whose teardown took the lab down, not on the tests that ran beside them."""

from __future__ import annotations

import os
import resource
import time

import pytest


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("GPUHARDEN_TEST_TIMELINE")
    if not path:
        yield
        return
    start, cpu = time.time(), _children_cpu()
    yield
    line = "%s\t%.1f\t%.1f\t%.1f\t%s\n" % (os.environ.get("PYTEST_XDIST_WORKER", "main"), start, time.time(),
                                            _children_cpu() - cpu, item.nodeid)
    with open(path, "a", encoding="utf-8") as timeline:  # one short append per test: the workers' lines stay whole
        timeline.write(line)
