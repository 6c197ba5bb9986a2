# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of tests/real: the unit tests' scratch directory (world_tmp) and the host guard."""

from __future__ import annotations

import pytest

from tests.real import daemons
from tests.unit.conftest import world_tmp  # noqa: F401 - a fixture, used by name


@pytest.fixture
def host_guard():
    """Nothing the daemons would create by default appears on the host, and the kernel tunables the kubelet would set
    keep the host's values."""
    before = daemons.host_paths_present()
    sysctls = daemons.host_sysctls()
    yield
    assert daemons.host_paths_present() == before
    assert daemons.host_sysctls() == sysctls
