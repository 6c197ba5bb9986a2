# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 47: every node-side module, through its real entry point, on hostile and odd inputs generated from real
files, ends in a clear refusal that changes nothing or in a success the real component accepts (tests/fuzz/engine.py).

Bounded here (``make unit``: a fixed, derandomized handful of cases per module); ``make fuzz`` runs the same generator
for long (tests/fuzz/conftest.py).  Every outcome outside the two allowed fails the module's test with the cases that
produced it; tests/fuzz/test_regressions.py keeps a named case of each class found.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, seed, settings

from tests.fuzz import mutations
from tests.fuzz.engine import run_case
from tests.fuzz.nodes import SPECS

LONG = os.environ.get("GPUHARDEN_FUZZ") == "long"
# Bounded: a few cases per module, so that the whole run takes a minute or two.
BOUNDED_EXAMPLES = 6
LONG_EXAMPLES = int(os.environ.get("GPUHARDEN_FUZZ_EXAMPLES", "100"))
SEED = int(os.environ.get("GPUHARDEN_FUZZ_SEED") or random.SystemRandom().randrange(2 ** 32)) if LONG else None


def workdir():
    path = Path(tempfile.mkdtemp(prefix="gpuharden-fuzz-"))
    path.chmod(0o755)  # nvml_check's unprivileged child reads the node root
    return path


def run_one(case):
    spec = SPECS[case.module]
    where = workdir()
    try:
        outcome, _runs = run_case(case, spec.build, mutations.apply, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return outcome


@pytest.mark.parametrize("module", sorted(SPECS))
def test_hostile_inputs_end_in_a_clear_refusal_or_an_accepted_success(module, fuzz_recorder):
    spec = SPECS[module]
    unexpected = []
    strategy = mutations.case_strategy(module, spec.variants, spec.targets, None)

    @settings(max_examples=LONG_EXAMPLES if LONG else BOUNDED_EXAMPLES)
    @given(case=strategy)
    def explore(case):
        outcome = run_one(case)
        fuzz_recorder.record(case, outcome)
        if not outcome.allowed:
            unexpected.append((case, outcome))

    if SEED is not None:
        fuzz_recorder.seed = SEED
        explore = seed(SEED)(explore)
    explore()
    assert not unexpected, "\n".join("%s -> %s (%s mode): %s" % (case.brief(), outcome.kind, outcome.mode, outcome.detail)
                                     for case, outcome in unexpected[:20])
