"""`seq2serve export ORG/NAME OUT` (issue 51 item 8): a hub id is read from the
Hugging Face hub's cache through huggingface_hub's snapshot_download, offline-aware.
No hub can be reached here: the cache is laid out as huggingface_hub lays it
(models--ORG--NAME/blobs, snapshots/COMMIT/* linking to them, refs/main) from a tiny
T5 folder, and the command runs as a user runs it, with HF_HOME pointing at it and
HF_HUB_OFFLINE=1 (huggingface_hub reads both when it is imported). And two packages of
one name: the server's refusal names `--name`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_t5_parity import make_t5_package_dir

from seq2serve.model.package.manifest import load_package

REPO = "seq2serve-tests/tiny-t5"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(home: Path, folder: Path) -> Path:
    """`folder`'s files as snapshot_download leaves them in HF_HOME/hub."""
    repo = home / "hub" / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def run_export(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "seq2serve.server.cli.main", "export", *args,
                           "--quiet"], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def hub_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    hub_cache(root / "home", make_t5_package_dir(root / "tiny-t5", "t5"))
    done = run_export(root / "home", REPO, str(root / "pkg"), "--attention", "plain")
    assert done.returncode == 0, done.stderr
    return root / "pkg"


def test_a_hub_id_exports_from_the_cache(hub_package: Path) -> None:
    manifest = load_package(hub_package).manifest
    assert manifest.name == "tiny-t5"  # the repository's name, not the commit's folder
    assert manifest.exporter["source"]["hub"] == {  # type: ignore[index]
        "repo_id": REPO, "commit": COMMIT}
    assert manifest.task == "summarize" and manifest.input_prefix == "summarize: "


def test_a_hub_id_neither_cached_nor_reachable(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    done = run_export(tmp_path / "home", "seq2serve-tests/absent", str(tmp_path / "out"))
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert "seq2serve-tests/absent: not a directory" in message, message
    assert "HF_HUB_OFFLINE is set" in message and str(tmp_path / "home" / "hub") in message
    assert not (tmp_path / "out").exists()


def test_two_packages_of_one_name_are_refused_naming_the_option(hub_package: Path,
                                                                tmp_path: Path) -> None:
    """An fp32 and an int8 package both named after their folder (exported with that
    name by hand): the server says which option tells them apart."""
    from serving import server_config

    from seq2serve.server.assembly import ModelLoadError, load_models
    from seq2serve.server.core.registry import ModelRegistry
    from seq2serve.server.metrics import Metrics

    for copy in ("fp32", "int8"):
        shutil.copytree(hub_package, tmp_path / "models" / copy)
    registry = ModelRegistry()
    with pytest.raises(ModelLoadError) as info:
        load_models(registry, server_config(tmp_path / "models"), Metrics())
    assert "model name 'tiny-t5' is already served" in str(info.value)
    assert "--name" in str(info.value)


def test_a_revision_of_a_hub_id_is_read_and_recorded(hub_package: Path, tmp_path: Path
                                                     ) -> None:
    """--revision v1 reads the commit the cache's refs/v1 names (snapshot_download's
    revision), not main's; the manifest records both the revision and that commit."""
    repo = hub_package.parent / "home" / "hub" / ("models--" + REPO.replace("/", "--"))
    tagged = "fedcba9876543210fedcba9876543210fedcba98"
    shutil.copytree(repo / "snapshots" / COMMIT, repo / "snapshots" / tagged, symlinks=True)
    (repo / "refs" / "v1").write_text(tagged)
    done = run_export(hub_package.parent / "home", REPO, str(tmp_path / "pkg"),
                      "--revision", "v1", "--attention", "plain")
    assert done.returncode == 0, done.stderr
    manifest = load_package(tmp_path / "pkg").manifest
    assert manifest.exporter["source"]["hub"] == {  # type: ignore[index]
        "repo_id": REPO, "commit": tagged, "revision": "v1"}
    absent = run_export(hub_package.parent / "home", REPO, str(tmp_path / "none"),
                        "--revision", "v2")
    assert absent.returncode == 1 and "does not hold it" in " ".join(absent.stderr.split())


def test_a_revision_for_a_local_folder_is_refused(tmp_path: Path) -> None:
    folder = make_t5_package_dir(tmp_path / "tiny-t5", "t5")
    done = run_export(tmp_path / "home", str(folder), str(tmp_path / "out"),
                      "--revision", "v1")
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert f"--revision v1: {folder} is a local folder" in message, message
    assert not (tmp_path / "out").exists()
