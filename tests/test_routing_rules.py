"""The pure half of routing: rulesets (ftpbc.routing.rules), URI templates and destination URIs
(ftpbc.routing.templates), and the ``routes:`` configuration they are loaded from."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ftpbc.config.loader import parse_config
from ftpbc.config.routes import AllowList, Fence, match_server
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
    # a missing value is a failure...
    with pytest.raises(TemplateError, match=r"##port## is missing; write ##port:-## in the template"):
        wmq.render(values(HostName="h", QueueName="q1"))
    # ... unless the template gives it a default: empty here, and the substitution drops the lone ':'
    optional = UriTemplate.parse(["ftp://app@##HostName##", ":##port:-##", "/queues/##QueueName##"],
                                 [None, "s/^:$//"])
    assert optional.render(values(HostName="h", QueueName="q1")) == "ftp://app@h/queues/q1"
    assert optional.render(values(HostName="h", port="21", QueueName="q1")) == "ftp://app@h:21/queues/q1"


def test_null_templates_let_several_substitutions_edit_one_text() -> None:
    t = UriTemplate.parse(["topic:##TopicName:-##", None, None],
                          ["s/\\./_/g", "s/^topic:$/topic:none/", None])
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


#: every category a value may not hold, not only ASCII controls: C1 (U+0085 NEL), line and paragraph
#: separators, format characters (zero width space, right-to-left override, byte order mark)
UNICODE_BREAKERS = ["\u0085", "\u2028", "\u2029", "\u200b", "\u202e", "\ufeff", "\x7f"]


@pytest.mark.parametrize("char", UNICODE_BREAKERS)
def test_values_and_paths_refuse_every_control_and_format_character(char: str) -> None:
    t = UriTemplate.parse(["file:///routes/##asset##"])
    code = re.escape(f"U+{ord(char):04X}")
    with pytest.raises(TemplateError, match=f"##asset## .* contains a control or format character {code}"):
        t.render(values(asset=f"a{char}b"))
    # nor can a URL smuggle one in percent-encoded (decoded before it is checked)
    encoded = "".join(f"%{b:02X}" for b in char.encode("utf-8"))
    with pytest.raises(TemplateError, match=f"the path holds a control or format character {code}"):
        parse_destination(f"ftp://h/in/a{encoded}b")
    with pytest.raises(TemplateError, match="control or format character"):  # nor a default
        UriTemplate.parse([f"file:///routes/##asset:-a{char}##"])


def test_a_missing_or_empty_value_fails_unless_the_template_gives_a_default() -> None:
    t = UriTemplate.parse(["file:///routes/", "##asset##"])
    with pytest.raises(TemplateError, match="##asset## is missing"):
        t.render(values())  # never file:///routes/, the parent directory
    with pytest.raises(TemplateError, match="##asset## is empty"):
        t.render(values(asset=""))
    assert UriTemplate.parse(["file:///routes/", "##asset:-##"]).render(values()) == "file:///routes/"
    assert UriTemplate.parse(["file:///r/##asset:-none##"]).render(values(asset="")) == "file:///r/none"
    assert UriTemplate.parse(["file:///r/##asset:-none##"]).render(values(asset="a1")) == "file:///r/a1"
    with pytest.raises(TemplateError, match=r"'\.\.'"):
        UriTemplate.parse(["file:///r/##asset:-../x##"])


@pytest.mark.parametrize("templates, subs, kind", [
    (["endpoint:##name##"], [], "endpoint"), (["topic:", "##t##"], [None, "s/x/y/"], "topic"),
    (["topic:##t##", None], [None, "s/^topic:/file:\\/\\/\\//"], None),  # edited while current
    (["topic:x"], ["s/^topic:/ftp:/"], None), (["##uri##"], [], None), (["file:///x/##a##"], [], None),
])
def test_a_template_fixed_to_endpoints_or_topics_is_known_as_such(templates: list[str | None],
                                                                   subs: list[str | None],
                                                                   kind: str | None) -> None:
    assert UriTemplate.parse(templates, subs).fixed_kind() == kind


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
    ("r: {source: events, rulesets: [{name: a, uri_template: ['endpoint:audit']}]}\n"
     "  q: {source: events, rulesets: [{name: a, uri_template: ['endpoint:audit']}]}", "source of route"),
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
    # each templated directory ruleset declares where it may deliver: nothing else is allowed
    assert route.rulesets[0].allow == ("sftp://app@127.0.0.1:2222/srv/in",)
    tcp = AllowList.of(route.rulesets[0].allow, config.servers)
    for uri in ("ftp://app@127.0.0.1:2121/exchange/flow/inbox", "sftp://app@127.0.0.1:2222/srv/agents/x"):
        target = parse_destination(uri)
        assert not tcp.permits(target, match_server(config.servers, target)), uri
    assert [(r.name, r.allow) for r in route.rulesets if r.compiled().template.templated and not r.allow] == [
        ("wmq_t", None)]  # a topic template: only this file's topics
    assert where(short_name="Other") == (None, None)
    assert (route.failure, route.nohit) == ("endpoint:failed", "ftp://app@127.0.0.1:2121/exchange/nohit")


# --------------------------------------------------------------------------- the fence

FENCE_BASE = """
servers:
  s: {url: "file:///tmp/ftpbc-routes"}
  other: {url: "file:///tmp/ftpbc-other"}
