"""The command line in every corner a new user runs into.

Log options on every command, progress bars only on a terminal, ``ftpbc request``'s output and
input, ``Client.collect`` of an id with nothing to wait for, ``--json`` and option placement,
one-line errors for what is missing here, handler modules from named directories only, help
texts whole and in one style, and the README's table of commands.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
import socket
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from ftpbc.analytics import compact as compact_module
from ftpbc.analytics import mirror as mirror_module
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, sources_from_config
from ftpbc.cli import LAZY_COMMANDS, asked_format, cli, summary
from ftpbc.client import Client
from ftpbc.config.loader import load_config
from ftpbc.errors import RequestTimeout, UnknownRequest
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.support import FTPBC, ftpbc_env, popen_ftpbc, run_ftpbc, wait_until
from tests.test_bad_input import GOOD, main_in_process, one_line, write

REPO = Path(__file__).resolve().parent.parent


def echo(message: Message) -> bytes:
    return b"re:" + message.body


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(tmp_path, GOOD)


@pytest.fixture
def serving(config: Path) -> Iterator[Path]:
    """A node serving ``quote`` with :func:`echo`, in this process."""
    with Node(load_config(config, node_id="provider"), handlers={"quote": echo}):
        yield config


def json_records(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each of which must be a JSON object (there must be one)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    return [json.loads(line) for line in lines]


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``stderr`` (each must parse); the command's own lines are skipped."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def all_commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path the group offers, at any depth: ``("send",)``, ``("dlq",)``,
    ``("dlq", "list")``... (walked, not listed: a command added later is in it)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from all_commands(command, (*path, name))


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command | None = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), name)
    assert command is not None
    return command


# --------------------------------------------------------------------------- 1. log options


@pytest.mark.parametrize("before", [True, False], ids=["before-the-command", "after-it"])
def test_log_lines_are_json_with_log_format_json(config: Path, before: bool) -> None:
    """A request that times out logs its withdrawal; with --log-format json (given before or
    after the subcommand) that line is a JSON object with the node and the message."""
    args = ["request", "-c", str(config), "quote", "--data", "x", "--timeout", "0.2"]
    options = ["--log-format", "json", "--log-level", "info"]
    result = main_in_process(*(options + args if before else args + options))
    assert result.returncode == 3, result.stderr
    logged = json_lines(result.stderr)
    withdrawn = [r for r in logged if "withdrawn" in r["message"]]
    assert withdrawn, result.stderr
    assert withdrawn[0]["level"] == "info" and withdrawn[0]["node"] == load_config(config).node.id
    # in-process, the root logger is handed back as it was when the command is done
    assert not any(getattr(h, "_ftpbc", False) for h in logging.getLogger().handlers)


def test_log_level_warning_drops_info_lines(config: Path) -> None:
    result = main_in_process("request", "-c", str(config), "quote", "--data", "x", "--timeout", "0.2",
                             "--log-format", "json", "--log-level", "warning")
    assert result.returncode == 3
    assert not [r for r in json_lines(result.stderr) if r["level"] == "info"], result.stderr


def test_one_shot_commands_log_warnings_only_by_default(config: Path) -> None:
    """Without --log-level, a one-shot command's stderr is its own message, no line per step."""
    result = main_in_process("request", "-c", str(config), "quote", "--data", "x", "--timeout", "0.2",
                             env={"FTPBC_LOG_LEVEL": None})
    assert result.returncode == 3
    assert one_line(result).startswith("ftpbc: timeout: endpoint 'quote'")


