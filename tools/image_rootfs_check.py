# SPDX-License-Identifier: GPL-3.0-or-later
"""Build the drift CronJob's image root file system from the artifacts with its Containerfile, without a container engine.

No container engine runs on the development machines, so this runs the recipe the way an engine would, in a chroot:

1. FROM: the base image's root file system is made by debootstrap from the Debian mirror (the variant and release
   the official debian:<release>-slim image is made from), cached under ~/.cache/gpuharden/image-rootfs.
2. Each instruction in order: RUN in the chroot (`/bin/sh -c`, as the current USER, in WORKDIR, with the ENV and
   ARG values and the engine's default PATH), COPY from the build context (the directory with the wheel and the
   tarball), ENV, ARG, USER, WORKDIR. The result of every step before the first COPY (the steps that do not depend
   on the artifacts) is cached, keyed by the base and the instructions, as an engine caches layers.
3. In the built root, as the pod runs it (read-only root, /tmp a fresh tmpfs, the image's user, HOME=/tmp):
   `gpuharden --help`, `ansible-galaxy collection list gpuharden.k8s` (the version galaxy.yml names),
   and the CronJob's own command from drift-cronjob.yaml, which with no inventory mounted must end with drift's
   usage exit (2) and its "inventory ... does not exist" message, before any push.

What the build steps see of this machine: /etc/resolv.conf (as an engine copies it) and, when this machine trusts
a CA bundle of its own (SSL_CERT_FILE or PIP_CERT set), that bundle read-only at /run/image-build/ca.crt with
PIP_CERT, SSL_CERT_FILE and CURL_CA_BUNDLE pointing at it, for the build only (an engine's --build-arg or secret
mount). Nothing of it stays in the root file system. Proxy variables are passed as an engine passes them.

Needs root (chroot, mount namespaces), debootstrap and tar with zstd. Exit 0 when every step and check passed, 1 when
one failed (its output is printed), 2 when the recipe or the context cannot be used as they are.

    python tools/image_rootfs_check.py [--containerfile deploy/kubernetes/Containerfile] [--context dist]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuharden" / "image-rootfs"
MIRROR = "http://deb.debian.org/debian"
# The base images this check can make: the official debian:<release>-slim images are debootstrap's minbase variant
# of that release, then documentation and locales trimmed (debuerreotype/debuerreotype: scripts/debuerreotype-init,
# scripts/debuerreotype-slimify; its Dockerfile names `debootstrap --variant=minbase` as the stand-in base).
BASES = {"docker.io/library/debian:bookworm-slim": ("bookworm", "minbase"), "debian:bookworm-slim": ("bookworm", "minbase")}
# The PATH a container engine gives a RUN step when no ENV sets one (moby/moby pkg/system: DefaultPathEnvUnix).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Predefined build arguments engines pass from the build host without an ARG line.
PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "FTP_PROXY", "ftp_proxy")
SUPPORTED = ("FROM", "ARG", "ENV", "COPY", "RUN", "USER", "WORKDIR")
BUILD_CA = "/run/image-build/ca.crt"
CRONJOB = REPO / "deploy" / "kubernetes" / "drift-cronjob.yaml"


class RecipeError(Exception):
    """The Containerfile or the build context cannot be used as they are (exit 2)."""


class StepFailed(Exception):
    """A build step or a check in the root file system failed (exit 1)."""


def parse_containerfile(text, name="Containerfile"):
    """[(line number, INSTRUCTION, arguments)]: continuation lines joined, comment lines dropped (also inside a
    continued instruction, as the engines do). Anything but SUPPORTED is refused: this check would not run it."""
    instructions = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        line = pending + stripped
        pending = ""
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in SUPPORTED:
            raise RecipeError("%s:%d: instruction %s is not one this check runs (%s)" % (name, start, keyword, ", ".join(SUPPORTED)))
        arguments = arguments.strip()
        if keyword == "RUN" and (arguments.startswith("[") or arguments.startswith("--")):
            raise RecipeError("%s:%d: RUN %s: only the shell form without options is run here" % (name, start, arguments[:20]))
        instructions.append((start, keyword, arguments))
    if pending:
        raise RecipeError("%s:%d: the last instruction ends with a line continuation" % (name, start))
    if not instructions or instructions[0][1] != "FROM":
        raise RecipeError("%s: the first instruction must be FROM" % name)
    if [keyword for _, keyword, _ in instructions].count("FROM") != 1:
        raise RecipeError("%s: one FROM (a single stage) is what this check builds" % name)
    return instructions


def assignments(arguments):
    """ENV/ARG's KEY=VALUE words (quotes as the shell reads them)."""
    pairs = {}
    for word in shlex.split(arguments):
        key, sep, value = word.partition("=")
        pairs[key] = value if sep else None
    return pairs


