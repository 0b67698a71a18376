"""The pure half of routing: rulesets (ftpbc.routing.rules), URI templates and destination URIs
(ftpbc.routing.templates), and the ``routes:`` configuration they are loaded from."""

from __future__ import annotations

from typing import Any

import pytest

from ftpbc.config.loader import parse_config
from ftpbc.config.routes import match_server
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConfigError
from ftpbc.routing.rules import RuleError, Ruleset, first_match, with_defaults
from ftpbc.routing.templates import (
    MAX_URI,
    MAX_VALUE,
    Substitution,
    Target,
    TemplateError,
    UriTemplate,
    parse_destination,
)


def values(**kv: str) -> Any:
    return kv.get


# --------------------------------------------------------------------------- templates


def test_templates_append_by_position_and_substitutions_edit_the_current_text() -> None:
    wmq = UriTemplate.parse(["ftp://app@##HostName##", ":##port##", "/queues/##QueueName##"],
                            [None, "s/^:$//"])
    assert wmq.render(values(HostName="h", port="2121", QueueName="q1")) == "ftp://app@h:2121/queues/q1"
    # a missing value is empty, and the substitution drops the lone ':'
    assert wmq.render(values(HostName="h", QueueName="q1")) == "ftp://app@h/queues/q1"


def test_null_templates_let_several_substitutions_edit_one_text() -> None:
    t = UriTemplate.parse(["topic:##TopicName##", None, None], ["s/\\./_/g", "s/^topic:$/topic:none/", None])
    assert t.render(values(TopicName="a.b.c")) == "topic:a_b_c"
    assert t.render(values()) == "topic:none"


def test_the_seeds_escaped_slashes_and_flags() -> None:
    s = Substitution.parse("s/^wmq:\\/\\/$//")
    assert s.apply("wmq://") == "" and s.apply("wmq://x") == "wmq://x"
    assert Substitution.parse("s|A|b|gi").apply("aAa") == "bbb"
    assert Substitution.parse("s#(x)#<\\1>#").apply("xx") == "<x>x"


@pytest.mark.parametrize("bad", ["s/a/b", "x/a/b/", "s/(/b/", "s/a/b/q", "s/a/\\9/"])
def test_bad_substitutions_are_refused_with_their_text(bad: str) -> None:
    with pytest.raises(TemplateError, match="substitution"):
        Substitution.parse(bad)


@pytest.mark.parametrize("value, why", [("../etc", "'..'"), ("a/../b", "'..'"), ("x\x00y", "control"),
                                        ("line\nbreak", "control"),
                                        ("x" * (MAX_VALUE + 1), "over the limit")])
def test_hostile_values_are_refused_never_substituted(value: str, why: str) -> None:
    t = UriTemplate.parse(["file:///routes/##asset##"])
    with pytest.raises(TemplateError, match=why):
        t.render(values(asset=value))