@pytest.mark.parametrize("path", list(all_commands()), ids=" ".join)
def test_every_command_takes_the_log_options(path: tuple[str, ...]) -> None:
    result = main_in_process(*path, "--log-level", "debug", "--log-format", "json", "-v", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--log-level [debug|info|warning|error]", "-v, --verbose", "--log-format [text|json]"):
        assert option in result.stdout, f"ftpbc {' '.join(path)} --help: no {option}"


@pytest.mark.parametrize("path", list(all_commands()), ids=" ".join)
def test_every_command_line_click_cannot_parse_fails_in_json(path: tuple[str, ...]) -> None:
    """Click stops at the unknown option before it takes the --log-format after it: the
    error is still the one JSON object on stderr."""
    result = main_in_process(*path, "--log-format", "json", "--no-such-option")
    assert result.returncode == 2, result.stderr
    [line] = json_records(result.stderr)
    assert line["level"] == "error" and line["error"] == "NoSuchOption", line
    assert "--no-such-option" in line["message"]


def config_commands() -> Iterator[tuple[str, ...]]:
    """Every command that does its work on a configuration (``-c``), groups left out."""
    for path in all_commands():
        command = command_at(path)
        if not isinstance(command, click.Group) and any(p.name == "config_path" for p in command.params):
            yield path


@pytest.mark.parametrize("path", list(config_commands()), ids=" ".join)
def test_every_command_that_fails_logs_and_ends_in_json(path: tuple[str, ...], tmp_path: Path) -> None:
    """Its arguments given, a configuration that is not there: at debug, every line on stderr,
    the final error included, is one JSON object, and the last one says what failed."""
    command = command_at(path)
    arguments = ["1" for p in command.params if isinstance(p, click.Argument) and p.required]
    if any(p.name == "data" for p in command.params):
        arguments += ["--data", "x"]  # the body is checked before the configuration is read
    missing = tmp_path / "nope.yaml"
    result = main_in_process(*path, *arguments, "-c", str(missing), "--log-format", "json",
                             "--log-level", "debug", env={"FTPBC_LOG_FORMAT": None})
    assert result.returncode == 2, result.stderr
    *_, last = json_records(result.stderr)
    assert last == {**last, "level": "error", "error": "ConfigError",
                    "message": f"{missing}: configuration file not found"}


def test_the_last_log_format_asked_for_is_found_in_a_command_line_click_cannot_parse() -> None:
    assert asked_format(["send", "--log-format", "text", "--bogus", "--log-format=json"]) == "json"
    assert asked_format(["send", "--bogus", "--log-format", "yaml"]) is None
    assert asked_format(["send", "--bogus", "--", "--log-format", "json"]) is None
    assert asked_format(["send", "--bogus", "--log-format"]) is None


# --------------------------------------------------------------------------- 2. progress bars


class FakeBar:
    """Stands in for tqdm: records how it was made and what it was told."""

    made: list[FakeBar] = []

    def __init__(self, iterable: Any = None, **kwargs: Any) -> None:
        self.iterable = iterable
        self.kwargs = kwargs
        self.events: list[tuple[str, Any]] = []
        FakeBar.made.append(self)

    def __enter__(self) -> FakeBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.events.append(("postfix", text))

    def update(self, n: int = 1) -> None:
        self.events.append(("update", n))


@pytest.fixture
def fake_tqdm(monkeypatch: pytest.MonkeyPatch) -> list[FakeBar]:
    import tqdm

    FakeBar.made = []
    monkeypatch.setattr(tqdm, "tqdm", FakeBar)
    return FakeBar.made


def fake_stderr(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    stream = io.StringIO()
    stream.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", stream)


class NoTransport:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "log-file"])
def test_mirror_bar_only_on_a_terminal_and_labels_each_folder_with_its_own_count(
        config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_tqdm: list[FakeBar],
        tty: bool) -> None:
    sources = sources_from_config(load_config(config), ())
    found = {folder: i + 1 for i, folder in enumerate(ARCHIVE_FOLDERS)}  # a different count each

    def mirror_folder(t: object, source: object, folder: str, root: Path, stats: Any) -> None:
        stats.new += found[folder]

    monkeypatch.setattr(mirror_module, "open_transport", lambda server: NoTransport())
    monkeypatch.setattr(mirror_module, "mirror_folder", mirror_folder)
    fake_stderr(monkeypatch, tty)
    stats = mirror_module.update_mirror(tmp_path / "mirror", sources, progress=True)
    assert stats.new == sum(found.values())
    (bar,) = fake_tqdm
    assert bar.kwargs["disable"] is (not tty)
    assert bar.kwargs["total"] == len(ARCHIVE_FOLDERS)
    # after each folder: its label with its own count, then the bar moves on by one
    expected: list[tuple[str, Any]] = []
    total = 0
    for folder in ARCHIVE_FOLDERS:
        total += found[folder]
        expected += [("postfix", f"quote/{folder} new={found[folder]} total={total}"), ("update", 1)]
    assert bar.events == expected


def test_no_bar_when_not_asked_for_even_on_a_terminal(config: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      fake_tqdm: list[FakeBar]) -> None:
    fake_stderr(monkeypatch, True)
    mirror_module.update_mirror(tmp_path / "mirror", [], progress=False)
    assert fake_tqdm[0].kwargs["disable"] is True


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "log-file"])
def test_compaction_bar_only_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           fake_tqdm: list[FakeBar], tty: bool) -> None:
    fake_stderr(monkeypatch, tty)
    compact_module.compact([], tmp_path / "compacted", tmp_path / "journals", progress=True)
    (bar,) = fake_tqdm
    assert bar.kwargs["disable"] is (not tty)


# --------------------------------------------------------------------------- 3. request, aggregate


