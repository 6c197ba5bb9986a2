# SPDX-License-Identifier: GPL-3.0-or-later
"""Running Ansible for `gpuharden drift` (and explain): ansible-playbook through ansible-runner, its --list-hosts, the
collection's playbooks as Ansible finds them, the extra vars as ansible-playbook parses them, and the processes a run
leaves behind, found by a marker in their environment and stopped.

Imports no other gpuharden module, so the collection lookup (cluster_side, kubeconfig) can use it without a cycle.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

DRIFT_PLAYBOOK = "gpuharden.k8s.drift_check"
HARDEN_PLAYBOOK = "gpuharden.k8s.harden_gpu_nodes"
# Collection playbook names must be identifiers (ansible-core collection_loader); the hyphenated files beside them
# (harden-gpu-nodes.yml, ...) only import these for project-directory use.
PLAYBOOK_FILES = {DRIFT_PLAYBOOK: "drift_check.yml", HARDEN_PLAYBOOK: "harden_gpu_nodes.yml"}
# The variable the playbooks' hosts pattern comes from, and its default (playbooks/drift_check.yml, harden_gpu_nodes.yml).
TARGET_VARIABLE = ("gpuharden_target_hosts", "gpu_nodes")
# ansible-runner's Runner.status values of a run that got to its end (ansible-runner src/ansible_runner/runner.py,
# Runner.run: canceled, successful, timeout or failed).  Every other value (canceled, timeout, or a status the run
# never left such as starting/running) is a run that did not finish.
FINISHED_STATUSES = ("successful", "failed")
# How often ansible-runner polls the cancel callback and the job timeout: its pexpect loop wakes up on the child's
# output or after pexpect_timeout seconds (default 5; ansible-runner config/_base.py, read from env/settings).
RUNNER_SETTINGS = {"pexpect_timeout": 1}
LIST_HOSTS_TIMEOUT = 60
# Every process a run starts on the controller (ansible-playbook, its workers, the modules and ssh clients they start)
# inherits this variable, with a value of its own run, so they can be found and stopped when the run ends, whatever
# session or process group they moved to.
RUN_MARKER = "GPUHARDEN_RUN_ID"
# Seconds the processes of an ended run get between SIGTERM and SIGKILL, and again to vanish after SIGKILL.
TERMINATE_GRACE = 3.0


class DriftError(Exception):
    """A usage or environment problem: nothing (more) can be checked."""



def runner_env():
    """ansible-runner starts ansible-playbook from PATH in a scratch directory: prefer the one beside this Python,
    and keep the ansible.cfg of the directory the user ran us from.  No colour: ansible-runner runs ansible on a
    pseudo-terminal, so ansible would colour its output, and an error read from it (ansible_output) must be plain
    text (ANSIBLE_FORCE_COLOR, from the caller's environment, would win over ANSIBLE_NOCOLOR: it is turned off)."""
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    if "ANSIBLE_CONFIG" not in os.environ and os.path.exists("ansible.cfg"):
        env["ANSIBLE_CONFIG"] = os.path.abspath("ansible.cfg")
    return env


def collection_bases():
    """Where Ansible looks for collections, in its order: its collections paths (ansible.cfg, ANSIBLE_COLLECTIONS_PATH),
    then sys.path."""
    if "ANSIBLE_CONFIG" not in os.environ and os.path.exists("ansible.cfg"):
        os.environ["ANSIBLE_CONFIG"] = os.path.abspath("ansible.cfg")
    from ansible import constants  # noqa: PLC0415 (reads ansible.cfg like ansible-playbook does)

    return [os.path.expanduser(base) for base in list(constants.COLLECTIONS_PATHS) + sys.path if base]


def resolve_playbook(name):
    """A playbook path, or the installed collection's playbook file for one of PLAYBOOK_FILES's names."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    if name not in PLAYBOOK_FILES:
        raise DriftError("playbook %s: no such file" % name)
    searched = []
    for base in collection_bases():
        candidate = os.path.join(base, "ansible_collections", "gpuharden", "k8s", "playbooks", PLAYBOOK_FILES[name])
        searched.append(base)
        if os.path.isfile(candidate):
            return candidate
    raise DriftError("the gpuharden.k8s collection is not installed (no playbooks/%s below %s); install it with "
                     "ansible-galaxy collection install" % (PLAYBOOK_FILES[name], ", ".join(searched[:4])))


def _marked_processes(marker):
    """The pids of the live processes of the run ``marker`` (RUN_MARKER=marker in their environment, as read from
    /proc/PID/environ: Linux; elsewhere none are found).  Skipped: processes of other users (unreadable), zombies (an
    empty environ, or gone by the time it is read) and OpenSSH ControlPersist masters (``ssh: PATH [mux]``: they serve
    every run using that socket, hold no lock, and exit on their own when idle)."""
    entry = ("%s=%s" % (RUN_MARKER, marker)).encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    pids = []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as handle:
                environ = handle.read().split(b"\0")
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if entry in environ and not (cmdline.startswith(b"ssh: ") and b"[mux]" in cmdline):
            pids.append(int(name))
    return pids


def _signal_processes(pids, signum):
    """``signum`` to each pid and, for a process group leader (an ansible-playbook worker), to its whole group."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid and pid != os.getpgrp():
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except OSError:
            pass  # gone meanwhile, or not ours


def stop_processes(marker, grace=TERMINATE_GRACE):
    """Ends whatever the run ``marker`` left running: SIGTERM, SIGKILL to what is still there ``grace`` seconds later,
    then waits up to ``grace`` more for it to be gone.  Returns the pids found at first (none after a run that ended
    by itself).

    ansible-runner kills only ansible-playbook's process group on cancel or timeout, with SIGKILL, so ansible-playbook
    cannot pass the signal on.  Since ansible-core 2.19 each WorkerProcess calls os.setsid() when it starts (ansible-core
    lib/ansible/executor/process/worker.py, WorkerProcess._detach; a process group of its own at least when 2.21's
    WORKER_SESSION_ISOLATION is off): the workers, and the modules or ssh clients they run, are outside ansible-playbook's
    process group, which only ansible-playbook's own SIGINT/SIGTERM handler reaches
    (lib/ansible/executor/task_queue_manager.py, TaskQueueManager._signal_handler: "the children become process
    leaders").  Orphaned, a worker waiting for its parent (a pause, a prompt, a queue) waits forever, and one running
    a module goes on with it, holding its connection (and a node's run lock) meanwhile.  A worker's SIGTERM handler passes the
    signal on to its own group and exits (WorkerProcess._term)."""
    found = _marked_processes(marker)
    pids = found
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not pids:
            break
        _signal_processes(pids, signum)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _marked_processes(marker)  # again: also the processes a dying one started meanwhile
    return found


def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
    """One ansible-runner run; (status, rc, stats, stdout).  ``cancel``: a callable that says stop (then the status is
    ``canceled``); ``timeout``: seconds, after which ansible-runner kills the run (status ``timeout``).  Whichever way
    it ends, no process of the run is left when this returns (stop_processes)."""
    import ansible_runner  # noqa: PLC0415 (keeps `gpuharden --help` fast)

    marker = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="gpuharden-drift-") as private_data_dir:
        cmdline = []
        if tags:
            cmdline += ["--tags", ",".join(tags)]
        # ansible-runner 2.4 drops a settings= argument when env/settings does not exist (config/_base.py,
        # prepare_env), so the settings go in the file.
        os.makedirs(os.path.join(private_data_dir, "env"))
        with open(os.path.join(private_data_dir, "env", "settings"), "w", encoding="utf-8") as handle:
            json.dump(RUNNER_SETTINGS, handle)
        options = {"cancel_callback": cancel} if cancel is not None else {}
        try:
            runner = ansible_runner.run(
                private_data_dir=private_data_dir,
                envvars=dict(runner_env(), **{RUN_MARKER: marker}),
                inventory=inventory,
                playbook=playbook,
                limit=limit,
                forks=forks,
                extravars=extravars,
                cmdline=" ".join(cmdline) or None,
                quiet=True,
                event_handler=event_handler,
                timeout=timeout,
                **options,
            )
        finally:
            stop_processes(marker)
        stdout = runner.stdout.read() if runner.stdout else ""
        stats = runner.stats or {}
    return runner.status, runner.rc, stats, stdout


