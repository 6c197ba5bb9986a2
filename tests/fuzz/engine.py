# SPDX-License-Identifier: GPL-3.0-or-later
"""The hostile-input harness: build a node root, mutate it, run a module as Ansible runs it, judge the outcome.

One case = one module, one seed layout (``variant``), one mutation (``family`` with its ``payload``) of one
``target`` (a file the module reads or writes, or an option).  ``run_case`` builds a fresh node root, applies the
mutation, then runs the module's real entry point in a fresh Python (the args JSON file, as
tests/unit/conftest.py run_module and Ansible's local runs do) in check mode, then in normal mode, then once more
when the normal run changed something.  After each run exactly one of two outcomes is allowed:

* ``refused``: a failure whose message is one line, names the file or option the mutation touched, shows no Python
  internals, and the node root (bytes, types, modes, owners, link targets, mtimes) and the directory outside it are
  unchanged;
* ``succeeded``: no write outside the root or through a link, no temporary file left, nothing changed in check
  mode, every file written accepted by the real component's own check (``validators``), and a second normal run
  changes nothing.

Anything else is a failure, named by the class of issue 47 it belongs to (``CLASSES``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuharden_lab import REPO_ROOT

COLLECTIONS = REPO_ROOT / "build" / "collections"
RACER = Path(__file__).resolve().parent / "racer"
# A module that has not ended after this many seconds hangs (the slowest module run here takes about 3 s on an idle
# machine; `make test` runs the bounded cases beside two labs and molecule, at a load of 6 to 12 on two cores, and a
# hang blocks forever, so a generous bound costs nothing but finds every hang).
CASE_TIMEOUT = float(os.environ.get("GPUHARDEN_FUZZ_CASE_TIMEOUT", "60"))

# The classes of issue 47 (one named regression test each, tests/fuzz/test_regressions.py), and the two allowed outcomes.
CLASSES = {
    "rejected_by_component": "a working config rewritten into one the component refuses",
    "traceback": "a traceback instead of an error (MODULE FAILURE)",
    "hang": "the module did not end",
    "write_through_link": "a write through a link or outside the node root",
    "half_done": "a failure or a check-mode run that changed the node",
    "leftover_temp": "a temporary file left behind",
    "lost_update": "another writer's change lost",
    "wrong_result": "a success with a wrong result",
    "not_idempotent": "a second run changed the node again",
    "invalid_accepted": "input the component refuses was accepted",
    "unclear_error": "an error that is not one line naming the file (parser internals, Python type names)",
}
ALLOWED = ("refused", "succeeded")
# What a message must not show: Python's own words for its exceptions and types, and parser reports.
_INTERNALS = re.compile(
    r"Traceback|MODULE FAILURE|NoneType|codec can't|object has no attribute|unhashable|not subscriptable|"
    r"<class '|\b(?:Key|Index|Type|Value|Attribute|Recursion|Memory|Overflow|OS|IsADirectory|NotADirectory|"
    r"Permission|FileNotFound|UnicodeDecode)Error\b|\bin \"<unicode string>\"|\^\s*$|\[Errno \d+\]")
TEMP_NAMES = (".gpuharden-", ".ansible_tmp")
OUTSIDE_MARKER = "gpuharden-fuzz-outside-the-root"  # tests/fuzz/mutations.py puts it in files outside the root
# ansible-core's own argument-spec validation, before the module's code runs: it names the option, and its wording
# (e.g. "<class 'str'> cannot be converted to a float") is ansible-core's, the same for every module.
_ANSIBLE_ARGSPEC = re.compile(r"^(argument '|missing required arguments|value of \S+ must be one (?:or more )?of|Unsupported parameters|"
                              r"parameters are mutually exclusive|one of the following is required|elements value for option|"
                              r"Elements value for option|\S+ is required when|missing parameter\(s\) required by)")


@dataclass(frozen=True)
class Case:
    """One hostile input.  ``payload`` is hashable data the family interprets (bytes, a tuple of edits, ...)."""

    module: str
    variant: str
    family: str
    target: str
    payload: tuple = ()

    @property
    def key(self):
        return hashlib.sha1(repr((self.module, self.variant, self.family, self.target, self.payload)).encode()).hexdigest()[:12]

    def brief(self):
        shown = repr(self.payload)
        return "%s/%s %s on %s %s" % (self.module, self.variant, self.family, self.target, shown[:160] + ("..." if len(shown) > 160 else ""))


@dataclass
class Built:
    """A node root ready for a module: its args, environment and what a message may name for each target."""

    root: Path
    outside: Path
    args: dict
    env: dict = field(default_factory=dict)
    check_mode: bool = True  # the module supports check mode
    again: bool = True  # run once more after a change (False where the double keeps no state: the API server's)
    names: dict = field(default_factory=dict)  # target -> extra strings a message may name instead of the path
    validate: object = None  # validate(built, changed_paths) -> [problems]: the component's own check
    after_success: object = None  # after_success(built, result) -> [problems] (e.g. the MIG layout applied)
    server: object = None  # a fake API server (device_plugin): .mutations lists the changing requests
    wrong_if: object = None  # wrong_if(case, target) -> why a success of that case would be a wrong result, or None
    cleanup: list = field(default_factory=list)


@dataclass
class Mutation:
    names: list = field(default_factory=list)  # strings the message should name (one of them)
    links: list = field(default_factory=list)  # (link path here, its target here or None)
    immutable: list = field(default_factory=list)  # paths made chattr +i (undone after the case)
    race: dict | None = None  # {"path": here, "content": text}: the concurrent writer
    expect: str | None = None  # "refused": only a refusal is right (input the component refuses)
    wrong_if_success: str | None = None  # why a success would be a wrong result


@dataclass
class Outcome:
    kind: str  # "refused", "succeeded" or a key of CLASSES
    detail: str = ""
    mode: str = ""
    seconds: float = 0.0

    @property
    def allowed(self):
        return self.kind in ALLOWED


# ---------------------------------------------------------------------------------------------------------------
# Snapshots


def snapshot(root):
    """Every entry below ``root`` (not following links): type, mode, owner, rdev, bytes or link target, and the
    mtime of everything but directories (a temporary file made and removed again, by gpuharden or by the other writer
    of a race, changes its directory's mtime and nothing else)."""
    snap = {}
    root = str(root)
    if not os.path.lexists(root):
        return snap
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            data = None
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    data = hashlib.sha256(handle.read()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                data = os.readlink(path)
            mtime = None if stat.S_ISDIR(info.st_mode) else info.st_mtime_ns
            snap[path] = (info.st_mode, info.st_rdev, info.st_uid, info.st_gid, mtime, data)
    return snap


def changed_paths(before, after):
    """Paths added, removed or changed between two snapshots."""
    return sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))


