"""``vectors DIR``: the golden vectors exported, one line, exit codes 0, 1 and 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.cli.commands import vectors as vectors_module
from async_task_api_worker.conformance.golden import MANIFEST_NAME, SCHEMAS_FOLDER, load_manifest

COUNT = len(load_manifest().vectors)


def test_vectors_exports_and_prints_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "vectors"
    assert main(["vectors", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"{COUNT} golden vectors and the JSON Schemas written to {dest.resolve()} "
        f"(index: {MANIFEST_NAME}; schemas: {SCHEMAS_FOLDER}/)\n"
    )
    assert err == ""
    assert (dest / MANIFEST_NAME).is_file()
    assert len(list(dest.rglob("*.bin"))) == COUNT
    assert sorted(path.name for path in (dest / SCHEMAS_FOLDER).iterdir()) == [
        "cancel.schema.json",
        "envelope.schema.json",
        "report.schema.json",
    ]


def test_vectors_refuses_a_non_empty_folder_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["vectors", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"async-task-api-worker: {tmp_path} is not empty: --force")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_vectors_force_writes_into_a_non_empty_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["vectors", "--force", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(
        f"{COUNT} golden vectors and the JSON Schemas written to "
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / MANIFEST_NAME).is_file()


def test_vectors_refuses_a_file_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "vectors"
    target.write_text("")
    assert main(["vectors", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"async-task-api-worker: {target} is not a directory\n"


def test_vectors_exits_1_when_a_file_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(dest: Path, *, force: bool = False) -> int:
        raise PermissionError(13, "Permission denied", str(dest / MANIFEST_NAME))

    monkeypatch.setattr(vectors_module, "export_vectors", refuse)
    assert main(["vectors", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"async-task-api-worker: cannot write the vectors to {tmp_path / 'v'}")


def test_vectors_without_a_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["vectors"])
    assert exited.value.code == 2
    assert "DIR" in capsys.readouterr().err


def test_vectors_as_a_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "async_task_api_worker", "vectors", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"{COUNT} golden vectors and the JSON Schemas written to ")
