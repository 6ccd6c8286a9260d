"""The README's main command, run as a new user would: in a fresh copy of the
repository with a fresh virtual environment, it starts the server with the
shipped models and a client call prints a translation."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from serving import free_port

ROOT = Path(__file__).resolve().parents[2]


def readme_command(heading: str, language: str = "sh") -> str:
    """The first ```sh (or other `language`) block after a README heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    match = re.search(rf"```{language}\n(.*?)\n```", section, re.S)
    assert match, f"no {language} block under {heading!r}"
    return match.group(1).strip()


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_command("## Tests") in ci


@pytest.mark.slow
def test_readme_main_command_serves_and_translates(tmp_path: Path) -> None:
    repo = tmp_path / "seq2serve"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    command = readme_command("## Quick start")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEQ2SERVE_", "VIRTUAL_ENV"))}
    # Free ports, never the defaults (a user's own server may hold them): the server
    # and the client commands both read these variables.
    env.update(SEQ2SERVE_HOST="127.0.0.1", SEQ2SERVE_PORT=str(free_port()),
               SEQ2SERVE_HTTP_PORT=str(free_port()), SEQ2SERVE_METRICS_PORT=str(free_port()))
    proc = subprocess.Popen(["bash", "-c", command], cwd=repo, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        # The command leaves the server running in the background, as a user would;
        # it is in the command's process group, which may be gone already.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, err[-3000:]
    # The sentences the command translates (one per language pair), and what the
    # README says it prints: each a translation that the shipped model gets right.
    sources = re.findall(r'translate [^"]*"([^"]+)"', command)
    shown = readme_command("## Quick start", "text").splitlines()
    assert len(sources) == len(shown) >= 2
    assert lines[-len(shown):] == shown, err[-3000:]
    assert not set(shown) & set(sources)  # translations, not echoes
