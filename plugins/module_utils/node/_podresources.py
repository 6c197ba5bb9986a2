# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The kubelet's pod-resources API (``v1.PodResourcesLister``) over its unix socket, stdlib only.

Node Python gains no dependency (air-gapped fleets: no grpcio, no protobuf package), so this is a small gRPC
client for ONE unary call per connection over HTTP/2 with prior knowledge (h2c):

* HTTP/2 (RFC 9113): connection preface, SETTINGS and their ACK, PING ACK, HEADERS + CONTINUATION, DATA
  (padding stripped), WINDOW_UPDATE for every DATA frame consumed (connection and stream), so answers far larger
  than the 65,535-byte initial window (a node with hundreds of pods) flow; RST_STREAM and GOAWAY end the call.
* HPACK (RFC 7541): the request is sent as literals without indexing and without Huffman coding; answers are
  decoded fully (static and dynamic table, table size updates, integers, strings, Huffman from Appendix B), as
  grpc-go's encoder (golang.org/x/net/http2/hpack) uses all of them.
* gRPC over HTTP/2 (grpc/grpc doc/PROTOCOL-HTTP2.md): ``content-type: application/grpc``, ``te: trailers``, the
  5-byte length prefix per message, ``grpc-status``/``grpc-message`` from the trailers (or a trailers-only answer).
* protobuf wire format: a schema-driven decoder for ListPodResourcesResponse and AllocatableResourcesResponse
  (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, v0.36.3); answers are plain dicts.

Errors are ``PodResourcesError`` (a ``GpuhardenError``); ``PodResourcesUnavailable`` (a subclass) means there is
no API to ask (no socket, or nothing listens on it) so the caller falls back to another source. Every call is
bounded by ``timeout`` seconds, connection included: it never hangs.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import time
import urllib.parse

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
DEFAULT_TIMEOUT = 10.0
# The kubelet's own client (k8s.io/kubernetes pkg/kubelet/apis/podresources/client.go DefaultMaxMsgSize) accepts
# answers up to 16 MiB; so do we, then stop reading.
MAX_MESSAGE = 16 * 1024 * 1024

# gRPC status codes (grpc/grpc doc/statuscodes.md).
GRPC_CODES = {
    0: "OK", 1: "Cancelled", 2: "Unknown", 3: "InvalidArgument", 4: "DeadlineExceeded", 5: "NotFound",
    6: "AlreadyExists", 7: "PermissionDenied", 8: "ResourceExhausted", 9: "FailedPrecondition", 10: "Aborted",
    11: "OutOfRange", 12: "Unimplemented", 13: "Internal", 14: "Unavailable", 15: "DataLoss", 16: "Unauthenticated",
}  # fmt: skip
UNIMPLEMENTED = 12
UNIMPLEMENTED_HINTS = {
    "GetAllocatableResources": "this kubelet does not serve it: Kubernetes 1.21-1.22 need the KubeletPodResourcesGetAllocatable feature gate",
    "Get": "this kubelet does not serve it: it needs the KubeletPodResourcesGet feature gate",
}


class PodResourcesError(GpuhardenError):
    """A pod-resources call failed; ``grpc_status`` is the gRPC status code when the server sent one."""

    def __init__(self, msg, grpc_status=None, grpc_message=None):
        super().__init__(msg)
        self.grpc_status = grpc_status
        self.grpc_message = grpc_message

    @property
    def unimplemented(self):
        return self.grpc_status == UNIMPLEMENTED


class PodResourcesUnavailable(PodResourcesError):
    """No pod-resources API to ask: the socket is missing or nothing listens on it; fall back to another source."""


# ---------------------------------------------------------------------------------------------
# HPACK (RFC 7541)

# Appendix A: the static table (index 1..61).
STATIC_TABLE = (
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""), ("cache-control", ""),
    ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""), ("date", ""),
    ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""), ("if-match", ""),
    ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""), ("if-unmodified-since", ""),
    ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""), ("proxy-authenticate", ""),
    ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""),
    ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
)  # fmt: skip

# Appendix B: the code length of each symbol 0..255 and of EOS (256), 16 symbols a row. The code is canonical
# (codes of one length are consecutive in symbol order, shorter codes first), so the lengths rebuild the codes;
# tests check the result against codes the appendix lists.
HUFFMAN_LENGTHS = (
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
)  # fmt: skip
EOS = 256


