# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  backup:
    description:
      - Keep a timestamped copy of every file the module changes, next to it.
      - The copies are returned in RV(backup_files), keyed by the edited path.
    type: bool
    default: false
notes:
  - Files are written atomically (a temporary file in the same directory, then a rename) and keep their
    owner, mode and SELinux context. Comments and the order of entries are preserved.
"""
