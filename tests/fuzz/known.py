# SPDX-License-Identifier: GPL-3.0-or-later
"""Outcome classes still expected on the planners another helper owns in phase 1 of issue 47.

kubelet_config (node/_kubelet.py), containerd_nvidia_runtime (node/_containerd.py), nvidia_device_nodes
(node/_device_nodes.py) and device_plugin (cluster/_device_plugin*.py) are being changed for issue 43; phase 2
finishes them.  Until then the generative run counts
these classes on these modules as known (reported in the summary, not failed), and tests/fuzz/test_regressions.py
pins one case of each as a strict xfail, so that a fix turns it into an error to remove from here.
node_audit's "every-check" variant runs those three planners too: their classes are known there as well.
"""

PHASE_2 = "phase 2 of issue 47: the planner is another helper's (issue 43) in phase 1"

KNOWN = {
    "kubelet_config": {"traceback", "hang", "rejected_by_component", "unclear_error", "write_through_link", "not_idempotent",
                       "half_done", "invalid_accepted", "lost_update"},
    "containerd_nvidia_runtime": {"traceback", "hang", "rejected_by_component", "unclear_error", "write_through_link",
                                  "not_idempotent", "half_done", "invalid_accepted", "lost_update"},
}
KNOWN_VARIANTS = {("node_audit", "every-check"): {"traceback", "hang", "unclear_error"}}


def is_known(case, outcome):
    return outcome.kind in KNOWN.get(case.module, set()) or outcome.kind in KNOWN_VARIANTS.get((case.module, case.variant), set())
