# SPDX-License-Identifier: GPL-3.0-or-later
"""The stdlib-only pod-resources client: HPACK (RFC 7541 Appendix C vectors), Huffman (Appendix B), HTTP/2 frame
handling against a scripted peer, gRPC status mapping and the protobuf decoder.

Replays of grpc-go's real answers (recorded from lab/realcomponents/podresources-server) run here without Go;
tests/real/test_podresources_client.py talks to the server itself.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _podresources as pr

from tests.unit.podresources_fake import field, varint

FIXTURES = Path(__file__).parent / "fixtures" / "podresources"


def unhex(text):
    return bytes.fromhex(text.replace(" ", ""))


# ---------------------------------------------------------------------------------------------
# HPACK: RFC 7541 Appendix C


def test_integers_c1():
    assert pr.encode_integer(10, 5) == unhex("0a")
    assert pr.encode_integer(1337, 5) == unhex("1f9a0a")
    assert pr.encode_integer(42, 8) == unhex("2a")
    assert pr.decode_integer(unhex("0a"), 0, 5) == (10, 1)
    assert pr.decode_integer(unhex("1f9a0a"), 0, 5) == (1337, 3)
    assert pr.decode_integer(unhex("2a"), 0, 8) == (42, 1)
    for value in (0, 30, 31, 127, 128, 4096, 2**28):
        assert pr.decode_integer(pr.encode_integer(value, 7), 0, 7)[0] == value


def test_integer_errors():
    with pytest.raises(pr.PodResourcesError, match="runs past"):
        pr.decode_integer(unhex("ff"), 0, 7)
    with pytest.raises(pr.PodResourcesError, match="too large"):
        pr.decode_integer(unhex("ff ffffffffff01"), 0, 7)


def test_literals_c2():
    decoder = pr.HpackDecoder()
    assert decoder.decode(unhex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572")) == [("custom-key", "custom-header")]
    assert decoder.size == 55 and decoder.dynamic == [("custom-key", "custom-header")]
    decoder = pr.HpackDecoder()
    assert decoder.decode(unhex("040c 2f73 616d 706c 652f 7061 7468")) == [(":path", "/sample/path")]
    assert decoder.decode(unhex("1008 7061 7373 776f 7264 0673 6563 7265 74")) == [("password", "secret")]
    assert decoder.decode(unhex("82")) == [(":method", "GET")]
    assert decoder.size == 0 and decoder.dynamic == []


REQUESTS = [
    [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")],
    [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"), ("cache-control", "no-cache")],
    [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"), ("custom-key", "custom-value")],
]
RESPONSES = [
    [(":status", "302"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"), ("location", "https://www.example.com")],
    [(":status", "307"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"), ("location", "https://www.example.com")],
    [
        (":status", "200"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ("location", "https://www.example.com"), ("content-encoding", "gzip"),
        ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
    ],
]  # fmt: skip


@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            id="C.3-plain",
        ),
        pytest.param(
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
            id="C.4-huffman",
        ),
    ],
)
def test_requests_c3_c4(blocks):
    decoder = pr.HpackDecoder()
    for block, want, size in zip(blocks, REQUESTS, (57, 110, 164), strict=True):
        assert decoder.decode(unhex(block)) == want
        assert decoder.size == size
    assert decoder.dynamic == [("custom-key", "custom-value"), ("cache-control", "no-cache"), (":authority", "www.example.com")]


@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(
            [
                "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d"
                "546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "4803 3330 37c1 c0bf",
                "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 666f"
                "6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b"
                "2076 6572 7369 6f6e 3d31",
            ],
            id="C.5-plain",
        ),
        pytest.param(
            [
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                "4883 640e ffc1 c0bf",
                "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 b335"
                "dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
            ],
            id="C.6-huffman",
        ),
    ],
)
def test_responses_with_eviction_c5_c6(blocks):
    decoder = pr.HpackDecoder(256)
    for block, want, size in zip(blocks, RESPONSES, (222, 222, 215), strict=True):
        assert decoder.decode(unhex(block)) == want
        assert decoder.size == size
    assert [name for name, _value in decoder.dynamic] == ["set-cookie", "content-encoding", "date"]


def test_table_size_updates():
    decoder = pr.HpackDecoder()
    decoder.decode(unhex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"))
    assert decoder.decode(unhex("20 82")) == [(":method", "GET")]  # size 0 empties the table
    assert decoder.dynamic == [] and decoder.max_size == 0
    decoder.decode(unhex("3fe11f 82"))  # back to 4096
    assert decoder.max_size == 4096
    with pytest.raises(pr.PodResourcesError, match="above 4096"):
        decoder.decode(unhex("3fe21f"))
    with pytest.raises(pr.PodResourcesError, match="after a header field"):
        pr.HpackDecoder().decode(unhex("82 20"))


def test_hpack_errors():
    with pytest.raises(pr.PodResourcesError, match="index 0"):
        pr.HpackDecoder().decode(b"\x80")
    with pytest.raises(pr.PodResourcesError, match="index 62 is in neither table"):
        pr.HpackDecoder().decode(b"\xbe")
    with pytest.raises(pr.PodResourcesError, match="string runs past"):
        pr.HpackDecoder().decode(unhex("0005 61"))
    assert issubclass(pr.PodResourcesError, GpuhardenError)


def test_request_block_is_decodable_and_uncompressed():
    headers = pr._request_headers("/v1.PodResourcesLister/List", "localhost", 2.5)
    block = pr.encode_headers(headers)
    assert pr.HpackDecoder().decode(block) == headers
    assert b"/v1.PodResourcesLister/List" in block and ("grpc-timeout", "2500m") in headers


# ---------------------------------------------------------------------------------------------
# Huffman: RFC 7541 Appendix B


def test_huffman_table_is_the_appendix():
    codes = pr.huffman_codes()
    assert len(codes) == 257
    # Spot checks against the code column of Appendix B.
    assert codes[0] == (0x1FF8, 13)
    assert codes[ord(" ")] == (0x14, 6)
    assert codes[ord("0")] == (0x0, 5)
    assert codes[ord("a")] == (0x3, 5)
    assert codes[ord("A")] == (0x21, 6)
    assert codes[ord("X")] == (0xFC, 8)
    assert codes[ord("\\")] == (0x7FFF0, 19)
    assert codes[10] == (0x3FFFFFFC, 30)
    assert codes[22] == (0x3FFFFFFE, 30)
    assert codes[127] == (0xFFFFFFC, 28)
    assert codes[192] == (0x3FFFFE0, 26)
    assert codes[220] == (0xFFFFFFD, 28)
    assert codes[255] == (0x3FFFFEE, 26)
    assert codes[pr.EOS] == (0x3FFFFFFF, 30)
    # A complete prefix code: the Kraft sum is exactly 1.
    assert sum(2 ** (30 - length) for _code, length in codes) == 2**30


def test_huffman_vectors_and_round_trip():
    assert pr.huffman_decode(unhex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")) == b"www.example.com"
    assert pr.huffman_decode(unhex("a8eb 1064 9cbf")) == b"no-cache"
    assert pr.huffman_decode(unhex("6402")) == b"302"
    assert pr.huffman_encode(b"custom-key") == unhex("25a8 49e9 5ba9 7d7f")
    every = bytes(range(256))
    assert pr.huffman_decode(pr.huffman_encode(every)) == every
    assert pr.huffman_decode(b"") == b""


def test_huffman_errors():
    with pytest.raises(pr.PodResourcesError, match="padding"):
        pr.huffman_decode(unhex("f1e3 c2e5 f23a 6ba0 ab90 f400"))  # padding of zeros
    with pytest.raises(pr.PodResourcesError, match="padding"):
        pr.huffman_decode(b"\xff")  # 8 bits of padding
    with pytest.raises(pr.PodResourcesError, match="EOS"):
        pr.huffman_decode(b"\xff\xff\xff\xfc")  # EOS (30 ones) then padding


# ---------------------------------------------------------------------------------------------
# protobuf


def _key(number, wire):
    return _varint(number << 3 | wire)


# The protobuf encoders the scripted kubelet uses too.
_varint, _len = varint, field


def _str(number, text):
    return _len(number, text.encode())


def test_decode_list_response():
    topology = _len(1, _key(1, 0) + _varint(1)) + _len(1, b"")  # nodes [{ID: 1}, {ID: 0}]
    device = _str(1, "nvidia.com/gpu") + _str(2, "GPU-a") + _str(2, "GPU-b") + _len(3, topology)
    memory = _str(1, "memory") + _key(2, 0) + _varint(2**40)
    dra = _str(2, "claim") + _str(3, "ns")
    container = (
        _str(1, "main") + _len(2, device) + _len(3, _varint(4) + _varint(5))  # packed cpu_ids
        + _key(3, 0) + _varint(-1)  # one unpacked, negative
        + _len(4, memory) + _len(5, dra)
        + _key(9, 1) + b"\0" * 8 + _key(10, 5) + b"\0" * 4  # unknown fixed64 / fixed32 fields: skipped
    )  # fmt: skip
    pod = _str(1, "train-0") + _str(2, "ml") + _len(3, container) + _len(3, _str(1, "sidecar"))
    message = _len(1, pod) + _len(1, _str(1, "empty"))
    pods = pr.decode_message(message, pr.LIST_RESPONSE)["pod_resources"]
    assert pods == [
        {
            "name": "train-0",
            "namespace": "ml",
            "containers": [
                {
                    "name": "main",
                    "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-a", "GPU-b"], "topology": {"nodes": [{"ID": 1}, {"ID": 0}]}}],
                    "cpu_ids": [4, 5, -1],
                    "memory": [{"memory_type": "memory", "size": 2**40, "topology": None}],
                    "dynamic_resources": [{"claim_name": "claim", "claim_namespace": "ns", "claim_resources": []}],
                },
                {"name": "sidecar", "devices": [], "cpu_ids": [], "memory": [], "dynamic_resources": []},
            ],
        },
        {"name": "empty", "namespace": "", "containers": []},
    ]
    assert pr.decode_message(b"", pr.ALLOCATABLE_RESPONSE) == {"devices": [], "cpu_ids": [], "memory": []}


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x0a\x05ab", "runs past"),
        (b"\x08\x80", "truncated varint"),
        (b"\x0b", "wire type 3"),
        (b"\x08" + b"\xff" * 11, "longer than 10"),
    ],
)
def test_decode_errors(data, match):
    with pytest.raises(pr.PodResourcesError, match=match):
        pr.decode_message(data, pr.LIST_RESPONSE)


# ---------------------------------------------------------------------------------------------
# HTTP/2 and gRPC against a scripted peer


def _headers(stream, headers, flags=pr.FLAG_END_HEADERS):
    return pr.frame(pr.HEADERS, flags, stream, pr.encode_headers(headers))


OK_HEAD = [(":status", "200"), ("content-type", "application/grpc")]
OK_TRAILERS = [("grpc-status", "0"), ("grpc-message", "")]


class Peer:
    """The server end of a socketpair: runs a script (bytes to send, predicates to wait for a client frame, seconds
    to sleep, or functions of the peer), recording the client's frames."""

    def __init__(self, script):
        self.client, self.server = socket.socketpair()
        self.frames = []
        self.buffer = bytearray()
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def read_frame(self):
        while len(self.buffer) < 9 or len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
            chunk = self.server.recv(65536)
            if not chunk:
                return None
            self.buffer.extend(chunk)
        length = int.from_bytes(self.buffer[:3], "big")
        item = (self.buffer[3], self.buffer[4], struct.unpack(">I", self.buffer[5:9])[0], bytes(self.buffer[9 : 9 + length]))
        del self.buffer[: 9 + length]
        self.frames.append(item)
        return item

    def wait_for(self, predicate):
        while True:
            item = self.read_frame()
            if item is None or predicate(item):
                return item

    def _run(self, script):
        try:
            while len(self.buffer) < len(pr.PREFACE):
                self.buffer.extend(self.server.recv(65536))
            assert self.buffer.startswith(pr.PREFACE)
            del self.buffer[: len(pr.PREFACE)]
            for step in script:
                if isinstance(step, float):
                    time.sleep(step)
                elif isinstance(step, bytes):
                    self.server.sendall(step)
                elif getattr(step, "peer_step", False):
                    step(self)
                elif self.wait_for(step) is None:
                    return
            self.server.shutdown(socket.SHUT_WR)
            while self.read_frame() is not None:  # what the client sends after the answer (ACKs, updates)
                pass
        except OSError:
            pass

    def call(self, method="List", timeout=5.0, window=pr.DEFAULT_WINDOW):
        try:
            head, body, trailers = pr.exchange(self.client, "/v1.PodResourcesLister/" + method, b"", timeout, window=window)
            return pr.grpc_result(method, head, body, trailers)
        finally:
            self.client.close()
            self.thread.join(5)
            self.server.close()


