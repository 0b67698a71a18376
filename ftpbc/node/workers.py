"""A fixed number of worker threads fed from one queue: where a poller's claims are handled.

:class:`concurrent.futures.ThreadPoolExecutor` would do the same, but each ``submit`` builds a
``Future`` (with its ``Condition``) and a work item, and looks for an idle thread through a
semaphore; the worker then marks the future running and sets its result, each under a lock.
All of that happens once per message, half of it on the poller's thread, which bounds how fast a
node claims.  A poller needs none of it: its jobs report through its own counters, never through
a future.

Guaranteed:

* at most ``size`` jobs run at once, and jobs start in the order they were submitted;
* threads are started on demand, up to ``size`` (an endpoint that never gets a message starts
  none), and an idle thread is reused before a new one is started;
* a job that raises is logged with its traceback and its thread goes on with the next one;
* after :meth:`shutdown`, jobs not yet started are dropped, every thread exits once its
  current job returns, and :meth:`submit` raises ``RuntimeError``.

Not guaranteed: :meth:`shutdown` does not wait for running jobs (the poller drains its own
in-flight count first), and threads are daemons, so a job still running when the process exits
is cut short, as the executor's would be.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ftpbc.workers")

_Job = tuple[Callable[..., object], tuple[Any, ...]]


class Workers:
    """Up to ``size`` daemon threads named ``<name>_<n>`` running submitted jobs."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"workers must be at least 1, got {size}")
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: threads waiting for a job and not yet promised one by a submit
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on a worker thread (queued while all ``size`` are busy)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: workers are shut down")
            self._queue.put((fn, args))
            if self._idle > 0:
                self._idle -= 1  # that thread takes this job: no new thread needed
                return
            if len(self._threads) < self.size:
                thread = threading.Thread(target=self._loop, name=f"{self.name}_{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def shutdown(self) -> None:
        """Drop the jobs not started and let every thread exit after its current job."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            for _ in self._threads:
                self._queue.put(None)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except BaseException:  # the boundary of this thread: logged, and on to the next job
                log.exception("%s: a job failed", self.name)
            with self._lock:
                self._idle += 1


__all__ = ["Workers"]
