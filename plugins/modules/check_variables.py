#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/check_variables.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: check_variables
short_description: Fail on misspelt gpuharden variables before a run changes anything
version_added: 0.1.0
description:
  - Looks at the names of the variables of every host of the play (inventory C(group_vars) and C(host_vars), extra
    vars, play vars) and fails when a name with one of the collection's prefixes is not a variable the collection
    knows, naming the closest known variable (I(did you mean ...)). The prefixes are C(gpuharden_) and each role's
    name followed by C(_) (C(device_permissions_), C(kubelet_topology_), C(mig_), ...).
  - A name without those prefixes counts too when it is very close to a known name (a misspelt prefix, for example
    C(kubelet_toplogy_cpu_manager_policy)).
  - Known are every option in the roles' C(meta/argument_specs.yml), every key of their C(defaults/main.yml) and
    C(vars/main.yml), the playbooks' variables listed in the collection's C(meta/variables.yml), and the
    names the collection's tasks set themselves (C(register), C(set_fact)). Names starting with C(_) are internal
    and never checked, nor are C(ansible_*) names.
  - Opt-outs, read per host. C(gpuharden_known_extra_variables) is a list of names or shell patterns (for example
    C(mig_site_*)) of variables of your own that share a prefix. C(gpuharden_allow_unknown_variables=true) turns
    the failure into a warning.
  - Runs on the controller only and never contacts a node. One run checks every host of the play, those of the
    other C(serial) batches too, so that a typo in a later batch stops the run before the first batch is changed.
    Use it as a play's first task, with C(run_once=true) (a run per host would check the same hosts again) and
    C(any_errors_fatal=true).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
options: {}
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

EXAMPLES = r"""
- name: Check the gpuharden variables of the play's hosts
  gpuharden.k8s.check_variables:
  run_once: true
  any_errors_fatal: true
  tags: [always]

# group_vars/all.yml of a site whose own roles also use the mig_ prefix
# gpuharden_known_extra_variables:
#   - mig_site_*
#   - gpuharden_cmdb_id
"""

RETURN = r"""
unknown:
  description:
    - Per host, the unknown variables and the closest known name (C(suggestion), null when none is close).
    - Also filled when C(gpuharden_allow_unknown_variables) made them warnings.
  returned: always
  type: dict
  sample:
    gpu-a:
      - name: kubelet_topology_tppology_manager_policy
        suggestion: kubelet_topology_topology_manager_policy
checked_hosts:
  description: The hosts whose variables were checked.
  returned: always
  type: list
  elements: str
  sample: [gpu-a]
"""