def parse_list_hosts(text):
    """The hosts of `ansible-playbook --list-hosts` output, every play together (the ``hosts (N):`` blocks,
    ansible-core lib/ansible/cli/playbook.py, PlaybookCLI.run)."""
    hosts, inside = set(), False
    for line in text.splitlines():
        if re.match(r"^\s+hosts \(\d+\):\s*$", line):
            inside = True
        elif inside and line.startswith("      ") and line.strip():
            hosts.add(line.strip())
        else:
            inside = False
    return hosts


def play_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=LIST_HOSTS_TIMEOUT):
    """The hosts the playbook's plays target, as ansible-playbook --list-hosts resolves them (the templated hosts
    pattern, the inventory, --limit); None when that cannot be read.  Only for naming the hosts of a run that did
    not finish, so a further SIGINT/SIGTERM (``stop.count`` grows) or the timeout abandons it, and stops everything
    it started (its session, and any process of it that left the session: stop_processes)."""
    listed = list_hosts(playbook, inventory, limit=limit, extravars=extravars, stop=stop, timeout=timeout)
    return parse_list_hosts(listed[1]) if listed is not None and listed[0] == 0 else None


def list_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=LIST_HOSTS_TIMEOUT):
    """``ansible-playbook --list-hosts``: (returncode, stdout, stderr), or None when it could not be started or was
    abandoned (a further SIGINT/SIGTERM, or ``timeout`` seconds).  Whichever way it ends, nothing it started is left."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, **runner_env(), **{RUN_MARKER: marker})
    executable = shutil.which("ansible-playbook", path=env["PATH"])
    if not executable:
        return None
    command = [executable, "--list-hosts", "-i", inventory, "-e", json.dumps(extravars), playbook]
    if limit:
        command += ["--limit", limit]
    signals = stop.count if stop else 0
    deadline = time.monotonic() + timeout
    try:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
    except OSError:
        return None
    output = None
    try:
        while output is None:
            try:
                output = process.communicate(timeout=0.2)
            except subprocess.TimeoutExpired:
                if (stop and stop.count > signals) or time.monotonic() > deadline:
                    break
    finally:
        if output is None:
            # abandoned: its group (start_new_session made it the leader), then what of it is elsewhere, then what
            # of its group stayed without the marker
            _signal_processes([process.pid], signal.SIGTERM)
            stop_processes(marker)
            _signal_processes([process.pid], signal.SIGKILL)
            # a survivor holding a pipe must not keep the wait from returning
            process.stdout.close()
            process.stderr.close()
            process.wait()
        else:
            stop_processes(marker)
    return None if output is None else (process.returncode, output[0], output[1])


def parse_extra_vars(values):
    """-e KEY=VALUE, -e '{"json": 1}' or -e @file.yml/json, like ansible-playbook (later wins)."""
    result = {}
    for value in values or []:
        if value.startswith("@"):
            import yaml  # noqa: PLC0415

            path = value[1:]
            try:
                with open(path, encoding="utf-8") as handle:
                    data = yaml.safe_load(handle) or {}
            except (OSError, yaml.YAMLError) as error:
                raise DriftError("-e %s: %s" % (value, error)) from None
            if not isinstance(data, dict):
                raise DriftError("-e %s: the file must hold a mapping of variables" % value)
            result.update(data)
        elif value.lstrip().startswith("{"):
            try:
                data = json.loads(value)
            except ValueError as error:
                raise DriftError("-e %s: not valid JSON: %s" % (value, error)) from None
            result.update(data)
        else:
            for pair in value.split():
                key, sep, item = pair.partition("=")
                if not sep or not key:
                    raise DriftError("-e %r: give KEY=VALUE, JSON or @FILE" % value)
                result[key] = item
    return result
