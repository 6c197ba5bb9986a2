# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The shell around every module's work: its missing libraries, its one exception type, its exit.

A module's ``main()`` builds its ``AnsibleModule`` and hands it here with the function that does the work;
``run_module`` is the one place where a ``GpuhardenError`` becomes ``fail_json``.

Node-side modules ship this file, so it imports nothing of the collection but ``_errors``: the callers pass in the
import guards of the libraries they need (``HAS_X`` and the import's traceback; ``_k8s.REQUIREMENT`` for the
controller's modules).
"""

from __future__ import annotations

import traceback

from ansible.module_utils.basic import missing_required_lib
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


def run_module(module, action, requires=(), never_changed=False, fail_when=None, counters=None):
    """End ``module`` with ``action(module)``'s result dict, or with its failure.

    ``requires``: ``(library, present, import_error)`` triples, checked in order before ``action`` runs.
    ``never_changed``: the result says ``changed=False`` whatever it holds (info modules, and node_lock, whose lock is
    bookkeeping the same run removes again).
    ``fail_when(params, result)``: a message when a result that was read without error should still fail the task
    (a ``fail_on`` threshold), else None; the failure carries the whole result.
    ``counters``: {result key: a callable returning a running total} (``_k8s.RESULT_COUNTERS``: ``api_retries``); the
    result, and a failure too, carries how much each total grew while ``action`` ran.
    """
    for library, present, import_error in requires:
        if not present:
            module.fail_json(msg=missing_required_lib(library), exception=import_error)
    counters = counters or {}
    started = {key: count() for key, count in counters.items()}

    def counted(result):
        return dict(result, **{key: count() - started[key] for key, count in counters.items()})

    try:
        result = counted(action(module))
    except GpuhardenError as error:
        module.fail_json(msg=error.msg, exception=traceback.format_exc(), **counted(error.result))
    if never_changed:
        result = dict(result, changed=False)
    message = fail_when(module.params, result) if fail_when else None
    if message:
        module.fail_json(msg=message, **result)
    module.exit_json(**result)