def huffman_codes():
    """[(code, length)] per symbol 0..256, the canonical code of HUFFMAN_LENGTHS."""
    codes = [None] * len(HUFFMAN_LENGTHS)
    code, previous = 0, 0
    for length, symbol in sorted((length, symbol) for symbol, length in enumerate(HUFFMAN_LENGTHS)):
        code <<= length - previous
        codes[symbol] = (code, length)
        code, previous = code + 1, length
    return codes


_DECODE = None


def _decode_table():
    global _DECODE
    if _DECODE is None:
        _DECODE = {(length, code): symbol for symbol, (code, length) in enumerate(huffman_codes())}
    return _DECODE


def huffman_decode(data):
    """The octets a Huffman-coded HPACK string stands for (RFC 7541 section 5.2)."""
    table = _decode_table()
    out = bytearray()
    code, length = 0, 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            symbol = table.get((length, code))
            if symbol is None:
                if length >= 30:
                    raise PodResourcesError("pod-resources: HPACK: invalid Huffman code")
                continue
            if symbol == EOS:
                raise PodResourcesError("pod-resources: HPACK: EOS symbol inside a Huffman-coded string")
            out.append(symbol)
            code, length = 0, 0
    # Padding: fewer than 8 bits, the most significant bits of EOS (all ones).
    if length > 7 or code != (1 << length) - 1:
        raise PodResourcesError("pod-resources: HPACK: invalid Huffman padding")
    return bytes(out)


