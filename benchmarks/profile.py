"""Where the receiver's time goes: py-spy attached to the running server, summarized as text.

``py-spy record`` samples the server's Python stacks while wrk drives it. The SVG flame graph is
for people; the raw (collapsed stacks) file is summarized here: time by package of the innermost
frame, time under each receiver function (inclusive), and the top frames.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PY_SPY = str(Path(sys.executable).parent / "py-spy")
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<where>[^()]*)\)$")


def record(
    pid: int, out: Path, *, seconds: int, fmt: str, native: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``py-spy record`` on ``pid`` for ``seconds``; the caller waits on the process."""
    command = [
        PY_SPY,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(seconds),
        "--rate",
        "200",
        "--format",
        fmt,
        "--output",
        str(out),
    ]
    command.append("--native" if native else "--nonblocking")
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@dataclass(frozen=True)
class Frame:
    name: str
    where: str  # "path:line", or a shared library for native frames

    @property
    def module(self) -> str:
        path = self.where.rsplit(":", 1)[0]
        for marker in ("site-packages/", "lib/python3", "/work/main/"):
            if marker in path:
                path = path.split(marker, 1)[1]
                if marker == "lib/python3":
                    path = "stdlib/" + path.split("/", 1)[1] if "/" in path else path
                break
        return path

    @property
    def package(self) -> str:
        module = self.module
        if module.startswith("stdlib/"):
            parts = module.split("/")
            return "stdlib:" + (parts[1].removesuffix(".py") if len(parts) > 1 else "?")
        if "/" not in module:
            return module.split(".", 1)[0] or "?"
        head = module.split("/", 1)[0]
        if head == "receiver":
            return module.removesuffix(".py").replace("/", ".")
        return head

    def __str__(self) -> str:
        return f"{self.name} ({self.module}:{self.where.rsplit(':', 1)[-1]})"


def parse(path: Path) -> list[tuple[list[Frame], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for text in stack.split(";"):
            match = _FRAME.match(text)
            frames.append(Frame(match["name"], match["where"]) if match else Frame(text, "?"))
        stacks.append((frames, int(count)))
    return stacks


# Frames above the event loop (the process's start-up chain): on every stack, they say nothing.
_BOOTSTRAP = (
    "click/",
    "<frozen runpy>",
    "uvicorn/main.py",
    "uvicorn/server.py",
    "uvicorn/_compat.py",
    "uvicorn/__main__.py",
    "asyncio/runners.py",
    "asyncio/base_events.py",
)


def syscalls(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Start ``strace -c -f`` on ``pid`` (all its threads): system calls counted until SIGINT."""
    return subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def per_request(strace_summary: Path, requests: int) -> str:
    """strace's table as calls per request: on the receiver, each ``write`` is a database round
    trip or a piece of an HTTP answer, each ``fdatasync`` a SQLite commit, each ``futex`` a
    thread hand-off."""
    lines = [f"{strace_summary.name}: system calls per request ({requests} requests, under strace)"]
    for line in strace_summary.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
            calls = int(parts[3])
            if calls >= requests * 0.05:
                lines.append(f"  {parts[-1]:<16} {calls / requests:7.2f}")
    return "\n".join(lines) + "\n"


def _top(counter: collections.Counter[str], total: int, n: int) -> Iterable[str]:
    for key, count in counter.most_common(n):
        yield f"  {100 * count / total:5.1f}%  {key}"


def summarize(raw: Path, *, top: int = 25) -> str:
    stacks = parse(raw)
    total = sum(n for _, n in stacks)
    if not total:
        return f"{raw.name}: no samples"
    by_package: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        by_package[frames[-1].package] += n
        leaf[str(frames[-1])] += n
        for name in {
            f"{f.name} ({f.module})" for f in frames if not f.module.startswith(_BOOTSTRAP)
        }:
            inclusive[name] += n
        for name in {f"{f.package}.{f.name}" for f in frames if f.package.startswith("receiver")}:
            ours[name] += n
    lines = [f"{raw.name}: {total} samples (busy time only: idle waits are not sampled)", ""]
    lines += ["Self time by package of the innermost frame:", *_top(by_package, total, 20), ""]
    lines += ["Inclusive time under each receiver function:", *_top(ours, total, top), ""]
    lines += ["Top frames, self time:", *_top(leaf, total, top), ""]
    lines += ["Top functions, inclusive time:", *_top(inclusive, total, top)]
    return "\n".join(lines) + "\n"
