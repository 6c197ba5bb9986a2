# SPDX-License-Identifier: GPL-3.0-or-later
"""grpc-go is the judge of the stdlib-only pod-resources client (plugins/module_utils/node/_podresources.py).

lab/realcomponents/podresources-server registers the REAL generated ``v1.PodResourcesLister`` service of k8s.io/kubelet
(the control plane's version) on a unix socket, with canned answers from JSON; the client's answers must equal the
JSON, through grpc-go's own HTTP/2 framing, HPACK encoder (Huffman, dynamic table) and flow control.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _podresources as pr

from tests.builds import skip_unbuilt
from tests.unit.conftest import run_module, world_tmp  # noqa: F401 - fixture
from tests.unit.test_device_audit_podresources import SOCKET, _pods, _uuid, named_node  # noqa: F401 - fixture
from tests.unit.test_device_cgroup_audit import UID_B, _by_id, v1_node  # noqa: F401 - fixture

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
BUILD = "lab/realcomponents/build-podresources-server.sh"


def server_binary() -> Path:
    k8s = re.search(r"^K8S_VERSION=v1\.(\d+)\.(\d+)", (REPO / "lab/controlplane/build.sh").read_text(), re.M)
    cache = Path(os.environ.get("GPUHARDEN_CACHE", Path.home() / ".cache" / "gpuharden"))
    path = cache / "realcomponents" / ("podresources-server-v0.%s.%s" % k8s.groups()) / "podresources-server"
    if not os.access(path, os.X_OK):
        skip_unbuilt("%s not built: run `%s`" % (path, BUILD))
    return path


@pytest.fixture
def serve(tmp_path):
    """serve(list=..., allocatable=...) -> socket path; a method given None answers Unimplemented."""
    binary = server_binary()
    started = []

    def start(list=None, allocatable=None, sock=None):  # noqa: A002 - the RPC's name
        sock = sock or tmp_path / ("kubelet-%d.sock" % len(started))
        argv = [str(binary), "-socket", str(sock)]
        for flag, data in (("-list", list), ("-allocatable", allocatable)):
            if data is not None:
                path = tmp_path / ("%s-%d.json" % (flag[1:], len(started)))
                path.write_text(json.dumps(data))
                argv += [flag, str(path)]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(process)
        start.processes[str(sock)] = process
        ready, _w, _x = select.select([process.stdout], [], [], 20)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("ready "), "podresources-server did not start: %r %s" % (line, process.stderr.read() if process.poll() is not None else "")
        return str(sock)

    start.processes = {}
    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def expected_devices(devices):
    out = []
    for device in devices or []:
        topology = device.get("topology")
        out.append(
            {
                "resource_name": device.get("resource_name", ""),
                "device_ids": device.get("device_ids", []),
                "topology": None if topology is None else {"nodes": [{"ID": int(n.get("ID", 0))} for n in topology.get("nodes", [])]},
            }
        )
    return out


def expected_memory(memory):
    return [
        {
            "memory_type": m.get("memory_type", ""),
            "size": int(m.get("size", 0)),
            "topology": None if m.get("topology") is None else {"nodes": [{"ID": int(n.get("ID", 0))} for n in m["topology"].get("nodes", [])]},
        }
        for m in memory or []
    ]


def expected_list(data):
    """What the client returns for a protojson ListPodResourcesResponse (proto3 defaults filled in)."""
    return [
        {
            "name": pod.get("name", ""),
            "namespace": pod.get("namespace", ""),
            "containers": [
                {
                    "name": c.get("name", ""),
                    "devices": expected_devices(c.get("devices")),
                    "cpu_ids": [int(i) for i in c.get("cpu_ids", [])],
                    "memory": expected_memory(c.get("memory")),
                    "dynamic_resources": [
                        {
                            "claim_name": r.get("claim_name", ""),
                            "claim_namespace": r.get("claim_namespace", ""),
                            "claim_resources": [
                                {
                                    "cdi_devices": [{"name": d.get("name", "")} for d in cr.get("cdi_devices", [])],
                                    "driver_name": cr.get("driver_name", ""),
                                    "pool_name": cr.get("pool_name", ""),
                                    "device_name": cr.get("device_name", ""),
                                }
                                for cr in r.get("claim_resources", [])
                            ],
                        }
                        for r in c.get("dynamic_resources", [])
                    ],
                }
                for c in pod.get("containers", [])
            ],
        }
        for pod in data.get("pod_resources", [])
    ]


LIST = {
    "pod_resources": [
        {
            "name": "train-0",
            "namespace": "ml",
            "containers": [
                {
                    "name": "main",
                    "devices": [
                        {
                            "resource_name": "nvidia.com/gpu",
                            "device_ids": ["GPU-3b1c2f6e-0000-1111-2222-333344445555", "GPU-7d0e9a8b-6666-7777-8888-999900001111"],
                            "topology": {"nodes": [{"ID": 0}, {"ID": 1}]},
                        },
                        {"resource_name": "nvidia.com/mig-1g.10gb", "device_ids": ["MIG-5c6a6f8e-1111-2222-3333-444455556666"]},
                    ],
                    "cpu_ids": [2, 3, 66, 67],
                    "memory": [{"memory_type": "memory", "size": "17179869184", "topology": {"nodes": [{"ID": 0}]}}],
                    "dynamic_resources": [
                        {
                            "claim_name": "gpu",
                            "claim_namespace": "ml",
                            "claim_resources": [
                                {
                                    "driver_name": "gpu.nvidia.com",
                                    "pool_name": "node-1",
                                    "device_name": "gpu-1",
                                    "cdi_devices": [{"name": "k8s.gpu.nvidia.com/claim=abc"}],
                                }
                            ],
                        }
                    ],
                },
                {"name": "sidecar"},
            ],
        },
        {
            "name": "infer-1",
            "namespace": "serving",
            "containers": [{"name": "server", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-a1b2c3d4-aaaa-bbbb-cccc-ddddeeeeffff::3"]}]}],
        },
        {"name": "web-\u00e9t\u00e9", "namespace": "default", "containers": [{"name": "nginx"}]},
    ]
}
ALLOCATABLE = {
    "devices": [
        {"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-3b1c2f6e-0000-1111-2222-333344445555"], "topology": {"nodes": [{"ID": 0}]}},
        {"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-7d0e9a8b-6666-7777-8888-999900001111"], "topology": {"nodes": [{"ID": 1}]}},
    ],
    "cpu_ids": list(range(128)),
    "memory": [{"memory_type": "hugepages-1Gi", "size": "0"}],
}


def test_list_and_allocatable_equal_the_servers_data(serve):
    sock = serve(list=LIST, allocatable=ALLOCATABLE)
    assert pr.list_pod_resources(sock) == expected_list(LIST)
    assert pr.get_allocatable_resources(sock) == {
        "devices": expected_devices(ALLOCATABLE["devices"]),
        "cpu_ids": ALLOCATABLE["cpu_ids"],
        "memory": expected_memory(ALLOCATABLE["memory"]),
    }
    # One connection per call: a second round on the same server works the same.
    assert pr.list_pod_resources(sock) == expected_list(LIST)


def big_list(pods=500, devices=8):
    return {
        "pod_resources": [
            {
                "name": "job-%03d-worker" % i,
                "namespace": "team-%d" % (i % 17),
                "containers": [
                    {
                        "name": "cuda",
                        "devices": [
                            {
                                "resource_name": "nvidia.com/gpu",
                                "device_ids": ["GPU-%08x-%04x-4000-8000-%012x" % (i, d, i * devices + d) for d in range(devices)],
                                "topology": {"nodes": [{"ID": d % 2} for d in range(2)]},
                            }
                        ],
                        "cpu_ids": list(range(i % 64, i % 64 + 8)),
                    },
                    {"name": "logger"},
                ],
            }
            for i in range(pods)
        ]
    }


@pytest.mark.parametrize("window", [pr.DEFAULT_WINDOW, 1 << 20], ids=["default-window", "1MiB-window"])
def test_500_pods_8_devices_flow_control(serve, window):
    """~230 KB: several times the 65,535-byte initial window, in 16 KiB DATA frames."""
    data = big_list()
    sock = serve(list=data)
    started = time.monotonic()
    message = pr.call(sock, "List", window=window)
    elapsed = time.monotonic() - started
    assert len(message) > 3 * pr.DEFAULT_WINDOW
    assert pr.decode_message(message, pr.LIST_RESPONSE)["pod_resources"] == expected_list(data)
    assert elapsed < 5


def test_unimplemented_methods(serve):
    """A kubelet without GetAllocatableResources (before 1.23 without its feature gate) answers Unimplemented."""
    sock = serve(list=LIST)
    with pytest.raises(pr.PodResourcesError) as caught:
        pr.get_allocatable_resources(sock)
    assert caught.value.unimplemented and not isinstance(caught.value, pr.PodResourcesUnavailable)
    assert "Unimplemented (12): method GetAllocatableResources not implemented" in caught.value.msg
    assert pr.list_pod_resources(sock) == expected_list(LIST)  # the server is still fine
    sock = serve(allocatable=ALLOCATABLE)
    with pytest.raises(pr.PodResourcesError, match="method List not implemented") as caught:
        pr.list_pod_resources(sock)
    assert caught.value.grpc_status == 12


def test_empty_answer(serve):
    sock = serve(list={}, allocatable={})
    assert pr.list_pod_resources(sock) == []
    assert pr.get_allocatable_resources(sock) == {"devices": [], "cpu_ids": [], "memory": []}


def test_stopped_server_is_unavailable(serve):
    sock = serve(list=LIST)
    assert pr.available(sock)
    # grpc-go's listener removes the socket on Stop; the client reports "not available", the fallback signal.
    serve.processes[sock].terminate()
    deadline = time.monotonic() + 10
    while os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(pr.PodResourcesUnavailable, match="pod-resources API not available"):
        pr.list_pod_resources(sock)


def _allocatable(node):
    return {"devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [_uuid(node, minor)]} for minor in range(8)]}


def test_device_cgroup_audit_takes_the_allocation_from_grpc_go(serve, named_node):  # noqa: F811 - the fixture
    """The module, run as Ansible runs it, reads the real server's List on the node root's kubelet socket."""
    sock = serve(list={"pod_resources": _pods(named_node)}, allocatable=_allocatable(named_node), sock=named_node.root / SOCKET)
    result = run_module("device_cgroup_audit", {"root": str(named_node.root), "node_name": "dgx"}, {})
    assert not result.get("failed"), result
    assert result["allocation_source"] == "pod-resources"
    assert result["pod_resources"] == {"socket": sock, "pods": 4, "unmatched": ["ml/pending/main"], "reason": None}
    found = _by_id(result)
    assert set(found) == {"isolation_breach", "broken_allocation"}
    assert {f["pod"] for f in found["isolation_breach"]} == {UID_B}
