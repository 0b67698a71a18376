"""The Python client: send one-way messages, make requests and wait for their responses.

    with ftpbc.Client.from_config("ftpbc.yaml") as client:
        answer = client.request("quote", b"EURUSD", timeout=10)
        name = client.send("audit", b"...")          # one-way; returns the remote file name
        uid = client.submit("quote", b"GBPUSD")     # request now, collect later (any process)
        answer = client.collect("quote", uid, timeout=30)
        m = client.receive("audit", timeout=10)      # pull a one-way message; m.ack() or m.nack()
        client.publish("orders", b"...")            # to every subscription of a topic (docs/topics.md)
        with client.subscribe("orders", name="audit") as deliveries: ...

One response poller per endpoint serves every outstanding request of this process: one listing
of ``outbox`` finds all the responses that have arrived, whatever the number of waiting threads.
While requests are outstanding it polls soon after a poll that found nothing (backing off up to
``poll_interval``); with none outstanding it sends nothing at all.

``Client(..., metrics=True)`` counts requests sent, responses received (error and expiry
replies among them), timeouts, round-trip seconds and requests in flight in a Prometheus
registry of its own (:attr:`Client.metrics_registry`); ``metrics_port=N`` also serves it on
``http://127.0.0.1:N/metrics`` (see docs/operating.md).
"""

from ftpbc.client.api import Client

__all__ = ["Client"]
