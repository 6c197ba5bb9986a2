# SPDX-License-Identifier: GPL-3.0-or-later
"""A test whose upstream binary is not built skips, naming the make target that builds it; under `make test`, which
builds them all first (GPUHARDEN_REQUIRE_BUILT=1), a missing build fails the test instead, so CI cannot pass by
skipping what it claims to run."""

from __future__ import annotations

import os

import pytest

REQUIRE_VARIABLE = "GPUHARDEN_REQUIRE_BUILT"


def skip_unbuilt(message: str) -> None:
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail("%s (%s=1: this run built it first, so a missing build is a failure)" % (message, REQUIRE_VARIABLE))
    pytest.skip(message)
