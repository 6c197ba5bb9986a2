# SPDX-License-Identifier: GPL-3.0-or-later
"""The environment that runs one Ansible run under Mitogen for Ansible's strategy (opt-in, measured; not the default).

Mitogen is installed by the project's optional extra (``pip install -e '.[mitogen]'``, pyproject.toml); it is enabled
for a run only, by the environment, never by ansible.cfg: ``ANSIBLE_STRATEGY_PLUGINS`` points at the strategy
plugins the installed ``ansible_mitogen`` package ships, and ``ANSIBLE_STRATEGY=mitogen_linear`` picks its linear
strategy (the one the playbooks' default ``linear`` becomes).  ``bench/drift.py --mitogen`` uses it; for a shell:

    eval "$(python bench/mitogen_env.py)"   # then gpuharden drift ..., ansible-playbook ..., pytest -m lab ...
"""

from __future__ import annotations

import os
import shlex
import sys

STRATEGY = "mitogen_linear"


def mitogen_env():
    """{variable: value} for a run under Mitogen; SystemExit naming the extra when it is not installed."""
    try:
        import ansible_mitogen
    except ImportError:
        raise SystemExit("mitogen is not installed in this Python (%s): pip install -e '.[mitogen]'" % sys.executable) from None
    plugins = os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy")
    if not os.path.isfile(os.path.join(plugins, STRATEGY + ".py")):
        raise SystemExit("%s has no %s strategy: this mitogen is not the one pyproject.toml's extra names" % (plugins, STRATEGY))
    return {"ANSIBLE_STRATEGY_PLUGINS": plugins, "ANSIBLE_STRATEGY": STRATEGY}


def main():
    for name, value in mitogen_env().items():
        print("export %s=%s" % (name, shlex.quote(value)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
