# SPDX-License-Identifier: GPL-3.0-or-later
"""What `make dist` runs, with the build tools only (build/dist-venv: `build`, setuptools, ansible-core).

    python tools/dist.py requirements
        the dist venv's packages, with the pins pyproject.toml gives them (its build-system requires, the dev extra's
        `build`, the dependencies' ansible-core and cryptography), one a line: no second copy of a pin to drift.
    python tools/dist.py check-url [--test-build]
        refuses (exit 2) what `collection` would refuse for $GPUHARDEN_URL, before anything is built.
    python tools/dist.py collection --output-path dist [--url URL] [--test-build]
        the collection tarball, built from a staged copy of this checkout in which the project URL placeholder
        (PLACEHOLDER: galaxy.yml's repository/documentation/homepage, the systemd units' Documentation=, the alert
        rules' runbook_url) is the project's public URL (--url, else $GPUHARDEN_URL, else the web URL of the clone's
        origin remote), and in which the README's relative links point at the project's sources (--source-url, else
        $GPUHARDEN_SOURCE_URL, else URL/blob/main; for a release, URL/blob/<its tag>): Galaxy renders the README away
        from the files, and the developer docs are not shipped.

Refused, nothing built: no URL, a URL that is not http(s), or one whose host is below the reserved .invalid domain
(RFC 2606: it can never resolve), or any .invalid URL left in a staged file.  --test-build (make test, the unit tests)
accepts a .invalid URL: the tarball it makes is for the checks, never for release.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
PLACEHOLDER = "https://gpuharden.invalid"
# What `make test` and the unit tests build with: a reserved name, so such a tarball can never pass for a release.
TEST_URL = "https://test-build.gpuharden.invalid"
INVALID_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s\"'<>()/]*\.invalid\b[^\s\"'<>()]*", re.IGNORECASE)
# A Markdown link's target (inline form): what the README's relative links are.
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
# The README lines of the collection (the tarball renders it on Galaxy and in the installed copy).
READMES = ("README.md",)


class DistError(Exception):
    """`make dist` refuses: the message names the file, the setting and what to do."""


def requirements(pyproject=REPO / "pyproject.toml"):
    """The dist venv's requirement strings, with pyproject.toml's pins."""
    data = tomllib.loads(Path(pyproject).read_text())

    def named(specs, name):
        found = [spec for spec in specs if re.match(r"%s\b" % re.escape(name), spec.replace("_", "-"), re.IGNORECASE)]
        if len(found) != 1:
            raise DistError("pyproject.toml: no single requirement %s in %s" % (name, specs))
        return found[0]

    return list(data["build-system"]["requires"]) + [
        named(data["project"]["optional-dependencies"]["dev"], "build"),
        named(data["project"]["dependencies"], "ansible-core"),
        # the pin that keeps ansible-galaxy quiet (pyproject.toml says why)
        named(data["project"]["dependencies"], "cryptography"),
    ]


def origin_url(remote=None):
    """The web URL of a clone's origin remote (``remote``: its URL, else `git remote get-url origin` of this checkout):
    https://host/path for an https, ssh:// or scp-like (git@host:path) remote, without .git; None for anything else
    (no remote, a local path), where make dist then needs GPUHARDEN_URL."""
    if remote is None:
        found = subprocess.run(["git", "-C", str(REPO), "remote", "get-url", "origin"], capture_output=True, text=True, check=False)
        remote = found.stdout.strip() if found.returncode == 0 else ""
    scp = re.match(r"^[\w.-]+@([\w.-]+):(?!/)(.+)$", remote)
    if scp:
        host, path = scp.groups()
    else:
        parts = urlsplit(remote)
        if parts.scheme not in ("https", "http", "ssh", "git+ssh") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path.lstrip("/")
    path = path[:-4] if path.endswith(".git") else path
    return "https://%s/%s" % (host, path.rstrip("/")) if path else None


def check_url(url, test_build=False):
    """The project URL without a trailing slash, or DistError."""
    setting = ("set GPUHARDEN_URL to the project's public URL (where its README renders): make dist GPUHARDEN_URL=https://... "
               "(a clone whose origin is an https or ssh remote gets that one)")
    if not url:
        raise DistError("galaxy.yml (repository, documentation, homepage), deploy/systemd/*.service|*.timer (Documentation=) and "
                        "deploy/monitoring/gpuharden-alerts.yml (runbook_url) hold the placeholder %s: %s" % (PLACEHOLDER, setting))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DistError("GPUHARDEN_URL=%s: not an http(s) URL; %s" % (url, setting))
    if parts.hostname.endswith(".invalid") and not test_build:
        raise DistError("GPUHARDEN_URL=%s: the .invalid domain never resolves (a placeholder, not a release URL); %s" % (url, setting))
    return url.rstrip("/")


def build_ignore(source=REPO):
    import yaml  # noqa: PLC0415 (`requirements` runs on the system Python, before the dist venv exists)

    return yaml.safe_load((Path(source) / "galaxy.yml").read_text()).get("build_ignore", [])


def _ignored(relative, patterns):
    # ansible-galaxy's rule (ansible-core galaxy/collection/__init__.py, _build_files_manifest_walk): fnmatch of the
    # path relative to the collection's root, a matching directory left out whole.
    return any(fnmatch.fnmatch(relative, pattern) for pattern in patterns)


def _relink(text, source_url):
    """``text`` (the README, at the collection's root) with each relative link pointing at that file in the project's
    sources: Galaxy renders the README on a page of its own, away from the tarball's files, where a relative link is
    dead (and the developer docs it links to are not in the tarball at all).  In-page links (#section) stay."""

    def replace(match):
        target = match.group(1)
        if target.startswith("#") or urlsplit(target).scheme:
            return match.group(0)
        return "](%s/%s)" % (source_url, target)

    return MARKDOWN_LINK.sub(replace, text)


def stage(target, url, source_url, test_build=False, source=REPO):
    """Copy ``source`` into ``target``, leaving out what build_ignore leaves out, with the placeholder replaced by
    ``url`` and the README's relative links made absolute; DistError for a .invalid URL left anywhere."""
    source, target = Path(source), Path(target)
    patterns = build_ignore(source)
    copied = []
    for root, dirs, files in os.walk(source):
        relative_root = os.path.relpath(root, source)
        relative_root = "" if relative_root == "." else relative_root
        dirs[:] = [name for name in dirs if not _ignored(os.path.join(relative_root, name), patterns)]
        os.makedirs(target / relative_root, exist_ok=True)
        for name in files:
            relative = os.path.join(relative_root, name)
            if not _ignored(relative, patterns):
                shutil.copy2(source / relative, target / relative, follow_symlinks=True)
                copied.append(relative)
    left = []
    for relative in copied:
        path = target / relative
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = text.replace(PLACEHOLDER, url)
        if relative in READMES:
            new = _relink(new, source_url)
        if new != text:
            path.write_text(new)
        left += ["%s: %s" % (relative, found) for found in INVALID_URL.findall(new) if not (test_build and found.startswith(url))]
    if left:
        raise DistError("a .invalid URL (a placeholder) would ship: %s; replace it with %s, which make dist sets from GPUHARDEN_URL"
                        % ("; ".join(left[:5]), PLACEHOLDER))
    return sorted(copied)


def build_collection(output, url, source_url=None, test_build=False, ansible_galaxy=None):
    """The collection tarball in ``output``, built from a staged copy; its path."""
    url = check_url(url, test_build)
    source_url = (source_url or url + "/blob/main").rstrip("/")
    ansible_galaxy = ansible_galaxy or str(Path(sys.executable).parent / "ansible-galaxy")
    (REPO / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="collection-stage-", dir=REPO / "build") as staging:
        stage(staging, url, source_url, test_build)
        built = subprocess.run([ansible_galaxy, "collection", "build", "--force", "--output-path", str(output), staging],
                               capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise DistError("ansible-galaxy collection build failed (exit %d): %s" % (built.returncode, (built.stderr or built.stdout)[-2000:]))
    return Path(built.stdout.strip().rsplit(" ", 1)[-1])


def tarball_problems(tarball):
    """What must not ship in the collection tarball, one line each: the URL placeholder, a developer doc (what
    build_ignore leaves out of docs/), a relative link in the README (Galaxy's page), a relative Markdown link of
    another document to a file the tarball does not hold."""
    import posixpath  # noqa: PLC0415
    import tarfile  # noqa: PLC0415

    with tarfile.open(tarball) as archive:
        texts = {}
        for member in archive.getmembers():
            if member.isfile():
                data = archive.extractfile(member).read()
                try:
                    texts[member.name] = data.decode()
                except UnicodeDecodeError:
                    texts[member.name] = ""
    problems = ["%s: the placeholder %s (make dist GPUHARDEN_URL=...)" % (name, PLACEHOLDER)
                for name, text in texts.items() if re.search(re.escape(PLACEHOLDER) + r"(?![\w.-])", text)]
    developer_docs = [pattern for pattern in build_ignore() if pattern.startswith("docs/")]
    problems += ["%s: a developer doc (galaxy.yml build_ignore)" % name for name in texts if name in developer_docs]
    for name, text in texts.items():
        if not name.endswith(".md"):
            continue
        for target in MARKDOWN_LINK.findall(text):
            path = target.split("#", 1)[0]
            if not path or urlsplit(target).scheme:
                continue
            if name in READMES:
                problems.append("%s: its relative link %s is dead where Galaxy renders it" % (name, target))
            elif posixpath.normpath(posixpath.join(posixpath.dirname(name), path)) not in texts:
                problems.append("%s: its link %s names no file of the tarball" % (name, target))
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tools/dist.py")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("requirements")
    url_check = commands.add_parser("check-url")
    url_check.add_argument("--test-build", action="store_true")
    collection = commands.add_parser("collection")
    collection.add_argument("--output-path", required=True)
    collection.add_argument("--url", default=os.environ.get("GPUHARDEN_URL", ""))
    collection.add_argument("--source-url", default=os.environ.get("GPUHARDEN_SOURCE_URL", ""))
    collection.add_argument("--test-build", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "requirements":
            print("\n".join(requirements()))
        elif args.command == "check-url":
            check_url(os.environ.get("GPUHARDEN_URL", "") or origin_url(), args.test_build)
        else:
            print(build_collection(args.output_path, args.url or origin_url(), args.source_url, args.test_build))
    except DistError as error:
        print("make dist: %s" % error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
