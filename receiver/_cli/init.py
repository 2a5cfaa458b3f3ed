"""``receiver init [DIR]``: a small project that runs on the embedded SQLite default, with the
three tests every receiver needs (receiver/_cli/scaffold.py holds the files)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .._exceptions import ReceiverError
from . import scaffold
from .loading import text_argument


def add_init_parser(sub: Any) -> None:
    p = sub.add_parser(
        "init", help="write a small project: an app, its configuration and its three tests"
    )
    p.add_argument("directory", nargs="?", default=".", help="where (created if missing)")
    p.add_argument(
        "--tool",
        action="store_true",
        help="an agent's tool run through the action executor, instead of a webhook receiver",
    )
    p.add_argument(
        "--queued",
        action="store_true",
        help="queued mode: answer 202 once stored, run the handler on workers",
    )
    p.add_argument("--force", action="store_true", help="overwrite files that exist")


def project_files(name: str, *, tool: bool, queued: bool = False) -> dict[str, str]:
    """The files of a new project, by name."""
    if tool and queued:
        raise ReceiverError("--queued is for webhooks; a tool runs when the agent calls it")
    if tool:
        return {
            "agent.py": scaffold.AGENT,
            "test_agent.py": scaffold.TEST_AGENT,
            "README.md": scaffold.README.format(
                name=name, option=" --tool", run=scaffold.RUN_AGENT
            ),
            "pyproject.toml": scaffold.PYPROJECT,
        }
    config = scaffold.CONFIG + (scaffold.QUEUED_MODE if queued else "")
    tests = (
        scaffold.TEST_QUEUED if queued else scaffold.TEST_ORDERS.format(crash=scaffold.CRASH_INLINE)
    )
    run = scaffold.RUN_WEBHOOK
    if queued:
        run += "\nreceiver worker --config receiver.toml   # runs the queued deliveries"
    return {
        "receiver.toml": config,
        "orders.py": scaffold.ORDERS.format(),
        "sql/0001_orders.sql": scaffold.APP_SQL,
        "test_orders.py": tests,
        "README.md": scaffold.README.format(
            name=name, option=" --queued" if queued else "", run=run
        ),
        "pyproject.toml": scaffold.PYPROJECT,
    }


def _within(target: Path, name: str) -> list[Path]:
    """The paths a file's name goes through in ``target``: ``sql/0001_orders.sql`` is the
    ``sql`` directory and the file (neither may be a link)."""
    parts = Path(name).parts
    return [target.joinpath(*parts[: i + 1]) for i in range(len(parts))]


def _write(path: Path, text: str) -> None:
    """Write ``path`` itself, never a file a link there points to: a link put in its place
    after the check above makes the open fail (ELOOP) instead of writing through it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def init_command(args: argparse.Namespace) -> int:
    # The name is written into the project's files (UTF-8) and printed: bytes the shell handed
    # over that are not UTF-8 cannot be.
    target = Path(text_argument("directory", args.directory, "the project's files name it"))
    try:
        name = target.resolve().name or "app"
        files = project_files(name, tool=args.tool, queued=args.queued)
        if target.exists() and not target.is_dir():
            raise ReceiverError(f"{target} is a file: init writes a project into a directory")
        # A link is refused, --force or not: written through, a dangling one would create its
        # target outside the directory, and any other would overwrite a file anywhere.
        links = [n for n in files if any(p.is_symlink() for p in _within(target, n))]
        if links:
            raise ReceiverError(
                f"symbolic links in {target}: {', '.join(links)}; init never writes through a "
                "link: remove them, or choose another directory"
            )
        existing = [n for n in files if (target / n).exists()]
        if existing and not args.force:
            raise ReceiverError(
                f"{', '.join(existing)} already exist in {target}: choose an empty directory, "
                "or --force to overwrite them"
            )
        target.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (target / name).parent.mkdir(exist_ok=True)  # sql/
            _write(target / name, text)
    except OSError as exc:
        # A name too long, no permission, a full disk: said in one line, not a traceback.
        raise ReceiverError(f"cannot write the project in {target}: {exc.strerror}") from None
    print(f"receiver: wrote {', '.join(files)} in {target}")
    print(f"  cd {target} && python -m pytest")
    return 0
