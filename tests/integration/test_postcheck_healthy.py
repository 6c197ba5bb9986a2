# SPDX-License-Identifier: GPL-3.0-or-later
"""Role postcheck on the healthy fleet: nothing at warning or above."""

from __future__ import annotations

import pytest

from tests.integration.test_postcheck import _play, _severe
from tests.labfixtures import shared_lab

pytestmark = pytest.mark.lab


# real_nodes: the healthy lab is a fresh install on the real kubelet and containerd, hardened by the product's own
# playbook (scenarios/healthy.yaml); they need real-components; `make real-nodes` runs only these.
@pytest.mark.real_nodes
class TestHealthy:
    @pytest.fixture(scope="class")
    @classmethod
    def lab(cls):
        with shared_lab("healthy") as state:  # read-only here
            yield state

    def test_nothing_at_warning_or_above(self, lab):
        saved, elapsed = _play(lab)
        print("postcheck on %d healthy nodes: %.1fs" % (len(saved), elapsed))
        assert set(saved) == set(lab["nodes"])
        assert {node: _severe(saved, node) for node in saved} == {node: [] for node in saved}
        assert all(entry["ok"] for entry in saved.values())
