# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab: simulated GPU nodes for tests, molecule and `make demo`.

Nothing in the product (plugins/, roles/, the CLI outside this package) may import it.  It works
from a source checkout only, because it uses the NVML double built under build/nvml.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
NVML_DOUBLE_DIR = REPO_ROOT / "tests" / "fakes" / "nvml"
NVML_FIXTURES = NVML_DOUBLE_DIR / "fixtures"
NVML_LIBRARY_DIR = REPO_ROOT / "build" / "nvml"
