#!/usr/bin/env python3
"""A partner that speaks the ftpbc exchange protocol with nothing but Python's ftplib.

It does not import ftpbc: it shows what a system written in any language must do to send a
request to an endpoint served by ftpbc nodes and collect the answer.

    FTPBC_PASSWORD=... python examples/foreign_producer.py --port 2121 \\
        --repository /exchange/quote EURUSD

The protocol, for a request with a fresh UUID::

    STOR  <repo>/instage/req.<uuid>              upload where no provider looks
    RNFR  <repo>/instage/req.<uuid>              publish atomically: a provider never sees
    RNTO  <repo>/inbox/req.<uuid>                  a half-written request
    NLST  <repo>/outbox                          poll until resp.<uuid> (or resp.<uuid>.error)
    RNFR  <repo>/outbox/resp.<uuid>              claim it: the rename succeeds for one collector
    RNTO  <repo>/outselect/resp.<uuid>~<me>
    RETR  <repo>/outselect/resp.<uuid>~<me>      read the answer
    RNFR  <repo>/outselect/resp.<uuid>~<me>      archive it, naming who collected it and when
    RNTO  <repo>/outarchive/resp.<uuid>~<me>~<yyyymmddThhmmss.mmmZ>

``resp.<uuid>.error`` instead of ``resp.<uuid>`` means the provider's handler failed; its body is
the reason.  Exit status: 0 answer printed, 3 no answer in time, 4 error reply, 2 FTP failure.
"""

from __future__ import annotations

import argparse
import ftplib
import io
import os
import posixpath
import sys
import time
import uuid
from datetime import UTC, datetime

ERROR_SUFFIX = ".error"


class NoResponse(Exception):
    """Nothing answered in time (not TimeoutError: a socket timeout is one, and means FTP trouble)."""


def archive_stamp() -> str:
    now = datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z"


def list_names(ftp: ftplib.FTP, directory: str) -> list[str]:
    try:
        return [posixpath.basename(n) for n in ftp.nlst(directory)]
    except ftplib.error_perm as exc:
        if str(exc).startswith("550"):  # some servers answer an empty listing with 550
            return []
        raise


def request(ftp: ftplib.FTP, repository: str, body: bytes, *, me: str, timeout: float,
            poll: float = 0.05) -> tuple[bytes, bool]:
    """Send ``body`` as a request, wait for the answer; (body, is_error_reply)."""
    uid = str(uuid.uuid4())
    name = f"req.{uid}"
    staged = f"{repository}/instage/{name}"
    ftp.storbinary(f"STOR {staged}", io.BytesIO(body))
    ftp.rename(staged, f"{repository}/inbox/{name}")

    wanted = {f"resp.{uid}": False, f"resp.{uid}{ERROR_SUFFIX}": True}
    deadline = time.monotonic() + timeout
    while True:
        found = [n for n in list_names(ftp, f"{repository}/outbox") if n in wanted]
        if found:
            response = found[0]
            break
        if time.monotonic() > deadline:
            raise NoResponse(f"no response to {name} in {repository}/outbox within {timeout:g} s")
        time.sleep(poll)

    claimed = f"{repository}/outselect/{response}~{me}"
    ftp.rename(f"{repository}/outbox/{response}", claimed)  # error_perm here: another collector won
    buf = io.BytesIO()
    ftp.retrbinary(f"RETR {claimed}", buf.write)
    ftp.rename(claimed, f"{repository}/outarchive/{response}~{me}~{archive_stamp()}")
    return buf.getvalue(), wanted[response]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("body", help="the request body (text)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=21)
    parser.add_argument("--user", default="ftpbc")
    parser.add_argument("--password-env", default="FTPBC_PASSWORD",
                        help="environment variable holding the password")
    parser.add_argument("--repository", required=True, help="the endpoint's repository, e.g. /exchange/quote")
    parser.add_argument("--id", default="foreign", help="this partner's name in claimed/archived file names")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)

    password = os.environ.get(args.password_env)
    if password is None:
        print(f"foreign_producer: environment variable {args.password_env} is not set", file=sys.stderr)
        return 2
    try:
        with ftplib.FTP() as ftp:
            ftp.connect(args.host, args.port, timeout=10)
            ftp.login(args.user, password)
            ftp.voidcmd("TYPE I")
            answer, is_error = request(ftp, args.repository.rstrip("/"), args.body.encode("utf-8"),
                                       me=args.id, timeout=args.timeout)
    except NoResponse as exc:
        print(f"foreign_producer: {exc}", file=sys.stderr)
        return 3
    except (ftplib.Error, OSError) as exc:
        print(f"foreign_producer: ftp://{args.user}@{args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    if is_error:
        print(f"foreign_producer: error reply: {answer.decode('utf-8', 'replace')}", file=sys.stderr)
        return 4
    sys.stdout.write(answer.decode("utf-8", "replace") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