def huffman_encode(data):
    """``data`` Huffman-coded (tests; requests are sent uncoded)."""
    codes = huffman_codes()
    value, bits = 0, 0
    for byte in data:
        code, length = codes[byte]
        value, bits = (value << length) | code, bits + length
    pad = -bits % 8
    value, bits = (value << pad) | ((1 << pad) - 1), bits + pad
    return value.to_bytes(bits // 8, "big")


def encode_integer(value, prefix_bits, first=0):
    """RFC 7541 section 5.1; ``first`` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_integer(data, pos, prefix_bits):
    """(value, next position) of the integer whose prefix starts at ``data[pos]``."""
    limit = (1 << prefix_bits) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise PodResourcesError("pod-resources: HPACK: integer runs past the header block")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 28:  # nothing in a header block needs more than 2^32
            raise PodResourcesError("pod-resources: HPACK: integer too large")


def encode_string(text):
    raw = text.encode("utf-8")
    return encode_integer(len(raw), 7) + raw


def decode_string(data, pos):
    if pos >= len(data):
        raise PodResourcesError("pod-resources: HPACK: string runs past the header block")
    huffman = bool(data[pos] & 0x80)
    length, pos = decode_integer(data, pos, 7)
    if pos + length > len(data):
        raise PodResourcesError("pod-resources: HPACK: string runs past the header block")
    raw = bytes(data[pos : pos + length])
    return (huffman_decode(raw) if huffman else raw).decode("utf-8", "replace"), pos + length


def encode_headers(headers):
    """A header block of literals without indexing, new names, no Huffman (RFC 7541 section 6.2.2)."""
    return b"".join(b"\x00" + encode_string(name) + encode_string(value) for name, value in headers)


class HpackDecoder:
    """One connection's decoding context: the dynamic table survives from one header block to the next."""

    def __init__(self, max_table_size=4096):
        self.max_allowed = max_table_size  # SETTINGS_HEADER_TABLE_SIZE we advertise (the default)
        self.max_size = max_table_size
        self.size = 0
        self.dynamic = []  # newest first

    def _evict(self):
        while self.size > self.max_size and self.dynamic:
            name, value = self.dynamic.pop()
            self.size -= len(name.encode("utf-8")) + len(value.encode("utf-8")) + 32

    def _add(self, name, value):
        self.dynamic.insert(0, (name, value))
        self.size += len(name.encode("utf-8")) + len(value.encode("utf-8")) + 32
        self._evict()  # an entry larger than the table empties it (section 4.4)

    def _entry(self, index):
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        if 0 < index - len(STATIC_TABLE) <= len(self.dynamic):
            return self.dynamic[index - len(STATIC_TABLE) - 1]
        raise PodResourcesError("pod-resources: HPACK: index %d is in neither table (dynamic: %d)" % (index, len(self.dynamic)))

    def decode(self, block):
        """[(name, value)] of one complete header block."""
        headers = []
        pos = 0
        data = bytes(block)
        while pos < len(data):
            byte = data[pos]
            if byte & 0xE0 == 0x20 and headers:
                raise PodResourcesError("pod-resources: HPACK: table size update after a header field (section 4.2)")
            if byte & 0x80:  # 6.1 indexed
                index, pos = decode_integer(data, pos, 7)
                if index == 0:
                    raise PodResourcesError("pod-resources: HPACK: index 0")
                headers.append(self._entry(index))
            elif byte & 0x40:  # 6.2.1 literal with incremental indexing
                index, pos = decode_integer(data, pos, 6)
                name = self._entry(index)[0] if index else None
                if name is None:
                    name, pos = decode_string(data, pos)
                value, pos = decode_string(data, pos)
                self._add(name, value)
                headers.append((name, value))
            elif byte & 0x20:  # 6.3 dynamic table size update
                size, pos = decode_integer(data, pos, 5)
                if size > self.max_allowed:
                    raise PodResourcesError("pod-resources: HPACK: table size update to %d above %d" % (size, self.max_allowed))
                self.max_size = size
                self._evict()
            else:  # 6.2.2 without indexing (0000), 6.2.3 never indexed (0001)
                index, pos = decode_integer(data, pos, 4)
                name = self._entry(index)[0] if index else None
                if name is None:
                    name, pos = decode_string(data, pos)
                value, pos = decode_string(data, pos)
                headers.append((name, value))
        return headers


# ---------------------------------------------------------------------------------------------
# HTTP/2 (RFC 9113)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM, FLAG_ACK, FLAG_END_HEADERS, FLAG_PADDED, FLAG_PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
DEFAULT_WINDOW = 65535
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE we keep (the default): a larger frame is a protocol error
H2_ERRORS = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT", "STREAM_CLOSED",
    "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)  # fmt: skip
STREAM = 1  # the one stream of the connection


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _h2_error(code):
    return H2_ERRORS[code] if code < len(H2_ERRORS) else "0x%x" % code


def _strip_padding(flags, payload, what):
    if not flags & FLAG_PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise PodResourcesError("pod-resources: HTTP/2: %s frame with more padding than payload" % what)
    return payload[1 : len(payload) - payload[0]]


class _Connection:
    """Frame I/O on a connected socket, with one deadline for the whole call."""

    def __init__(self, sock, deadline, where):
        self.sock = sock
        self.deadline = deadline
        self.where = where
        self.buffer = bytearray()

    def _remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()  # noqa: UP041 - not TimeoutError before Python 3.10, and nodes may run 3.8
        return left

    def send(self, data):
        self.sock.settimeout(self._remaining())
        self.sock.sendall(data)

    def reply(self, data):
        """A control frame (ACK, WINDOW_UPDATE): a peer that already closed after its answer is no error, what
        it sent is still read; a peer that closed too early shows as end of stream on the next read."""
        try:
            self.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _fill(self, count):
        while len(self.buffer) < count:
            self.sock.settimeout(self._remaining())
            chunk = self.sock.recv(max(65536, count - len(self.buffer)))
            if not chunk:
                raise PodResourcesError("pod-resources: %s closed the connection before the answer was complete" % self.where)
            self.buffer.extend(chunk)

    def read_frame(self):
        """(type, flags, stream, payload)."""
        self._fill(9)
        length = int.from_bytes(self.buffer[:3], "big")
        kind, flags, stream = self.buffer[3], self.buffer[4], struct.unpack(">I", self.buffer[5:9])[0] & 0x7FFFFFFF
        if length > MAX_FRAME:
            raise PodResourcesError("pod-resources: HTTP/2: %d-byte frame above SETTINGS_MAX_FRAME_SIZE %d" % (length, MAX_FRAME))
        self._fill(9 + length)
        payload = bytes(self.buffer[9 : 9 + length])
        del self.buffer[: 9 + length]
        return kind, flags, stream, payload


def _request_headers(path, authority, timeout):
    # grpc/grpc doc/PROTOCOL-HTTP2.md "Requests"; grpc-timeout in milliseconds (at most 8 digits).
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "%dm" % min(max(int(timeout * 1000), 1), 99999999)),
        ("user-agent", "gpuharden-podresources/1"),
    ]


