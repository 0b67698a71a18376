#!/usr/bin/env python3
"""Round trips per operation: ftpbc's FTP transport against bare ftplib across a slow link.

On loopback a round trip costs tens of microseconds, so how many of them an operation waits for
hardly shows; across a WAN it is most of an operation's time.  This puts a delay line between
the client and vsftpd: a proxy that holds every byte ``--delay`` seconds in each direction, on
the control connection and on every data connection (it rewrites the server's EPSV and PASV
replies to ports of its own).  It then times, one operation at a time on one session:

* ``put``: 1 KiB uploaded (ftpbc ``Transport.put``; the floor: ``EPSV``/``PASV``, ``STOR``,
  the ``150``, the data, the ``226``, as bench/floor/lean.py does it);
* ``get``: 1 KiB downloaded;
* ``rename``: one ``RNFR`` + ``RNTO``;
* ``send``: what a message costs its producer on the wire, a put into a stage directory and a
  rename into the box.

Each row prints the p50 in milliseconds and in round trips (p50 / (2 x delay)) for both, and
ftpbc's time over the floor's.

    python3 bench/bench_wan.py --delay 0.005 --ops 20

Needs vsftpd (``.ci/run`` installs it).
"""

from __future__ import annotations

import argparse
import io
import queue
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from floor.lean import LeanFTP  # noqa: E402
from servers import running  # noqa: E402

from ftpbc.config.servers import ServerConfig  # noqa: E402
from ftpbc.transport import open_transport  # noqa: E402

_EPSV = re.compile(rb"\(\|\|\|(\d+)\|\)")
_PASV = re.compile(rb"\((\d+),(\d+),(\d+),(\d+),(\d+),(\d+)\)")


class DelayLine:
    """A loopback TCP proxy that delivers every byte ``delay`` seconds after it arrived, both
    ways, control and data connections alike (passive replies are rewritten to ports it
    forwards)."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.sockets: list[socket.socket] = []
        self.port = self._listen(upstream[1], control=True)

    def _listen(self, upstream_port: int, *, control: bool) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        self.sockets.append(listener)

        def accept() -> None:
            while True:
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                server = socket.create_connection((self.upstream[0], upstream_port))
                for s in (client, server):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.sockets.append(s)
                self._line(client, server, None)
                self._line(server, client, self._rewrite if control else None)
                if not control:
                    listener.close()  # one data connection per passive reply
                    return

        threading.Thread(target=accept, daemon=True).start()
        return int(listener.getsockname()[1])

    def _rewrite(self, data: bytes) -> bytes:
        data = _EPSV.sub(lambda m: b"(|||%d|)" % self._listen(int(m[1]), control=False), data)
        return _PASV.sub(lambda m: self._pasv(m), data)

    def _pasv(self, m: re.Match[bytes]) -> bytes:
        port = self._listen(int(m[5]) * 256 + int(m[6]), control=False)
        return b"(127,0,0,1,%d,%d)" % (port // 256, port % 256)

    def _line(self, src: socket.socket, dst: socket.socket,
              rewrite: Callable[[bytes], bytes] | None) -> None:
        pending: queue.SimpleQueue[tuple[float, bytes | None]] = queue.SimpleQueue()

        def read() -> None:
            try:
                while data := src.recv(65536):
                    pending.put((time.monotonic() + self.delay, rewrite(data) if rewrite else data))
            except OSError:
                pass
            pending.put((time.monotonic() + self.delay, None))

        def write() -> None:
            while True:
                due, data = pending.get()
                # The delay line itself: each piece leaves when it is due, not a synchronisation.
                time.sleep(max(due - time.monotonic(), 0))
                try:
                    if data is None:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def _p50_ms(op: Callable[[int], object], count: int) -> float:
    op(-1)  # warm: the session, the directories
    times = []
    for i in range(count):
        t0 = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.005, help="seconds each way (default 0.005)")
    parser.add_argument("--ops", type=int, default=20, help="operations timed per row")
    args = parser.parse_args()
    body = b"m" * 1024
    rtt_ms = 2 * args.delay * 1000
    with tempfile.TemporaryDirectory(prefix="bench-wan-") as tmp, running(["vsftpd"], Path(tmp)) as targets:
        target: dict[str, Any] = targets["vsftpd"]
        line = DelayLine((target["host"], target["port"]), args.delay)
        root = Path(target["root"])
        for d in ("ours", "floor"):
            for sub in ("stage", "box"):
                (root / d / sub).mkdir(parents=True)
                (root / d / sub).chmod(0o777)
        (root / "src").write_bytes(body)
        (root / "src").chmod(0o666)
        ours = open_transport(ServerConfig.from_url(
            f"ftp://{target['user']}@127.0.0.1:{line.port}/", password=target["password"], name="wan"))
        floor = LeanFTP({**target, "host": "127.0.0.1", "port": line.port})

        def send_ours(i: int) -> None:
            ours.put(f"/ours/stage/s{i}", io.BytesIO(body))
            ours.rename(f"/ours/stage/s{i}", f"/ours/box/s{i}")

        def send_floor(i: int) -> None:
            floor.put(f"/floor/stage/s{i}", body)
            floor.rename(f"/floor/stage/s{i}", f"/floor/box/s{i}")

        try:
            rows: list[tuple[str, Callable[[int], object], Callable[[int], object]]] = [
                ("put 1 KiB", lambda i: ours.put(f"/ours/stage/p{i}", io.BytesIO(body)),
                 lambda i: floor.put(f"/floor/stage/p{i}", body)),
                ("get 1 KiB", lambda i: ours.get("/src", io.BytesIO()), lambda i: floor.get("/src")),
                ("rename", lambda i: ours.rename(f"/ours/stage/p{i}", f"/ours/box/p{i}"),
                 lambda i: floor.rename(f"/floor/stage/p{i}", f"/floor/box/p{i}")),
                ("send (put + rename)", send_ours, send_floor),
            ]
            print(f"vsftpd behind a delay line: {rtt_ms:g} ms round trip, {args.ops} operations a row, p50")
            print(f"{'operation':22} {'ftpbc ms':>9} {'(RTTs)':>7} {'floor ms':>9} {'(RTTs)':>7} "
                  f"{'ftpbc / floor':>14}")
            for label, mine, bare in rows:
                a, b = _p50_ms(mine, args.ops), _p50_ms(bare, args.ops)
                print(f"{label:22} {a:9.1f} {a / rtt_ms:7.2f} {b:9.1f} {b / rtt_ms:7.2f} {a / b:14.2f}")
        finally:
            ours.close()
            floor.close()
            line.close()


if __name__ == "__main__":
    main()
