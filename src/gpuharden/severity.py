# SPDX-License-Identifier: GPL-3.0-or-later
"""The one severity scale of the CLI: the collection's (plugins/module_utils/core/_findings.py; a unit test pins the
two equal), since the CLI does not import the collection's code."""

from __future__ import annotations

SEVERITIES = ("info", "warning", "error", "critical")


def counted(findings, threshold):
    """The findings at or above ``threshold``."""
    rank = SEVERITIES.index(threshold)
    return [entry for entry in findings if entry.get("severity") in SEVERITIES[rank:]]
