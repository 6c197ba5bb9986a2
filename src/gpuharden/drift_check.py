# SPDX-License-Identifier: GPL-3.0-or-later
"""One `gpuharden drift` check over the fleet (or one --slice of it): the drift-check playbook through ansible-runner,
its events folded into outcomes, the cluster side run here from the play's hand-over (gpuharden/cluster_side.py),
the report built; or Incomplete when the run did not finish (a signal, the timeout, a playbook cut short), with the
hosts that have no final result.  StopRequest turns SIGINT and SIGTERM into a request the run polls.
"""

from __future__ import annotations

import math
import os
import signal
import tempfile
import threading
import time

from gpuharden import ansible_output, cluster_side, drift_report, drift_run, drift_slices, drift_terminal, kubeconfig

# How often `gpuharden drift` looks for a signal or the --timeout while its cluster side runs
CLUSTER_SIDE_POLL = 0.2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# --slice lists the play's hosts before the run: a dynamic inventory of a large fleet may take minutes.
SLICE_LIST_TIMEOUT = 600
# --cluster-check: where the cluster side's consistency check runs.  IN_PROCESS (the default): here, the collection's
# module_utils called from the play's hand-over (cluster_side.py); MODULE: the gpu_consistency module in the play, as
# plain ansible-playbook runs it.  Both call the same function; the report's cluster.ran_in says which ran.
IN_PROCESS, MODULE = "in-process", "module"
CLUSTER_CHECK_CHOICES = (IN_PROCESS, MODULE)


class Incomplete(Exception):
    """The run did not finish (a signal, the timeout, a canceled or cut-short playbook): nothing is reported.

    ``pending``: hosts without a final result; ``checked``: hosts that had one when the run stopped (not reported
    either, since the run's cluster-wide checks and the other hosts are missing); ``hosts_known``: False when the
    play's host list could not be read, so hosts not yet started may be missing from ``pending``; ``details``: the
    first error lines of ansible-playbook's output, when it stopped by itself."""

    def __init__(self, reason, code, pending=(), checked=(), hosts_known=True, details=""):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.pending = sorted(pending)
        self.checked = sorted(checked)
        self.hosts_known = hosts_known
        self.details = details