def peer_step(function):
    function.peer_step = True
    return function


def _end_of_request(item):
    return item[0] == pr.DATA and item[1] & pr.FLAG_END_STREAM


def _grpc(message):
    return struct.pack(">BI", 0, len(message)) + message


def test_request_frames():
    peer = Peer([_end_of_request, pr.frame(pr.SETTINGS, 0, 0) + _headers(1, OK_HEAD) + pr.frame(pr.DATA, 0, 1, _grpc(b"")), _headers(1, OK_TRAILERS, 5)])
    assert peer.call() == b""
    kinds = [(kind, flags, stream) for kind, flags, stream, _payload in peer.frames]
    assert kinds[:3] == [(pr.SETTINGS, 0, 0), (pr.HEADERS, pr.FLAG_END_HEADERS, 1), (pr.DATA, pr.FLAG_END_STREAM, 1)]
    assert (pr.SETTINGS, pr.FLAG_ACK, 0) in kinds[3:]
    request = dict(pr.HpackDecoder().decode(peer.frames[1][3]))
    assert request[":path"] == "/v1.PodResourcesLister/List" and request["content-type"] == "application/grpc" and request["te"] == "trailers"
    assert peer.frames[2][3] == b"\0\0\0\0\0"


def test_continuation_padding_priority_ping_settings():
    block = pr.encode_headers(OK_HEAD)
    padded_priority = bytes([3]) + b"\x00\x00\x00\x00\x10" + block[:5]
    script = [
        _end_of_request,
        pr.frame(pr.SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20))
        + pr.frame(pr.PING, 0, 0, b"12345678")
        + pr.frame(pr.HEADERS, pr.FLAG_PADDED | pr.FLAG_PRIORITY, 1, padded_priority + b"\0\0\0")
        + pr.frame(pr.CONTINUATION, 0, 1, block[5:9])
        + pr.frame(pr.CONTINUATION, pr.FLAG_END_HEADERS, 1, block[9:])
        + pr.frame(pr.PRIORITY, 0, 1, b"\0\0\0\0\x10")
        + pr.frame(0xEE, 0, 0, b"unknown frame type")
        + pr.frame(pr.DATA, pr.FLAG_PADDED, 1, bytes([4]) + _grpc(b"hello") + b"\0\0\0\0"),
        _headers(1, OK_TRAILERS, 5),
    ]
    peer = Peer(script)
    assert peer.call() == b"hello"
    assert (pr.SETTINGS, pr.FLAG_ACK, 0, b"") in peer.frames
    assert (pr.PING, pr.FLAG_ACK, 0, b"12345678") in peer.frames


