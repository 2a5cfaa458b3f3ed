"""The package as a user gets it: build the sdist and the wheel (the wheel from the sdist, as
``python -m build`` does) from a copy of the source, check what the wheel holds (the library and
its pytest plugin, nothing else), then, in fresh virtualenvs away from the source tree, install
the wheel and follow the tutorial as written (docs/tutorial.md: its commands, its files, its
output), and install the sdist with every extra."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import receiver
from tests.docs.blocks import blocks
from tests.pgcluster import free_port
from tests.servers import ROOT

pytestmark = pytest.mark.slow

PACKAGED = sorted(
    str(p.relative_to(ROOT))
    for p in [
        ROOT / "receiver" / "py.typed",
        *(ROOT / "receiver" / "_store" / "sql").rglob("*.sql"),
        *(ROOT / "receiver" / "_console").glob("*.html"),
        *(ROOT / "receiver" / "_console").glob("*.css"),
    ]
)
TUTORIAL = ROOT / "docs" / "tutorial.md"


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: nothing of this checkout or its virtualenv."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    return {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RECEIVER_", "PYTHON", "VIRTUAL_ENV", "PYTEST"))
        },
        "PATH": path,
    }


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


def copy_of_the_source(tmp: Path) -> Path:
    """A clone's files, so that a build or an install leaves nothing in the working tree."""
    source = tmp / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.db*", "site"
        ),
    )
    return source


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    tmp = tmp_path_factory.mktemp("dist")
    source = copy_of_the_source(tmp)
    out = tmp / "dist"
    output = run(sys.executable, "-m", "build", "--outdir", out, source, cwd=tmp, env=clean_env())
    assert "absent from the `packages` configuration" not in output
    (sdist,) = out.glob("receiver_webhooks-*.tar.gz")
    (wheel,) = out.glob("receiver_webhooks-*.whl")
    return Dist(sdist, wheel)


