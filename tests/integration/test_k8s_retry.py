# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 4 on the lab's real API server (kube-apiserver v1.36.3) under throttling: API Priority and Fairness
puts the tool's ServiceAccount into a priority level of its own with about three seats that rejects what does not fit
(flowcontrol.apiserver.k8s.io/v1: a FlowSchema matching the ServiceAccount, a Limited PriorityLevelConfiguration with
nominalConcurrencyShares 1, nothing lent or borrowed, limitResponse Reject).  A burst of concurrent LISTs through the
collection's path (_k8s_access.list_all) then gets the server's own 429s without retries, and succeeds whole with the
retry policy (_k8s.RetryPolicy), which counts its retries.

Then the collection's modules, each run as Ansible runs it (its own Python process), several at once through the same
throttled priority level: every one succeeds, and their results' ``api_retries`` tell the retries they needed.

The test reads only the API server: one stand-in node is the smallest lab manager.up brings the control plane up with."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access

from tests.labfixtures import running_lab
from tests.unit import conftest

pytestmark = pytest.mark.lab

BURST = 32  # concurrent LISTs per burst
# A loaded machine may start one burst's LISTs one after another and never fill the level: a burst is made again, at
# most this many times, until the level was full (bounded: at most 3 x 32 unretried LISTs, then 2 x 32 and one burst
# of at most 5 attempts each with the policy, 320 requests)
BURSTS = 3
LEVEL = "gpuharden-retry-test"
# k8s.io/api v0.36.3 flowcontrol/v1/types.go: the headers the APF filter sets on every request it classified
# (k8s.io/apiserver v0.36.3 pkg/server/filters/priority-and-fairness.go setResponseHeaders), rejected ones included.
FLOW_SCHEMA_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
APF_REJECTION_TEXT = "Too many requests, please try again later."


@pytest.fixture(scope="module")
def lab():
    with running_lab("fresh-fleet", node_count=1, stand_ins=True) as state:
        yield state


@pytest.fixture(scope="module")
def throttled(lab):
    """The UID of the FlowSchema that puts the tool's identity into its tiny priority level."""
    admin = client(lab["cluster"]["admin_kubeconfig"])
    try:
        return throttle_the_tool(admin, lab["cluster"]["tool_identity"])
    finally:
        admin.close()


def client(kubeconfig, policy=None):
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    params.update(kubeconfig=kubeconfig, request_timeout=30)
    api = _k8s.api_client(params)
    if policy is not None:
        api.gpuharden_retry = policy
    return api


def throttle_the_tool(admin, identity):
    """The FlowSchema and its priority level; returns the FlowSchema's UID."""
    namespace, name = identity.split(":")[2:]
    create = _k8s.endpoint(admin, "POST", "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations")
    create({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration", "metadata": {"name": LEVEL},
            "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
                                                    "limitResponse": {"type": "Reject"}}}})
    create = _k8s.endpoint(admin, "POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")
    answer = create({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": LEVEL},
                     "spec": {"priorityLevelConfiguration": {"name": LEVEL}, "matchingPrecedence": 500,
                              "distinguisherMethod": {"type": "ByUser"},
                              "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": name}}],
                                         "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                                                            "namespaces": ["*"]}],
                                         "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})
    return json.loads(answer.data)["metadata"]["uid"]


def wait_classified(api, uid, timeout=60):
    """Until the API server's flow control puts the tool's requests into the FlowSchema (its controller syncs it)."""
    deadline = time.monotonic() + timeout
    while True:
        headers = _k8s.request(api, "GET", "/api/v1/nodes", limit=1).headers
        if headers.get(FLOW_SCHEMA_HEADER) == uid:
            return
        assert time.monotonic() < deadline, "the API server never classified the tool's requests into %s: %s" % (LEVEL, dict(headers))
        time.sleep(0.5)