def substitute(text, values):
    """$VAR and ${VAR} in COPY, ENV, USER and WORKDIR arguments, as the engines expand them (unknown: empty)."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: values.get(m.group(1) or m.group(2)) or "", text)


def base_of(reference, name):
    image = reference.split("@", 1)[0]
    if image not in BASES:
        raise RecipeError("%s: FROM %s: this check makes only %s" % (name, reference, ", ".join(sorted(BASES))))
    return BASES[image]


def run(argv, what, **kwargs):
    started = time.monotonic()
    completed = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if completed.returncode:
        raise StepFailed("%s: exit %d\n%s" % (what, completed.returncode, (completed.stdout + completed.stderr)[-6000:]))
    return completed, time.monotonic() - started


def snapshot(root, path):
    temp = path.with_name(path.name + ".part")
    run(["tar", "--zstd", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(temp), "."], "saving %s" % path.name)
    os.replace(temp, path)


def restore(path, root):
    run(["tar", "--zstd", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(path)], "unpacking %s" % path.name)
    root.chmod(0o755)  # an image's / (a temporary directory's 0700, kept in the archive, would lock its users out)


def base_rootfs(release, variant, root, cache):
    """The base's root file system in ``root``, from the cache or made now by debootstrap (then cached)."""
    cached = cache / ("base-%s-%s.tar.zst" % (release, variant))
    if not cached.is_file():
        if not shutil.which("debootstrap"):
            raise RecipeError("debootstrap is not installed: apt-get install debootstrap")
        work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=cache))
        try:
            run(["debootstrap", "--variant=%s" % variant, release, str(work), MIRROR], "debootstrap %s" % release)
            # apt's downloaded packages are no part of an image (the official one carries none)
            for deb in (work / "var" / "cache" / "apt" / "archives").glob("*.deb"):
                deb.unlink()
            snapshot(work, cached)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    restore(cached, root)


def passwd_entry(root, user):
    """(uid, gid, home) for USER's value (name or number, optionally :group) from the root file system's files."""
    name, _, group = user.partition(":")
    entries = [line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines() if line.count(":") == 6]
    found = next((entry for entry in entries if entry[0] == name or entry[2] == name), None)
    if found is None and not name.isdigit():
        raise StepFailed("USER %s: no such user in the image's /etc/passwd" % user)
    uid = int(found[2]) if found else int(name)
    gid = int(found[3]) if found else uid
    if group:
        groups = [line.split(":") for line in (root / "etc" / "group").read_text().splitlines() if line.count(":") == 3]
        match = next((entry for entry in groups if entry[0] == group or entry[2] == group), None)
        if match is None and not group.isdigit():
            raise StepFailed("USER %s: no such group in the image's /etc/group" % user)
        gid = int(match[2]) if match else int(group)
    return uid, gid, found[5] if found else "/"


def host_ca_bundle():
    for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        path = os.environ.get(name)
        if path and os.path.isfile(path):
            return path
    return None


def chroot_command(root, command, env, user, workdir, *, read_only=False, ca_bundle=None):
    """argv that runs ``command`` with /bin/sh -c in the chroot, in a mount namespace of its own: /proc, /dev and
    (for checks) a read-only root with a fresh tmpfs /tmp, all gone when it exits."""
    uid, gid, _ = user
    mounts = ["mount -t proc proc {r}/proc", "mount --rbind /dev {r}/dev"]
    if ca_bundle:
        mounts.append("mount --bind -o ro %s {r}%s" % (shlex.quote(ca_bundle), BUILD_CA))
    if read_only:
        mounts = ["mount --bind {r} {r}", "mount -o remount,bind,ro {r}", "mount -t tmpfs -o mode=1777 tmpfs {r}/tmp", *mounts]
    setup = " && ".join(mounts).format(r=shlex.quote(str(root)))
    inner = "cd %s && %s" % (shlex.quote(workdir), command)
    env_words = " ".join(shlex.quote("%s=%s" % item) for item in sorted(env.items()))
    script = "%s && exec chroot --userspec=%d:%d --groups=%d %s /usr/bin/env -i %s /bin/sh -c %s" % (
        setup, uid, gid, gid, shlex.quote(str(root)), env_words, shlex.quote(inner))
    return ["unshare", "--mount", "--propagation", "private", "--fork", "/bin/sh", "-c", script]