def test_the_wheel_holds_the_library_and_its_plugin_only(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as whl:
        names = whl.namelist()
        info = f"receiver_webhooks-{receiver.__version__}.dist-info"
        metadata = email.message_from_bytes(whl.read(f"{info}/METADATA"))
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        licenses = [n for n in names if n.startswith(f"{info}/licenses/")]
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"receiver", "_receiver_pytestplugin.py", info}, tops
    assert [p for p in PACKAGED if p not in names] == []
    assert not any(n.startswith(("handlers/", "tests/", "examples/", "docs/")) for n in names)
    assert (metadata["Name"], metadata["Version"]) == ("receiver-webhooks", receiver.__version__)
    assert metadata["License-Expression"] == "MIT"
    assert licenses == [f"{info}/licenses/LICENSE"]
    assert "receiver = receiver._cli:main" in entry_points
    assert "receiver = _receiver_pytestplugin" in entry_points
    extras = set(metadata.get_all("Provides-Extra") or [])
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras == set(declared["optional-dependencies"])
    with tarfile.open(dist.sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert [p for p in [*PACKAGED, "LICENSE", "README.md"] if p not in in_sdist] == []


@dataclass
class Command:
    line: str
    expected: str


def walk(page: Path = TUTORIAL) -> tuple[dict[str, str], list[Command]]:
    """A page's files (its titled blocks) and its commands with their printed output."""
    files: dict[str, str] = {}
    commands: list[Command] = []
    for block in blocks(page):
        if block.title:
            files[block.title] = block.text
        elif block.lang == "console":
            for chunk in re.split(r"^\$ ", block.text, flags=re.M)[1:]:
                line, _, expected = chunk.partition("\n")
                commands.append(Command(line, expected))
    return files, commands


def test_the_tutorial_runs_as_written_from_the_wheel(
    dist: Dist, tmp_path: Path, served: list[subprocess.Popen[str]]
) -> None:
    """Every command of the tutorial, in order, in a new directory outside the clone: the
    install (from the built wheel, the name's stand-in until it is published), the files it
    asks for, the server, each delivery's printed answer line for line, and the test."""
    files, commands = walk()
    assert set(files) == {"app.py", "pytest.ini", "test_app.py"}
    work = tmp_path / "tutorial"
    work.mkdir()
    env = clean_env()
    port = free_port()
    ran = []
    for command in commands:
        line = command.line.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        expected = command.expected.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        if line == ". .venv/bin/activate":
            venv = work / ".venv"
            env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin{os.pathsep}{env['PATH']}"}
            ran.append(line)
            continue
        if line.startswith("pip install "):
            line = line.replace('"receiver-webhooks[', f'"{dist.wheel}[')
            assert str(dist.wheel) in line, line
        if line.startswith("receiver serve"):
            for name, text in files.items():  # written before the server imports them
                (work / name).write_text(text)
            served.append(start(f"{line} --port {port}", work, env, tmp_path / "serve.log"))
            ran.append(line)
            continue
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        printed = done.stdout
        if line.startswith("pytest"):  # its timing, and its progress line's padding
            printed = re.sub(r" in \d+\.\d+s| +", " ", printed)
            expected = re.sub(r" in \d+\.\d+s| +", " ", expected)
        if line.startswith(("python3 -m venv", "pip install")):
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            assert printed == expected, f"$ {line}\n{printed}{done.stderr}"
        ran.append(line)
    assert [c.split()[0] for c in ran] == [
        "python3",
        ".",
        "pip",
        "receiver",
        "receiver",
        "receiver",
        "receiver",
        "python",
        "pytest",
    ]
    where = run(
        work / ".venv/bin/python",
        "-c",
        "import receiver; print(receiver.__file__)",
        cwd=work,
        env=env,
    )
    assert where.startswith(str(work / ".venv")), where
    version = run(work / ".venv/bin/receiver", "--version", cwd=work, env=env)
    assert version == f"receiver {receiver.__version__}\n"
    # Without an app: a clear error, not the demo module that only a clone has.
    lost = subprocess.run(
        [work / ".venv/bin/receiver", "serve"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lost.returncode == 2
    assert "no app to run: give --app module:attribute" in lost.stderr, lost.stderr
    assert "Try it" not in lost.stdout  # the demo's line, for an app that did not start


def test_the_home_page_installs_work_as_written(tmp_path: Path) -> None:
    """The home page's install lines, each in a fresh virtualenv: the package index's name (not
    run: nothing is released), then from a clone, in its directory, and from the wheel built
    there, exactly as written; each gives the command and the kit."""
    lines = [
        line.removeprefix("$ ")
        for block in blocks(ROOT / "docs" / "index.md")
        if block.lang == "console"
        for line in block.text.splitlines()
        if line.startswith("$ ")
    ]
    assert lines[0] == "pip install receiver-webhooks"
    from_clone, build, from_wheel = lines[1:]
    clone = copy_of_the_source(tmp_path)
    for name, commands in (("clone", [from_clone]), ("wheel", [build, from_wheel])):
        venv = tmp_path / f"venv-{name}"
        env = clean_env()
        run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
        env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin{os.pathsep}{env['PATH']}"}
        for command in commands:
            run("bash", "-c", command, cwd=clone, env=env, timeout=600)
        where = "import receiver, receiver.testing; print(receiver.__file__)"
        # Away from the clone, whose receiver/ folder would be imported first from its directory.
        found = run(venv / "bin" / "python", "-c", where, cwd=tmp_path, env=env)
        assert found.startswith(str(venv)), found
        version = run(venv / "bin" / "receiver", "--version", cwd=tmp_path, env=env)
        assert version == f"receiver {receiver.__version__}\n"
    assert [p.name for p in (clone / "dist").glob("*.whl")] == [
        f"receiver_webhooks-{receiver.__version__}-py3-none-any.whl"
    ]


def test_the_docs_build_from_the_docs_extra_alone(tmp_path: Path) -> None:
    """CONTRIBUTING's docs-only install: the ``docs`` extra in a fresh virtualenv (the pinned
    versions) is all ``mkdocs build --strict`` needs, the API reference's imports included."""
    clone = copy_of_the_source(tmp_path)
    venv = tmp_path / "venv"
    env = clean_env()
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin{os.pathsep}{env['PATH']}"}
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
    run(*pip, "--constraint", clone / "constraints.txt", "-e", ".[docs]", cwd=clone, env=env)
    site = tmp_path / "site"
    env["NO_MKDOCS_2_WARNING"] = "1"
    run(venv / "bin" / "mkdocs", "build", "--strict", "--site-dir", site, cwd=clone, env=env)
    assert (site / "reference" / "testing" / "index.html").exists()


def start(line: str, cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[str]:
    log = log_path.open("w+")
    server = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    port = line.rsplit(" ", 1)[1]
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
            return server
        except httpx.HTTPError:
            assert server.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)


def test_the_sdist_installs_with_every_extra(dist: Dist, tmp_path: Path) -> None:
    """The sdist installs into a fresh virtualenv, every extra a user may ask for is satisfied by
    the pinned versions (constraints.txt) and each integration imports from there. The extras'
    packages (hundreds of megabytes) are this checkout's pinned ones, lent through a path entry:
    the fresh site-packages holds only the sdist's install, and this checkout's editable install
    is not visible from it. (The tutorial's test installs the wheel with nothing lent.)"""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = ("test", "bench", "docs", "mutate")  # this repository's toolchains, not a user's
    user_extras = sorted(e for e in declared["optional-dependencies"] if e not in own)
    modules = {
        "mcp": "receiver.contrib.mcp",
        "openai-agents": "receiver.contrib.openai_agents",
        "langgraph": "receiver.contrib.langgraph",
        "pydantic-ai": "receiver.contrib.pydantic_ai",
        "dbos": "receiver.contrib.dbos",
        "prefect": "receiver.contrib.prefect",
        "testing": "receiver.testing",
    }
    assert set(user_extras) == set(modules), user_extras
    env = clean_env()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    where = "import site; print(site.getsitepackages()[0])"
    site = Path(run(python, "-c", where, cwd=tmp_path, env=env).strip())
    (lent,) = {p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)}
    (site / "pinned.pth").write_text(lent + "\n")
    installed = run(python, "-m", "pip", "install", "--no-deps", dist.sdist, cwd=tmp_path, env=env)
    assert "Successfully installed receiver-webhooks" in installed, installed
    check = f"""
import importlib, importlib.metadata as md, sys
from packaging.requirements import Requirement
dist = md.distribution("receiver-webhooks")
assert str(dist.locate_file("")).startswith({str(site)!r}), dist.locate_file("")
unmet = []
for line in dist.requires or []:
    req = Requirement(line)
    for extra in [None, *{user_extras!r}]:
        env = {{"extra": extra or ""}}
        if req.marker is None and extra is None or req.marker and req.marker.evaluate(env):
            try:
                version = md.version(req.name)
            except md.PackageNotFoundError:
                unmet.append(f"{{extra}}: {{req}} (missing)")
                continue
            if not req.specifier.contains(version, prereleases=True):
                unmet.append(f"{{extra}}: {{req}} ({{version}})")
assert not unmet, unmet
for module in sys.argv[1:]:
    importlib.import_module(module)
import receiver
print(receiver.__file__)
"""
    printed = run(python, "-c", check, *modules.values(), cwd=tmp_path, env=env)
    assert printed.startswith(str(site)), printed
    store = f"sqlite:///{tmp_path}/receipts.db"
    migrated = run(venv / "bin/receiver", "migrate", "--store", store, cwd=tmp_path, env=env)
    assert "applied 0001_initial" in migrated
