"""A user-space FTP relay that delays, stalls and resets traffic, and a link switch for partitions.

The kernel these tests run on has no ``netem`` qdisc (nor ``prio``, ``matchall`` or ``gact``), so
delay and loss cannot be put on a veth.  Instead every FTP client reaches the server through
:class:`RelayProcess`: one ``python -m tests.faults_net`` process in the root namespace with one
listening port per *route* (a node's host, the clients), each forwarding to the real server.

What passes through a route
    The control connection byte for byte, except that the server's ``227`` (PASV) and ``229``
    (EPSV) replies are rewritten to a port of the relay's own, opened for that one transfer and
    forwarded to the server's passive port: the data connections of a route take the same faulty
    path as its commands.  Half-closes are forwarded (a STOR ends with the client's FIN).

What a fault does (:class:`LinkFault`, set per route at run time)
    ``delay`` plus ``uniform(0, jitter)`` seconds before every chunk, in each direction (and before
    connecting upstream).  A lost TCP segment is invisible above the socket: what the application
    sees is its retransmission, a stall of RTO (200 ms and more, doubling).  So loss is modelled
    as a stall of ``uniform(stall_min, stall_max)`` seconds with probability ``stall_p`` per chunk,
    and, with probability ``reset_p`` per chunk, a connection given up on: both of its sockets are
    reset (RST, ``SO_LINGER`` 0), as a peer whose retransmissions ran out would.  A chunk is
    whatever one read returned (up to 64 KiB), so a command and its reply are one chunk each.
    ``hold`` seconds more before a control reply that starts with one of ``held_replies``
    (vsftpd's ``226 Transfer complete``: the server has the whole file, the client does not know
    it yet); nothing else is slowed.

A partition is not the relay's: :func:`set_link` takes a host's ``eth0`` down in its namespace.
Its packets then go nowhere, in either direction: established connections hang until a timeout
ends them (no RST, no FIN), new ones fail at once (no route).  Up again, the address and its
route come back, and connections not yet given up on resume.

The control protocol (the parent's side is :class:`RelayProcess`): the relay prints one JSON line
``{"ready": {route: port}}``, then answers each JSON line on its stdin with one on its stdout:
``{"route": r, "fault": {...}}`` sets a route's fault (``null`` clears it),
``{"stats": true}`` returns each route's counters.  It exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 64 * 1024
#: how long a passive port opened by the relay waits for its one data connection
DATA_ACCEPT_TIMEOUT = 60.0
_EPSV = re.compile(rb"^229 (.*)\(\|\|\|(\d+)\|\)(.*)$", re.S)
_PASV = re.compile(rb"^227 (.*?)\(?(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)\)?(.*)$", re.S)


@dataclass(frozen=True)
class LinkFault:
    """What one route does to every chunk it forwards (module docstring); the default: nothing."""

    delay: float = 0.0
    jitter: float = 0.0
    stall_p: float = 0.0
    stall_min: float = 0.2
    stall_max: float = 1.0
    reset_p: float = 0.0
    #: control replies held ``hold`` seconds more: those starting with one of these
    held_replies: tuple[str, ...] = ()
    hold: float = 0.0

    def describe(self) -> str:
        return (f"delay {self.delay * 1000:.0f}+{self.jitter * 1000:.0f} ms, stalls {self.stall_p:.1%} "
                f"of {self.stall_min:g}-{self.stall_max:g} s, resets {self.reset_p:.2%} per chunk")


# ---------------------------------------------------------------------- the relay process


class _Reset(Exception):
    """A fault chose to give this connection up."""


@dataclass
class _Counters:
    connections: int = 0
    data_connections: int = 0
    refused: int = 0
    chunks: int = 0
    bytes: int = 0
    stalls: int = 0
    resets: int = 0
    delayed_s: float = 0.0


@dataclass
class _Route:
    name: str
    listen_host: str
    upstream: tuple[str, int]
    rng: random.Random
    fault: LinkFault = field(default_factory=LinkFault)
    counters: _Counters = field(default_factory=_Counters)
    port: int = 0

    async def hop(self, nbytes: int) -> None:
        """What this route's fault does to one chunk of ``nbytes`` bytes (0: a new connection)."""
        f = self.fault
        c = self.counters
        if nbytes:
            c.chunks += 1
            c.bytes += nbytes
        if f.reset_p and self.rng.random() < f.reset_p:
            c.resets += 1
            raise _Reset
        wait = f.delay + (self.rng.uniform(0, f.jitter) if f.jitter else 0.0)
        if f.stall_p and self.rng.random() < f.stall_p:
            c.stalls += 1
            wait += self.rng.uniform(f.stall_min, f.stall_max)
        if wait > 0:
            c.delayed_s += wait
            await asyncio.sleep(wait)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pair:
    """One relayed connection: the client's side and the server's side."""

    def __init__(self, route: _Route, down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 up: tuple[asyncio.StreamReader, asyncio.StreamWriter], control: bool) -> None:
        self.route = route
        self.down, self.up = down, up
        self.control = control

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._pump(self.down[0], self.up[1], rewrite=False)),
                 asyncio.create_task(self._pump(self.up[0], self.down[1], rewrite=self.control))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() is not None for t in done):
                for w in (self.down[1], self.up[1]):
                    _reset(w)
            else:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for t in tasks:
                t.cancel()
            for w in (self.down[1], self.up[1]):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    rewrite: bool) -> None:
        pending = b""
        while True:
            data = await reader.read(CHUNK)
            if not data:
                if pending:
                    writer.write(pending)
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            if rewrite:
                # Whole lines only: a 227/229 reply must be seen entire to be rewritten.
                pending += data
                cut = pending.rfind(b"\n") + 1
                if not cut:
                    continue
                data, pending = await self._rewrite(pending[:cut]), pending[cut:]
                await self._hold(data)
            await self.route.hop(len(data))
            writer.write(data)
            await writer.drain()

    async def _hold(self, block: bytes) -> None:
        """A control reply the route's fault holds (``held_replies``) waits ``hold`` seconds."""
        f = self.route.fault
        if f.hold > 0 and any(line.startswith(r.encode()) for r in f.held_replies
                              for line in block.splitlines()):
            self.route.counters.delayed_s += f.hold
            await asyncio.sleep(f.hold)

    async def _rewrite(self, block: bytes) -> bytes:
        out = []
        for line in block.splitlines(keepends=True):
            if m := _EPSV.match(line):
                port = await _open_data_port(self.route, int(m.group(2)))
                line = b"229 " + m.group(1) + b"(|||" + str(port).encode() + b"|)" + m.group(3)
            elif m := _PASV.match(line):
                server_port = int(m.group(6)) * 256 + int(m.group(7))
                port = await _open_data_port(self.route, server_port)
                host = self.route.listen_host.replace(".", ",").encode()
                line = (b"227 " + m.group(1) + b"(" + host + b"," + str(port // 256).encode() + b","
                        + str(port % 256).encode() + b")" + m.group(8))
            out.append(line)
        return b"".join(out)


async def _connect_up(route: _Route, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    await route.hop(0)
    reader, writer = await asyncio.open_connection(route.upstream[0], port)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def _serve(route: _Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 port: int, control: bool) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        up = await _connect_up(route, port)
    except (OSError, _Reset):
        route.counters.refused += 1
        _reset(writer)
        return
    await _Pair(route, (reader, writer), up, control).run()


async def _open_data_port(route: _Route, server_port: int) -> int:
    """A port of the relay's, forwarded to the server's passive ``server_port`` for one connection."""
    route.counters.data_connections += 1
    taken = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if taken.is_set():
            _reset(writer)  # one data connection per passive reply, as the server allows
            return
        taken.set()
        server.close()
        await _serve(route, reader, writer, server_port, control=False)

    server = await asyncio.start_server(accept, route.listen_host, 0)

    async def expire() -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(taken.wait(), DATA_ACCEPT_TIMEOUT)
        server.close()

    asyncio.get_running_loop().create_task(expire())
    return int(server.sockets[0].getsockname()[1])


async def _relay_main(listen: str, upstream: tuple[str, int], routes: list[str], seed: int) -> None:
    loop = asyncio.get_running_loop()
    table: dict[str, _Route] = {}
    for i, name in enumerate(routes):
        route = _Route(name, listen, upstream, random.Random(seed * 1000 + i))

        async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          route: _Route = route) -> None:
            route.counters.connections += 1
            await _serve(route, reader, writer, route.upstream[1], control=True)

        server = await asyncio.start_server(control, listen, 0)
        route.port = int(server.sockets[0].getsockname()[1])
        table[name] = route
    print(json.dumps({"ready": {n: r.port for n, r in table.items()}}), flush=True)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        cmd = json.loads(line)
        if cmd.get("stats"):
            reply: dict[str, Any] = {"stats": {n: asdict(r.counters) for n, r in table.items()}}
        else:
            fault = cmd["fault"]
            table[cmd["route"]].fault = (LinkFault(**{**fault, "held_replies": tuple(fault["held_replies"])})
                                         if fault else LinkFault())
            reply = {"ok": cmd["route"]}
        print(json.dumps(reply), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FTP relay with injected delay, stalls and resets")
    parser.add_argument("--listen", required=True, help="address the routes listen on")
    parser.add_argument("--upstream", required=True, help="the FTP server, host:port")
    parser.add_argument("--routes", required=True, help="comma-separated route names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    host, port = args.upstream.rsplit(":", 1)
    asyncio.run(_relay_main(args.listen, (host, int(port)), args.routes.split(","), args.seed))


# ---------------------------------------------------------------------- the parent's side


class RelayProcess:
    """The relay as a child process (module docstring); use as a context manager.

    ``ports`` maps each route to the port it listens on at ``listen``.
    """

    def __init__(self, listen: str, upstream: tuple[str, int], routes: list[str], *, seed: int,
                 log: Path, cwd: Path) -> None:
        self.listen = listen
        self.argv = [sys.executable, "-m", "tests.faults_net", "--listen", listen,
                     "--upstream", f"{upstream[0]}:{upstream[1]}", "--routes", ",".join(routes),
                     "--seed", str(seed)]
        self.log, self.cwd = log, cwd
        self.proc: subprocess.Popen[str] | None = None
        self.ports: dict[str, int] = {}
        self.faults: dict[str, LinkFault] = {r: LinkFault() for r in routes}
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()

    def __enter__(self) -> RelayProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(self.cwd),
                                                                         os.environ.get("PYTHONPATH")]))}
        with open(self.log, "ab") as err:
            # stdin is the control channel: the relay exits when it closes (this process gone).
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        threading.Thread(target=self._read, name="relay-stdout", daemon=True).start()
        try:
            self.ports = {k: int(v) for k, v in self._reply("ready", 30).items()}
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _reply(self, key: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise RuntimeError(f"the relay did not answer within {timeout:g} s "
                                   f"({self.log.read_text()[-2000:]})") from None
            if line is None:
                raise RuntimeError(f"the relay exited: {self.log.read_text()[-2000:]}")
            reply = json.loads(line)
            if key in reply:
                return reply[key]

    def _command(self, cmd: dict[str, Any], key: str) -> Any:
        with self._lock:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            return self._reply(key, 30)

    def set_fault(self, route: str, fault: LinkFault | None) -> None:
        """Set (None: clear) the fault of ``route``; returns once the relay applies it."""
        self._command({"route": route, "fault": asdict(fault) if fault else None}, "ok")
        self.faults[route] = fault or LinkFault()

    def stats(self) -> dict[str, dict[str, float]]:
        return dict(self._command({"stats": True}, "stats"))

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def set_link(netns: str, up: bool) -> None:
    """Take the ``eth0`` of a host's namespace ``netns`` down (a partition) or up again."""
    subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up" if up else "down"], check=True,
                   capture_output=True, timeout=30)


if __name__ == "__main__":
    main()