def exchange(sock, path, message=b"", timeout=DEFAULT_TIMEOUT, authority="localhost", where="the kubelet", window=DEFAULT_WINDOW):
    """The HTTP/2 side of one unary gRPC call on a connected socket: (response headers, body, trailers).

    ``window``: the flow-control window we grant, on the connection and the stream; half of it consumed is given
    back with WINDOW_UPDATE, so an answer of any size flows (the default keeps the protocol's 65,535 bytes).
    """
    conn = _Connection(sock, time.monotonic() + timeout, where)
    settings = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0)
    grow = b""
    if window > DEFAULT_WINDOW:
        settings += struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, window)
        grow = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", window - DEFAULT_WINDOW))
    conn.send(
        PREFACE
        + frame(SETTINGS, 0, 0, settings)
        + grow
        + frame(HEADERS, FLAG_END_HEADERS, STREAM, encode_headers(_request_headers(path, authority, timeout)))
        + frame(DATA, FLAG_END_STREAM, STREAM, struct.pack(">BI", 0, len(message)) + message)
    )  # fmt: skip
    threshold = max(window // 2, 1)
    decoder = HpackDecoder()
    blocks = []  # decoded header blocks of our stream: response headers, then trailers
    body = bytearray()
    pending = None  # (stream, end_stream, fragments) while CONTINUATION frames are due
    consumed = 0  # DATA bytes not yet given back with WINDOW_UPDATE
    while True:
        kind, flags, stream, payload = conn.read_frame()
        if pending is not None:
            if kind != CONTINUATION or stream != pending[0]:
                raise PodResourcesError("pod-resources: HTTP/2: a header block was interrupted by frame type %d" % kind)
            pending[2].append(payload)
            if not flags & FLAG_END_HEADERS:
                continue
            kind, stream, end_stream, block = HEADERS, pending[0], pending[1], b"".join(pending[2])
            pending = None
        elif kind == HEADERS:
            block = _strip_padding(flags, payload, "HEADERS")
            if flags & FLAG_PRIORITY:
                block = block[5:]
            end_stream = bool(flags & FLAG_END_STREAM)
            if not flags & FLAG_END_HEADERS:
                pending = (stream, end_stream, [block])
                continue
        elif kind == CONTINUATION:
            raise PodResourcesError("pod-resources: HTTP/2: CONTINUATION without a HEADERS frame")
        if kind == HEADERS:
            headers = decoder.decode(block)  # every block, whatever its stream: the table is shared
            if stream == STREAM:
                blocks.append(headers)
                if end_stream:
                    break
        elif kind == DATA:
            if stream == STREAM:
                body.extend(_strip_padding(flags, payload, "DATA"))
                if len(body) > MAX_MESSAGE + 5:
                    raise PodResourcesError("pod-resources: the answer is larger than %d bytes" % MAX_MESSAGE)
            if flags & FLAG_END_STREAM and stream == STREAM:
                break
            # Flow control: give back what was consumed, padding included, on the connection and the stream.
            consumed += len(payload)
            if consumed >= threshold:
                conn.reply(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", consumed)) + frame(WINDOW_UPDATE, 0, STREAM, struct.pack(">I", consumed)))
                consumed = 0
        elif kind == SETTINGS:
            if not flags & FLAG_ACK:
                conn.reply(frame(SETTINGS, FLAG_ACK, 0))
        elif kind == PING:
            if not flags & FLAG_ACK:
                conn.reply(frame(PING, FLAG_ACK, 0, payload))
        elif kind == RST_STREAM and stream == STREAM:
            code = struct.unpack(">I", payload[:4])[0] if len(payload) >= 4 else 1
            raise PodResourcesError("pod-resources: %s reset the call (HTTP/2 %s)" % (where, _h2_error(code)))
        elif kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8]) if len(payload) >= 8 else (0, 1)
            if (last & 0x7FFFFFFF) < STREAM or code:
                debug = payload[8:].decode("utf-8", "replace")
                raise PodResourcesError("pod-resources: %s closed the connection (GOAWAY %s%s)" % (where, _h2_error(code), ": " + debug if debug else ""))
        elif kind == PUSH_PROMISE:
            raise PodResourcesError("pod-resources: HTTP/2: PUSH_PROMISE although push is disabled")
        # PRIORITY, WINDOW_UPDATE (our request fits the initial window), unknown types: ignored (section 4.1).
    if not blocks:
        raise PodResourcesError("pod-resources: %s ended the call without headers" % where)
    return blocks[0], bytes(body), blocks[-1] if len(blocks) > 1 else blocks[0]


def grpc_messages(body):
    """The messages of a gRPC body (length-prefixed, grpc/grpc doc/PROTOCOL-HTTP2.md "Length-Prefixed-Message")."""
    messages, pos = [], 0
    while pos < len(body):
        if pos + 5 > len(body):
            raise PodResourcesError("pod-resources: gRPC: truncated message prefix")
        compressed, length = struct.unpack(">BI", body[pos : pos + 5])
        if compressed:
            raise PodResourcesError("pod-resources: gRPC: a compressed message although none was accepted")
        if pos + 5 + length > len(body):
            raise PodResourcesError("pod-resources: gRPC: message of %d bytes truncated at %d" % (length, len(body) - pos - 5))
        messages.append(body[pos + 5 : pos + 5 + length])
        pos += 5 + length
    return messages


