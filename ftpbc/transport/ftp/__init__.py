"""FTP and FTPS (explicit ``AUTH TLS`` + ``PROT P``, or implicit TLS): :class:`FTPTransport`.

The package, one job per module, each importing only those above it in this list:

* :mod:`~ftpbc.transport.ftp.listing` - MLSD/MLST/LIST lines parsed into entries; pure (no I/O)
  and public; says what a listing refuses and why;
* :mod:`~ftpbc.transport.ftp.control` - the control connection: a session, its replies bounded
  in time and size, connecting, logging in, closing; running an operation on a pooled session
  (its errors mapped at the boundary, retried where that is safe);
* :mod:`~ftpbc.transport.ftp.data` - data connections: passive mode, the TLS data channel, the
  minimum transfer rate, files and listings read or written through them;
* :mod:`~ftpbc.transport.ftp.transport` - :class:`FTPTransport`, the
  :class:`~ftpbc.transport.base.Transport` itself: commands, retries, error mapping at the
  boundary (:mod:`ftpbc.transport.errormap`), the listing strategies.

Only :class:`FTPTransport` (and the listing module) are meant for code outside the package.
"""

from ftpbc.transport.ftp.transport import FTPTransport

__all__ = ["FTPTransport"]