def test_flow_control_window_updates():
    """An answer 10x the 65,535-byte window from a peer that honours flow control: it never sends beyond the window
    and waits for the client's WINDOW_UPDATE frames (connection and stream) to go on."""
    message = bytes(range(256)) * 2560  # 655,360 bytes
    body = _grpc(message)

    @peer_step
    def send_honouring_windows(peer):
        windows = {0: pr.DEFAULT_WINDOW, 1: pr.DEFAULT_WINDOW}
        pos = 0
        while pos < len(body):
            size = min(16384, len(body) - pos, windows[0], windows[1])
            if size <= 0:
                item = peer.wait_for(lambda item: item[0] == pr.WINDOW_UPDATE)
                windows[item[2]] += struct.unpack(">I", item[3])[0]
                continue
            peer.server.sendall(pr.frame(pr.DATA, 0, 1, body[pos : pos + size]))
            windows[0] -= size
            windows[1] -= size
            pos += size

    peer = Peer([_end_of_request, _headers(1, OK_HEAD), send_honouring_windows, _headers(1, OK_TRAILERS, 5)])
    assert peer.call(timeout=10) == message
    updates = [f for f in peer.frames if f[0] == pr.WINDOW_UPDATE]
    assert {f[2] for f in updates} == {0, 1}  # connection and stream
    assert sum(struct.unpack(">I", f[3])[0] for f in updates if f[2] == 1) >= len(body) - pr.DEFAULT_WINDOW


