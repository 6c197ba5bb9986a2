# SPDX-License-Identifier: GPL-3.0-or-later
"""README.md stays the user's document (issue 45 item 6) and the user docs' links stay whole.

README.md: at most 350 lines and no dated history (a date such as 2026-12-06, "Before that ..."): dated measurements
go to docs/benchmarks.md, latest first.  Every relative link in README.md, docs/*.md and deploy/*/README.md must
name a file that exists and, with a #fragment into a markdown file, a heading of that file, under GitHub's anchor
rules (lowercase; letters, digits, spaces, '-' and '_' kept, everything else dropped; each space becomes '-'; a
repeated heading gets -1, -2, ...).  The alerting rules' runbook_url points into README.md the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_README_LINES = 350
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HISTORY = re.compile(r"\bBefore that\b")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) or [text](target "title"); images too.  Inline code is blanked before this runs.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:


def _user_docs() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").glob("*/README.md"))]


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, inline code blanked, HTML comments skipped."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or line.lstrip().startswith("<!--"):
            continue
        yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (markdown inline syntax counts as its characters)."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: Unicode letters, digits and '_'
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """Every relative link of a markdown file that names no file, or no heading of the markdown file it names."""
    problems = []
    text = path.read_text()
    for number, line in _prose_lines(text):
        for target in LINK.findall(INLINE_CODE.sub("``", line)):
            if EXTERNAL.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file {dest}")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
                problems.append(f"{where}: {dest.name} has no heading with anchor #{fragment}")
    return problems


def test_readme_is_at_most_350_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/*.md"


def test_readme_holds_no_dated_history():
    dated = [f"README.md:{n}: {line.strip()}" for n, line in enumerate(README.read_text().splitlines(), 1)
             if DATE.search(line) or HISTORY.search(line)]
    assert not dated, "dated history belongs in docs/benchmarks.md (latest first) or the CHANGELOG:\n" + "\n".join(dated)


@pytest.mark.parametrize("doc", _user_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    assert not broken_links(doc), "\n".join(broken_links(doc))


def test_alert_runbooks_point_at_a_readme_heading():
    rules = yaml.safe_load((REPO / "deploy" / "monitoring" / "gpuharden-alerts.yml").read_text())
    runbooks = {rule["annotations"]["runbook_url"] for group in rules["groups"] for rule in group["rules"]
                if "runbook_url" in rule.get("annotations", {})}
    assert runbooks
    readme_anchors = anchors(README.read_text())
    for url in runbooks:
        # the project's URL (the placeholder make dist replaces, tools/dist.py), whose page shows the README
        file_part, _, fragment = url.partition("#")
        assert file_part == "https://gpuharden.invalid" and fragment in readme_anchors, url


@pytest.mark.parametrize(("heading", "slug"), [
    ("The drift runner (`gpuharden drift`)", "the-drift-runner-gpuharden-drift"),
    ("Why is my GPU pod failing?", "why-is-my-gpu-pod-failing"),
    ("containerd's nvidia runtime (`containerd_nvidia_runtime`, role `container_runtime`)",
     "containerds-nvidia-runtime-containerd_nvidia_runtime-role-container_runtime"),
    ("gpu_facts: when NVML is unusable", "gpu_facts-when-nvml-is-unusable"),
    ("Fleets beyond one controller (`--slice K/N`, `drift-merge`, AWX job slicing)",
     "fleets-beyond-one-controller---slice-kn-drift-merge-awx-job-slicing"),
])
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_the_checker_finds_broken_links(tmp_path):
    """The link check itself: a missing file, a missing heading and a repeated heading's -1 anchor."""
    (tmp_path / "other.md").write_text("# Title\n\n## Same\n\n## Same\n\n```sh\n# not a heading\n```\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](other.md#same-1) [b](other.md#same-2) [c](missing.md) [d](#title) `[e](nowhere.md)`\n"
                   "[f](https://example.com/x.md) [g](other.md#not-a-heading)\n\n# Title\n")
    problems = broken_links(doc, root=tmp_path)
    assert [p.split(": ", 2)[1] for p in problems] == ["other.md#same-2", "missing.md", "other.md#not-a-heading"], problems
