# SPDX-License-Identifier: GPL-3.0-or-later
"""A small Kubernetes API server double for the device_plugin cases of the hostile-input harness.

It answers LISTs and GETs from ``objects`` (by API path), or with ``override[path]`` (raw bytes: what a broken or
hostile server sends), 404 otherwise; it answers every PATCH/POST/PUT/DELETE with the object it was sent.  A request
with ``dryRun=All`` changes nothing; every other changing request is recorded in ``mutations``, so the harness can
tell a refusal that changed the cluster (a PATCH before the error) from one that did not.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import yaml


class FakeApiServer:
    def __init__(self):
        self.objects = {}  # API path of a collection or object -> object (a list path -> list of items)
        self.override = {}  # API path -> raw answer bytes
        self.mutations = []
        self.written = {}  # API path -> the last object a changing request sent there
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def kubeconfig(self, path):
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fuzz",
            "clusters": [{"name": "fuzz", "cluster": {"server": self.url}}],
            "users": [{"name": "fuzz", "user": {"token": "fuzz"}}],
            "contexts": [{"name": "fuzz", "context": {"cluster": "fuzz", "user": "fuzz"}}]}))
        return str(path)

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's name)
                path = urlparse(self.path).path
                if path in fake.override:
                    return self._send(200, fake.override[path])
                if path in fake.objects:
                    value = fake.objects[path]
                    if isinstance(value, list):
                        return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": value})
                    return self._send(200, value)
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                                        "message": "%s not found" % path})

            def _change(self):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                if not isinstance(body, dict):
                    body = {}
                if "All" not in parse_qs(url.query).get("dryRun", []):
                    fake.mutations.append("%s %s" % (self.command, url.path))
                    fake.written[url.path] = body
                body.setdefault("metadata", {}).setdefault("resourceVersion", "2")
                return self._send(200 if self.command != "POST" else 201, body)

            do_PATCH = do_POST = do_PUT = do_DELETE = _change  # noqa: N815

        return Handler