def grpc_result(method, headers, body, trailers, where="the kubelet"):
    """The one answer message of a unary call, or PodResourcesError with the gRPC status."""
    head = dict(headers)
    status = head.get(":status")
    tail = dict(trailers)
    if status != "200":
        raise PodResourcesError("pod-resources: %s answered %s with HTTP status %s" % (where, method, status))
    if "grpc-status" not in tail:
        raise PodResourcesError("pod-resources: %s answered %s without grpc-status" % (where, method))
    try:
        code = int(tail["grpc-status"])
    except ValueError:
        raise PodResourcesError("pod-resources: %s answered %s with grpc-status %r" % (where, method, tail["grpc-status"])) from None
    text = urllib.parse.unquote(tail.get("grpc-message", ""))
    if code != 0:
        hint = " (%s)" % UNIMPLEMENTED_HINTS.get(method, "this kubelet does not serve it") if code == UNIMPLEMENTED else ""
        raise PodResourcesError(
            "pod-resources: %s answered %s with gRPC status %s (%d)%s%s" % (where, method, GRPC_CODES.get(code, "?"), code, ": " + text if text else "", hint),
            grpc_status=code, grpc_message=text,
        )  # fmt: skip
    if not head.get("content-type", "").startswith("application/grpc"):
        raise PodResourcesError("pod-resources: %s answered %s with content-type %r" % (where, method, head.get("content-type")))
    messages = grpc_messages(body)
    if len(messages) != 1:
        raise PodResourcesError("pod-resources: %s answered the unary %s with %d messages" % (where, method, len(messages)))
    return messages[0]


def call(socket_path, method, message=b"", timeout=DEFAULT_TIMEOUT, window=DEFAULT_WINDOW):
    """The answer message of ``/v1.PodResourcesLister/<method>`` on ``socket_path``, within ``timeout`` seconds."""
    where = "the pod-resources API at %s" % socket_path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as error:
            raise PodResourcesUnavailable("pod-resources API not available: %s: %s" % (socket_path, error.strerror)) from None
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
                raise PodResourcesUnavailable("pod-resources API not available: %s: %s" % (socket_path, error.strerror)) from None
            hint = " (reading it needs root on the node)" if error.errno in (errno.EACCES, errno.EPERM) else ""
            raise PodResourcesError("pod-resources: cannot connect to %s: %s%s" % (socket_path, error.strerror or error, hint)) from None
        try:
            headers, body, trailers = exchange(sock, "/%s/%s" % (SERVICE, method), message, timeout, where=where, window=window)
        except socket.timeout:  # noqa: UP041 - not TimeoutError before Python 3.10, and nodes may run 3.8
            raise PodResourcesError("pod-resources: %s did not answer %s within %gs" % (where, method, timeout)) from None
        except OSError as error:
            raise PodResourcesError("pod-resources: %s: %s failed: %s" % (where, method, error.strerror or error)) from None
        return grpc_result(method, headers, body, trailers, where)
    finally:
        sock.close()


