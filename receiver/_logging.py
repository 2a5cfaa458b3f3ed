"""Structured logs: one JSON object per line, with the fields the pipeline passes as ``extra``.

The pipeline logs one line per decision (logger ``receiver``) with ``provider``, ``webhook_id``,
``event_type``, ``outcome``, ``status``, ``fence``, ``duration_ms``, ``request_id`` (the
gateway's ``X-Kong-Request-Id`` or ``X-Request-Id``) and, for rejections, the failed ``check``.
Those fields are all it passes: never a body, a secret or a signature. The formatters here only
render what they are given.

Under any other formatter (plain ``uvicorn module:rx``, an application's own
``logging.Formatter("%(message)s")``) a line would lose those fields, so every receiver logger
(:func:`get_logger`) also appends them to the message text as ``key=value`` pairs (strings
quoted when they contain anything unusual, so a webhook-id cannot forge a line).
:class:`JSONFormatter` keeps the short message and the fields apart; :class:`TextFormatter`
shows the message as it is.

``receiver serve``, ``worker``, ``proxy`` and ``console`` install them with ``--log-format``:
``auto`` (the default) is ``text`` when stderr is a terminal and ``json`` otherwise (a pipe, a
file, a container's log collector); :func:`logging_config` is the ``dictConfig`` handed to
uvicorn. An application that configures logging itself can use :class:`JSONFormatter` in its
own handler.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import logging.config
import re
import sys
from typing import Any

import orjson

from ._secrets import mask_text

FORMATS = ("auto", "json", "text")
#: The help of every command's ``--log-format``.
FORMAT_HELP = "auto (text on a terminal, else json), json (one object per line) or text"


def resolve_format(log_format: str) -> str:
    """``json`` or ``text``: ``auto`` is text for a person at a terminal, JSON for a machine."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {log_format!r}")
    if log_format != "auto":
        return log_format
    isatty = getattr(sys.stderr, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's coloured duplicate of the message
}


_PLAIN = re.compile(r"[\w.:/@+-]+")


def _value(value: object) -> str:
    text = str(value)
    if isinstance(value, str) and not _PLAIN.fullmatch(text):
        return json.dumps(text, ensure_ascii=False)  # spaces, quotes, newlines: one token
    return text


class _FieldsInMessage(logging.Filter):
    """Appends a record's ``extra`` fields to its message (see the module docstring); the
    message as the code wrote it, its secrets masked, is kept as ``record._text``. The
    traceback of a logged exception is rendered here too, masked (``record.exc_text``, which
    every ``logging.Formatter`` prints instead of rendering its own): an exception's message
    may carry what a handler was given (``password=...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "_text"):
            written = record.getMessage()
            text = mask_text(written)
            if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
                record.exc_text = mask_text(_TRACEBACK.formatException(record.exc_info))
            fields = " ".join(
                f"{k}={_value(v)}" for k, v in extras(record).items() if v is not None
            )
            record._text = text
            if fields or text != written:
                record.msg, record.args = f"{text} {fields}" if fields else text, None
        return True


_FIELDS = _FieldsInMessage()
_TRACEBACK = logging.Formatter()


def get_logger(name: str) -> logging.Logger:
    """A receiver logger (``receiver`` or ``receiver.*``) whose lines carry their fields in
    the message text too."""
    logger = logging.getLogger(name)
    logger.addFilter(_FIELDS)  # at most once: addFilter ignores a filter already there
    return logger


def _message(record: logging.LogRecord) -> str:
    """The message as the code wrote it, without the appended fields."""
    text = getattr(record, "_text", None)
    return text if isinstance(text, str) else record.getMessage()


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _dumps(obj: dict[str, Any]) -> str:
    try:
        return orjson.dumps(obj, default=str).decode()
    except TypeError:  # orjson refuses what json accepts (integers past 64 bits, ...)
        return json.dumps(obj, default=str, ensure_ascii=False)


class JSONFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, every ``extra`` field, and ``exc_type``/``exc`` when an exception is logged."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message(record),
        }
        for key, value in extras(record).items():
            out.setdefault(key, value)
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return _dumps(out)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if hasattr(record, "_text"):  # a receiver logger: the fields are in the message already
            return line
        fields = " ".join(f"{k}={v}" for k, v in extras(record).items() if v is not None)
        if not fields:
            return line
        head, newline, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {fields}{newline}{tail}"


def logging_config(log_format: str = "json", level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the receiver and uvicorn (``log_config=`` of
    ``uvicorn.run``): every record to stderr in ``log_format``. The ``receiver`` logger is left
    alone (it propagates to the root), so handlers an application added to it stay. ``auto``
    is decided here, by this process's stderr (:func:`resolve_format`)."""
    log_format = resolve_format(log_format)
    name = {"trace": "DEBUG"}.get(level.lower(), level.upper())
    formatter = "receiver._logging.JSONFormatter" if log_format == "json" else None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "receiver": {"()": formatter or "receiver._logging.TextFormatter"},
        },
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "receiver",
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"handlers": ["default"], "level": name},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": name, "propagate": False},
            "uvicorn.error": {"level": name},
            "uvicorn.access": {"handlers": ["default"], "level": name, "propagate": False},
        },
    }


def configure_logging(log_format: str = "json", level: str = "info") -> None:
    """Install :func:`logging_config` in this process (for commands that do not run uvicorn)."""
    logging.config.dictConfig(logging_config(log_format, level))