class StopRequest:
    """SIGINT and SIGTERM while a run is under way: remembered, not acted on where they land.

    Handed to ansible-runner as its cancel callback: given one, ansible-runner installs no signal handlers of its own
    (ansible-runner src/ansible_runner/interface.py, init_runner; its own ones are never uninstalled) and polls the
    callback in its pexpect loop, then SIGKILLs ansible-playbook's process group and ends with status ``canceled``
    (src/ansible_runner/runner.py, Runner.run and Runner.handle_termination).  That group is not the whole run: see
    stop_processes, which run_playbook calls after every run.  Used as a context manager: installs the handlers in
    the main thread and puts the previous ones back on exit."""

    def __init__(self):
        self.signum = None
        self.count = 0
        self._previous = {}

    def __call__(self, signum, _frame=None):
        self.count += 1
        if self.signum is None:
            self.signum = signum

    def requested(self):
        return self.signum is not None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self)
        return self

    def __exit__(self, *_exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        return False

    def exit_code(self):
        return drift_report.EXIT_SIGNAL_BASE + int(self.signum)

    def name(self):
        return signal.Signals(self.signum).name


def stopped(args, stop, deadline, status=None):
    """(reason, exit code) when the run must end here without a report, else None.  Before a playbook (``status``
    None): a signal came or the --timeout is used up; after one: a signal, or a runner status of a run that did not
    get to its end (timeout, canceled, anything but successful/failed)."""
    if stop is not None and stop.requested():
        return "interrupted by %s" % stop.name(), stop.exit_code()
    if status == "timeout" or (status is None and deadline is not None and time.monotonic() >= deadline):
        return "timed out (--timeout %s s)" % args.timeout, drift_report.EXIT_INCOMPLETE
    if status is not None and status not in drift_run.FINISHED_STATUSES:
        return "ansible-runner ended the run with status %s" % status, drift_report.EXIT_INCOMPLETE
    return None


def runner_timeout(deadline):
    """ansible-runner's timeout= for a playbook started now: the whole seconds left of --timeout (at least 1)."""
    return None if deadline is None else max(1, math.ceil(deadline - time.monotonic()))


def incomplete(args, extravars, limit, outcomes, stop, reason, code):
    """The Incomplete of a drift check that stopped: every host of the play without a final result named, from the
    run's events and, for hosts not started yet, from the play's host list."""
    listed = drift_run.play_hosts(args.playbook, args.inventory, limit=limit, extravars=extravars, stop=stop)
    done = outcomes.done()
    return Incomplete(reason, code, pending=(outcomes.play_hosts() | (listed or set())) - done, checked=done,
                      hosts_known=listed is not None)


def check(args, extravars, stream, limit, stop=None, deadline=None):
    progress = None if args.quiet else drift_terminal.progress(stream)
    outcomes = drift_report.Outcomes(progress=progress)
    try:
        return _check(args, extravars, stream, limit, stop, deadline, outcomes)
    finally:
        if progress is not None:
            progress.end()


def _check(args, extravars, stream, limit, stop, deadline, outcomes):
    before = stopped(args, stop, deadline)
    if before:
        raise incomplete(args, extravars, limit, outcomes, stop, *before)
    started = time.time()
    # --cluster-check: the consistency check here (from the play's hand-over) or in its module run, as ansible-playbook runs it
    cluster = cluster_side_runner() if getattr(args, "cluster_check", IN_PROCESS) == IN_PROCESS else None
    if cluster is not None:
        extravars = dict(extravars, gpuharden_drift_cluster_in_process=True)
    status, rc, _stats, stdout = drift_run.run_playbook(args.playbook, args.inventory, limit=limit, forks=args.forks,
                                                        extravars=extravars, event_handler=outcomes.feed,
                                                        cancel=stop.requested if stop is not None else None, timeout=runner_timeout(deadline))
    finished = time.time()
    after = stopped(args, stop, deadline, status)
    if after:
        raise incomplete(args, extravars, limit, outcomes, stop, *after)
    if not outcomes.seen:
        raise not_run("the drift check", args.inventory, limit, outcomes.plays.unmatched(), status, rc, stdout)
    if not outcomes.finished():
        # killed, crashed or stopped by a play-wide error: the hosts it had not got to have no result, and the
        # cluster-wide checks at the end of the play did not run for any host
        error = incomplete(args, extravars, limit, outcomes, stop, "ansible-playbook stopped before the end of the play "
                           "(%s)" % ansible_output.describe_exit(status, rc), drift_report.EXIT_INCOMPLETE)
        error.details = ansible_output.error_excerpt(stdout)
        raise error
    outcomes.close()
    if cluster is not None and outcomes.consistency_options is not None:
        run_cluster_side(cluster, outcomes, lambda: stopped(args, stop, deadline) is not None)
        interrupted = stopped(args, stop, deadline)
        if interrupted:
            # the play is complete, but not the cluster-wide checks: no report, as for a play cut short
            raise Incomplete(*interrupted, checked=outcomes.done())
        finished = time.time()
    outcomes.credential = cluster_credential(outcomes)
    return drift_report.build_report(outcomes, inventory=args.inventory, limit=limit, fail_severity=args.fail_severity,
                        started=started, finished=finished, node_names=outcomes.node_names)


def cluster_credential(outcomes):
    """The credential the run's cluster side used (its kubeconfig, from the play's hand-over or the module's
    arguments) and when it expires; None where no cluster side ran."""
    options = outcomes.consistency_options if outcomes.consistency_options is not None else outcomes.consistency_invocation
    if not isinstance(options, dict):
        return None
    path = options.get("kubeconfig")
    if path is not None and not isinstance(path, str):
        return {"kubeconfig": None, "kind": "unknown", "expires_at": None, "note": "a kubeconfig given as a dictionary"}
    return kubeconfig.credential_expiry(path, options.get("context"))


def cluster_side_runner():
    """A cluster_side.Runner for the installed collection (its import starts now, beside the play), or None where the
    collection is not below Ansible's collections paths (a --playbook file elsewhere): the playbook then runs the
    gpu_consistency module itself, and the report's cluster.ran_in says so."""
    base = cluster_side.collection_base(drift_run.collection_bases())
    return cluster_side.Runner(base) if base else None


def run_cluster_side(cluster, outcomes, interrupted=lambda: False, poll=CLUSTER_SIDE_POLL):
    """The consistency check (and the RuntimeClass dry run in it) here, from the play's hand-over in ``outcomes``.  A
    check that cannot run is the report's consistency_error, and its RuntimeClass dry run a failed check, as when the
    module run fails.

    It runs in a thread while this one polls ``interrupted()`` (a signal, --timeout): then it is left behind (its
    requests end with the process) and ``outcomes`` is not touched; the caller reports the run as incomplete."""
    done = {}

    def work():
        try:
            done["result"] = cluster.run(outcomes.consistency_options, outcomes.node_reports)
        except cluster_side.ClusterSideError as error:
            done["error"] = error

    thread = threading.Thread(target=work, name="gpuharden-cluster-side", daemon=True)
    thread.start()
    while thread.is_alive():
        if interrupted():
            return
        thread.join(poll)
    # ran here, whether it answered or not (an answer's own ran_in says the same)
    outcomes.consistency_ran_in = drift_report.RAN_IN_CONTROLLER
    try:
        if "result" not in done:
            raise done.get("error") or cluster_side.ClusterSideError("the consistency check ended without a result")
        outcomes.api_retries += done["result"].get("api_retries") or 0
        outcomes.take_consistency(done["result"])
    except cluster_side.ClusterSideError as error:
        outcomes.consistency_error = " ".join(str(error).split())[:500]
        outcomes.consistency_access = error.access
        if (outcomes.consistency_options or {}).get("runtime_class") is not None and outcomes.runtime_class is None:
            # the dry run rides in the consistency check's run: it did not run either, for the same reason
            outcomes.runtime_class = {"failed": True, "msg": outcomes.consistency_error, "access": error.access}


def check_slice(args, extravars, stream, stop=None, deadline=None):
    """The drift check of --slice K/N's hosts only: the play's hosts (its pattern, -l) from ansible-playbook
    --list-hosts, cut by slice_of, and handed to the run as its --limit, so the other slices' hosts are never contacted.
    A slice without hosts is an empty report; a fleet without hosts is the usual "no host to check" (exit 2)."""
    index, count = args.slice
    stopped_before = stopped(args, stop, deadline)
    if stopped_before:
        raise Incomplete(*stopped_before, hosts_known=False)
    listed = drift_run.list_hosts(args.playbook, args.inventory, limit=args.limit, extravars=extravars, stop=stop,
                        timeout=runner_timeout(deadline) or SLICE_LIST_TIMEOUT)
    if listed is None:
        reason = stopped(args, stop, deadline) or ("listing the play's hosts took over %d s" % SLICE_LIST_TIMEOUT, drift_report.EXIT_INCOMPLETE)
        raise Incomplete(reason[0] + " (listing the hosts to slice)", reason[1], hosts_known=False)
    returncode, stdout, stderr = listed
    output = ansible_output.strip_ansi(stderr + "\n" + stdout)
    if returncode != 0 and any(text in output for text in ansible_output.NO_HOSTS_TEXTS):
        # -l matched no host: nothing to contact, and the ordinary run says so in its words
        return check(args, extravars, stream, args.limit, stop, deadline)
    if returncode != 0:
        excerpt = ansible_output.error_excerpt(output)
        raise drift_run.DriftError("--slice %d/%d: ansible-playbook --list-hosts could not list the hosts to slice (exit %d)%s" % (
            index, count, returncode, (":\n" + ansible_output.indent(excerpt)) if excerpt else ""))
    fleet = drift_run.parse_list_hosts(stdout)
    if not fleet:
        # nothing to contact: the ordinary run says which pattern or -l matched no host
        return check(args, extravars, stream, args.limit, stop, deadline)
    hosts = drift_slices.slice_hosts(fleet, index, count)
    part = drift_slices.slice_section(index, count, fleet, hosts)
    if not hosts:
        stream.write("gpuharden drift: slice %d/%d has no host (the fleet has %d): an empty report, nothing checked; "
                     "the other slices check the fleet\n" % (index, count, len(fleet)))
        stream.flush()
        now = time.time()
        report = drift_report.build_report(drift_report.Outcomes(), inventory=args.inventory, limit=args.limit, fail_severity=args.fail_severity,
                              started=now, finished=now)
        return dict(report, slice=part)
    if not args.quiet:
        stream.write("gpuharden drift: slice %d/%d: %d of %d host(s)\n" % (index, count, len(hosts), len(fleet)))
        stream.flush()
    with tempfile.TemporaryDirectory(prefix="gpuharden-slice-") as scratch:
        # a file, not a comma list: a slice of a large fleet outgrows one command-line argument (128 KiB on Linux)
        limit_file = os.path.join(scratch, "limit")
        with open(limit_file, "w", encoding="utf-8") as handle:
            handle.write("".join(host + "\n" for host in hosts))
        report = check(args, extravars, stream, "@" + limit_file, stop, deadline)
    return dict(report, limit=args.limit, slice=part)


def not_run(what, inventory, limit, unmatched, status, rc, stdout):
    """The DriftError of a playbook run that ran nothing on any host: no host to work on (which pattern or -l matched
    nothing; ``unmatched``: the hosts patterns of the plays that matched no host), or ansible-playbook's first error
    lines, with its exit code in words."""
    found = ansible_output.no_hosts(stdout, inventory=inventory, limit=limit, unmatched_plays=unmatched,
                                    pattern_variable=drift_run.TARGET_VARIABLE)
    if found:
        kind, reason = found
        hint = {"inventory": "check -i and ansible's warnings about it",
                "limit": "give -l hosts or groups of the inventory",
                "pattern": "put the GPU nodes in the group %s names (default %s), or set it: -e %s=GROUP%s"
                           % (drift_run.TARGET_VARIABLE[0], drift_run.TARGET_VARIABLE[1], drift_run.TARGET_VARIABLE[0], ", or widen -l" if limit else "")}[kind]
        return drift_run.DriftError("no host to run %s on: %s.  Nothing was checked or changed; %s" % (what, reason, hint))
    excerpt = ansible_output.error_excerpt(stdout)
    return drift_run.DriftError("ansible-playbook ran %s on no host (%s)%s" % (
        what, ansible_output.describe_exit(status, rc), (":\n" + ansible_output.indent(excerpt)) if excerpt else ", and printed nothing"))