# ---------------------------------------------------------------------------------------------
# protobuf wire format (protobuf.dev/programming-guides/encoding) for api.proto's answers

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# field number: (name, kind, repeated, submessage schema); k8s.io/kubelet/pkg/apis/podresources/v1/api.proto
NUMA_NODE = {1: ("ID", "int64", False, None)}
TOPOLOGY = {1: ("nodes", "message", True, NUMA_NODE)}
CONTAINER_DEVICES = {
    1: ("resource_name", "string", False, None),
    2: ("device_ids", "string", True, None),
    3: ("topology", "message", False, TOPOLOGY),
}
CONTAINER_MEMORY = {
    1: ("memory_type", "string", False, None),
    2: ("size", "uint64", False, None),
    3: ("topology", "message", False, TOPOLOGY),
}
CDI_DEVICE = {1: ("name", "string", False, None)}
CLAIM_RESOURCE = {  # 5 share_id is skipped
    1: ("cdi_devices", "message", True, CDI_DEVICE),
    2: ("driver_name", "string", False, None),
    3: ("pool_name", "string", False, None),
    4: ("device_name", "string", False, None),
}
DYNAMIC_RESOURCE = {
    2: ("claim_name", "string", False, None),
    3: ("claim_namespace", "string", False, None),
    4: ("claim_resources", "message", True, CLAIM_RESOURCE),
}
CONTAINER_RESOURCES = {
    1: ("name", "string", False, None),
    2: ("devices", "message", True, CONTAINER_DEVICES),
    3: ("cpu_ids", "int64", True, None),
    4: ("memory", "message", True, CONTAINER_MEMORY),
    # DRA claims (the kubelet fills them with its KubeletPodResourcesDynamicResources feature gate): decoded so that
    # callers can tell that devices reached a container another way than through a device plugin.
    5: ("dynamic_resources", "message", True, DYNAMIC_RESOURCE),
}
POD_RESOURCES = {
    1: ("name", "string", False, None),
    2: ("namespace", "string", False, None),
    3: ("containers", "message", True, CONTAINER_RESOURCES),
}
LIST_RESPONSE = {1: ("pod_resources", "message", True, POD_RESOURCES)}
ALLOCATABLE_RESPONSE = {
    1: ("devices", "message", True, CONTAINER_DEVICES),
    2: ("cpu_ids", "int64", True, None),
    3: ("memory", "message", True, CONTAINER_MEMORY),
}
_DEFAULTS = {"string": "", "int64": 0, "uint64": 0, "message": None}


def _varint(data, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise PodResourcesError("pod-resources: protobuf: truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise PodResourcesError("pod-resources: protobuf: varint longer than 10 bytes")


def _scalar(kind, value):
    if kind == "int64":
        value &= (1 << 64) - 1
        return value - (1 << 64) if value >> 63 else value
    return value & ((1 << 64) - 1)


def decode_message(data, schema, depth=0):
    """A message as a dict with every schema field (repeated: a list; unset scalars: proto3 defaults)."""
    if depth > 16:
        raise PodResourcesError("pod-resources: protobuf: messages nested too deep")
    out = {name: ([] if repeated else _DEFAULTS[kind]) for name, kind, repeated, _sub in schema.values()}
    pos = 0
    data = memoryview(data)
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        field = schema.get(number)
        if wire == VARINT:
            value, pos = _varint(data, pos)
            if field and field[1] in ("int64", "uint64"):
                value = _scalar(field[1], value)
                if field[2]:
                    out[field[0]].append(value)
                else:
                    out[field[0]] = value
        elif wire == LEN:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise PodResourcesError("pod-resources: protobuf: field %d runs past the message" % number)
            chunk, pos = data[pos : pos + length], pos + length
            if not field:
                continue
            name, kind, repeated, sub = field
            if kind == "string":
                value = bytes(chunk).decode("utf-8", "replace")
            elif kind == "message":
                value = decode_message(chunk, sub, depth + 1)
            else:  # packed repeated varints
                inner = 0
                while inner < len(chunk):
                    item, inner = _varint(chunk, inner)
                    out[name].append(_scalar(kind, item))
                continue
            if repeated:
                out[name].append(value)
            else:
                out[name] = value
        elif wire == I64:
            pos += 8
        elif wire == I32:
            pos += 4
        else:
            raise PodResourcesError("pod-resources: protobuf: wire type %d (field %d) is not supported" % (wire, number))
        if pos > len(data):
            raise PodResourcesError("pod-resources: protobuf: field %d runs past the message" % number)
    return out


# ---------------------------------------------------------------------------------------------
# The API


def list_pod_resources(socket_path=DEFAULT_SOCKET, timeout=DEFAULT_TIMEOUT):
    """List: [{name, namespace, containers: [{name, devices: [{resource_name, device_ids, topology}], cpu_ids, memory,
    dynamic_resources: [{claim_name, claim_namespace, claim_resources: [{cdi_devices, driver_name, pool_name, device_name}]}]}]}]."""
    return decode_message(call(socket_path, "List", b"", timeout), LIST_RESPONSE)["pod_resources"]


def get_allocatable_resources(socket_path=DEFAULT_SOCKET, timeout=DEFAULT_TIMEOUT):
    """GetAllocatableResources: {devices: [{resource_name, device_ids, topology}], cpu_ids, memory}."""
    return decode_message(call(socket_path, "GetAllocatableResources", b"", timeout), ALLOCATABLE_RESPONSE)


def available(socket_path):
    """Whether a unix socket is at ``socket_path`` (something may listen on it)."""
    try:
        return stat.S_ISSOCK(os.stat(socket_path).st_mode)
    except OSError:
        return False
