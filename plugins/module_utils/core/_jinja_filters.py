# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The Jinja filters the roles' YAML applied to their variables, as Python (issue 45: the decisions leave Jinja):
cluster/_role_preflight.py's rules and core/_role_options.py's options maps read the variables exactly as the
``| int``, ``| float`` and ``| bool`` they replace did."""

from __future__ import annotations

# The spellings ansible-core 2.19's ``| bool`` filter reads (plugins/filter/core.py _valid_bool_true/_valid_bool_false).
BOOL_TRUE = ("yes", "on", "true", "1")
BOOL_FALSE = ("no", "off", "false", "0")


def as_int(value):
    """Jinja's ``| int`` filter: the integer, else the integer part of a float, else 0."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


def as_float(value):
    """Jinja's ``| float`` filter: the float, else 0.0."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def as_bool(value):
    """Ansible's ``| bool`` filter (ansible-core 2.19 plugins/filter/core.py to_bool): the well-known spellings of true,
    any other value false (its deprecated fallback keeps only 1 true)."""
    if isinstance(value, (str, int)):
        value = str(value).lower()
    try:
        return value in BOOL_TRUE or (value not in BOOL_FALSE and value == 1)
    except TypeError:
        return False
