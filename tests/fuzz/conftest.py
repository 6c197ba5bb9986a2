# SPDX-License-Identifier: GPL-3.0-or-later
"""The hostile-input harness's run modes and its summary.

``make unit`` runs the bounded mode: a fixed, derandomized set of a few cases per module (seconds per module).
``make fuzz`` sets GPUHARDEN_FUZZ=long: GPUHARDEN_FUZZ_EXAMPLES cases per module (default 100), a random seed printed
in the summary (GPUHARDEN_FUZZ_SEED repeats a run), the summary table written to build/fuzz-summary.txt.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import pytest
from gpuharden_lab import REPO_ROOT
from hypothesis import HealthCheck, Phase, settings

LONG = os.environ.get("GPUHARDEN_FUZZ") == "long"
SUMMARY_FILE = REPO_ROOT / "build" / "fuzz-summary.txt"
FINDINGS_FILE = REPO_ROOT / "build" / "fuzz-findings.txt"

settings.register_profile("gpuharden-bounded", derandomize=True, database=None, deadline=None, print_blob=False,
                          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
settings.register_profile("gpuharden-long", derandomize=False, database=None, deadline=None, print_blob=False,
                          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


class Recorder:
    """Every case's outcome, for the summary: distinct cases per module and outcome."""

    def __init__(self):
        self.outcomes = defaultdict(dict)  # module -> {case key: outcome kind}
        self.failures = []
        self.seed = None

    def record(self, case, outcome):
        self.outcomes[case.module][case.key] = outcome.kind
        if not outcome.allowed:
            self.failures.append("%s [%s mode] %s\n    %s" % (outcome.kind, outcome.mode, case.brief(), outcome.detail))

    def table(self):
        kinds = sorted({kind for cases in self.outcomes.values() for kind in cases.values()},
                       key=lambda kind: (kind not in ("refused", "succeeded"), kind))
        rows = [["module", "cases"] + kinds]
        totals = Counter()
        for module in sorted(self.outcomes):
            counts = Counter(self.outcomes[module].values())
            rows.append([module, str(len(self.outcomes[module]))] + ["%d" % counts[kind] if counts[kind] else "." for kind in kinds])
            totals.update(counts)
        total = sum(len(cases) for cases in self.outcomes.values())
        rows.append(["all", str(total)] + [str(totals[kind]) for kind in kinds])
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.append("distinct cases: %d" % total)
        if self.seed is not None:
            lines.append("seed: %s (GPUHARDEN_FUZZ_SEED=%s repeats this run)" % (self.seed, self.seed))
        return "\n".join(lines)


RECORDER = Recorder()


@pytest.fixture(scope="session")
def fuzz_recorder():
    return RECORDER


def pytest_configure(config):
    settings.load_profile("gpuharden-long" if LONG else "gpuharden-bounded")


def pytest_terminal_summary(terminalreporter):
    if not RECORDER.outcomes:
        return
    text = RECORDER.table()
    terminalreporter.write_sep("=", "hostile inputs: cases per module and outcome")
    terminalreporter.write_line(text)
    if LONG:
        SUMMARY_FILE.parent.mkdir(parents=True, exist_ok=True)
        SUMMARY_FILE.write_text(text + "\n")
        FINDINGS_FILE.write_text("".join(line + "\n" for line in sorted(RECORDER.failures)))
        terminalreporter.write_line("written to %s; every outcome outside the two allowed in %s"
                                    % (SUMMARY_FILE, FINDINGS_FILE))
