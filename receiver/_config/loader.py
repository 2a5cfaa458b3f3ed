"""Configuration from a TOML file: ``receiver serve --config receiver.toml``.

One file describes one Receiver: its store, limits, providers, and the handler modules that
register their handlers on it::

    store = "sqlite:///receiver.db"
    handlers = ["myapp.webhooks"]        # each module defines def register(rx)

    [providers.billing]                  # served at POST /billing
    secrets_env = ["BILLING_SECRET", "BILLING_SECRET_OLD"]
    schedule = "svix"

:func:`load_config` checks everything the file says and touches nothing else: no environment,
no imports, no database, so ``receiver ttl`` and ``receiver migrate`` work without the secrets.
:meth:`Config.receiver` then reads the secrets from the environment, imports the handler
modules, and builds the Receiver.

Every error names the file, the line and the key path (``receiver.toml:12:
providers.billing.schedule: ...``; receiver/_config/toml_source.py finds the line). Unknown keys are
errors: a typo must not silently leave a default in place. The checked file is a
:class:`~receiver.Config` (receiver/_config/model.py), which builds the Receiver.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any

from .._exceptions import ConfigurationError
from .._ops.forwarded import TrustedProxies
from .._ops.sweeper import AUDIT_RETENTION, DEAD_LETTER_RETENTION
from .._queue.backoff import Backoff
from .._store.url import store_from_url
from .._verification.keys import dedup_key as check_dedup_key
from .._verification.twilio import Twilio
from .._webhooks.admission import DEFAULT_MAX_WAIT
from .._webhooks.app import DEFAULT_MAX_BODY, DEFAULT_STORE, Receiver
from .._webhooks.providers import _NAME, DEFAULT_TOLERANCE
from .._webhooks.schedules import RetrySchedule, dedup_window, parse_duration
from .._webhooks.senders import sender_timeout
from .._webhooks.timespans import DAY
from .model import Config, ProviderConfig
from .toml_source import Key, located, read, scan, show

SCHEMES: Mapping[str, str] = {
    "standard-webhooks": "svix",
    "stripe": "stripe",
    "github": "github",
    "shopify": "shopify",
    "slack": "slack",
    "paddle": "paddle",
    "zoom": "zoom",
    "linear": "linear",
    "twilio": "twilio",
}
# Schemes that sign a timestamp.
_TIMED = ("standard-webhooks", "stripe", "slack", "paddle", "zoom", "linear")

# The defaults of Receiver() and Provider(), stated here so that Config shows effective values;
# tests/unit/test_config.py checks that they still agree with the signatures.
DEFAULT_RETRY_AFTER = 5
DEFAULT_SWEEP_INTERVAL = 60.0
DEFAULT_LEASE = 60.0

_TOP_KEYS = (
    "store",
    "handlers",
    # The app's own SQL files (its tables), applied by `receiver migrate` as the owner.
    "migrations",
    "max_body_size",
    "retry_after",
    "sweep_interval",
    "trusted_proxies",
    "workers",
    "dead_letter_retention",
    "audit_retention",
    # Admission control (receiver/_webhooks/admission.py): the bound on deliveries in
    # progress (absent: derived from the pool) and the wait it keeps an admitted one within.
    "max_in_progress",
    "max_queue_wait",
    "providers",
)
_PROVIDER_KEYS = (
    "scheme",
    "secrets_env",
    "tolerance",
    "schedule",
    "review_margin",
    "ttl",
    "lease",
    # Queued mode (docs/how-to/queued.md): "inline" or "queued", and the workers' retries.
    "mode",
    "retry_attempts",
    "retry_base",
    "retry_cap",
    # Where the ledger's id comes from: a dotted path into the payload, or a list of them.
    "dedup_key",
    # Twilio signs the URL it requested: the webhook URL as configured in Twilio.
    "url",
    # The sender's time limit (absent: the schedule preset's sender's; false: none) and the
    # answer to a delivery shed under load (503 or 429).
    "timeout",
    "shed_status",
    # Inline deliveries still running when the sender's time is nearly spent: answered 202.
    "handoff",
    # The same content already in the window under another id: "run", "hold" or "absorb".
    "same_content",
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HANDLER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*)?")
_SECRET_PREFIXES = ("whsec_", "whpk_", "whsk_")


def _secret_like(value: object) -> bool:
    """Whether ``value`` looks like a webhook secret: an error message must never echo it."""
    return isinstance(value, str) and value.strip().startswith(_SECRET_PREFIXES)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a configuration file; raise ConfigurationError naming line and key.

    Reads neither the environment nor the handler modules: `Config.receiver` does.
    """
    name = os.fspath(path)
    text, doc = read(name)
    return _Parser(name, scan(text)).config(doc)