def test_large_window_setting():
    peer = Peer([_end_of_request, _headers(1, OK_HEAD) + pr.frame(pr.DATA, 0, 1, _grpc(b"x")), _headers(1, OK_TRAILERS, 5)])
    assert peer.call(window=1 << 20) == b"x"
    settings = peer.frames[0][3]
    assert struct.pack(">HI", pr.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20) in settings
    assert peer.frames[1][0] == pr.WINDOW_UPDATE and struct.unpack(">I", peer.frames[1][3])[0] == (1 << 20) - 65535


def test_trailers_only_unimplemented():
    trailers = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12"), ("grpc-message", "unknown%20method%20Get")]
    peer = Peer([_end_of_request, _headers(1, trailers, 5)])
    with pytest.raises(pr.PodResourcesError) as caught:
        peer.call("GetAllocatableResources")
    assert caught.value.unimplemented and caught.value.grpc_status == 12 and caught.value.grpc_message == "unknown method Get"
    assert "Unimplemented (12): unknown method Get" in caught.value.msg and "KubeletPodResourcesGetAllocatable" in caught.value.msg


@pytest.mark.parametrize(
    "script, match",
    [
        ([_end_of_request, pr.frame(pr.RST_STREAM, 0, 1, struct.pack(">I", 8))], r"reset the call \(HTTP/2 CANCEL\)"),
        ([_end_of_request, pr.frame(pr.GOAWAY, 0, 0, struct.pack(">II", 0, 11) + b"too many pings")], "GOAWAY ENHANCE_YOUR_CALM: too many pings"),
        ([_end_of_request, _headers(1, OK_HEAD)], "closed the connection before the answer was complete"),
        ([_end_of_request, _headers(1, [(":status", "503")], 5)], "HTTP status 503"),
        ([_end_of_request, _headers(1, OK_HEAD) + pr.frame(pr.DATA, pr.FLAG_END_STREAM, 1, _grpc(b""))], "without grpc-status"),
        ([_end_of_request, _headers(1, OK_HEAD) + pr.frame(pr.DATA, 0, 1, b"\1\0\0\0\0"), _headers(1, OK_TRAILERS, 5)], "compressed"),
        ([_end_of_request, _headers(1, OK_HEAD) + pr.frame(pr.DATA, 0, 1, _grpc(b"a") + _grpc(b"b")), _headers(1, OK_TRAILERS, 5)], "2 messages"),
        ([_end_of_request, _headers(1, OK_HEAD) + pr.frame(pr.DATA, 0, 1, b"\0\0\0\0\x09ab"), _headers(1, OK_TRAILERS, 5)], "truncated"),
        ([_end_of_request, pr.frame(pr.CONTINUATION, pr.FLAG_END_HEADERS, 1, b"")], "CONTINUATION without"),
        ([_end_of_request, pr.frame(pr.HEADERS, 0, 1, b"\x88") + pr.frame(pr.DATA, 0, 1, b"")], "interrupted"),
        ([_end_of_request, pr.frame(pr.PUSH_PROMISE, pr.FLAG_END_HEADERS, 1, b"\0\0\0\2")], "PUSH_PROMISE"),
        ([_end_of_request, b"\x01\x00\x00\x00\x00\x00\x00\x00\x01"], "above SETTINGS_MAX_FRAME_SIZE"),
    ],
    ids=["rst", "goaway", "eof", "http-status", "no-trailers", "compressed", "two-messages", "truncated", "continuation", "interrupted", "push",
         "frame-size"],
)  # fmt: skip
def test_protocol_errors(script, match):
    with pytest.raises(pr.PodResourcesError, match=match):
        Peer(script).call()