class Build:
    def __init__(self, containerfile, context, cache, out=sys.stdout):
        self.containerfile, self.context, self.cache, self.out = containerfile, context, cache, out
        self.instructions = parse_containerfile(containerfile.read_text(), containerfile.name)
        self.env, self.args = {}, {}
        self.user, self.workdir = "0", "/"
        self.ca_bundle = host_ca_bundle()

    def say(self, text):
        self.out.write(text + "\n")
        self.out.flush()

    def step_env(self, root):
        env = {name: os.environ[name] for name in PROXY_VARS if name in os.environ}
        env.update({key: value for key, value in self.args.items() if value is not None})
        env.update(self.env)
        env.setdefault("PATH", DEFAULT_PATH)
        uid, gid, home = passwd_entry(root, self.user)
        env.setdefault("HOME", home if uid else "/root")
        if self.ca_bundle:
            env.update(PIP_CERT=BUILD_CA, SSL_CERT_FILE=BUILD_CA, CURL_CA_BUNDLE=BUILD_CA)
        return env, (uid, gid, home)

    def copy(self, arguments, root):
        words = substitute(arguments, {**self.args, **self.env}).split()
        if any(word.startswith("--") for word in words):
            raise RecipeError("%s: COPY %s: options are not run here" % (self.containerfile.name, arguments))
        *sources, destination = words
        matched = []
        for source in sources:
            found = sorted(glob.glob(str(self.context / source)))
            if not found:
                raise RecipeError("build context %s: no file matches %s (run `make dist`)" % (self.context, source))
            matched += found
        if len(matched) > 1 and not destination.endswith("/"):
            raise RecipeError("%s: COPY of several files needs a destination ending in /" % self.containerfile.name)
        target = root / destination.lstrip("/")
        for path in matched:
            if destination.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / os.path.basename(path))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        return matched

    @staticmethod
    def key_of(previous, keyword, arguments):
        return hashlib.sha256((previous + "\0" + keyword + "\0" + arguments).encode()).hexdigest()[:24]

    def build(self, root):
        """Run the recipe into ``root``; self.env, self.user and self.workdir are then the image's, for the checks."""
        started = time.monotonic()
        _, keyword, reference = self.instructions[0]
        release, variant = base_of(reference, self.containerfile.name)
        for _, keyword, arguments in self.instructions:  # a context without the artifacts fails now, not after the base
            if keyword == "COPY":
                for source in arguments.split()[:-1]:
                    if not glob.glob(str(self.context / source)):
                        raise RecipeError("build context %s: no file matches %s (run `make dist`)" % (self.context, source))
        key = "%s-%s" % (release, variant)
        cacheable = []  # the steps before the first COPY: their keys only depend on the base and the recipe
        for _, keyword, arguments in self.instructions[1:]:
            if keyword == "COPY":
                break
            key = self.key_of(key, keyword, arguments)
            cacheable.append(key)
        cached = [index for index, step in enumerate(cacheable) if (self.cache / ("step-%s.tar.zst" % step)).is_file()]
        first = cached[-1] + 1 if cached else 0
        if cached:
            restore(self.cache / ("step-%s.tar.zst" % cacheable[cached[-1]]), root)
            self.say("image: %s, steps 1-%d from the cache (%.1f s)" % (reference, first, time.monotonic() - started))
        else:
            base_rootfs(release, variant, root, self.cache)
            self.say("image: %s as debootstrap %s %s (%.1f s)" % (reference, variant, release, time.monotonic() - started))
        self._prune({"step-%s.tar.zst" % step for step in cacheable})
        (root / "etc" / "resolv.conf").unlink(missing_ok=True)
        shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
        if self.ca_bundle:
            (root / "run" / "image-build").mkdir(parents=True, exist_ok=True)
            (root / BUILD_CA.lstrip("/")).touch()
        for index, (number, keyword, arguments) in enumerate(self.instructions[1:]):
            if index < first and keyword not in ("ENV", "ARG", "USER", "WORKDIR"):
                continue
            step_started = time.monotonic()
            if keyword == "ENV":
                self.env.update({k: substitute(v or "", {**self.args, **self.env}) for k, v in assignments(arguments).items()})
            elif keyword == "ARG":
                self.args.update({k: v for k, v in assignments(arguments).items() if k not in self.args or v is not None})
            elif keyword == "USER":
                self.user = substitute(arguments, {**self.args, **self.env})
            elif keyword == "WORKDIR":
                self.workdir = os.path.join(self.workdir, substitute(arguments, {**self.args, **self.env}))
                (root / self.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
            elif keyword == "COPY":
                copied = self.copy(arguments, root)
                self.say("step %d (line %d) COPY %s (%.1f s)" % (index + 1, number, " ".join(os.path.basename(p) for p in copied),
                                                                  time.monotonic() - step_started))
            elif keyword == "RUN":
                env, user = self.step_env(root)
                argv = chroot_command(root, arguments, env, user, self.workdir, ca_bundle=self.ca_bundle)
                try:
                    _, seconds = run(argv, "step %d (line %d) RUN" % (index + 1, number))
                except StepFailed as error:
                    raise StepFailed("%s\n(the command: %s)" % (error, arguments)) from None
                self.say("step %d (line %d) RUN %s (%.1f s)" % (index + 1, number, arguments[:70], seconds))
            if index < len(cacheable) and keyword in ("RUN",) and index >= first:
                snapshot(root, self.cache / ("step-%s.tar.zst" % cacheable[index]))
        (root / "etc" / "resolv.conf").unlink(missing_ok=True)
        if self.ca_bundle:
            shutil.rmtree(root / "run" / "image-build", ignore_errors=True)
        self.say("image built in %.1f s" % (time.monotonic() - started))

    def _prune(self, keep):
        for path in self.cache.glob("step-*.tar.zst"):
            if path.name not in keep:
                path.unlink()

    def pod_env(self, root, extra):
        env, user = self.step_env(root)
        for name in ("PIP_CERT", "SSL_CERT_FILE", "CURL_CA_BUNDLE", *PROXY_VARS):
            env.pop(name, None)
        env.update(extra)
        return env, user

    def check(self, root, command, extra_env, expect_rc=0, expect_text=None, label=None):
        """``command`` as the pod runs the image: read-only root, fresh /tmp, the image's user and WORKDIR."""
        env, user = self.pod_env(root, extra_env)
        argv = chroot_command(root, command, env, user, self.workdir, read_only=True)
        started = time.monotonic()
        completed = subprocess.run(argv, capture_output=True, text=True, check=False)
        output = completed.stdout + completed.stderr
        if completed.returncode != expect_rc or (expect_text and expect_text not in output):
            raise StepFailed("check %s: exit %d (wanted %d%s)\n%s" % (
                label or "`%s`" % command, completed.returncode, expect_rc, ", and %r in the output" % expect_text if expect_text else "",
                output[-6000:]))
        self.say("check %s: exit %d as wanted (%.1f s)" % (label or "`%s`" % command, completed.returncode, time.monotonic() - started))
        return completed.stdout


def cronjob_container(path=CRONJOB):
    (listing,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    (cronjob,) = [item for item in listing["items"] if item["kind"] == "CronJob"]
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def checks(build, root):
    """What the image must do in the pod's conditions; returns the installed collection's version."""
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    pod = {"HOME": "/tmp", "ANSIBLE_HOME": "/tmp/ansible", "TMPDIR": "/tmp"}
    build.check(root, "gpuharden --help", pod, expect_text="drift")
    listed = build.check(root, "ansible-galaxy collection list gpuharden.k8s --format json", pod)
    versions = {name: info["version"] for paths in json.loads(listed).values() for name, info in paths.items()}
    if versions.get("gpuharden.k8s") != galaxy["version"]:
        raise StepFailed("the image holds gpuharden.k8s %s, galaxy.yml says %s" % (versions.get("gpuharden.k8s"), galaxy["version"]))
    container = cronjob_container()
    env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    command = container["command"]
    if command[:2] != ["/bin/sh", "-c"]:
        raise StepFailed("%s: the container's command is not `/bin/sh -c SCRIPT`" % CRONJOB.name)
    # No inventory volume here: the real gpuharden refuses with its usage exit before the run, so nothing is pushed.
    build.check(root, command[2], env, expect_rc=2, expect_text="inventory /etc/gpuharden/inventory does not exist",
                label="the command of %s's container" % CRONJOB.name)
    return versions["gpuharden.k8s"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--containerfile", type=Path, default=REPO / "deploy" / "kubernetes" / "Containerfile")
    parser.add_argument("--context", type=Path, default=REPO / "dist", help="the directory with the wheel and the collection tarball")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the base and the steps before the first COPY are cached")
    parser.add_argument("--keep", type=Path, help="build into this (new) directory and leave it there")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if os.geteuid() != 0:
            raise RecipeError("needs root (chroot and mount namespaces)")
        args.cache.mkdir(parents=True, exist_ok=True)
        build = Build(args.containerfile, args.context, args.cache)
        if args.keep:
            if args.keep.exists():
                raise RecipeError("--keep %s: exists already (a new directory is wanted)" % args.keep)
            args.keep.mkdir(parents=True)
        root = args.keep or Path(tempfile.mkdtemp(prefix="rootfs-", dir=args.cache))
        try:
            build.build(root)
            version = checks(build, root)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    except RecipeError as error:
        print("image_rootfs_check: %s" % error, file=sys.stderr)
        return 2
    except StepFailed as error:
        print("image_rootfs_check: FAILED: %s" % error, file=sys.stderr)
        return 1
    print("image_rootfs_check: passed: gpuharden.k8s %s image from %s in %.1f s" % (version, args.context, time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
