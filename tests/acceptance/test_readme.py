"""The README's one example runs as written, in a new directory, with the receiver this checkout
installs: its app.py, the app's table, uvicorn serving it, and both deliveries' printed answers
line for line; the handler's row is written once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.test_wheel import clean_env, start, walk
from tests.pgcluster import free_port
from tests.servers import ROOT

pytestmark = pytest.mark.slow


def test_the_readme_example_runs_as_written(
    tmp_path: Path, served: list[subprocess.Popen[str]]
) -> None:
    files, commands = walk(ROOT / "README.md")
    assert set(files) == {"app.py"}
    work = tmp_path / "example"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    bin_dir = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    env = {**clean_env(), "PATH": f"{bin_dir}{os.pathsep}{clean_env()['PATH']}"}
    port = free_port()
    # The sends of "Two commands" are scripts/serve's demo (tests/acceptance/test_serve_script.py).
    example = [c for c in commands if "/demo" not in c.line]
    programs = [c.line.split()[0] for c in example]
    assert programs == ["export", "python", "uvicorn", "receiver", "receiver"]
    export, table, serve, *sends = example
    name, _, value = export.line.removeprefix("export ").partition("=")
    env[name] = value.split("#")[0].strip().strip('"')
    subprocess.run(["bash", "-c", table.line], cwd=work, env=env, check=True, timeout=60)
    served.append(start(f"{serve.line} --port {port}", work, env, tmp_path / "serve.log"))
    for send in sends:
        line = send.line.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        done = subprocess.run(
            ["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=60
        )
        expected = send.expected.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        assert done.stdout == expected, f"$ {line}\n{done.stdout}{done.stderr}"
    with sqlite3.connect(work / "receiver.db") as db:
        assert db.execute("SELECT invoice FROM paid").fetchall() == [("in_1",)]
