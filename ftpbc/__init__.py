"""ftpbc: exchange messages, one-way and request/response, through files on FTP, FTPS and SFTP
servers or a shared directory, with any number of cluster nodes competing for the work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Client", "Message", "Node", "__version__"]

if TYPE_CHECKING:
    from ftpbc.client import Client
    from ftpbc.exchange.message import Message
    from ftpbc.node.serve import Node


def __getattr__(name: str) -> Any:
    # Lazy, so `import ftpbc.errors` (and the CLI) does not pull in paramiko and pyftpdlib.
    if name == "Client":
        from ftpbc.client import Client

        return Client
    if name == "Message":
        from ftpbc.exchange.message import Message

        return Message
    if name == "Node":
        from ftpbc.node.serve import Node

        return Node
    raise AttributeError(f"module 'ftpbc' has no attribute {name!r}")