def test_timeout_never_hangs():
    peer = Peer([_end_of_request, _headers(1, OK_HEAD), 4.0])  # headers, then silence
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        pr.exchange(peer.client, "/v1.PodResourcesLister/List", b"", 0.3)
    assert time.monotonic() - started < 3.5  # well before the silence ends; slack for a loaded CI machine
    peer.client.close()
    peer.thread.join(5)


def test_call_timeout_message(tmp_path):
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)  # accepts (backlog) and never answers
    try:
        started = time.monotonic()
        with pytest.raises(pr.PodResourcesError, match=r"did not answer List within 0.3s"):
            pr.list_pod_resources(path, timeout=0.3)
        assert time.monotonic() - started < 10  # the server never answers: only the timeout ends the call
    finally:
        server.close()


def test_missing_socket_is_unavailable(tmp_path):
    with pytest.raises(pr.PodResourcesUnavailable, match="pod-resources API not available: .*No such file"):
        pr.list_pod_resources(str(tmp_path / "kubelet.sock"))
    stale = tmp_path / "stale.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(stale))
    server.close()  # the file stays, nothing listens: ECONNREFUSED
    with pytest.raises(pr.PodResourcesUnavailable, match="Connection refused"):
        pr.get_allocatable_resources(str(stale))
    assert pr.available(str(stale)) and not pr.available(str(tmp_path / "kubelet.sock"))
    (tmp_path / "file").write_text("")
    assert not pr.available(str(tmp_path / "file"))