def _holds_marker(path):
    try:
        with open(path, "rb") as handle:
            return OUTSIDE_MARKER.encode() in handle.read(8 * 1024 * 1024)
    except OSError:
        return False


def temp_leftovers(root):
    found = []
    for directory, dirs, files in os.walk(str(root)):
        found.extend(os.path.join(directory, name) for name in dirs + files if name.startswith(TEMP_NAMES))
    return found


# ---------------------------------------------------------------------------------------------------------------
# Running a module the way Ansible does


@dataclass
class Run:
    result: dict | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def run_module(module, args, env, timeout=CASE_TIMEOUT, race=None):
    """A fresh Python runs plugins/modules/<module>.py on an args file; None result when it printed no JSON."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, prefix="gpuharden-fuzz-") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    path = [str(COLLECTIONS)]
    extra = {}
    if race:
        path.append(str(RACER))
        extra["GPUHARDEN_FUZZ_RACE"] = json.dumps(race)
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **env, **extra)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(REPO_ROOT / "plugins/modules" / (module + ".py")), handle.name],
                               env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        timed_out = True
    finally:
        os.unlink(handle.name)
    seconds = time.monotonic() - started
    result = None
    for line in reversed(out.strip().splitlines()):
        try:
            result = json.loads(line)
            break
        except ValueError:
            continue
    return Run(result, out, err, timed_out, seconds)


def module_args(built, check):
    return dict(built.args, _ansible_check_mode=check, _ansible_diff=True)


# ---------------------------------------------------------------------------------------------------------------
# Judging one run


def message_problem(msg, names):
    """Why ``msg`` is not an error a person can act on, or None."""
    if not isinstance(msg, str) or not msg.strip():
        return "no message"
    ansible_core = _ANSIBLE_ARGSPEC.match(msg)  # it quotes the value as given, control characters included
    if "\n" in msg.strip() and not ansible_core:
        return "more than one line: %r" % msg[:300]
    internal = None if ansible_core else _INTERNALS.search(msg)
    if internal:
        return "shows Python or parser internals (%r): %r" % (internal.group(0), msg[:300])
    if names and not any(name in msg for name in names):
        return "names none of %s: %r" % (", ".join(repr(name) for name in names[:4]), msg[:300])
    return None


def _failure(run):
    """(failed?, message) of a run that printed JSON."""
    result = run.result
    return bool(result.get("failed")), result.get("msg", "")


def judge(built, mutation, run, before, after, outside_before, outside_after, mode):
    """The outcome of one run of a case."""
    if run.timed_out:
        return Outcome("hang", "no end within %.0f s (%s mode)" % (CASE_TIMEOUT, mode), mode, run.seconds)
    if run.result is None:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome("traceback", "no JSON result; stderr ends %r" % tail[:300], mode, run.seconds)
    failed, msg = _failure(run)
    if failed and ("MODULE FAILURE" in msg or run.result.get("module_stderr")):
        return Outcome("traceback", msg[:300], mode, run.seconds)
    outcome = _judge_result(built, mutation, run, before, after, outside_before, outside_after, mode)
    outcome.seconds = run.seconds
    return outcome


def _judge_result(built, mutation, run, before, after, outside_before, outside_after, mode):
    failed, msg = _failure(run)
    race = _race_outcome(mutation, before, after, mode, failed, msg) if mode == "normal" else None
    if failed:
        if race is not None:
            return race
        leftovers = temp_leftovers(built.root)
        if changed_paths(outside_before, outside_after):
            return Outcome("write_through_link", "a refusal changed files outside the root: %s"
                           % changed_paths(outside_before, outside_after)[:3], mode)
        if after != before or (built.server is not None and built.server.mutations):
            what = changed_paths(before, after)[:5] or (built.server.mutations[:3] if built.server else [])
            return Outcome("half_done", "refused (%r) after changing %s" % (msg[:200], what), mode)
        if leftovers:
            return Outcome("leftover_temp", "%s (after the refusal %r)" % (leftovers[:3], msg[:200]), mode)
        return _refusal(msg, mutation, mode)
    if race is not None:
        return race
    if mutation.race and os.path.exists(mutation.race["marker"]):
        before = dict(before)
        before.pop(mutation.race["path"], None)  # the other writer's change is not the module's
        after = dict(after)
        after.pop(mutation.race["path"], None)
    if OUTSIDE_MARKER in run.stdout or any(_holds_marker(path) for path in changed_paths(before, after)):
        return Outcome("write_through_link", "read a file out of the root through a link (its content is in the output "
                       "or in a file written)", mode)
    if changed_paths(outside_before, outside_after):
        return Outcome("write_through_link", "changed outside the root: %s" % changed_paths(outside_before, outside_after)[:3], mode)
    for link, target in mutation.links:
        if not os.path.islink(link):
            return Outcome("write_through_link", "the link %s was replaced without being asked to" % link, mode)
        if target and target in {path for path in changed_paths(before, after)}:
            return Outcome("write_through_link", "written through the link %s to %s" % (link, target), mode)
    leftovers = temp_leftovers(built.root)
    if leftovers:
        return Outcome("leftover_temp", str(leftovers[:3]), mode)
    changed = changed_paths(before, after)
    if mode == "check" and changed:
        return Outcome("half_done", "check mode changed %s" % changed[:5], mode)
    if mode == "check" and built.server is not None and built.server.mutations:
        return Outcome("half_done", "check mode sent %s" % built.server.mutations[:3], mode)
    if mutation.expect == "refused":
        return Outcome("invalid_accepted", "accepted an input the component refuses (changed=%s)" % run.result.get("changed"), mode)
    if mutation.wrong_if_success:
        return Outcome("wrong_result", mutation.wrong_if_success, mode)
    if mode == "normal":
        problems = []
        if built.validate:
            problems.extend(built.validate(built, [path for path in changed if os.path.isfile(path) and not os.path.islink(path)]))
        if built.after_success:
            problems.extend(built.after_success(built, run.result))
        if problems:
            return Outcome("rejected_by_component", "; ".join(problems)[:600], mode)
    return Outcome("succeeded", "changed=%s" % run.result.get("changed"), mode)


def _race_outcome(mutation, before, after, mode, failed, msg):
    """A concurrent writer's change must survive: a refusal naming the file, nothing else changed."""
    race = mutation.race
    if not race or not os.path.exists(race["marker"]):
        return None  # the writer never got its turn: the module wrote nothing there
    try:
        now = Path(race["path"]).read_text()
    except OSError:
        now = None
    if now != race["content"]:
        return Outcome("lost_update", "the other writer's change to %s was overwritten (%s)" % (race["path"], "refused" if failed else "success"), mode)
    if not failed:
        return None  # the other writer's change stands and the module did not write that file after it: judged as usual
    others = [path for path in changed_paths(before, after) if path != race["path"]]
    if others:
        return Outcome("half_done", "refused the other writer's change (%r) after changing %s" % (msg[:200], others[:5]), mode)
    return _refusal(msg, mutation, mode)


