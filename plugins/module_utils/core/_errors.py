# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The one exception type of the module_utils layer; only the module shell (``_module_shell.run_module``, called by
each module's main()) turns it into fail_json."""

from __future__ import annotations


class GpuhardenError(Exception):
    """A clear, user-facing failure.

    ``msg`` names the file, field and value at fault.  ``result`` carries whatever partial
    result the caller should still report (for example the state reached before a failed step).
    """

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.msg = msg
        self.result = result