class _Parser:
    """Checks a parsed document, key by key; every error carries its key path and line."""

    def __init__(self, path: str, lines: Mapping[tuple[str, ...], int]) -> None:
        self.path = path
        self.lines = lines

    def error(self, key: Key, message: str) -> ConfigurationError:
        return located(self.path, self.lines, key, message)

    def config(self, doc: dict[str, Any]) -> Config:
        self.known_keys((), doc, _TOP_KEYS, "the file's top level")
        store = doc.get("store", DEFAULT_STORE)
        if not isinstance(store, str) or not store:
            raise self.error(("store",), f"expected a store URL (a string), got {show(store)}")
        try:
            store_from_url(store)
        except ConfigurationError as exc:
            raise self.error(("store",), str(exc)) from exc
        handlers = doc.get("handlers", [])
        if not isinstance(handlers, list):
            raise self.error(
                ("handlers",),
                f'expected a list of modules, e.g. ["myapp.webhooks"], got {show(handlers)}',
            )
        for index, spec in enumerate(handlers):
            if not isinstance(spec, str) or not _HANDLER.fullmatch(spec):
                raise self.error(
                    ("handlers", index),
                    'expected "module" (its register(rx) is called) or "module:function", '
                    f"got {show(spec)}",
                )
        migrations = doc.get("migrations")
        if migrations is not None and (not isinstance(migrations, str) or not migrations):
            expected = 'expected a directory of .sql files, relative to this file, e.g. "sql"'
            raise self.error(("migrations",), f"{expected}, got {show(migrations)}")
        max_body_size = doc.get("max_body_size", DEFAULT_MAX_BODY)
        if isinstance(max_body_size, bool) or not isinstance(max_body_size, int):
            raise self.error(
                ("max_body_size",), f"expected a number of bytes, got {show(max_body_size)}"
            )
        if max_body_size <= 0:
            raise self.error(("max_body_size",), f"must be positive, got {max_body_size}")
        retry_after = self.duration(("retry_after",), doc.get("retry_after", DEFAULT_RETRY_AFTER))
        if not retry_after.is_integer():
            raise self.error(
                ("retry_after",), "must be whole seconds: it is sent as a Retry-After header"
            )
        sweep = doc.get("sweep_interval", DEFAULT_SWEEP_INTERVAL)
        if sweep is True:
            raise self.error(
                ("sweep_interval",), "expected a duration, or false to run no background sweeper"
            )
        proxies = doc.get("trusted_proxies", [])
        if not isinstance(proxies, list) or not all(isinstance(p, str) for p in proxies):
            raise self.error(
                ("trusted_proxies",),
                'expected a list of addresses or networks, e.g. ["10.0.0.0/8"], '
                f"got {show(proxies)}",
            )
        try:
            TrustedProxies(proxies)
        except ConfigurationError as exc:
            raise self.error(("trusted_proxies",), str(exc)) from exc
        retention = {
            name: self.duration((name,), doc.get(name, default))
            for name, default in (
                ("dead_letter_retention", DEAD_LETTER_RETENTION),
                ("audit_retention", AUDIT_RETENTION),
            )
        }
        workers = doc.get("workers", 0)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise self.error(
                ("workers",),
                "expected a number of in-process worker slots for queued deliveries (0: none, "
                f"run `receiver worker` instead), got {show(workers)}",
            )
        max_in_progress = doc.get("max_in_progress")
        if max_in_progress is not None and (
            isinstance(max_in_progress, bool)
            or not isinstance(max_in_progress, int)
            or max_in_progress < 0
        ):
            raise self.error(
                ("max_in_progress",),
                "expected a number of deliveries in progress per process (0: no bound; leave "
                f"it out to derive it from the pool size), got {show(max_in_progress)}",
            )
        max_queue_wait = self.duration(
            ("max_queue_wait",), doc.get("max_queue_wait", DEFAULT_MAX_WAIT), positive=True
        )
        return Config(
            path=self.path,
            store=store,
            handlers=tuple(handlers),
            migrations=migrations,
            max_body_size=max_body_size,
            retry_after=int(retry_after),
            sweep_interval=None
            if sweep is False
            else self.duration(("sweep_interval",), sweep, positive=True),
            providers=self.providers(doc.get("providers")),
            trusted_proxies=tuple(proxies),
            workers=workers,
            dead_letter_retention=retention["dead_letter_retention"],
            audit_retention=retention["audit_retention"],
            max_in_progress=max_in_progress,
            max_queue_wait=max_queue_wait,
            _lines=self.lines,
        )

    def providers(self, value: object) -> tuple[ProviderConfig, ...]:
        if isinstance(value, list):
            raise self.error(
                ("providers",),
                "write one [providers.NAME] table per provider (NAME is its URL path), "
                "not [[providers]]",
            )
        if value is None or value == {}:
            raise self.error(
                ("providers",),
                'no providers: add a [providers.NAME] table with secrets_env = ["NAME_SECRET"]',
            )
        if not isinstance(value, dict):
            raise self.error(("providers",), f"expected tables, got {show(value)}")
        return tuple(self.provider(name, table) for name, table in value.items())

    def provider(self, name: str, table: object) -> ProviderConfig:
        key: Key = ("providers", name)
        if not isinstance(table, dict):
            raise self.error(key, f"expected a table [providers.{name}], got {show(table)}")
        if not _NAME.fullmatch(name):
            raise self.error(
                key, "a provider name is 1-64 letters, digits, '-' or '_' (it is a URL path)"
            )
        example = re.sub(r"\W", "_", name).upper() + "_SECRET"
        if "secrets" in table:
            raise self.error(
                (*key, "secrets"),
                "secrets are never read from the file: put each in an environment variable "
                f'and name the variables instead, e.g. secrets_env = ["{example}"]',
            )
        self.known_keys(key, table, _PROVIDER_KEYS, "a provider")
        scheme = table.get("scheme", "standard-webhooks")
        if not isinstance(scheme, str) or scheme not in SCHEMES:
            raise self.error(
                (*key, "scheme"),
                f"unknown scheme {show(scheme)}; known schemes: {', '.join(sorted(SCHEMES))}",
            )
        if "secrets_env" not in table:
            raise self.error(
                (*key, "secrets_env"),
                "missing: name the environment variables that hold this provider's secrets, "
                f'e.g. secrets_env = ["{example}"]',
            )
        secrets_env = self.env_names((*key, "secrets_env"), table["secrets_env"], example)
        tolerance: float | None = None
        if scheme in _TIMED:
            tolerance = self.duration(
                (*key, "tolerance"), table.get("tolerance", DEFAULT_TOLERANCE)
            )
        elif "tolerance" in table:
            raise self.error(
                (*key, "tolerance"),
                f"{scheme} signatures carry no timestamp, so there is no tolerance to set; "
                "remove this key",
            )
        schedule = self.schedule((*key, "schedule"), table.get("schedule", SCHEMES[scheme]))
        margin = self.duration((*key, "review_margin"), table.get("review_margin", DAY))
        ttl = None if "ttl" not in table else self.duration((*key, "ttl"), table["ttl"])
        lease = self.duration((*key, "lease"), table.get("lease", DEFAULT_LEASE), positive=True)
        try:
            window = dedup_window(schedule, review_margin=margin, ttl=ttl, provider=name)
        except ConfigurationError as exc:
            message = str(exc).removeprefix(f"provider {name!r}: ")
            raise self.error((*key, "review_margin" if ttl is None else "ttl"), message) from exc
        mode = table.get("mode", "inline")
        if mode not in ("inline", "queued"):
            raise self.error(
                (*key, "mode"),
                f'expected "inline" (handlers run while the sender waits) or "queued" '
                f"(answered 202, handlers run on workers), got {show(mode)}",
            )
        retry = self.retry(key, table)
        dedup_key = self.dedup_key((*key, "dedup_key"), table.get("dedup_key"))
        url = self.url(key, scheme, table.get("url"))
        timeout = table.get("timeout", sender_timeout(schedule.name))
        if timeout is False:
            timeout = None
        elif timeout is not None:
            timeout = self.duration((*key, "timeout"), timeout, positive=True)
        shed_status = table.get("shed_status", 503)
        if shed_status not in (429, 503) or isinstance(shed_status, bool):
            raise self.error(
                (*key, "shed_status"),
                f"expected 503 or 429 (the answer to a delivery shed under load), "
                f"got {show(shed_status)}",
            )
        handoff = table.get("handoff", False)
        if not isinstance(handoff, bool):
            raise self.error(
                (*key, "handoff"),
                f"expected true or false (answer 202 and finish in the background when the "
                f"sender's time is nearly spent), got {show(handoff)}",
            )
        same_content = table.get("same_content", "run")
        if same_content not in ("run", "hold", "absorb"):
            raise self.error(
                (*key, "same_content"),
                f'expected "run", "hold" (for review) or "absorb" (answered as a duplicate), '
                f"got {show(same_content)}",
            )
        return ProviderConfig(
            name=name,
            scheme=scheme,
            secrets_env=secrets_env,
            tolerance=tolerance,
            review_margin=margin,
            ttl=ttl,
            lease=lease,
            window=window,
            mode=mode,
            retry=retry,
            dedup_key=dedup_key,
            url=url,
            timeout=timeout,
            shed_status=shed_status,
            handoff=handoff,
            same_content=same_content,
        )

    def dedup_key(self, key: Key, value: object) -> tuple[str, ...] | None:
        """``dedup_key``: one dotted path into the payload, or a list of them."""
        if value is None:
            return None
        paths = [value] if isinstance(value, str) else value
        if not isinstance(paths, list) or not paths:
            raise self.error(
                key,
                'expected a dotted path into the payload, e.g. "record.id", or a list of them, '
                f'e.g. ["record.id", "commit_timestamp"], got {show(value)}',
            )
        name = str(key[1])
        try:
            check_dedup_key(paths, name)
        except ConfigurationError as exc:
            raise self.error(key, str(exc).removeprefix(f"provider {name!r}: ")) from exc
        return tuple(paths)

    def url(self, key: Key, scheme: str, value: object) -> str | None:
        """``url``: required by Twilio (the URL it signs), refused elsewhere."""
        if scheme != "twilio":
            if value is not None:
                raise self.error(
                    (*key, "url"), f"{scheme} signatures do not cover the URL; remove this key"
                )
            return None
        if value is None:
            raise self.error(
                (*key, "url"),
                "missing: Twilio signs the URL it requests; give the webhook URL exactly as "
                'configured in Twilio, e.g. url = "https://example.com/webhooks/twilio"',
            )
        if not isinstance(value, str):
            raise self.error((*key, "url"), f"expected the webhook URL, got {show(value)}")
        try:
            Twilio(["placeholder"], url=value)  # the URL's checks, without the secret
        except ConfigurationError as exc:
            raise self.error((*key, "url"), str(exc).removeprefix("Twilio: ")) from exc
        return value

    def retry(self, key: Key, table: Mapping[str, Any]) -> Backoff:
        """The queued mode's retries: ``retry_attempts``, ``retry_base``, ``retry_cap``."""
        default = Backoff()
        attempts = table.get("retry_attempts", default.attempts)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise self.error(
                (*key, "retry_attempts"),
                f"expected a whole number of attempts, at least 1, got {show(attempts)}",
            )
        base = self.duration(
            (*key, "retry_base"), table.get("retry_base", default.base), positive=True
        )
        cap = self.duration((*key, "retry_cap"), table.get("retry_cap", default.cap), positive=True)
        try:
            return Backoff(attempts=attempts, base=base, cap=cap)
        except ConfigurationError as exc:
            raise self.error((*key, "retry_cap"), str(exc)) from exc

    def env_names(self, key: Key, value: object, example: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            # Never echo a secret put where its variable's name belongs.
            shown = "a secret" if _secret_like(value) else show(value)
            raise self.error(
                key,
                "expected a non-empty list of environment variable names, "
                f'e.g. ["{example}"], got {shown}',
            )
        for index, item in enumerate(value):
            # Never echo the value: if it is not a name, it may well be the secret itself.
            if _secret_like(item):
                raise self.error(
                    (*key, index),
                    "this is a secret, not the name of an environment variable: put it in a "
                    "variable, name the variable here, and rotate the secret (it was in a file)",
                )
            if not isinstance(item, str) or not _ENV_NAME.fullmatch(item):
                raise self.error(
                    (*key, index),
                    "expected the name of an environment variable (letters, digits and '_', "
                    "not starting with a digit)",
                )
            if item in value[:index]:
                raise self.error((*key, index), f"{item} is listed twice")
        return tuple(value)

    def schedule(self, key: Key, value: object) -> RetrySchedule:
        if isinstance(value, list):
            value = tuple(self.duration((*key, i), item) for i, item in enumerate(value))
        elif not isinstance(value, str):
            raise self.error(
                key,
                'expected a preset name such as "svix" or a list of delays such as '
                f'["0s", "5s", "5m"], got {show(value)}',
            )
        try:
            return RetrySchedule.from_value(value)
        except ConfigurationError as exc:
            raise self.error(key, str(exc)) from exc

    def duration(self, key: Key, value: object, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.error(
                key,
                'expected a duration: seconds, or a string such as "90s", "5m", "2h", "3d", '
                f"got {show(value)}",
            )
        try:
            seconds = parse_duration(value)
        except ConfigurationError as exc:
            raise self.error(key, str(exc)) from exc
        if positive and seconds <= 0:
            raise self.error(key, f"must be longer than 0s, got {show(value)}")
        return seconds

    def known_keys(
        self, key: Key, table: Mapping[str, object], known: tuple[str, ...], what: str
    ) -> None:
        for name in table:
            if name in known:
                continue
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            if not key and name in _PROVIDER_KEYS:
                hint = " (provider settings go in a [providers.NAME] table)"
            elif key and name in _TOP_KEYS:
                hint = " (top-level keys must come before the first [table] header)"
            raise self.error((*key, name), f"unknown key{hint}; {what} takes {', '.join(known)}")


def _app_from_environment() -> Receiver:
    """uvicorn's factory for ``receiver serve --config``: every worker process builds its
    Receiver from ``RECEIVER_CONFIG``, with ``RECEIVER_STORE`` (if set) overriding the store."""
    path = os.environ.get("RECEIVER_CONFIG")
    if not path:
        raise ConfigurationError("RECEIVER_CONFIG is not set: name the configuration file")
    return load_config(path).receiver(store=os.environ.get("RECEIVER_STORE") or None)
