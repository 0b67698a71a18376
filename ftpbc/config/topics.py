"""``topics:``: publish/subscribe destinations (docs/topics.md).

A topic has one repository on one server::

    <repository>/incoming/                 the topic's own exchange area: publishers send here
    <repository>/subscriptions/<SUB>/      one exchange area per subscription (its inbox, ...)
    <repository>/subscriptions/<SUB>.subscription   the subscription's marker (the registry)
    <repository>/fanout/<SUB>/             copies being staged by a fanning-out node

Both kinds of area are addressed as *derived endpoints*: the topic's name is its incoming area
(so a plain send to it is a publish), and ``TOPIC/SUB`` is a subscription's area.  Their
:class:`~ftpbc.config.models.EndpointConfig` is computed here from the topic's settings, so the
one message lifecycle (send, claim, receive, recovery, sweeper, browse, dlq) serves them as it
serves endpoints.  ``models`` builds those endpoint configurations (this module imports nothing
of ``models``, which holds the topics), and compiles the selectors declared here at load.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ftpbc.config.area import AREA_KEYS, AreaSettings, Workers

T = TypeVar("T")

#: a subscription's name: a directory name of its own (no leading dot, no ``/`` or ``~``)
SUBSCRIPTION_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")
#: ``TOPIC/SUB`` names subscription SUB of topic TOPIC wherever an endpoint name is taken
SEPARATOR = "/"
#: the parts of a topic's repository
INCOMING = "incoming"
SUBSCRIPTIONS = "subscriptions"
FANOUT = "fanout"
MARKER_SUFFIX = ".subscription"


def check_subscription_name(name: str) -> str:
    if not SUBSCRIPTION_RE.fullmatch(name):
        raise ValueError(f"subscription name {name!r} must be 1-64 characters of A-Z a-z 0-9 . _ - "
                         "and not start with '.'")
    return name


def split_name(name: str) -> tuple[str, str | None]:
    """``("orders", "audit")`` from ``"orders/audit"``; ``(name, None)`` without a ``/``."""
    topic, sep, sub = name.partition(SEPARATOR)
    return (topic, sub) if sep else (name, None)


class SubscriptionConfig(BaseModel):
    """A durable subscription declared in the configuration: created when a node starts."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    #: a JMS message selector: only the messages it selects are copied to this subscription
    #: (compiled when the configuration is loaded: see ``models.Config``)
    selector: str | None = None
    #: declared subscriptions are durable; non-durable ones belong to a running subscriber
    #: (``client.subscribe(..., durable=False)``)
    durable: bool = True

    @field_validator("durable")
    @classmethod
    def _only_durable(cls, v: bool) -> bool:
        if not v:
            raise ValueError("subscriptions in the configuration are durable; a non-durable one is made "
                             "by its subscriber (client.subscribe(topic, durable=False))")
        return v


class TopicConfig(AreaSettings):
    """A publish/subscribe topic (docs/topics.md).  Poll settings apply to the fan-out of its
    incoming area by serving nodes; the area settings to the incoming and subscription areas."""

    subscriptions: dict[str, SubscriptionConfig] = Field(default_factory=dict)
    #: ``ftpbc serve`` fans this topic out (false: leave it to other nodes)
    fanout: bool = True
    workers: Workers = 2

    #: derived endpoint configurations, by key (see :meth:`derived`)
    _derived: dict[str, Any] = PrivateAttr(default_factory=dict)
    _derived_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @field_validator("subscriptions")
    @classmethod
    def _names(cls, v: dict[str, SubscriptionConfig]) -> dict[str, SubscriptionConfig]:
        for name in v:
            check_subscription_name(name)
        return v

    def area_settings(self) -> dict[str, Any]:
        """The settings the topic's areas take as endpoints (server and repository aside)."""
        return {k: getattr(self, k) for k in AREA_KEYS}

    @property
    def incoming_dir(self) -> str:
        return f"{self.repository.rstrip('/')}/{INCOMING}"

    def subscription_dir(self, name: str) -> str:
        return f"{self.subscriptions_dir}/{name}"

    @property
    def subscriptions_dir(self) -> str:
        return f"{self.repository.rstrip('/')}/{SUBSCRIPTIONS}"

    @property
    def fanout_dir(self) -> str:
        return f"{self.repository.rstrip('/')}/{FANOUT}"

    def derived(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` once per key and process: Runtime.lifecycle asks for an endpoint's
        configuration per message, and deriving one validates it again."""
        found = self._derived.get(key)
        if found is None:
            with self._derived_lock:
                found = self._derived.get(key)
                if found is None:
                    found = self._derived[key] = make()
        return found  # type: ignore[no-any-return]


__all__ = ["SEPARATOR", "SUBSCRIPTION_RE", "SubscriptionConfig", "TopicConfig", "check_subscription_name",
           "split_name"]