endpoints:
  events: {server: s, repository: /events}
  audit: {server: s, repository: /audit}
topics:
  news: {server: s, repository: /topics/news}
"""


def fence_config(ruleset: str, route_extra: str = "") -> Any:
    return parse_config(FENCE_BASE + f"""
routes:
  r:
    source: events{route_extra}
    rulesets:
      - {ruleset}
""", source="ftpbc.yaml")


@pytest.mark.parametrize("ruleset, key, message", [
    # a destination from message values without an allow list
    ("{name: own, uri_template: ['##uri##']}", "routes.r.rulesets.0.uri_template",
     "ruleset 'own' builds its destination from message properties (##uri##) and declares no allow list"),
    ("{name: a, uri_template: ['file:///tmp/ftpbc-routes/out/', '##asset##']}",
     "routes.r.rulesets.0.uri_template", "declares no allow list"),
    # allow entries that name nothing configured, or an exchange area
    ("{name: a, uri_template: ['##uri##'], allow: ['ftp://app@h:21/x']}", "routes.r.rulesets.0.allow.0",
     "matches no configured server"),
    ("{name: a, uri_template: ['##uri##'], allow: ['endpoint:nope']}", "routes.r.rulesets.0.allow.0",
     "unknown endpoint"),
    ("{name: a, uri_template: ['##uri##'], allow: ['file:///tmp/ftpbc-routes/out', "
     "'file:///tmp/ftpbc-routes/audit/inbox']}", "routes.r.rulesets.0.allow.1",
     "lies inside the exchange area of endpoint 'audit'"),
    ("{name: a, uri_template: ['##uri##'], allow: []}", "routes.r.rulesets.0.allow", "empty list"),
    ("{name: a, uri_template: ['##uri##'], allow: ['file:///x/##a##']}", "routes.r.rulesets.0.allow",
     "no ##name## templates"),
    # fixed destinations inside an endpoint's or a topic's area, by any server name that reaches it
    ("{name: a, uri_template: ['file:///tmp/ftpbc-routes/audit/inbox']}", "routes.r.rulesets.0.uri_template",
     "lies inside the exchange area of endpoint 'audit'"),
    ("{name: a, uri_template: ['file:///tmp/ftpbc-routes/audit']}", "routes.r.rulesets.0.uri_template",
     "endpoint 'audit'"),
    ("{name: a, uri_template: ['file:///tmp/ftpbc-routes/topics/news/incoming/inbox']}",
     "routes.r.rulesets.0.uri_template", "topic 'news'"),
    ("{name: a, uri_template: ['file:///tmp/ftpbc-routes/events/inerror']}",
     "routes.r.rulesets.0.uri_template", "endpoint 'events'"),
    ("{name: a, uri_template: ['endpoint:nope']}", "routes.r.rulesets.0.uri_template", "unknown endpoint"),
    ("{name: a, uri_template: ['endpoint:events']}", "routes.r.rulesets.0.uri_template", "own source"),
    ("{name: a, uri_template: ['http://x/']}", "routes.r.rulesets.0.uri_template", "expected endpoint"),
])
def test_destinations_outside_the_fence_are_refused_at_load_naming_the_key(ruleset: str, key: str,
                                                                           message: str) -> None:
    with pytest.raises(ConfigError) as info:
        fence_config(ruleset)
    text = str(info.value)
    assert "\n" not in text and text.startswith("ftpbc.yaml:"), text
    assert f"{key}: " in text and message in text, text


def test_an_allow_entry_refused_is_shown_at_its_own_line() -> None:
    text = FENCE_BASE + """