# ---------------------------------------------------------------------------------------------
# Replays of grpc-go (lab/realcomponents/podresources-server, k8s.io/kubelet v0.36.3, grpc v1.79.3)


def _replay(name, method):
    """Feed the recorded server->client bytes of a real exchange to the client."""
    peer = Peer([_end_of_request, (FIXTURES / name).read_bytes()])
    return peer.call(method)


def _from_json(pods):
    """The protojson fixture as the decoder returns it (defaults filled in)."""

    def device(d):
        topology = d.get("topology")
        return {"resource_name": d["resource_name"], "device_ids": d.get("device_ids", []),
                "topology": {"nodes": [{"ID": n.get("ID", 0)} for n in topology.get("nodes", [])]} if topology is not None else None}  # fmt: skip

    return [
        {
            "name": p["name"],
            "namespace": p["namespace"],
            "containers": [
                {
                    "name": c["name"],
                    "devices": [device(d) for d in c.get("devices", [])],
                    "cpu_ids": c.get("cpu_ids", []),
                    "memory": [],
                    "dynamic_resources": [],
                }
                for c in p.get("containers", [])
            ],
        }
        for p in pods
    ]


def test_replay_grpc_go_list():
    message = _replay("go-list.h2", "List")
    want = _from_json(json.loads((FIXTURES / "list.json").read_text())["pod_resources"])
    assert pr.decode_message(message, pr.LIST_RESPONSE)["pod_resources"] == want


def test_replay_grpc_go_unimplemented():
    with pytest.raises(pr.PodResourcesError) as caught:
        _replay("go-unimplemented.h2", "GetAllocatableResources")
    assert caught.value.unimplemented
    assert "method GetAllocatableResources not implemented" in caught.value.msg
