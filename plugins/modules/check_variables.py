#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/check_variables.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: check_variables
short_description: Fail on misspelt or invalid gpuharden variables before a run changes anything
version_added: 0.1.0
description:
  - Looks at the variables of every host of the play (inventory C(group_vars) and C(host_vars), extra vars, play
    vars) and fails, before any task contacts a node, on any of these.
  - A name with one of the collection's prefixes that is not a variable the collection knows, naming the closest
    known variable (I(did you mean ...)). The prefixes are C(gpuharden_) and each role's name followed by C(_)
    (C(device_permissions_), C(kubelet_topology_), C(mig_), ...). A name without those prefixes counts too when it is
    very close to a known name (a misspelt prefix, for example C(kubelet_toplogy_cpu_manager_policy)).
  - A value that does not fit, for every role option (its type, choices and elements in the role's
    C(meta/argument_specs.yml)) and every playbook variable (its type, choices and format in the collection's
    C(meta/variables.yml)), templated as the role would see it (the host's value, else the role's default), checked
    with Ansible's own C(ArgumentSpecValidator), as the role's own argument validation would when it starts, later
    in the run. For example C(kubelet_topology_cpu_manager_policy=statc) or C(gpuharden_max_unavailable=abc).
    A value that uses a variable the run sets later (a fact, a registered result) cannot be templated yet; it is
    listed in RV(not_validated), with a warning, and its role checks it when it starts.
  - A variable that feeds a play keyword (C(gpuharden_target_hosts), C(gpuharden_serial),
    C(gpuharden_max_fail_percentage), ...; C(play_keyword) in C(meta/variables.yml)) set in the inventory. Ansible
    templates a play's keywords once for the play, before any host's variables exist, so such a value would be
    silently ignored; give it as an extra var.
  - Known names are every option in the roles' C(meta/argument_specs.yml), every key of their C(defaults/main.yml)
    and C(vars/main.yml), the playbooks' variables listed in the collection's C(meta/variables.yml), and the names
    the collection's tasks set themselves (C(register), C(set_fact)). Names starting with C(_) are internal and never
    checked, nor are C(ansible_*) names.
  - Opt-outs for names, read per host. C(gpuharden_known_extra_variables) is a list of names or shell patterns (for
    example C(mig_site_*)) of variables of your own that share a prefix. C(gpuharden_allow_unknown_variables=true)
    turns the failure on unknown names into a warning. A bad value has no opt-out.
  - Runs on the controller only and never contacts a node (delegate it to localhost). The run of the first
    C(serial) batch checks every host of the play, those of the other batches too, so that a mistake in a later
    batch stops the run before the first batch is changed; the runs of the later batches rely on it. Use it as a
    play's first task, with C(run_once=true) (a run per host would check the same hosts again) and
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
  delegate_to: localhost
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
invalid:
  description: >-
    Per host, the variables whose value does not fit its spec, with Ansible's error (which names the variable) and the
    C(origin) of the value (path:line:column of the file Ansible read it from; null for a key=value extra var or a role
    default).
  returned: always
  type: dict
  sample:
    gpu-a:
      - name: kubelet_topology_cpu_manager_policy
        error: "value of kubelet_topology_cpu_manager_policy must be one of: , none, static, got: statc"
        origin: /srv/inventory/group_vars/gpu_nodes.yml:4:37
play_keyword_in_inventory:
  description: >-
    The variables that feed a play keyword and that hosts have in their inventory while the play does not (not given
    as extra or play vars), with the C(keyword), the C(hosts), their distinct C(values) and the C(origins) of those.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpuharden_serial", "keyword": "serial", "hosts": ["gpu-a", "gpu-b"], "values": [1],
            "origins": ["/srv/inventory/group_vars/gpu_nodes.yml:1:19"]}]
not_validated:
  description: >-
    The values that could not be validated before the run (they use a variable the run sets later), with the
    C(cause) and the C(hosts); each is also a warning. Their role checks them when it starts.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "mig_strategy", "cause": "'site_mig_strategy' is undefined; its role checks it when it starts", "hosts": ["gpu-b"]}]
checked_hosts:
  description: The hosts whose variables were checked.
  returned: always
  type: list
  elements: str
  sample: [gpu-a]
"""
