"""What a TLS listing costs against a plain one, on pure-ftpd and ProFTPD, with and without
TCP_QUICKACK on the client's TLS data connections.

Starts each server twice (plain, and TLS-only) with the test rig's context managers, puts
``--entries`` small files in one directory, and times ``--listings`` listings of it through
ftpbc's FTP transport (one pooled session: EPSV, MLSD, the TLS handshake of the data connection
where there is one, the transfer, ``226``).  "quickack off" replaces ftpbc's ``quickack``
(``transport/ftp/data.py``) with a no-op, which is how listings ran before it existed.  Prints
p50 and p90 per row, and how much slower TLS is than plain at p50.

    python3 bench/bench_tls_listing.py --listings 300

Needs root and the servers unpacked by ``.ci/run`` (``/opt/ftpbc-servers``).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ftpbc.transport.ftp.data as ftp_data
from ftpbc.config.servers import ServerConfig
from ftpbc.transport import open_transport
from tests.servers.process import ServerInstance
from tests.servers.proftpd import proftpd_binary, running_proftpd
from tests.servers.pureftpd import pureftpd_binary, running_pureftpd
from tests.servers.pyftpd import TLSMaterial, make_tls_material

#: passive ranges of their own, so a test run on this machine at the same time is not disturbed
PASV = {("pure-ftpd", False): (30000, 30199), ("pure-ftpd", True): (30200, 30399),
        ("ProFTPD", False): (30400, 30599), ("ProFTPD", True): (30600, 30799)}

Starter = Callable[[Path, tuple[int, int], TLSMaterial | None], AbstractContextManager[ServerInstance]]


def _starters() -> dict[str, Starter]:
    pure, pro = pureftpd_binary(), proftpd_binary()
    return {
        "pure-ftpd": lambda work, pasv, tls: running_pureftpd(pure, work, passive=pasv, tls=tls,
                                                              label="bench-pureftpd"),
        "ProFTPD": lambda work, pasv, tls: running_proftpd(pro, work, passive=pasv, tls=tls,
                                                           label="bench-proftpd"),
    }


def _time_listings(cfg: ServerConfig, path: str, listings: int) -> list[float]:
    with open_transport(cfg) as t:
        for _ in range(20):  # warm up: login, FEAT, TLS session, caches
            t.list(path)
        times = []
        for _ in range(listings):
            began = time.perf_counter()
            t.list(path)
            times.append(time.perf_counter() - began)
        return times


@contextmanager
def quickack(enabled: bool) -> Iterator[None]:
    """ftpbc as it is (enabled), or with TCP_QUICKACK never set, as before it existed."""
    original = ftp_data.quickack
    if not enabled:
        ftp_data.quickack = lambda conn: None
    try:
        yield
    finally:
        ftp_data.quickack = original


def _p(times: list[float], q: int) -> float:
    return statistics.quantiles(times, n=100)[q - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listings", type=int, default=300, help="timed listings per row")
    parser.add_argument("--entries", type=int, default=20, help="files in the listed directory")
    args = parser.parse_args()
    if not hasattr(socket, "TCP_QUICKACK"):
        print("note: this platform has no TCP_QUICKACK; both settings run the same code")
    rows = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="ftpbc-bench-tls-") as tmp:
        work = Path(tmp)
        tls = make_tls_material(work / "tls")
        for name, start in _starters().items():
            p50 = {}
            for secure in (False, True):
                inst = stack.enter_context(start(work / f"{name}-{secure}", PASV[name, secure],
                                                 tls if secure else None))
                listed = inst.root / "listed"
                listed.mkdir(mode=0o777)
                for i in range(args.entries):
                    (listed / f"msg{i:04d}").write_bytes(b"x" * 100)
                handle = inst.handle(name, scheme="ftps" if secure else "ftp",
                                     options={"ca_file": tls.ca_file} if secure else None)
                for quick in (False, True):
                    with quickack(quick):
                        times = _time_listings(handle.config(), "/listed", args.listings)
                    label = "TLS" if secure else "plain"
                    p50[label, quick] = _p(times, 50)
                    rows.append((name, label, "on" if quick else "off", _p(times, 50), _p(times, 90)))
            for quick in (False, True):
                rows.append((name, "TLS - plain", "on" if quick else "off",
                             p50["TLS", quick] - p50["plain", quick], float("nan")))
    print(f"{args.listings} listings of {args.entries} entries per row, one session, p50/p90 in ms")
    print(f"{'server':10} {'listing':12} {'quickack':8} {'p50':>8} {'p90':>8}")
    for name, label, quick, a, b in rows:
        print(f"{name:10} {label:12} {quick:8} {a:8.2f} {b:8.2f}".replace("nan", "   -"))


if __name__ == "__main__":
    main()