def test_request_ends_with_a_newline_on_a_terminal_only(serving: Path) -> None:
    args = [*FTPBC, "request", "-c", str(serving), "quote", "--data", "hi"]
    piped = subprocess.run(args, env=ftpbc_env(), capture_output=True, timeout=60, check=False)
    assert (piped.returncode, piped.stdout) == (0, b"re:hi"), piped.stderr  # exact bytes
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(args, env=ftpbc_env(), stdout=terminal, stderr=subprocess.PIPE, timeout=60,
                              check=False)
        os.close(terminal)
        terminal = -1
        assert proc.returncode == 0, proc.stderr
        out = b""
        while True:
            try:
                chunk = os.read(controller, 1024)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    assert out == b"re:hi\r\n"  # the terminal turns the newline into CR LF


def test_data_that_is_not_utf8_is_sent_as_its_bytes(config: Path, tmp_path: Path) -> None:
    # How Python hands over an argument with the byte 0xE9 in a UTF-8 locale: a lone surrogate.
    typed = os.fsdecode(b"caf\xe9")
    result = main_in_process("send", "-c", str(config), "quote", "--data", typed)
    assert result.returncode == 0, result.stderr
    sent = tmp_path / "exchange" / result.stdout.strip().lstrip("/")
    assert sent.read_bytes() == b"caf\xe9"


@pytest.mark.parametrize("timeout", ["0", "-1"])
def test_request_timeout_must_be_positive(config: Path, timeout: str) -> None:
    result = main_in_process("request", "-c", str(config), "quote", "--data", "x", "--timeout", timeout)
    assert result.returncode == 2
    assert "--timeout" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("since", ["2026-03-02", "2026-03-01T00:00"])
def test_aggregate_since_not_before_until_is_refused(config: Path, since: str) -> None:
    result = main_in_process("aggregate", "-c", str(config), "--since", since, "--until", "2026-03-01")
    assert result.returncode == 2
    assert one_line(result) == (f"ftpbc: error: --since '{since}' is not before --until '2026-03-01': "
                                "no submit time is in between")


# --------------------------------------------------------------------------- 4. Client.collect


def test_collect_of_an_id_never_sent_fails_at_once(config: Path) -> None:
    with Client(load_config(config, node_id="c1")) as client, \
            pytest.raises(UnknownRequest, match="not submitted by this client"):
        client.collect("quote", str(uuidlib.uuid4()), timeout=600)  # no 600 s wait


def test_collect_twice_fails_at_once_the_second_time(serving: Path) -> None:
    with Client(load_config(serving, node_id="c1")) as client:
        uid = client.submit("quote", b"x")
        assert client.collect("quote", uid, timeout=30) == b"re:x"
        with pytest.raises(UnknownRequest, match="already collected"):
            client.collect("quote", uid, timeout=600)
        answer = client.request("quote", b"y", timeout=30)
        assert answer == b"re:y"


def test_collect_of_another_clients_pending_request_waits(config: Path) -> None:
    """A request still in the inbox (nobody serves yet) is known to any client: it waits."""
    with Client(load_config(config, node_id="c1")) as one, Client(load_config(config, node_id="c2")) as two:
        uid = one.submit("quote", b"x")
        with pytest.raises(RequestTimeout):
            two.collect("quote", uid, timeout=0.2)


# --------------------------------------------------------------------------- 5. --json, seq options


