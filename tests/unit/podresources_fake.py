# SPDX-License-Identifier: GPL-3.0-or-later
"""A scripted kubelet pod-resources endpoint for unit tests (no Go needed): a unix socket that answers one unary
gRPC call per connection over HTTP/2, with the protobuf encoding of ListPodResourcesResponse
(k8s.io/kubelet/pkg/apis/podresources/v1/api.proto).  tests/real runs the real grpc-go server instead.
"""

from __future__ import annotations

import socket
import struct
import threading
import urllib.parse

from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _podresources as pr


def varint(value):
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def text(number, value):
    return field(number, value.encode())


def encode_devices(devices):
    out = b""
    for device in devices or []:
        body = text(1, device["resource_name"]) + b"".join(text(2, ident) for ident in device.get("device_ids", []))
        out += field(2, body)
    return out


def encode_allocatable(device_ids, resource_name="nvidia.com/gpu"):
    """AllocatableResourcesResponse with one device entry per ID."""
    return b"".join(field(1, text(1, resource_name) + text(2, ident)) for ident in device_ids)


def encode_list(pods):
    """ListPodResourcesResponse from [{name, namespace, containers: [{name, devices: [{resource_name, device_ids}], claims: [claim name]}]}]."""
    out = b""
    for pod in pods:
        containers = b"".join(
            field(3, text(1, c["name"]) + encode_devices(c.get("devices")) + b"".join(field(5, text(2, claim)) for claim in c.get("claims", [])))
            for c in pod.get("containers", [])
        )
        out += field(1, text(1, pod["name"]) + text(2, pod["namespace"]) + containers)
    return out


class FakeKubelet:
    """Serves ``answers`` ({method: bytes message, or (grpc status, message text)}) on ``path`` until closed."""

    def __init__(self, path, answers):
        self.path = str(path)
        self.answers = answers
        self.calls = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.listener.settimeout(0.1)
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                conn, _addr = self.listener.accept()
            except socket.timeout:  # noqa: UP041 - the same as the module_utils
                continue
            except OSError:
                return
            conn.settimeout(5)
            with conn:
                try:
                    self._answer(conn)
                except OSError:
                    pass

    def _answer(self, conn):
        buffer = bytearray()
        decoder = pr.HpackDecoder()
        path = None
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buffer.extend(chunk)
            if buffer.startswith(pr.PREFACE):
                del buffer[: len(pr.PREFACE)]
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length = int.from_bytes(buffer[:3], "big")
                kind, flags, payload = buffer[3], buffer[4], bytes(buffer[9 : 9 + length])
                del buffer[: 9 + length]
                if kind == pr.HEADERS:
                    path = dict(decoder.decode(payload))[":path"]
                if kind == pr.DATA and flags & pr.FLAG_END_STREAM:
                    self._respond(conn, path.rsplit("/", 1)[1])
                    return

    def _respond(self, conn, method):
        self.calls.append(method)
        answer = self.answers.get(method, (12, "method %s not implemented" % method))
        head = [(":status", "200"), ("content-type", "application/grpc")]
        out = pr.frame(pr.SETTINGS, 0, 0)
        if isinstance(answer, tuple):
            trailers = head + [("grpc-status", str(answer[0])), ("grpc-message", urllib.parse.quote(answer[1]))]
            out += pr.frame(pr.HEADERS, pr.FLAG_END_HEADERS | pr.FLAG_END_STREAM, 1, pr.encode_headers(trailers))
        else:
            body = struct.pack(">BI", 0, len(answer)) + answer
            out += pr.frame(pr.HEADERS, pr.FLAG_END_HEADERS, 1, pr.encode_headers(head))
            for pos in range(0, len(body), 16384):
                out += pr.frame(pr.DATA, 0, 1, body[pos : pos + 16384])
            out += pr.frame(pr.HEADERS, pr.FLAG_END_HEADERS | pr.FLAG_END_STREAM, 1, pr.encode_headers([("grpc-status", "0")]))
        conn.sendall(out)

    def close(self):
        self.stopping = True
        self.thread.join(5)
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
