"""A server whose sessions die (vsftpd answering ``500 OOPS:`` while it restarts) is a dropped
connection, not a refusal: the operation goes again on a fresh session, a caller is not failed
with a protocol error, and a message read at that moment is not charged a delivery."""

from __future__ import annotations

import ftplib
import io

import pytest

from ftpbc.errors import ConnectionLost, OutcomeUnknown, ProtocolError
from ftpbc.transport import open_transport
from ftpbc.transport.errormap import translate_ftp_reply
from tests.servers.handle import ServerHandle


def test_a_get_on_a_session_whose_helper_died_is_repeated_on_a_fresh_one(vsftpd_server: ServerHandle) -> None:
    directory = vsftpd_server.fresh_dir()
    with open_transport(vsftpd_server.config()) as t:
        t.put(f"{directory}/msg", io.BytesIO(b"payload"))
        t.list(directory)  # the pooled session is open and idle
        vsftpd_server.controls["kill_session_helpers"]()
        # That session now answers PASV with "500 OOPS: priv_sock_send_cmd" and closes.
        got = io.BytesIO()
        assert t.get(f"{directory}/msg", got) == len(b"payload")
        assert got.getvalue() == b"payload"
        assert [e.name for e in t.list(directory)] == ["msg"]


@pytest.mark.parametrize(("sent", "expected"), [(False, ConnectionLost), (True, OutcomeUnknown)])
def test_oops_is_a_dropped_session_whether_or_not_a_command_went_out(
        sent: bool, expected: type[Exception]) -> None:
    error = translate_ftp_reply(ftplib.error_perm("500 OOPS: priv_sock_send_cmd"), server="s", sent=sent)
    assert type(error) is expected
    assert "500 OOPS: priv_sock_send_cmd" in str(error)


def test_oops_for_an_allocation_is_still_a_refusal_of_the_command() -> None:
    # vsftpd refuses a listing too large to hold this way; the box is then listed by slices.
    error = translate_ftp_reply(ftplib.error_perm("500 OOPS: malloc"), server="s", sent=False)
    assert isinstance(error, ProtocolError)