def test_a_uri_cannot_grow_without_bound() -> None:
    t = UriTemplate.parse(["file:///r/##a##", *["##a##"] * (MAX_URI // MAX_VALUE)])
    with pytest.raises(TemplateError, match="grows past"):
        t.render(values(a="x" * MAX_VALUE))


# --------------------------------------------------------------------------- destinations


def test_destination_uris() -> None:
    assert parse_destination("endpoint:audit") == Target("endpoint", name="audit")
    assert parse_destination("topic:orders") == Target("topic", name="orders")
    d = parse_destination("sftp://app@Host.Example:2222/in/./a//b/")
    assert (d.kind, d.scheme, d.user, d.host, d.port, d.path) == ("directory", "sftp", "app", "host.example",
                                                                  2222, "/in/a/b")
    assert parse_destination("file:///srv/x").path == "/srv/x"


@pytest.mark.parametrize("uri, why", [
    ("ftp://app:secret@h/x", "password"), ("ftp://h/a/../b", "climbs"), ("ftp://h/a/%2e%2e/b", "climbs"),
    ("ftp://h/a%00b", "control"), ("http://h/x", "expected endpoint"), ("endpoint:a/b", "endpoint name"),
    ("ftp://h/x?y=1", "no query"), ("file://host/x", "names no host"), ("ftp:///x", "names no host"),
    ("ftp://h/" + "x" * 300, "longer than"),
])
def test_bad_destinations_are_refused(uri: str, why: str) -> None:
    with pytest.raises(TemplateError, match=why) as info:
        parse_destination(uri)
    assert "secret" not in str(info.value)


def test_a_url_matches_a_configured_server_by_scheme_host_port_and_user() -> None:
    servers = {"a": ServerConfig.from_url("ftp://app@127.0.0.1:2121/base", password="pw", name="a"),
               "b": ServerConfig.from_url("sftp://app@127.0.0.1:2222", password="pw", name="b"),
               "c": ServerConfig.from_url("file:///srv/exchange", name="c")}
    assert match_server(servers, parse_destination("ftp://app@127.0.0.1:2121/base/x")) == ("a", "/x")
    assert match_server(servers, parse_destination("ftp://127.0.0.1:2121/base/x")) == ("a", "/x")
    assert match_server(servers, parse_destination("ftp://other@127.0.0.1:2121/base/x")) is None
    assert match_server(servers, parse_destination("ftp://app@127.0.0.1:2121/elsewhere")) is None
    assert match_server(servers, parse_destination("ftp://app@127.0.0.1/base/x")) is None  # port 21
    assert match_server(servers, parse_destination("sftp://app@127.0.0.1:2222/d")) == ("b", "/d")
    assert match_server(servers, parse_destination("file:///srv/exchange/in")) == ("c", "/in")
    assert match_server(servers, parse_destination("file:///srv/exchangeX")) is None


# --------------------------------------------------------------------------- rulesets


def rs(name: str, **kw: Any) -> Ruleset:
    return Ruleset.compile(name, uri_template=kw.pop("uri_template", [f"endpoint:{name}"]), **kw)


def test_any_group_matching_all_its_properties_selects_and_exclusions_win() -> None:
    agent = rs("agent", properties=[{"short_name": "^Agent$", "asset": "^[^:]*$"}, {"kind2": "^x$"}],
               exclude=[{"asset": "^test"}])
    assert agent.selects(values(short_name="Agent", asset="web1"), str)
    assert agent.selects(values(kind2="x"), str)
    assert not agent.selects(values(short_name="Agent", asset="a:b"), str)
    assert not agent.selects(values(short_name="Agent"), str)  # a missing property does not match
    assert not agent.selects(values(short_name="Agent", asset="testbox"), str)


def test_body_groups_are_read_only_when_needed_and_at_most_once() -> None:
    reads: list[int] = []

    def body() -> str:
        reads.append(1)
        return "ERROR disk full on web1"

    first = rs("p", properties=[{"a": "^1$"}])
    second = rs("b", body=[["ERROR", "disk"]], exclude_body=[["IGNORE"]])
    third = rs("c", body=[["WARN"]])
    assert first_match([first, second, third], values(a="1"), body) is first
    assert reads == []
    assert first_match([first, third, second], values(a="2"), body) is second
    assert reads == [1]
    assert first_match([first, third], values(a="2"), body) is None


def test_first_matching_ruleset_wins_in_order() -> None:
    a, b = rs("a", properties=[{"x": "."}]), rs("b", properties=[{"x": "."}])
    assert first_match([a, b], values(x="1"), str) is a
    assert first_match([b, a], values(x="1"), str) is b


def test_defaults_fill_what_the_message_lacks_only() -> None:
    r = rs("d", uri_template=["ftp://h", ":##port##", "/q"], uri_substitution=[None, "s/^:$//"],
           defaults={"port": 2121})
    assert r.uri(with_defaults(values(), r.defaults)) == "ftp://h:2121/q"
    assert r.uri(with_defaults(values(port="21"), r.defaults)) == "ftp://h:21/q"


@pytest.mark.parametrize("kw, key", [({"properties": [{"a": "("}]}, "properties[0].a"),
                                     ({"properties": [{}]}, "properties[0]"),
                                     ({"body": [["ok", "["]]}, "body[0][1]"),
                                     ({"uri_template": []}, "uri_template")])
def test_rulesets_that_do_not_compile_name_the_key(kw: dict[str, Any], key: str) -> None:
    with pytest.raises(RuleError, match=key.replace("[", r"\[").replace("]", r"\]")):
        rs("bad", **kw)


# --------------------------------------------------------------------------- configuration

BASE = """
servers:
  s: {url: "file:///tmp/ftpbc-routes"}
endpoints:
  events: {server: s, repository: /events}
  audit: {server: s, repository: /audit}
"""


def test_a_routes_section_loads() -> None:
    config = parse_config(BASE + """
routes:
  deliver:
    source: events
    nohit: endpoint:audit
    failure: file:///tmp/ftpbc-routes/failed
    rulesets:
      - {name: a, properties: [{x: "^1$"}], uri_template: ["endpoint:audit"], capacity: 2}
""")
    route = config.routes["deliver"]
    assert route.rulesets[0].capacity == 2 and route.max_retry == 2
    assert [r.name for r in route.compiled()] == ["a"]


@pytest.mark.parametrize("routes, message", [
    ("r: {source: nope, rulesets: [{name: a, uri_template: [x]}]}", "routes.r.source: unknown endpoint"),
    ("r: {source: events, nohit: 'endpoint:nope', rulesets: [{name: a, uri_template: [x]}]}",
     "routes.r.nohit: unknown endpoint"),
    ("r: {source: events, failure: 'ftp://app@h:21/x', rulesets: [{name: a, uri_template: [x]}]}",
     "matches no configured server"),
    ("r: {source: events, rulesets: [{name: a, properties: [{x: '('}], uri_template: [x]}]}",
     "bad regular expression"),
    ("r: {source: events, rulesets: [{name: a, uri_template: [x], uri_substitution: ['s/a']}]}",
     "substitution"),
    ("r: {source: events, rulesets: [{name: a, uri_template: [x]}, {name: a, uri_template: [y]}]}",
     "used twice"),
    ("r: {source: events, rulesets: []}", "at least one ruleset"),
    ("r: {source: events, rulesets: [{name: a, uri_template: [x]}]}\n"
     "  q: {source: events, rulesets: [{name: a, uri_template: [x]}]}", "source of route"),
])
def test_bad_routes_are_one_line_naming_the_key(routes: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(BASE + "routes:\n  " + routes + "\n", source="ftpbc.yaml")
    assert "\n" not in str(info.value) and str(info.value).startswith("ftpbc.yaml")


def test_a_routed_endpoint_has_no_handler() -> None:
    with pytest.raises(ConfigError, match="has a handler"):
        parse_config(BASE.replace("repository: /events}", "repository: /events, handler: 'a.b:c'}") + """
routes:
  r: {source: events, rulesets: [{name: a, uri_template: ["endpoint:audit"]}]}
""")


# --------------------------------------------------------------------------- examples/routes.yaml


def test_the_example_routes_each_kind_of_message_where_its_comments_say(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from ftpbc.config.loader import load_config

    monkeypatch.setenv("HUB_PASSWORD", "x")
    monkeypatch.setenv("VAULT_PASSWORD", "y")
    config = load_config(Path(__file__).resolve().parent.parent / "examples" / "routes.yaml")
    route = config.routes["deliver"]
    rulesets = route.compiled()

    def where(**props: str) -> tuple[str | None, str | Target | tuple[str, str] | None]:
        ruleset = first_match(rulesets, values(**props), str)
        if ruleset is None:
            return None, None
        try:
            target = parse_destination(ruleset.uri(with_defaults(values(**props), ruleset.defaults)))
        except TemplateError as exc:
            return ruleset.name, str(exc)
        if target.kind != "directory":
            return ruleset.name, target.uri
        return ruleset.name, match_server(config.servers, target)

    assert where(asset="a1", uri="sftp://app@127.0.0.1:2222/srv/in") == ("tcp", ("vault", "/in"))
    assert where(short_name="Agent", asset="web1") == ("agent", ("vault", "/agents/web1"))
    assert where(short_name="Flow", asset="web2") == ("flow", "endpoint:flow")
    assert where(short_name="Console", asset="web3") == ("console", ("hub", "/exchange/console/web3"))
    assert where(HostName="127.0.0.1", QueueName="Q1") == ("wmq_q", ("hub", "/exchange/queues/Q1"))
    assert where(HostName="127.0.0.1", QueueName="Q1", port="2222") == ("wmq_q", None)  # no ftp server there
    assert where(HostName="h", TopicName="orders.eu") == ("wmq_t", "topic:orders_eu")
    assert where(short_name="Agent", asset="../x")[1] == "##asset## '../x' contains '..'"
    assert where(short_name="Other") == (None, None)
    assert (route.failure, route.nohit) == ("endpoint:failed", "ftp://app@127.0.0.1:2121/exchange/nohit")
