# SPDX-License-Identifier: GPL-3.0-or-later
"""Two drift reports compared field by field: the parity of `gpuharden drift`'s two paths to the consistency check
(in its own process, or the gpu_consistency module in the play), used by tests/unit/test_drift_parity.py and
tests/integration/test_drift_parity.py."""

from __future__ import annotations

import fnmatch

# The only fields two runs of the same check may differ in, each with why (a dotted path; * is one key):
IGNORED = {
    "generated_at": "when the run ended",
    "timestamp": "when the run ended",
    "duration_seconds": "how long the run took",
    "nodes.*.audit_seconds": "how long node_audit took on the node",
    "nodes.*.audit_cpu_seconds": "node_audit's CPU time on the node",
    "nodes.*.checks.*.seconds": "how long each node check took",
    "cluster.ran_in": "where the consistency check ran: the one difference the two paths are meant to have",
}


def differences(left, right, ignored=IGNORED, path=""):
    """Every difference between two reports (JSON values) as "path: left != right", leaving out the ``ignored`` paths:
    a key only one side has, a value that differs, a list of another length (then its elements one by one too)."""
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in ignored):
        return []
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(set(left) | set(right), key=str):
            where = "%s.%s" % (path, key) if path else str(key)
            if key not in left or key not in right:
                if not any(fnmatch.fnmatchcase(where, pattern) for pattern in ignored):
                    found.append("%s: only in the %s report" % (where, "left" if key in left else "right"))
                continue
            found += differences(left[key], right[key], ignored, where)
        return found
    if isinstance(left, list) and isinstance(right, list):
        found = [] if len(left) == len(right) else ["%s: %d != %d entries" % (path, len(left), len(right))]
        for index, (one, other) in enumerate(zip(left, right, strict=False)):  # the shorter one: its length is named above
            found += differences(one, other, ignored, "%s[%d]" % (path, index))
        return found
    return [] if left == right else ["%s: %r != %r" % (path, left, right)]
