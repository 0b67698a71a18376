"""The real peer: kombu's filesystem transport doing ftpbc's ``file://`` one-way work.

kombu writes each message in place (no stage, no journal, no fsync) into one folder and a
consumer reads and deletes it (or moves it to ``processed_folder`` with ``store_processed``).
A kill between kombu's read and its ack loses the message; ftpbc stages, journals and renames.
Same message count, same body size, same disk as the ftpbc side.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def local_oneway(spec: dict[str, Any]) -> dict[str, Any]:
    from kombu import Connection

    p = spec["params"]
    root = Path(spec["target"]["root"])
    folders = {"data_folder_in": str(root / "data"), "data_folder_out": str(root / "data"),
               "processed_folder": str(root / "processed"), "store_processed": True,
               "control_folder": str(root / "control")}
    for key in ("data_folder_in", "processed_folder", "control_folder"):
        Path(str(folders[key])).mkdir(parents=True, exist_ok=True)
    body = os.urandom(p["size"])
    with Connection("filesystem://", transport_options=folders) as conn:
        q = conn.SimpleQueue("bench")
        raw = {"content_type": "application/data", "content_encoding": "binary"}  # no serializer
        q.put(body, **raw)  # warm-up, consumed below with the others
        began = time.perf_counter()
        for _ in range(p["count"]):
            q.put(body, **raw)
        send_s = time.perf_counter() - began
        got = 0
        began = time.perf_counter()
        while got < p["count"] + 1:
            msg = q.get(block=True, timeout=10)
            msg.ack()
            got += 1
        recv_s = time.perf_counter() - began
        q.close()
    return {"send_rate": p["count"] / send_s, "consume_rate": got / recv_s}


CASES = {"local_oneway": local_oneway}
