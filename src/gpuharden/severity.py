# SPDX-License-Identifier: GPL-3.0-or-later
"""The CLI's use of the one severity scale, the collection's: gpuharden.vocabulary is a link to the collection's
plugins/module_utils/core/_vocabulary.py (the CLI reads reports without the collection installed)."""

from __future__ import annotations

from gpuharden.vocabulary import SEVERITIES

__all__ = ["SEVERITIES", "counted"]


def counted(findings, threshold):
    """The findings at or above ``threshold``."""
    rank = SEVERITIES.index(threshold)
    return [entry for entry in findings if entry.get("severity") in SEVERITIES[rank:]]
