# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden explain`: from one failing GPU pod (or a node) to its cause and its fix.

``gpuharden explain pod NAMESPACE/NAME``, ``gpuharden explain node NAME`` and ``gpuharden explain --failing`` (every
GPU pod of the cluster, one that requests an nvidia.com/* resource or runs the nvidia RuntimeClass, that is not
Running and Ready, nor Succeeded) read the cluster through the collection's one Kubernetes request path
(plugins/module_utils/k8s) and weigh the cause rules of gpuharden/explain_rules.py, in order: the first that fires is
the verdict.  Each piece of evidence is read at most once and only when a rule needs it: the pod (GET), the Nodes
(one LIST), the device plugin's pods (one LIST of the node's pods, or of the plugin DaemonSets' pods), the pod's
events (one LIST with a field selector).  A Pending pod with a misspelled resource costs the pod and the Nodes.
``--failing`` makes one LIST of pods and one of Nodes for the whole cluster, and reads no events.

The cluster identity is the one gpuharden drift gives the playbooks: ``-e gpuharden_kubeconfig=FILE`` (or
``--kubeconfig``, ``--context``), else K8S_AUTH_KUBECONFIG / K8S_AUTH_CONTEXT, else in-cluster credentials or the
default kubeconfig, as the collection's modules decide (_k8s.auth_settings).  The node's drift check uses the same.

Output: the verdict first (the cause, one line), then the evidence, each with where it was read, then the fix.  With
--json, schema 1::

    {"schema": 1, "target": {"kind": "pod"|"node", "name": ...}, "state": "cause"|"healthy"|"undecided",
     "verdict": {"cause": <rule id or null>, "finding_id": <catalogue id or null>, "stage": <harden tag or null>,
                 "summary": <the one line>},
     "evidence": [{"what", "where", "value"}], "fix": [<line>], "not_checked": [{"what", "cause", "fix"}],
     "api_requests": <requests made>, "api_retries": <of which sent again: throttled, failed or broken>}

``--failing`` prints ``{"schema": 1, "target": {"kind": "failing"}, "state", "pods": [<one pod's document>],
"not_checked", "api_requests", "api_retries"}``.

Three states, never silence: a cause found ("cause"), nothing wrong ("healthy"), or could not decide ("undecided":
``not_checked`` says what was not checked, why, and how to check it; a blind cluster side, an API server that
refused or could not be reached, comes first with its fix).

The node side: where no cluster-side rule explains a pod bound to a node (or the pod is Running and Ready, for what
its containers can open), the node-side rules weigh that node's audit.  With ``-i INVENTORY`` it is read with one
drift check of the node (NodeTrip: drift_check.yml limited to the node's host, the node's run lock held while it
reads; the only trip to a node an explanation makes); with ``--from-report`` it is taken from a drift report (no
trip); without either, the node side is not checked and said so.  ``node_trips`` and ``node_seconds`` in the JSON
count it.  ``--failing -i INVENTORY`` makes one drift run over the inventory for every pod.

Exit codes: 0 explained and healthy (no cause: the pod is Running and Ready or Succeeded, the node serves its GPUs,
--failing found no failing GPU pod); 1 a cause found (--failing: for some pod, and every failing pod decided);
4 could not decide (something was not checked: the cluster could not be read, or no rule explains the symptom;
--failing: any pod undecided); 2 usage or environment error (bad arguments, the collection not installed, no such
pod or node).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import sys
import threading
import time

from gpuharden import cluster_side, drift_check, drift_run, drift_slices

EXIT_HEALTHY, EXIT_CAUSE, EXIT_USAGE, EXIT_UNDECIDED = 0, 1, 2, 4
SCHEMA = 1
MODULE = "gpuharden explain"
DESCRIPTION = """\
Explain why a GPU pod fails (Pending, rejected, crash-looping) or why a node does not serve its GPUs: the cause in one
line, the evidence with where it was read, and the fix (a harden stage to run, or the change to the workload).
Read-only: it reads the cluster through the API server, each object at most once; with -i INVENTORY, the pod's node
too, with one drift check of that node, only where the cluster shows no cause.
"""
EPILOG = """\
examples:
  gpuharden explain pod ml/train-0 -e gpuharden_kubeconfig=~/.kube/gpuharden -i inventory.yml
  gpuharden explain node gpu-node-07 --from-report /var/lib/gpuharden/drift-report.json
  gpuharden explain --failing --json

exit codes:
  0    explained, healthy: no cause (the pod is Running and Ready, the node serves its GPUs, no failing GPU pod)
  1    a cause found: the first line names it, the output ends with the fix
  4    could not decide: what was not checked and why come first (an API server that refused or could not be reached,
       a node not read: give -i INVENTORY, or a symptom no rule explains); never a guess
  2    usage or environment error (bad arguments, the collection not installed, no such pod or node)
"""


class UsageError(Exception):
    """Bad arguments, or a pod or node that does not exist: exit 2."""


def load_collection():
    """The collection's k8s layer, findings catalogue and explain's rules (which import the collection's checks), from
    the collection the playbooks come from (as gpuharden drift finds it)."""
    prefix = "ansible_collections.gpuharden.k8s.plugins.module_utils."
    names = {"k8s": prefix + "k8s._k8s", "access": prefix + "k8s._k8s_access", "resources": prefix + "k8s._resources", "findings": prefix + "core._findings",
             "errors": prefix + "core._errors", "rules": "gpuharden.explain_rules"}
    try:
        modules = cluster_side.import_collection(names)
    except cluster_side.ClusterSideError as error:
        raise UsageError(str(error)) from None
    if modules is None:
        try:  # the one check and message every command gives for a missing collection
            cluster_side.require_collection()
        except cluster_side.CollectionError as error:
            raise UsageError(str(error)) from None
        raise UsageError("the gpuharden.k8s collection could not be imported")
    return argparse.Namespace(**modules)


def auth_params(args, environ=None):
    """The collection's auth options for the cluster identity: --kubeconfig/--context, else -e gpuharden_kubeconfig
    (as the roles take it), else K8S_AUTH_KUBECONFIG / K8S_AUTH_CONTEXT (the modules' fallbacks); None leaves the
    choice to _k8s.auth_settings (in-cluster, then the default kubeconfig)."""
    environ = os.environ if environ is None else environ
    extra = drift_run.parse_extra_vars(args.extra_vars)
    kubeconfig = args.kubeconfig or extra.get("gpuharden_kubeconfig") or environ.get("K8S_AUTH_KUBECONFIG") or None
    context = args.context or environ.get("K8S_AUTH_CONTEXT") or None
    return {"kubeconfig": kubeconfig, "context": context, "request_timeout": args.request_timeout}


class Reader:
    """The API reads of one explain run, each through the collection's request path; ``count`` requests made."""

    def __init__(self, lib, api, trip=None):
        self.lib, self.api, self.count, self.trip = lib, api, 0, trip

    @property
    def retries(self):
        """How many of the requests were sent again (the collection's retry policy: _k8s.retries_made)."""
        return self.lib.k8s.retries_made(self.api)

    def get(self, kind, name):
        """One object of a cluster-scoped ``kind`` (its path from the collection's resource table), or None."""
        self.count += 1
        send = self.lib.k8s.endpoint(self.api, "GET", *self.lib.resources.template(kind, named=True))
        status, body = self.lib.access.call(MODULE, self.api, send, self.lib.access.Target.of("get", kind, name=name), name, accept=(404,))
        return None if status == 404 else body

    def list(self, kind, namespace=None, **selectors):
        """Every ``kind`` in ``namespace`` (None: across all namespaces), one paginated LIST."""
        send = self.lib.k8s.endpoint(self.api, "GET", self.lib.resources.path(kind, namespace=namespace))
        items, pages = self.lib.access.list_all(MODULE, self.api, send, self.lib.access.Target.of("list", kind, namespace), **selectors)
        self.count += pages
        return items

    def pod(self, namespace, name):
        # a LIST by name, not a GET: the tool's identity may list pods and never get one (deploy/rbac/gpuharden-rbac.yaml)
        pods = self.list("Pod", namespace, field_selector="metadata.name=%s" % name)
        return pods[0] if pods else None

    def node(self, name):
        return self.get("Node", name)

    def nodes(self):
        return self.list("Node")

    def pods(self, node=None):
        selector = {"field_selector": "spec.nodeName=%s" % node} if node else {}
        return self.list("Pod", **selector)

    def events(self, namespace, name):
        # the events the API server holds for the pod (field selectors of k8s.io/kubernetes v1.36.3
        # pkg/registry/core/event/strategy.go ToSelectableFields)
        return self.list("Event", namespace, field_selector="involvedObject.kind=Pod,involvedObject.name=%s" % name)

    def plugin_pods(self, node=None):
        """The NVIDIA device plugin's pods (the pods whose spec has the plugin container, as _device_plugin finds the
        plugin): on ``node``, one LIST of the node's pods; cluster-wide, the plugin DaemonSets' pods (one LIST of
        DaemonSets, one of pods per plugin DaemonSet by its selector's labels)."""
        plugin = self.lib.rules._device_plugin
        if node:
            return [pod for pod in self.pods(node) if plugin.plugin_container(pod.get("spec") or {})]
        found = []
        for ds in self.list("DaemonSet"):
            if not plugin.is_plugin_daemonset(ds):
                continue
            labels = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            namespace = (ds.get("metadata") or {}).get("namespace")
            selector = ",".join("%s=%s" % pair for pair in sorted(labels.items()))
            pods = self.list("Pod", namespace, **({"label_selector": selector} if selector else {}))
            found.extend(pod for pod in pods if plugin.plugin_container(pod.get("spec") or {}))
        return found


NODE_TIMEOUT = 120.0
# the node findings whose subject is one pod: a pod they name is "flagged by the audit" for --failing
POD_FINDINGS = ("isolation_breach", "broken_allocation", "privileged_container", "gpu_access", "visible_devices_without_request",
                "device_used_by_other_container", "gpu_process_on_unallocated_device", "gpu_process_without_allocation",
                "gpu_process_exceeds_allocation")


def node_audit_of(report, node, source):
    """The evidence "node_audit" for ``node`` from a drift report (the node's findings, checks, not_checked, as drift
    reports them): {"state": "checked", "node", "host", "findings", "checks", "not_checked", "source"}, or
    {"state": "not_checked", "node", "cause", "fix"} where the report has no audit of the node."""
    for host, entry in (report.get("nodes") or {}).items():
        if entry.get("node", host) == node:
            return {"state": "checked", "node": node, "host": host, "findings": entry.get("findings") or [], "checks": entry.get("checks") or {},
                    "not_checked": entry.get("not_checked") or [], "pod_resources": entry.get("pod_resources"), "source": source}
    names = report.get("node_names") or {}
    for kind in ("unreachable", "failed"):
        for host, why in (report.get(kind) or {}).items():
            if names.get(host, host) == node:
                return {"state": "not_checked", "node": node, "host": host, "cause": "%s: host %s %s: %s" % (source, host, kind, str(why)[:300]),
                        "fix": "make the host reachable for Ansible (ansible -i INVENTORY -m ping %s), then run again" % host}
    return {"state": "not_checked", "node": node, "cause": "%s has no host whose node is %s" % (source, node),
            "fix": "name the node's inventory host: gpuharden explain ... -i INVENTORY --host HOST (its gpuharden_k8s_node_name is %s)" % node}


class NodeTrip:
    """The node side of an explanation: one drift check limited to the pod's node (its node_audit run, under the node's run
    lock, and the consistency check's findings for it), as `gpuharden drift -l HOST` makes it; ``trips`` counts them.
    ``host``: the node's inventory host where it is not named as the node."""

    def __init__(self, inventory, extra_vars=(), host=None, timeout=NODE_TIMEOUT, auth=None):
        self.inventory, self.extra_vars, self.host, self.timeout, self.trips, self.seconds = inventory, list(extra_vars), host, timeout, 0, 0.0
        self.auth = dict(auth or {})
        self._module = {}
        # gpu_pods_info's import (Ansible's module layer) overlaps the API reads that decide whether a trip is needed
        self._importing = threading.Thread(target=self._import_module, name="gpuharden-explain-import", daemon=True)
        self._importing.start()

    def _import_module(self):
        try:
            self._module.update(cluster_side.import_collection({"m": "ansible_collections.gpuharden.k8s.plugins.modules.gpu_pods_info"}) or {})
        except cluster_side.ClusterSideError:
            pass

    def pods_reading(self, node):
        """gpu_pods_info's result for ``node`` (its GPU pods, the pods snapshot the consistency check takes, the GPU
        Operator's reading), made here with the module's own code and handed to the play (gpuharden_gpu_pods_given in
        playbooks/tasks/node_plan_inputs.yml): one local module run less.  The module's default resource prefixes
        (nvidia.com/): they only choose the pods whose memory the cgroup check reads, a check no explain rule weighs.
        None where it cannot be made here: the play then makes it itself."""
        from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: PLC0415

        self._importing.join()
        module = self._module
        if not module:
            return None
        given = {key: value for key, value in dict(self.auth, nodes=[node], pods_snapshot=True, gpu_operator=True).items() if value is not None}
        checked = ArgumentSpecValidator(module["m"].argument_spec()).validate(given)
        if checked.error_messages:
            return None
        try:
            return module["m"].gather(checked.validated_parameters)
        except Exception:  # noqa: BLE001 (any failure: the play's own module run makes the reading, and reports it)
            return None

    def run(self, limit, node=None):
        """The drift report of the hosts ``limit`` names (drift_check.check, quietly), or a DriftError/Incomplete; with
        ``node``, the play is given that node's pods reading (pods_reading)."""
        args = argparse.Namespace(playbook=drift_run.resolve_playbook(drift_run.DRIFT_PLAYBOOK), inventory=os.path.abspath(self.inventory), forks=16,
                                  quiet=True, fail_severity="warning", timeout=self.timeout)
        extravars = drift_run.parse_extra_vars(self.extra_vars)
        extravars.update(gpuharden_drift_fail=False, gpuharden_drift_run_data=False,
                         gpuharden_run_owner="explain@%s:%d" % (socket.gethostname(), os.getpid()))
        # the cluster identity explain reads with is the play's too: the roles take gpuharden_kubeconfig, and the
        # collection's modules K8S_AUTH_CONTEXT from their environment (ansible-playbook's, this process's)
        if self.auth.get("kubeconfig"):
            extravars.setdefault("gpuharden_kubeconfig", self.auth["kubeconfig"])
        reading = self.pods_reading(node) if node else None
        if reading is not None:
            extravars["gpuharden_gpu_pods_given"] = reading
        self.trips += 1
        started = time.monotonic()
        try:
            with drift_check.StopRequest() as stop, _environment(K8S_AUTH_CONTEXT=self.auth.get("context")):
                return drift_check.check(args, extravars, io.StringIO(), limit, stop, started + self.timeout)
        finally:
            self.seconds += time.monotonic() - started

    def audit(self, node):
        """The evidence "node_audit" of ``node`` (node_audit_of's), from one trip."""
        host = self.host or node
        source = "gpuharden drift -i %s -l %s" % (self.inventory, host)
        if not os.path.exists(self.inventory):
            return {"state": "not_checked", "node": node, "cause": "inventory %s does not exist" % self.inventory, "fix": "give -i INVENTORY"}
        try:
            report = self.run(host, node)
        except drift_run.DriftError as error:
            return {"state": "not_checked", "node": node, "cause": "%s: %s" % (source, " ".join(str(error).split())[:500]),
                    "fix": "name the node's inventory host with --host HOST, or check the inventory (gpuharden drift -i %s -l %s)" % (self.inventory, host)}
        except drift_check.Incomplete as error:
            return {"state": "not_checked", "node": node, "cause": "%s: %s" % (source, error.reason),
                    "fix": "run again (a longer --node-timeout if the node is slow)"}
        return node_audit_of(report, node, source)


@contextlib.contextmanager
def _environment(**values):
    """This process's environment with ``values`` set (None: left as it is) for the block, then as it was: the play and
    drift's own cluster check read K8S_AUTH_CONTEXT from it, and nothing after the trip should."""
    saved = {name: os.environ.get(name) for name, value in values.items() if value is not None}
    os.environ.update({name: value for name, value in values.items() if value is not None})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


NO_TRIP = {"state": "not_checked", "cause": "no inventory given: gpuharden explain reads the node only through one drift check of it",
           "fix": "run again with -i INVENTORY (the inventory gpuharden drift uses; --host HOST where the node's inventory host has another name)"}


class Facts:
    """The evidence of one explanation, read the first time a rule needs it (EVIDENCE's names), then kept."""

    def __init__(self, reader, **given):
        self.__dict__["_reader"], self.__dict__["_have"] = reader, dict(given)

    def need(self, name):
        if name not in self._have:
            self._have[name] = getattr(self, "_read_" + name)()
        return self._have[name]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.need(name)

    def _bound_node(self):
        if "node_name" in self._have:
            return self._have["node_name"]
        return ((self._have.get("pod") or {}).get("spec") or {}).get("nodeName")

    def _read_nodes(self):
        return self._reader.nodes()

    def _read_node(self):
        name = self._bound_node()
        node = self._reader.node(name)
        if node is None:
            raise UsageError("node %s: no such node" % name)
        return node

    def _read_plugin_pods(self):
        return self._reader.plugin_pods(self._bound_node())

    def _read_node_audit(self):
        """One drift check of the pod's node (the only trip to a node an explanation makes), or why there is none."""
        node = self._bound_node()
        trip = self._reader.trip
        if trip is None:
            return dict(NO_TRIP, node=node)
        return trip.audit(node)

    def _read_events(self):
        """The pod's events; where they cannot be read (an identity without `list events`), none, and the read is
        named in not_checked: the scheduler's last word is in the pod's PodScheduled condition too."""
        meta = self._have["pod"].get("metadata") or {}
        try:
            return self._reader.events(meta.get("namespace"), meta.get("name"))
        except self._reader.lib.errors.GpuhardenError as error:
            access = error.result.get("access") or {}
            self._have.setdefault("unread", []).append({"what": "the events of pod %s/%s" % (meta.get("namespace"), meta.get("name")),
                                                        "cause": error.msg, "fix": access.get("fix") or "run again"})
            return []

    def have_trip(self):
        """Whether the node side can be read: a trip to make, or a node audit given (from a drift report)."""
        return "node_audit" in self._have or self._reader.trip is not None

    def unread(self):
        """What could not be read but was not needed for the verdict: {what, cause, fix} each."""
        return list(self._have.get("unread") or [])


def _stage(lib, finding_id):
    """The harden stage (tag) that fixes the finding, or None where none does (the catalogue's remediable: never)."""
    if not finding_id or lib.findings.CATALOGUE[finding_id][2] == lib.findings.NEVER:
        return None
    return lib.findings.stage_of(finding_id)


def _verdict(lib, rule, values, evidence):
    values = dict(values)
    finding_id = values.pop("_finding", rule.finding_id)
    return {"state": "cause",
            "verdict": {"cause": rule.id, "finding_id": finding_id, "stage": _stage(lib, finding_id),
                        "summary": rule.verdict % values},
            "evidence": evidence, "fix": [line % values for line in rule.fix], "not_checked": []}


def apply_rules(lib, rules, facts):
    """The first rule of ``rules`` that fires, as a document part, or None; each rule's evidence read as it needs it.
    A rule with ``needs_node_trip`` needs the evidence "node_audit", which Facts reads once, the first time such a
    rule is weighed (NodeTrip.audit); the cluster-side rules, weighed before, decide without it."""
    for rule in rules:
        for name in rule.needs:
            facts.need(name)
        matched = rule.predicate(facts)
        if matched:
            return _verdict(lib, rule, *matched)
    return None


def _container_evidence(rules, pod):
    evidence = []
    status = pod.get("status") or {}
    for entry in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = entry.get("state") or {}
        last = (entry.get("lastState") or {}).get("terminated") or {}
        waiting = state.get("waiting") or {}
        evidence.append(rules.item("container %s" % entry.get("name"), "pod %s status.containerStatuses[%s]" % (rules.pod_ref(pod), entry.get("name")),
                                   {"ready": bool(entry.get("ready")), "state": next(iter(state), None), "reason": waiting.get("reason"),
                                    "restarts": int(entry.get("restartCount") or 0), "last_termination": last.get("message") or last.get("reason")}))
    return evidence


def healthy(pod):
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return True
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def explain_pod(lib, facts, with_events=True):
    """One pod's document (no schema/target/api_requests yet).  The cluster-side rules first (a GPU pod that is not
    Running and Ready); then, for a pod bound to a node, the node-side rules over one drift check of that node (the
    trip is made only here, so that a cause the cluster shows costs no trip); a pod Running and Ready is weighed by the
    node-side rules too, for what it can open that it was not given."""
    rules, pod = lib.rules, facts.pod
    ref = rules.pod_ref(pod)
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    gpu_pod = rules.is_gpu_pod(pod)
    if healthy(pod):
        phase = "Succeeded" if status.get("phase") == "Succeeded" else "Running and Ready"
        evidence = [rules.item("pod phase", "pod %s status.phase, status.conditions[Ready]" % ref, status.get("phase"))]
        if not node or status.get("phase") == "Succeeded":
            return _healthy("%s is %s: no failure to explain" % (ref, phase), evidence)
        found = apply_rules(lib, rules.NODE_SIDE_POD_RULES, facts)
        if found:
            return found
        audit = facts.node_audit
        if audit["state"] != "checked":
            return _undecided(ref, evidence, [_node_missing(node, audit)],
                              summary="%s is %s, but what its containers can open on %s was not checked: %s" % (ref, phase, node, audit["cause"]))
        unread = rules.allocation_unread(facts) if rules.requested(pod) else None
        if unread:
            return _undecided(ref, evidence + [_audit_item(rules, audit)], [_allocation_missing(ref, node, unread)],
                              summary="%s is %s, but whether its containers can open only the GPUs allocated to them was not checked on "
                                      "%s: %s" % (ref, phase, node, unread))
        return _healthy("%s is %s, and the audit of node %s finds nothing against it" % (ref, phase, node),
                        evidence + [_audit_item(rules, audit)])
    if gpu_pod:
        found = apply_rules(lib, rules.POD_RULES, facts)
        if found:
            return found
    evidence = [rules.requested_item(pod), rules.item("pod status", "pod %s status.phase/reason, status.conditions[PodScheduled]" % ref,
                                                       {"phase": status.get("phase"), "reason": status.get("reason"),
                                                        "scheduler": (rules.scheduled_condition(pod) or {}).get("message")})]
    evidence += _container_evidence(rules, pod)
    if with_events:
        warnings = [event for event in facts.events if event.get("type") == "Warning"]
        if warnings:
            evidence.append(rules.item("warning events", "events of pod %s (involvedObject)" % ref,
                                       ["%s: %s" % (event.get("reason"), (event.get("message") or "").strip()[:200]) for event in warnings[-5:]]))
    if node:
        found = apply_rules(lib, rules.NODE_SIDE_POD_RULES, facts)
        if found:
            return found
        audit = facts.node_audit
        if audit["state"] != "checked":
            return _undecided(ref, evidence, [_node_missing(node, audit)])
        return _undecided(ref, evidence + [_audit_item(rules, audit)], summary="could not decide why %s fails: neither the cluster nor "
                          "the audit of node %s shows a cause" % (ref, node), missing=[{
            "what": "a cause of %s's failure" % ref,
            "cause": "neither the cluster (the pod, the Nodes, the device plugin) nor the audit of node %s shows one" % node,
            "fix": "read the containers' state and the events above (kubectl describe pod -n %s %s; kubectl logs)" % tuple(ref.split("/", 1))}])
    if not gpu_pod:
        return _undecided(ref, [rules.item("GPU resources requested", "pod %s spec.containers[].resources, spec.runtimeClassName" % ref, {})],
                          [{"what": "why %s fails" % ref, "cause": "the pod requests no GPU, runs no nvidia RuntimeClass and is on no node yet: "
                            "explain judges GPU pods, and what a bound pod can open on its node",
                            "fix": "kubectl describe pod -n %s %s" % tuple(ref.split("/", 1))}])
    return _undecided(ref, evidence, [{"what": "why the scheduler leaves %s Pending" % ref,
                                       "cause": "no GPU cause found in the pod, the Nodes and the device plugin",
                                       "fix": "read the scheduler's message above (kubectl describe pod -n %s %s)" % tuple(ref.split("/", 1))}])


def _healthy(summary, evidence):
    return {"state": "healthy", "verdict": {"cause": None, "finding_id": None, "stage": None, "summary": summary},
            "evidence": evidence, "fix": [], "not_checked": []}


def _allocation_missing(ref, node, cause):
    return {"what": "whether %s's containers can open only the GPUs the kubelet allocated to them" % ref, "cause": cause,
            "fix": "let node %s's audit read the kubelet's pod-resources API (/var/lib/kubelet/pod-resources/kubelet.sock, which "
                   "the kubelet serves), or give it the allocation (postcheck_audit_allocations), then run again" % node}


def _node_missing(node, audit):
    return {"what": "node-side causes on %s (the containers' device access, GPU health through NVML, kubelet checkpoints, device "
                    "permissions)" % node, "cause": audit["cause"], "fix": audit["fix"]}


def _audit_item(rules, audit):
    findings = audit["findings"]
    return rules.item("audit of node %s" % audit["node"], audit.get("source") or "gpuharden drift",
                      {"findings": sorted({"%s (%s)" % (entry.get("id"), entry.get("severity")) for entry in findings}) or "none",
                       "not_checked": [entry.get("what") for entry in audit.get("not_checked") or []] or "none"})


def _undecided(ref, evidence, missing, summary=None):
    summary = summary or "could not decide why %s fails: %s not checked" % (ref, missing[0]["what"])
    return {"state": "undecided", "verdict": {"cause": None, "finding_id": None, "stage": None, "summary": summary},
            "evidence": evidence, "fix": [], "not_checked": missing}


def explain_node(lib, facts):
    rules, node = lib.rules, facts.node
    name = rules.node_name(node)
    found = apply_rules(lib, rules.NODE_RULES, facts)
    if found:
        return found
    if facts.have_trip():
        found = apply_rules(lib, rules.NODE_SIDE_NODE_RULES, facts)
        if found:
            return found
    have = rules.advertised([node])
    evidence = [rules.item("GPU resources advertised", "node %s status.allocatable" % name, have)]
    evidence += [rules.item("device plugin pod", "pod %s status" % rules.pod_ref(pod), "Ready") for pod in rules.plugin_pods_on(facts, name)]
    gpu_node = rules._consistency.is_gpu_node(node, "nvidia.com/gpu.present")
    if gpu_node and not any(have.values()):
        return _undecided("node %s" % name, evidence, [{
            "what": "why the device plugin on %s advertises no GPU" % name,
            "cause": "its plugin pod is Ready, so the cause is on the node (NVML, the MIG layout, the plugin's registration)",
            "fix": "gpuharden drift -i INVENTORY -l %s" % name}])
    summary = ("node %s serves its GPUs: schedulable, device plugin Ready, advertises %s" % (name, ", ".join("%s=%d" % i for i in sorted(have.items())))
               if gpu_node else "node %s is schedulable and has no GPU to serve" % name)
    if facts.have_trip():
        audit = facts.node_audit
        if audit["state"] != "checked":
            return _undecided("node %s" % name, evidence, [_node_missing(name, audit)],
                              summary="%s; its own audit was not checked: %s" % (summary, audit["cause"]))
        evidence.append(_audit_item(rules, audit))
        summary += ", and its audit finds nothing above info"
    return _healthy(summary, evidence)


def flagged_pods(audits):
    """{(namespace, name) or uid: True} of the pods the node audits name in a finding about one pod (POD_FINDINGS)."""
    flagged = set()
    for audit in audits.values():
        for entry in audit.get("findings") or [] if audit.get("state") == "checked" else []:
            if entry.get("id") not in POD_FINDINGS:
                continue
            about = entry.get("pod")
            if isinstance(about, dict):
                flagged.add(str(about.get("uid") or "").lower() or (about.get("namespace"), about.get("name")))
            elif isinstance(about, str) and about:
                flagged.add(about.lower())
    return flagged


def explain_failing(lib, reader, audits=None, audit_source=None, nodes_only=None):
    """Every failing GPU pod with its verdict: one LIST of pods, one of Nodes (the plugin pods come from the pod LIST).
    With ``audits`` ({node: node_audit evidence}, from one drift run over the inventory or from a drift report), the
    pods those audits flag (a finding about one pod: it can open a GPU it was not given, or lost the one it was) too,
    and the node-side rules weigh each bound pod with its node's audit; without, no node is read (one trip per pod
    would not scale), and a bound pod no cluster-side rule explains is undecided, with the run that reads its node."""
    rules = lib.rules
    pods = reader.list("Pod", field_selector="status.phase!=Succeeded")
    nodes = reader.nodes()
    plugin_pods = [pod for pod in pods if rules._device_plugin.plugin_container(pod.get("spec") or {})]
    flagged = flagged_pods(audits or {})
    documents = []
    by_name = {rules.node_name(node): node for node in nodes}
    unread = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        named = rules.pod_uid(pod) in flagged or (meta.get("namespace"), meta.get("name")) in flagged
        plugin = any(pod is entry for entry in plugin_pods)
        bound = (pod.get("spec") or {}).get("nodeName")
        if nodes_only is not None and bound and bound not in nodes_only:
            continue
        if audits is None:
            audit = dict(NO_TRIP, node=bound)
        else:
            audit = audits.get(bound) or {"state": "not_checked", "node": bound, "cause": "%s did not audit node %s" % (audit_source, bound),
                                          "fix": "include the node in the run (-l)"}
        if healthy(pod) and not named:
            if bound and audit["state"] == "checked" and rules.requested(pod):
                why = rules.allocation_unread(Facts(reader, pod=pod, node_audit=audit))
                if why:
                    unread.setdefault((bound, why), []).append(rules.pod_ref(pod))
            continue
        if not named and not plugin and not rules.is_gpu_pod(pod):
            continue
        node, document = by_name.get(bound), None
        if node is not None and plugin and not named:
            # a device plugin pod: what fails is its node's GPUs, as explain node says; a node whose kubelet, NVML or
            # device nodes stop it first (only its audit shows that)
            facts = Facts(reader, node=node, plugin_pods=plugin_pods, pod=pod, node_audit=audit)
            document = apply_rules(lib, [rule for rule in rules.NODE_SIDE_POD_RULES if rule.id in rules.PLUGIN_NODE_SIDE_CAUSES], facts) \
                or apply_rules(lib, rules.NODE_RULES, facts)
        if document is None:
            # no per-pod events: the PodScheduled condition carries the scheduler's last word
            document = explain_pod(lib, Facts(reader, pod=pod, nodes=nodes, plugin_pods=plugin_pods, events=[], node_audit=audit),
                                   with_events=False)
            if named and healthy(pod) and document["state"] != "cause":
                # a finding about the pod that names no trouble (the GPUs it was given): not a failing pod
                why = rules.allocation_unread(Facts(reader, pod=pod, node_audit=audit)) if rules.requested(pod) else None
                if why:
                    unread.setdefault((bound, why), []).append(rules.pod_ref(pod))
                continue
        document["target"] = {"kind": "pod", "name": rules.pod_ref(pod), "node": bound}
        documents.append(document)
    states = {document["state"] for document in documents}
    state = "undecided" if "undecided" in states else ("cause" if "cause" in states else "healthy")
    not_checked = [{"what": "whether the GPU pods Running on %s (%s) can open only the GPUs allocated to them" % (node, ", ".join(sorted(refs)[:5])
                                                                                                               + (", ..." if len(refs) > 5 else "")),
                    "cause": why, "fix": _allocation_missing("", node, why)["fix"]} for (node, why), refs in sorted(unread.items())]
    return {"state": "undecided" if not_checked and state == "healthy" else state, "pods": documents, "not_checked": not_checked}


def for_drift_report(report, extra_vars):
    """The explanations a drift report carries (``explanations``): explain --failing over the report's own node
    audits, with no trip, limited to the pods bound to the run's nodes and those not bound yet: one LIST of pods and
    one of Nodes, with the run's cluster identity (-e gpuharden_kubeconfig, else the environment's).  Never raises: a
    cluster that cannot be read, or a collection that cannot be imported, is the document's not_checked."""
    args = argparse.Namespace(kubeconfig=None, context=None, extra_vars=[json.dumps(extra_vars)], request_timeout=30.0)
    target = {"kind": "failing"}
    try:
        lib = load_collection()
        params = auth_params(args)
        names = set((report.get("node_names") or {}).values()) | {entry.get("node", host) for host, entry in (report.get("nodes") or {}).items()}
        reader = Reader(lib, lib.k8s.api_client(params))
        document = explain_failing(lib, reader, audits_of_report(report, "this drift run"), "this drift run", nodes_only=names)
        count, retries = reader.count, reader.retries
    except (UsageError, drift_run.DriftError) as error:
        document, count, retries = _cannot(str(error)), 0, 0
    except Exception as error:  # noqa: BLE001 (the report is written either way; why the explanations are missing is in it)
        message = getattr(error, "msg", None) or str(error)
        access = ((getattr(error, "result", None) or {}).get("access") or {})
        document, count, retries = _cannot(" ".join(str(message).split())[:500], access.get("fix")), 0, 0
    return dict(document, schema=SCHEMA, target=target, api_requests=count, api_retries=retries)


def _cannot(cause, fix=None):
    return {"state": "undecided", "pods": [], "not_checked": [{
        "what": "the failing GPU pods' explanations", "cause": cause,
        "fix": fix or "gpuharden explain --failing --from-report REPORT.json (the report's node audits, read again from the cluster)"}]}


def audits_of_report(report, source):
    """{node: node_audit evidence} of every node a drift report audited (or could not)."""
    names = dict(report.get("node_names") or {})
    names.update({host: entry.get("node", host) for host, entry in (report.get("nodes") or {}).items()})
    return {node: node_audit_of(report, node, source) for node in set(names.values())}


def blind(error, target):
    """The document of a run that could not read the cluster: the cause and the fix first."""
    access = (getattr(error, "result", None) or {}).get("access") or {}
    fix = access.get("fix") or "check the cluster's access (kubectl --kubeconfig FILE auth can-i get pods -A) and run again"
    return {"state": "undecided", "verdict": {"cause": None, "finding_id": None, "stage": None,
                                              "summary": "could not check %s: %s" % (target, error.msg)},
            "evidence": [], "fix": [], "not_checked": [{"what": "the cluster (API server)", "cause": error.msg, "fix": fix}]}


EXIT_BY_STATE = {"healthy": EXIT_HEALTHY, "cause": EXIT_CAUSE, "undecided": EXIT_UNDECIDED}


def parse_target(args):
    if args.failing:
        if args.kind:
            raise UsageError("--failing takes no pod or node")
        return {"kind": "failing"}
    if args.kind not in ("pod", "node") or not args.name:
        raise UsageError("give pod NAMESPACE/NAME, node NAME or --failing")
    if args.kind == "pod":
        namespace, sep, name = args.name.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise UsageError("pod %r: give NAMESPACE/NAME" % args.name)
        return {"kind": "pod", "name": args.name, "namespace": namespace, "pod": name}
    if "/" in args.name:
        raise UsageError("node %r: a node name has no namespace" % args.name)
    return {"kind": "node", "name": args.name}


def explain(lib, target, params, trip=None, report=None, report_source=None):
    """The document for ``target`` (parse_target's), with schema, the count of API requests and of node trips.
    ``trip``: a NodeTrip (the node side is read with one drift check); ``report``: a drift report the node side is
    read from instead (no trip)."""
    trips = {"node_trips": 0, "node_seconds": 0.0}
    try:
        reader = Reader(lib, lib.k8s.api_client(params), trip=None if report is not None else trip)
    except lib.errors.GpuhardenError as error:
        return dict(blind(error, target.get("name") or "the failing GPU pods"), schema=SCHEMA, target=_public(target), api_requests=0, api_retries=0, **trips)
    given = {}
    if report is not None:
        audits = audits_of_report(report, report_source or "the drift report")
    try:
        if target["kind"] == "failing":
            if report is None and trip is not None:
                report_source = "gpuharden drift -i %s%s" % (trip.inventory, " -l %s" % trip.host if trip.host else "")
                try:
                    report = trip.run(trip.host)
                    audits = audits_of_report(report, report_source)
                except (drift_run.DriftError, drift_check.Incomplete) as error:
                    audits = {}
                    given["not_checked"] = [{"what": "the nodes (their audits)", "cause": "%s: %s" % (report_source, getattr(error, "reason", None) or
                                                                                                     " ".join(str(error).split())[:500]),
                                             "fix": "run gpuharden drift -i %s and read its errors" % trip.inventory}]
            document = explain_failing(lib, reader, audits if report is not None else None, report_source)
            document["not_checked"] = given.get("not_checked", []) + document["not_checked"]
        elif target["kind"] == "node":
            if report is not None:
                given["node_audit"] = audits.get(target["name"]) or node_audit_of(report, target["name"], report_source)
            document = explain_node(lib, Facts(reader, node_name=target["name"], **given))
        else:
            pod = reader.pod(target["namespace"], target["pod"])
            if pod is None:
                raise UsageError("pod %s: no such pod" % target["name"])
            bound = (pod.get("spec") or {}).get("nodeName")
            if report is not None and bound:
                given["node_audit"] = node_audit_of(report, bound, report_source)
            facts = Facts(reader, pod=pod, **given)
            document = explain_pod(lib, facts)
            document["not_checked"] = document["not_checked"] + facts.unread()
    except lib.errors.GpuhardenError as error:
        document = blind(error, target.get("name") or "the failing GPU pods")
    if trip is not None:
        trips = {"node_trips": trip.trips, "node_seconds": round(trip.seconds, 3)}
    return dict(document, schema=SCHEMA, target=_public(target), api_requests=reader.count, api_retries=reader.retries, **trips)


def _public(target):
    return {key: target[key] for key in ("kind", "name") if key in target}


def _value_text(value):
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def text(document):
    """The document for people: the verdict first, then the evidence (with where), the fix, what was not checked."""
    if document["target"]["kind"] == "failing" and "pods" in document:
        parts = ["%d failing GPU pod(s)" % len(document["pods"]) if document["pods"] else "no failing GPU pod"]
        for entry in document.get("not_checked") or []:
            parts.append("  not checked: %s: %s" % (entry["what"], entry["cause"]))
            parts.append("    fix: %s" % entry["fix"])
        for pod in document["pods"]:
            parts.append("")
            parts.append(text(pod).rstrip("\n"))
        return "\n".join(parts) + "\n"
    name = document["target"].get("name") or "the failing GPU pods"
    summary = document["verdict"]["summary"]
    lines = [summary if summary.startswith(("could not", "node ", name)) else "%s: %s" % (name, summary)]
    for entry in document["not_checked"]:
        lines.append("  not checked: %s: %s" % (entry["what"], entry["cause"]))
        lines.append("    fix: %s" % entry["fix"])
    if document["evidence"]:
        lines.append("  evidence:")
        lines.extend("    %s: %s   [%s]" % (e["what"], _value_text(e["value"]), e["where"]) for e in document["evidence"])
    if document["fix"]:
        lines.append("  fix:")
        lines.extend("    %s" % line for line in document["fix"])
    if document["verdict"].get("finding_id"):
        stage = document["verdict"].get("stage")
        lines.append("  finding: %s (%s)" % (document["verdict"]["finding_id"], "harden stage %s" % stage if stage else "no harden stage fixes it"))
    return "\n".join(lines) + "\n"


def add_parser(commands):
    parser = commands.add_parser("explain", help="why a GPU pod fails, or a node does not serve its GPUs: the cause, the evidence, the fix",
                                 description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", nargs="?", choices=("pod", "node"), help="what to explain")
    parser.add_argument("name", nargs="?", help="NAMESPACE/NAME of the pod, or the node's NAME")
    parser.add_argument("--failing", action="store_true", help="every GPU pod of the cluster that is not Running and Ready, each with its cause")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="KEY=VALUE, JSON or @FILE as for gpuharden drift: gpuharden_kubeconfig, and the inventory's variables for the "
                        "node's drift check (repeatable)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="the kubeconfig to read the cluster with (default: gpuharden_kubeconfig, "
                        "K8S_AUTH_KUBECONFIG, in-cluster, then the default kubeconfig)")
    parser.add_argument("--context", metavar="NAME", help="the kubeconfig context")
    parser.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS", help="per API request (default 30)")
    parser.add_argument("-i", "--inventory", metavar="INVENTORY", help="read the pod's node too: one drift check of that node (its "
                        "node_audit run) with this inventory; with --failing, one drift run over the inventory")
    parser.add_argument("--host", metavar="HOST", help="the node's inventory host, where it is not named as the node (with --failing: "
                        "a -l pattern of the drift run)")
    parser.add_argument("--node-timeout", type=float, default=NODE_TIMEOUT, metavar="SECONDS",
                        help="for the drift check of the node (default %d)" % NODE_TIMEOUT)
    parser.add_argument("--from-report", metavar="REPORT.json", help="read the nodes from this gpuharden drift --report instead of "
                        "running a drift check (no trip to any node)")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON (schema 1, see gpuharden/explain.py)")
    parser.set_defaults(handler=main)
    return parser


def node_side(args):
    """(NodeTrip or None, drift report or None) from -i/--host/--node-timeout/--from-report."""
    if args.inventory and args.from_report:
        raise UsageError("give -i INVENTORY (read the node now) or --from-report REPORT.json (read it from a drift report), not both")
    if args.node_timeout <= 0:
        raise UsageError("--node-timeout must be a positive number of seconds")
    if args.from_report:
        report = drift_slices.read_report(args.from_report)
        if not isinstance(report, dict) or not isinstance(report.get("nodes"), dict):
            raise UsageError("%s is not a gpuharden drift report (no nodes)" % args.from_report)
        return None, report
    if args.inventory:
        if not os.path.exists(args.inventory):
            raise UsageError("inventory %s does not exist" % args.inventory)
        return NodeTrip(args.inventory, args.extra_vars, args.host, args.node_timeout, auth=auth_params(args)), None
    if args.host:
        raise UsageError("--host names the node's inventory host: give -i INVENTORY too")
    return None, None


def main(args, out=None):
    out = out or sys.stdout
    try:
        target = parse_target(args)
        if args.request_timeout <= 0:
            raise UsageError("--request-timeout must be a positive number of seconds")
        params = auth_params(args)
        trip, report = node_side(args)
        lib = load_collection()
        document = explain(lib, target, params, trip=trip, report=report, report_source=args.from_report and "drift report %s" % args.from_report)
    except (UsageError, drift_run.DriftError, drift_slices.MergeError) as error:
        print("gpuharden explain: %s" % error, file=sys.stderr)
        return EXIT_USAGE
    out.write(json.dumps(document, indent=2, sort_keys=True) + "\n" if args.json else text(document))
    return EXIT_BY_STATE[document["state"]]
