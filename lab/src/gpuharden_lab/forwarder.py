# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the host's kube-apiserver reachable at 127.0.0.1:<port> inside each lab node.

The listening sockets are created inside the nodes' network namespaces (setns, then back), while
this process stays in the host's namespace and connects to the apiserver on the host's loopback.
So the control plane never listens on anything but 127.0.0.1, and every byte stays on loopback.

  python -m gpuharden_lab.forwarder --target 127.0.0.1:6443 --listen-port 6443 /run/netns/<ns> ...
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import socket

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def listen_in_netns(netns_path: str, port: int) -> socket.socket:
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
            listener.setblocking(False)
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    return listener


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _serve(listeners: list[socket.socket], host: str, port: int) -> None:
    async def handle(client_reader, client_writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))

    servers = [await asyncio.start_server(handle, sock=listener) for listener in listeners]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port on the host's loopback")
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("netns", nargs="+", help="network namespace files (/run/netns/NAME)")
    args = parser.parse_args(argv)
    host, _sep, port = args.target.rpartition(":")
    listeners = [listen_in_netns(path, args.listen_port) for path in args.netns]
    asyncio.run(_serve(listeners, host, int(port)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
