"""The coding agents' skill (skills/receiver/, Agent Skills format) is valid and runs as written:
its front matter names the skill and says when to use it; every Python block runs, in order, in
one namespace and one temporary directory; every ``$`` command of its console blocks runs there
too (install commands name the ``receiver-webhooks`` distribution and are not run: the suite
uses this checkout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.blocks import blocks
from tests.docs.test_examples import run_page
from tests.servers import ROOT

SKILL = ROOT / "skills" / "receiver"
PAGE = SKILL / "SKILL.md"


def front_matter() -> dict[str, object]:
    text = PAGE.read_text()
    found = re.match(r"\A---\n(.*?)\n---\n", text, re.S)
    assert found, "SKILL.md must open with YAML front matter between --- lines"
    data = yaml.safe_load(found.group(1))
    assert isinstance(data, dict)
    return data


def test_the_front_matter_names_the_skill_and_when_to_use_it() -> None:
    data = front_matter()
    assert set(data) == {"name", "description"}
    name, description = data["name"], data["description"]
    assert name == SKILL.name  # the folder's name, as the format asks
    assert isinstance(name, str)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    assert len(name) <= 64
    assert isinstance(description, str)
    assert 0 < len(description) <= 1024
    assert "Use when" in description


def test_the_files_it_names_exist() -> None:
    text = PAGE.read_text()
    named = set(re.findall(r"`((?:references|scripts)/[\w./-]+)", text))
    assert named
    assert [n for n in named if not (SKILL / n).exists()] == []


def commands() -> list[str]:
    found = []
    for block in blocks(PAGE):
        if block.lang == "console":
            found += [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
    return found


def test_install_commands_name_the_distribution() -> None:
    installs = [c for c in commands() if c.startswith("pip install")]
    assert installs
    assert all('"receiver-webhooks' in c for c in installs), installs


@pytest.mark.slow
def test_every_block_and_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "RECEIVER_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = " && ".join(
        c.replace("scripts/", f"{SKILL}/scripts/") for c in commands() if not c.startswith("pip ")
    )
    ran = subprocess.run(
        ["bash", "-c", f"set -e; {script}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count("3 passed") == 2, ran.stdout  # receiver init, and --tool
    for name in [n for n in os.environ if n.startswith("RECEIVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    python = [b for b in blocks(PAGE) if b.lang == "python"]
    assert len(python) >= 4
    run_page(python)
