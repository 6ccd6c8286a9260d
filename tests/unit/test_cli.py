"""The `seq2serve` command: every subcommand documents itself, and serving needs no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from seq2serve.server.cli.main import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: seq2serve {name}")
    assert " ".join(COMMANDS[name][1].split()) in " ".join(text.split())
    options = [line for line in text.splitlines() if line.lstrip().startswith("--")]
    assert len(options) >= 2, text


def test_serving_modules_do_not_import_torch() -> None:
    """The runtime (serve, translate, summarize, the package loader) installs without
    the `train` extra, so none of it may import torch, even where torch is installed."""
    code = ("import sys\n"
            "import seq2serve.server.app, seq2serve.server.client, seq2serve.server.engine.engine\n"
            "import seq2serve.server.cli.translate, seq2serve.server.cli.summarize\n"
            "import seq2serve.server.cli.translate_file\n"
            "import seq2serve.model.package.manifest\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'onnx') if m in sys.modules)\n"
            "print(heavy)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]", result.stdout
