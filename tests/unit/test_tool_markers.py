"""Every test that runs a system tool says so with `@pytest.mark.needs(...)`
(tests/system_tools.py, conftest.py): nothing else in tests/ looks a tool up, names
its path, runs it by its command name or skips for it by hand; a tool looked up
without the marker fails where the tool is missing (as SEQ2SERVE_HIDE_TOOLS makes it,
in .ci/run's second pass), and the marker skips naming the install command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import system_tools
from _pytest.outcomes import Failed, Skipped

TESTS = Path(__file__).resolve().parents[1]
COMMANDS = {c for tool in system_tools.TOOLS.values() for c in tool.commands}
FILES = {f for tool in system_tools.TOOLS.values() for f in tool.files}
SPAWNERS = {"run", "Popen", "check_output", "check_call", "call", "create_subprocess_exec",
            "execv", "execvp", "spawnv"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(call: ast.Call) -> str:
    function = call.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")


def _first_word(node: ast.expr) -> str | None:
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        node = node.elts[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split()[0] if node.value.split() else None
    return None


def offences(source: str) -> list[str]:
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and any(node.value.startswith(f) for f in FILES)):
            found.append(f"line {node.lineno}: names {node.value!r}: use system_tools.path")
    for call in _calls(tree):
        name = _name(call)
        if name == "which":
            found.append(f"line {call.lineno}: looks a tool up with which(): use "
                         "system_tools.path and the needs marker")
        if name in SPAWNERS and call.args and _first_word(call.args[0]) in COMMANDS:
            found.append(f"line {call.lineno}: runs {_first_word(call.args[0])!r} by its "
                         "command name: use system_tools.path and the needs marker")
        if name in ("skipif", "skip"):
            words = " ".join(str(n.value) for n in ast.walk(call)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str))
            named = sorted(t for t in system_tools.TOOLS if t in words.split()
                           or f"{t} " in words or f"/{t}" in words)
            if named or "apt-get" in words:
                found.append(f"line {call.lineno}: skips for {', '.join(named) or 'a tool'} "
                             "by hand: use @pytest.mark.needs")
    return found


def test_no_test_runs_a_tool_outside_the_marker() -> None:
    problems = [f"{path.relative_to(TESTS)} {problem}"
                for path in sorted(TESTS.rglob("*.py"))
                if path.name not in ("system_tools.py", "test_tool_markers.py")
                for problem in offences(path.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_the_check_finds_each_way_around_the_marker() -> None:
    assert len(offences('import shutil\nshutil.which("soffice")\n')) == 1
    assert len(offences('from pathlib import Path\nPath("/usr/bin/chromium")\n')) == 1
    assert len(offences('import subprocess\nsubprocess.run(["msgfmt", "-c", "x.po"])\n')) == 1
    assert len(offences('import pytest\npytest.mark.skipif(True, reason="needs dpkg-deb")\n')) == 1
    assert offences('import subprocess\nsubprocess.run(["umount", "x"])\n') == []


def test_a_hidden_tool_skips_a_marked_test_and_fails_an_unmarked_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(system_tools.HIDE_VARIABLE, "chromium,msgfmt")
    assert system_tools.find("chromium") is None and system_tools.find("msgfmt") is None
    why = system_tools.missing(("chromium",))
    assert why is not None and "apt-get install --no-install-recommends chromium" in why
    system_tools.declare(set())
    with pytest.raises(Failed, match=r"runs msgfmt without @pytest.mark.needs\('msgfmt'\)"):
        system_tools.path("msgfmt")
    system_tools.declare({"msgfmt"})
    with pytest.raises(Skipped, match="gettext"):
        system_tools.path("msgfmt")
    monkeypatch.setenv(system_tools.HIDE_VARIABLE, "all")
    assert all(system_tools.find(name) is None for name in system_tools.TOOLS)


@pytest.mark.needs("msgfmt")
def test_the_marker_gives_the_tool_to_a_test_that_declares_it() -> None:
    assert Path(system_tools.path("msgfmt")).name == "msgfmt"
