"""``ftpbc ftpd`` as the issue spells it: --user NAME:PASSWORD, and FTPS with --tls-cert."""

from __future__ import annotations

import io
import signal
from pathlib import Path

from ftpbc.config.servers import ServerConfig
from ftpbc.transport import open_transport
from tests.servers.pyftpd import make_tls_material
from tests.support import free_port, ftpbc_env, popen_ftpbc, wait_until


def test_ftpd_serves_ftps_to_name_password_login_and_stops_on_sigterm(tmp_path: Path) -> None:
    tls = make_tls_material(tmp_path / "tls")
    port = free_port()
    log = tmp_path / "ftpd.log"
    proc = popen_ftpbc("ftpd", "--root", str(tmp_path / "root"), "--port", str(port),
                       "--user", "alice:s3cret-pw", "--tls-cert", str(tls.cert_file),
                       "--tls-key", str(tls.key_file), log=log, env=ftpbc_env())
    try:
        wait_until(lambda: "serving" in log.read_text() or proc.poll() is not None, timeout=20,
                   what="ftpbc ftpd to listen")
        assert proc.poll() is None, log.read_text()
        cfg = ServerConfig.from_url(f"ftps://alice@127.0.0.1:{port}/", password="s3cret-pw",
                                    ca_file=tls.ca_file)
        with open_transport(cfg) as t:  # certificate verified against the test CA
            t.mkdir("/a/b")
            t.put("/a/b/x", io.BytesIO(b"over tls"))
            out = io.BytesIO()
            t.get("/a/b/x", out)
        assert out.getvalue() == b"over tls"
        assert (tmp_path / "root" / "a" / "b" / "x").read_bytes() == b"over tls"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "ftps://alice@127.0.0.1" in log.read_text()
    assert "s3cret-pw" not in log.read_text()
