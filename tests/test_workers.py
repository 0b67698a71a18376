"""The worker threads a poller hands its claims to (ftpbc.node.workers): what its docstring
guarantees, checked with events and deadlines (no sleeps)."""

from __future__ import annotations

import logging
import threading

import pytest

from ftpbc.node.workers import Workers
from tests.support import wait_until


def test_at_most_size_jobs_run_at_once() -> None:
    workers = Workers(2, "t")
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            started.append(i)
        release.wait(10)

    try:
        for i in range(5):
            workers.submit(job, i)
        wait_until(lambda: len(started) == 2, timeout=5, what="two jobs running")
        # Two threads, both busy: the other three wait in the queue, not on new threads.
        assert len(workers._threads) == 2
        assert sorted(started) == [0, 1]
        release.set()
        wait_until(lambda: len(started) == 5, timeout=5, what="every job started")
        assert sorted(started) == [0, 1, 2, 3, 4]
    finally:
        release.set()
        workers.shutdown()


def test_jobs_start_in_the_order_they_were_submitted() -> None:
    workers = Workers(1, "t")
    release = threading.Event()
    order: list[int] = []
    try:
        workers.submit(release.wait, 10)  # holds the one thread while the others queue
        for i in range(20):
            workers.submit(order.append, i)
        release.set()
        wait_until(lambda: len(order) == 20, timeout=5, what="every job run")
        assert order == list(range(20))
    finally:
        release.set()
        workers.shutdown()


def test_an_idle_thread_is_reused_before_a_new_one_is_started() -> None:
    workers = Workers(4, "t")
    done = []
    try:
        for i in range(10):
            finished = threading.Event()
            workers.submit(lambda i=i, ev=finished: (done.append(i), ev.set()))
            assert finished.wait(5)
            wait_until(lambda: workers._idle == 1, timeout=5, what="the thread idle again")
        assert done == list(range(10))
        assert len(workers._threads) == 1
    finally:
        workers.shutdown()


def test_a_job_that_raises_is_logged_and_its_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    workers = Workers(1, "t")
    ran = threading.Event()

    def bad() -> None:
        raise ValueError("boom")

    try:
        with caplog.at_level(logging.ERROR, logger="ftpbc.workers"):
            workers.submit(bad)
            workers.submit(ran.set)
            assert ran.wait(5), "the job after a failing one never ran"
        assert any("a job failed" in r.getMessage() and r.exc_info for r in caplog.records)
        assert len(workers._threads) == 1
    finally:
        workers.shutdown()


def test_shutdown_drops_jobs_not_started_and_refuses_new_ones() -> None:
    workers = Workers(1, "t")
    release = threading.Event()
    running = threading.Event()
    late = threading.Event()

    def first() -> None:
        running.set()
        release.wait(10)

    workers.submit(first)
    assert running.wait(5)
    workers.submit(late.set)  # queued behind the running job
    workers.shutdown()
    release.set()
    thread = workers._threads[0]
    thread.join(5)
    assert not thread.is_alive(), "the thread did not exit after its job"
    assert not late.is_set(), "a job queued before the shutdown still ran"
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(late.set)


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Workers(0, "t")