def _refusal(msg, mutation, mode):
    """A refusal that changed nothing: allowed when its message is one a person can act on."""
    problem = message_problem(msg, mutation.names)
    return Outcome("unclear_error", problem, mode) if problem else Outcome("refused", msg[:300], mode)


# ---------------------------------------------------------------------------------------------------------------
# One case, start to end


def undo_immutable(paths):
    for path in paths:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)


def run_case(case, build, mutate, workdir):
    """Build, mutate, run in check mode, in normal mode, and again; the first outcome that is not allowed wins."""
    root, outside = workdir / "root", workdir / "outside"
    for path in (root, outside):
        if path.exists():
            shutil.rmtree(path)
    outside.mkdir(parents=True)
    (outside / "sentinel").write_text("outside the node root: never written\n")
    built = build(case.variant, root, outside)
    mutation = Mutation()
    outcomes = []
    try:
        mutate(built, case, mutation)
        modes = (["check"] if built.check_mode else []) + ["normal"]
        for mode in modes:
            before, outside_before = snapshot(root), snapshot(outside)
            race = None
            if mode == "normal" and mutation.race:
                race = dict(mutation.race)
            if built.server is not None:
                built.server.mutations.clear()
            run = run_module(case.module, module_args(built, mode == "check"), built.env, race=race)
            outcome = judge(built, mutation, run, before, snapshot(root), outside_before, snapshot(outside), mode)
            outcomes.append(outcome)
            if not outcome.allowed or outcome.kind == "refused":
                return outcome, outcomes
        last = outcomes[-1]
        if last.kind == "succeeded" and run.result.get("changed") and mutation.race is None and built.again:
            before, outside_before = snapshot(root), snapshot(outside)
            again = run_module(case.module, module_args(built, False), built.env)
            after = snapshot(root)
            outcome = judge(built, Mutation(names=mutation.names, links=mutation.links), again, before, after, outside_before,
                            snapshot(outside), "again")
            if outcome.allowed and (again.result.get("changed") or changed_paths(before, after)):
                outcome = Outcome("not_idempotent", "a second run changed=%s, %s" % (again.result.get("changed"), changed_paths(before, after)[:5]),
                                  "again", again.seconds)
            outcomes.append(outcome)
            if not outcome.allowed:
                return outcome, outcomes
        return last, outcomes
    finally:
        undo_immutable(mutation.immutable)
        for cleanup in built.cleanup:
            cleanup()