def test_journal_json(config: Path) -> None:
    with Client(load_config(config, node_id="c1")):
        pass  # leaves an (empty) journal for c1
    result = main_in_process("journal", "-c", str(config), "--node-id", "c1", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["node"] == "c1" and doc["pending"] == []


def test_seq_show_json_and_options_after_the_subcommand(config: Path) -> None:
    assert main_in_process("seq", "set", "-c", str(config), "myseq", "41").returncode == 0
    after = main_in_process("seq", "show", "-c", str(config), "--json")
    assert after.returncode == 0, after.stderr
    assert [(s["kind"], s["sequence"], s["next"]) for s in json.loads(after.stdout)] == \
        [("global", "%{myseq}", 41)]
    before = main_in_process("seq", "-c", str(config), "show", "myseq", "--json")
    assert json.loads(before.stdout)["next"] == 41
    missing = main_in_process("seq", "show")
    assert missing.returncode == 2 and "Missing option '-c'" in missing.stderr


# --------------------------------------------------------------------------- 6. one-line errors


def test_missing_spark_extra_is_one_line(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed: import fails
    # Spark's needs are checked when Spark is to run: asked for here (auto would count first)
    result = main_in_process("aggregate", "-c", str(config), "--engine", "spark")
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ftpbc: error: pyspark is not installed") and "pip install 'ftpbc[spark]'" in line


@pytest.mark.parametrize("java_home", [None, "/nonexistent/jdk"])
def test_missing_java_names_java_17(config: Path, tmp_path: Path, java_home: str | None) -> None:
    result = main_in_process("aggregate", "-c", str(config), "--engine", "spark",
                             env={"PATH": str(tmp_path / "nothing-here"), "JAVA_HOME": java_home})
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ftpbc: error: ") and "Java 17" in line
    if java_home:
        assert java_home in line


def test_state_dir_below_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    path = write(tmp_path, GOOD.replace("{tmp}/state", "{tmp}/a-file/state"))
    result = main_in_process("send", "-c", str(path), "quote", "--data", "x")
    assert result.returncode == 2
    assert one_line(result) == f"ftpbc: error: node.state_dir: cannot write {tmp_path}/a-file/state: " \
                               "Not a directory"


def test_ftpd_port_in_use_names_the_port_and_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_ftpbc("ftpd", "--root", str(tmp_path / "root"), "--port", str(port), "--user", "u:pw",
                           env=ftpbc_env())
    assert result.returncode == 2
    assert one_line(result) == (f"ftpbc: error: --port: cannot listen on 127.0.0.1:{port}: the port is in "
                                "use by another program (choose another with --port)")


# --------------------------------------------------------------------------- 7. handler modules


def handler_module(directory: Path) -> str:
    """A module in ``directory`` with an echo handler; its name, unique to this test."""
    name = f"corner_handlers_{uuidlib.uuid4().hex[:8]}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text("def echo(message):\n    return message.body\n")
    return name


def test_handler_path_in_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # restored afterwards
    name = handler_module(tmp_path / "handlers")
    text = GOOD.replace("  journal_dir: {tmp}/journals\n",
                        "  journal_dir: {tmp}/journals\n  handler_path: [{tmp}/handlers]\n")
    text += f"    handler: {name}:echo\n"
    node = Node(load_config(write(tmp_path, text), node_id="n1"))
    assert callable(node.handlers["quote"])
    assert sys.path[-1] == str(tmp_path / "handlers")  # after the installed packages


def test_handlers_are_not_imported_from_the_working_directory_without_path(tmp_path: Path) -> None:
    """``ftpbc serve`` run where the module is: refused unless --path (or handler_path) names it."""
    workdir = tmp_path / "work"
    name = handler_module(workdir)
    path = write(tmp_path, GOOD + f"    handler: {name}:echo\n")
    refused = run_ftpbc("serve", "-c", str(path), env=ftpbc_env(), cwd=workdir)
    assert refused.returncode == 2
    assert f"cannot import handler module {name!r}" in one_line(refused)
    log = tmp_path / "serve.log"
    proc = popen_ftpbc("serve", "-c", str(path), "--path", ".", log=log, env=ftpbc_env(), cwd=workdir)
    try:
        wait_until(lambda: "serving quote" in log.read_text() or proc.poll() is not None, timeout=30,
                   what="the node to serve")
        assert proc.poll() is None, log.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()


# --------------------------------------------------------------------------- 8. help texts


def test_top_level_help_lists_every_command_with_its_whole_summary() -> None:
    result = run_ftpbc("--help", env=ftpbc_env({"COLUMNS": "80"}))
    assert result.returncode == 0
    listed = " ".join(result.stdout.split("Commands:", 1)[1].split())
    for name in LAZY_COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        assert f"{name} {summary(command)}" in listed, name
    assert "..." not in listed


@pytest.mark.parametrize("path", list(all_commands()), ids=" ".join)
def test_help_texts_in_one_style(path: tuple[str, ...]) -> None:
    """Every summary and option help: a capitalised sentence ending with a period."""
    command = command_at(path)
    texts = {"summary": summary(command)}
    texts.update({p.name or "?": p.help for p in command.params
                  if isinstance(p, click.Option) and p.help and p.name not in ("help", "version")})
    for what, text in texts.items():
        assert text[0].isupper() and text.rstrip().endswith("."), f"{' '.join(path)} {what}: {text!r}"


# --------------------------------------------------------------------------- 9. README


def test_readme_commands_table_lists_every_command_and_subcommand() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    # the first cell of each row (a ``\|`` inside it is text, not a cell boundary)
    cells = [re.split(r"(?<!\\)\|", row)[1] for row in section.splitlines() if row.startswith("| `ftpbc ")]
    for path in all_commands():
        name = path[0]
        rows = [c for c in cells if re.match(rf"\s*`ftpbc {re.escape(name)}\b", c)]
        assert rows, f"README's commands table has no row for ftpbc {name}"
        if len(path) == 2:
            assert any(re.search(rf"\b{re.escape(path[1])}\b", c) for c in rows), \
                f"README's row for ftpbc {name} does not name {path[1]}"