routes:
  r:
    source: events
    rulesets:
      - name: a
        uri_template: ['##uri##']
        allow:
          - file:///tmp/ftpbc-routes/out
          - file:///tmp/ftpbc-routes/audit/inbox
"""
    line = text.splitlines().index("          - file:///tmp/ftpbc-routes/audit/inbox") + 1
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="ftpbc.yaml")
    assert str(info.value).startswith(f"ftpbc.yaml:{line}: routes.r.rulesets.0.allow.1: "), str(info.value)


def test_outlinks_inside_an_exchange_area_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"routes\.r\.failure: .* lies inside the exchange area of endpoint "
                                          "'audit'"):
        fence_config("{name: a, uri_template: ['endpoint:audit']}",
                     "\n    failure: file:///tmp/ftpbc-routes/audit/inbox")


def test_destinations_inside_the_fence_load() -> None:
    config = fence_config("{name: a, uri_template: ['##uri##'], allow: ['file:///tmp/ftpbc-routes/out', "
                          "'endpoint:audit', 'topic:news']}")
    assert config.routes["r"].rulesets[0].allow is not None
    fence_config("{name: a, uri_template: ['endpoint:##x##']}")  # endpoints and topics only: no list needed
    fence_config("{name: a, uri_template: ['topic:', '##x##'], uri_substitution: [null, 's/a/b/']}")
    fence_config("{name: a, uri_template: ['file:///tmp/ftpbc-routes/eventsX']}")  # beside, not inside
    fence_config("{name: a, uri_template: ['file:///tmp/ftpbc-routes']}")  # above the areas


def test_an_allow_list_admits_its_directories_and_below_and_its_names_only() -> None:
    config = fence_config("{name: a, uri_template: ['##uri##'], allow: ['file:///tmp/ftpbc-routes/out', "
                          "'endpoint:audit']}")
    allow = AllowList.of(config.routes["r"].rulesets[0].allow or (), config.servers)
    fence = Fence.of(config.servers, config.endpoints, config.topics)

    def permits(uri: str) -> bool:
        target = parse_destination(uri)
        found = match_server(config.servers, target) if target.kind == "directory" else None
        return allow.permits(target, found)

    assert permits("file:///tmp/ftpbc-routes/out") and permits("file:///tmp/ftpbc-routes/out/a/b")
    assert permits("endpoint:audit")
    assert not permits("file:///tmp/ftpbc-routes/outside") and not permits("file:///tmp/ftpbc-routes")
    assert not permits("endpoint:events") and not permits("topic:news")
    assert not permits("file:///tmp/ftpbc-other/out")  # another server entirely
    assert fence.area_holding("s", "/audit") == "endpoint 'audit'"
    assert fence.area_holding("s", "/audit/inbox/x") == "endpoint 'audit'"
    assert fence.area_holding("s", "/auditX") is None and fence.area_holding("s", "/") is None
    assert fence.area_holding("other", "/audit") is None


def test_the_fence_sees_one_place_whichever_server_name_reaches_it() -> None:
    servers = {"app": ServerConfig.from_url("ftp://app@127.0.0.1:2121/", password="pw", name="app"),
               "tls": ServerConfig.from_url("ftps://ops@127.0.0.1:2121/exchange", password="pw", name="tls"),
               "far": ServerConfig.from_url("ftp://app@127.0.0.2:2121/", password="pw", name="far")}
    areas: dict[str, Any] = {"audit": parse_config(FENCE_BASE).endpoints["audit"].model_copy(
        update={"server": "app", "repository": "/exchange/audit"})}
    fence = Fence.of(servers, areas, {})
    assert fence.area_holding("tls", "/audit/inbox") == "endpoint 'audit'"  # another user, the same place
    assert fence.area_holding("app", "/exchange/audit/instage") == "endpoint 'audit'"
    assert fence.area_holding("far", "/exchange/audit/inbox") is None  # another host
