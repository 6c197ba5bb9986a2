# SPDX-License-Identifier: GPL-3.0-or-later
"""The result keys ansible-core reads itself (issue 43, problem 11): a module may return them only with their Ansible
meaning, or not at all.  Read from ansible-core 2.19 (the version pyproject.toml pins):

* ``executor/task_result.py``: ``is_skipped`` (any truthy ``skipped``, or every loop item's), ``is_failed``
  (``failed``, ``failed_when_result``), ``is_changed`` (``changed``), ``is_unreachable`` (``unreachable``),
  ``_loop_results`` (a list under ``results`` is a loop's items); ``_IGNORE`` (``failed``, ``skipped``: dropped from what
  callbacks see), ``_PRESERVE`` (``attempts``, ``changed``, ``retries``, ``exception``, ``warnings``, ``deprecations``,
  kept under no_log), ``censor_result`` (``censored``);
* ``executor/task_executor.py``: ``rc`` (non-zero makes the task failed when there is no ``failed``), ``ansible_facts``
  (merged into the host's facts), ``attempts``/``retries`` (until loops), ``msg`` (loop summaries), ``ansible_job_id``,
  ``started``, ``finished`` (async), ``skip_reason`` (and ``false_condition``, ``playbook/task.py``: a skipped task's
  why), ``item``, ``ansible_loop_var``, ``ansible_index_var``, ``ansible_loop`` (loop items), ``_ansible_notify``;
* ``plugins/action/__init__.py``: ``stdout``/``stderr`` (``stdout_lines``/``stderr_lines`` are made from them),
  ``module_stdout``/``module_stderr`` (a module that printed no JSON), ``_ansible_parsed``; and ``remove_internal_keys``
  (``vars/clean.py``) drops ``_ansible_*`` and ``constants.INTERNAL_RESULT_KEYS`` (``add_host``, ``add_group``);
* ``plugins/strategy/__init__.py``: ``add_host``, ``add_group`` (inventory changes), ``ansible_stats`` (set_stats),
  ``ansible_facts``;
* ``module_utils/basic.py``: ``invocation``, ``warnings``, ``deprecations`` (``_return_formatted``), ``failed``,
  ``msg``, ``exception`` (``fail_json``), ``changed``; the default callback shows ``msg`` and ``diff``.
"""

from __future__ import annotations

# key -> the Python types a result may hold under it, with Ansible's meaning (None: any, the module's own data
# under this key is what Ansible reads)
ALLOWED = {
    "changed": (bool,),
    "failed": (bool,),
    "msg": (str,),
    "diff": (dict, list),
    "warnings": (list,),
    "deprecations": (list,),
    "invocation": (dict,),
    "exception": (str,),
    "ansible_facts": (dict,),
}
# RETURN's documented type for each allowed key
ALLOWED_RETURN_TYPES = {"changed": {"bool"}, "failed": {"bool"}, "msg": {"str"}, "diff": {"dict", "list"}, "warnings": {"list"},
                        "deprecations": {"list"}, "invocation": {"dict"}, "exception": {"str"}, "ansible_facts": {"dict"}}
# keys a module must never return: Ansible gives them a meaning of its own (see above)
FORBIDDEN = frozenset({
    "skipped", "unreachable", "results", "failed_when_result", "attempts", "retries", "censored",
    "rc", "stdout", "stderr", "stdout_lines", "stderr_lines", "module_stdout", "module_stderr",
    "add_host", "add_group", "ansible_stats", "ansible_job_id", "started", "finished",
    "skip_reason", "false_condition", "item", "ansible_loop_var", "ansible_index_var", "ansible_loop",
})
# prefixes Ansible keeps for itself (vars/clean.py strip_internal_keys, and ansible_* variables set from results)
FORBIDDEN_PREFIXES = ("_ansible_", "ansible_")


def collisions(result):
    """['key: why'] for each top-level key of a module's ``result`` that Ansible would read as its own."""
    found = []
    for key, value in result.items():
        if key in ALLOWED:
            if not isinstance(value, ALLOWED[key]):
                found.append("%s: Ansible reads it as %s, got %s" % (key, "/".join(t.__name__ for t in ALLOWED[key]), type(value).__name__))
        elif key in FORBIDDEN or key.startswith(FORBIDDEN_PREFIXES):
            found.append("%s: a key ansible-core interprets itself" % key)
    return found


def return_collisions(module, documented):
    """['module.key: why'] for each key of a module's RETURN documentation that collides."""
    found = []
    for key, doc in documented.items():
        documented_type = (doc or {}).get("type")
        if key in ALLOWED_RETURN_TYPES:
            if documented_type not in ALLOWED_RETURN_TYPES[key]:
                found.append("%s.%s: documented as %s, Ansible reads it as %s" % (module, key, documented_type, "/".join(sorted(ALLOWED_RETURN_TYPES[key]))))
        elif key in FORBIDDEN or key.startswith(FORBIDDEN_PREFIXES):
            found.append("%s.%s: a key ansible-core interprets itself" % (module, key))
    return found
