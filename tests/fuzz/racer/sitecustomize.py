# SPDX-License-Identifier: GPL-3.0-or-later
"""A second writer between the module's read and its rename (tests/fuzz, lost updates), at a fixed moment.

Loaded only by the harness's module runs (its directory on PYTHONPATH, GPUHARDEN_FUZZ_RACE set): when the module makes
the temporary file it will rename over ``path`` (gpuharden's ``.gpuharden-`` prefix, in the file's directory), another
writer first replaces ``path`` atomically with ``content``, as a config-management agent does, and leaves ``marker``
so that the harness knows the race happened.  Nothing else of the module changes.
"""

import json
import os
import tempfile

_RACE = json.loads(os.environ.get("GPUHARDEN_FUZZ_RACE") or "null")
_mkstemp = tempfile.mkstemp


def _racing_mkstemp(*args, **kwargs):
    race = _RACE
    directory = kwargs.get("dir") if "dir" in kwargs else (args[2] if len(args) > 2 else None)
    prefix = kwargs.get("prefix") if "prefix" in kwargs else (args[1] if len(args) > 1 else "")
    if race and not os.path.exists(race["marker"]) and str(prefix or "").startswith(".gpuharden-") \
            and directory is not None and os.path.realpath(directory) == os.path.realpath(os.path.dirname(race["path"])):
        other = race["path"] + ".other-writer"
        with open(other, "w") as handle:
            handle.write(race["content"])
        os.replace(other, race["path"])
        with open(race["marker"], "w") as handle:
            handle.write("raced\n")
    return _mkstemp(*args, **kwargs)


if _RACE:
    tempfile.mkstemp = _racing_mkstemp