def burst(api):
    """BURST concurrent LISTs of Nodes through _k8s_access.list_all, started together: per LIST, None when it succeeded,
    else the GpuhardenError it raised; and the 429 answers seen (ApiException, headers included)."""
    list_nodes = _k8s.endpoint(api, "GET", "/api/v1/nodes")
    throttled = []

    def recorded(*args, **kwargs):
        try:
            return list_nodes(*args, **kwargs)
        except _k8s.ApiException as error:
            if error.status == 429:
                throttled.append(error)
            raise

    start = threading.Barrier(BURST)
    outcomes = [None] * BURST

    def one(index):
        start.wait()
        try:
            items, _pages = _k8s_access.list_all("test", api, recorded, _k8s_access.Target("list", "nodes"))
            assert items
        except GpuhardenError as error:
            outcomes[index] = error

    threads = [threading.Thread(target=one, args=(index,)) for index in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return outcomes, throttled


def test_a_throttled_burst_fails_without_retries_and_succeeds_with_them(lab, throttled):
    uid = throttled
    once = client(lab["cluster"]["tool_kubeconfig"], _k8s.RetryPolicy(attempts=1))
    try:
        wait_classified(once, uid)
        for _burst in range(BURSTS):
            failures, throttled = burst(once)
            if any(error is not None for error in failures):
                break
    finally:
        once.close()
    failed = [error for error in failures if error is not None]
    print("without retries: %d of %d LISTs throttled" % (len(failed), BURST))
    assert failed, "no LIST of the burst was throttled: the priority level admits %d concurrent LISTs" % BURST
    # every failure is the API server's flow control rejecting the request: 429, from the FlowSchema, with Retry-After
    assert {error.result.get("status") for error in failed} == {429}, [str(error) for error in failed]
    assert all("API server answered 429 Too Many Requests" in str(error) for error in failed)
    assert len(throttled) == len(failed) and _k8s.retries_made(once) == 0
    assert all(error.headers.get(FLOW_SCHEMA_HEADER) == uid for error in throttled)
    assert all(int(error.headers["Retry-After"]) >= 1 and APF_REJECTION_TEXT in error.body for error in throttled)

    retrying = client(lab["cluster"]["tool_kubeconfig"])
    try:
        for _burst in range(BURSTS):
            failures, unanswered = burst(retrying)
            retries = _k8s.retries_made(retrying)
            print("with the retry policy: %d of %d LISTs failed, %d retries" % (sum(error is not None for error in failures), BURST, retries))
            # the policy retries inside the request: no LIST fails, and no 429 reaches the caller
            assert [str(error) for error in failures if error is not None] == [] and unanswered == []
            if retries:
                break
    finally:
        retrying.close()
    assert retries > 0, "no request of %d bursts met a full priority level" % BURSTS


def test_modules_under_throttling_succeed_and_report_their_retries(lab, throttled, monkeypatch):
    """Module runs, each its own process as under ansible-playbook, while the test keeps the tool's priority level full
    with bursts of concurrent LISTs (not retried: they only take the seats): the modules' requests meet the server's
    429s, each module still succeeds, and its result's ``api_retries`` counts the requests it sent again."""
    monkeypatch.setattr(conftest, "MODULE_RUN_TIMEOUT", 480)  # a loaded lab machine: the imports alone take long
    auth = {"kubeconfig": lab["cluster"]["tool_kubeconfig"], "request_timeout": 60}
    saturating = client(lab["cluster"]["tool_kubeconfig"], _k8s.RetryPolicy(attempts=1))
    try:
        wait_classified(saturating, throttled)
        node = _k8s_access.list_kind("test", saturating, "Node")[0][0]["metadata"]["name"]
        runs = [
            ("gpu_workloads_info", {}),  # seven LISTs, one per kind
            ("gpu_pods_info", {"nodes": [node]}),
            ("disruption_budget", {"fleet": [node], "batch": [node], "settle_seconds": 0}),
            ("runtime_class", {"_ansible_check_mode": True}),  # reads and a server-side dry run: nothing is written
        ]
        done, bursts, rejected = threading.Event(), [0], [0]

        def saturate():
            while not done.is_set():
                rejected[0] += len(burst(saturating)[1])
                bursts[0] += 1

        saturator = threading.Thread(target=saturate, daemon=True)
        saturator.start()
        try:
            with ThreadPoolExecutor(len(runs)) as pool:
                # a round on a loaded machine may fall between the full moments of the level: run them again (at most
                # BURSTS rounds) until one of their requests met it, or one failed
                for _round in range(BURSTS):
                    results = list(pool.map(lambda run: conftest.run_module(run[0], dict(run[1], **auth), {}), runs))
                    if any(result.get("api_retries") or result.get("failed") for result in results):
                        break
        finally:
            done.set()
            saturator.join(300)
    finally:
        saturating.close()
    summary = [(name, result.get("failed", False), result.get("api_retries"), result.get("api_requests"))
               for (name, _args), result in zip(runs, results, strict=True)]
    print("%d saturating bursts, %d of their LISTs rejected; module runs (module, failed, api_retries, api_requests): %s"
          % (bursts[0], rejected[0], summary))
    assert [name for name, failed, _retries, _requests in summary if failed] == [], results
    assert all(isinstance(retries, int) and retries >= 0 for _name, _failed, retries, _requests in summary), summary
    # the premise, as in the burst test: this machine filled the priority level (a starved client cannot)
    assert rejected[0] > 0, "the saturating bursts were never throttled: the priority level was not full while the modules ran"
    # the level was full while they ran: some of their requests were throttled, and retried
    assert sum(retries for _name, _failed, retries, _requests in summary) > 0, summary
