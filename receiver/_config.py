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
:meth:`Config.receiver` then reads the secrets from the named environment variables, imports
the handler modules, and builds the Receiver. Secrets never come from the file: files get
committed, copied and pasted into tickets; deployments already keep secrets in the environment.

Every error names the file, the line and the key path (``receiver.toml:12:
providers.billing.schedule: ...``). tomllib reports where a syntax error is; for the rest the
line comes from a plain scan of the source for the key (:func:`_scan`), falling back to the
enclosing table. Unknown keys are errors: a typo must not silently leave a default in place.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._app import DEFAULT_MAX_BODY, DEFAULT_STORE, Receiver
from ._exceptions import ConfigurationError
from ._forwarded import TrustedProxies
from ._providers import _NAME, DEFAULT_TOLERANCE, Provider
from ._schedules import DAY, DedupWindow, RetrySchedule, dedup_window, parse_duration
from ._schemes import GitHub, Shopify, Slack, Stripe, _key
from ._store import Store
from ._store_url import store_from_url
from ._verification import StandardWebhooks, Verifier, _load_secret

#: Schemes a provider table may name, and the schedule each uses when the table names none
#: (Standard Webhooks senders get Provider()'s own default, "svix").
SCHEMES: Mapping[str, str] = {
    "standard-webhooks": "svix",
    "stripe": "stripe",
    "github": "github",
    "shopify": "shopify",
    "slack": "slack",
}
_TIMED = ("standard-webhooks", "stripe", "slack")  # schemes that sign a timestamp

# The defaults of Receiver() and Provider(), stated here so that Config shows effective values;
# tests/unit/test_config.py checks that they still agree with the signatures.
DEFAULT_RETRY_AFTER = 5
DEFAULT_SWEEP_INTERVAL = 60.0
DEFAULT_LEASE = 60.0

_TOP_KEYS = (
    "store",
    "handlers",
    "max_body_size",
    "retry_after",
    "sweep_interval",
    "trusted_proxies",
    "providers",
)
_PROVIDER_KEYS = ("scheme", "secrets_env", "tolerance", "schedule", "review_margin", "ttl", "lease")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HANDLER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*)?")
_SECRET_PREFIXES = ("whsec_", "whpk_", "whsk_")

Key = tuple[str | int, ...]
RegisterFunc = Callable[[Receiver], object]


@dataclass(frozen=True)
class ProviderConfig:
    """One ``[providers.NAME]`` table, checked; durations in seconds, defaults filled in."""

    name: str
    scheme: str
    #: Names of the environment variables holding the secrets, newest first.
    secrets_env: tuple[str, ...]
    #: None for schemes without a signed timestamp (GitHub, Shopify).
    tolerance: float | None
    review_margin: float
    ttl: float | None
    lease: float
    #: The schedule, span, margin and resulting dedup window (what ``receiver ttl`` prints).
    window: DedupWindow


@dataclass(frozen=True)
class Config:
    """A checked configuration file. :meth:`receiver` builds the Receiver it describes."""

    path: str
    store: str
    #: ``"module"`` (calls ``module.register(rx)``) or ``"module:function"``.
    handlers: tuple[str, ...]
    max_body_size: int
    retry_after: int
    #: None: no background sweeper (``sweep_interval = false``).
    sweep_interval: float | None
    providers: tuple[ProviderConfig, ...]
    #: Addresses or networks of the gateways whose X-Forwarded-For is believed.
    trusted_proxies: tuple[str, ...] = ()
    _lines: Mapping[tuple[str, ...], int] = field(default_factory=dict, repr=False, compare=False)

    def receiver(
        self, *, store: Store | str | None = None, environ: Mapping[str, str] | None = None
    ) -> Receiver:
        """Build the Receiver: secrets from ``environ`` (default ``os.environ``), then each
        handler module's ``register(rx)``. ``store`` overrides the file's store."""
        env = os.environ if environ is None else environ
        providers = [self._provider(p, env) for p in self.providers]
        registers = [self._register_func(index, spec) for index, spec in enumerate(self.handlers)]
        rx = Receiver(
            self.store if store is None else store,
            providers,
            max_body_size=self.max_body_size,
            retry_after=self.retry_after,
            sweep_interval=self.sweep_interval,
            trusted_proxies=self.trusted_proxies,
        )
        for index, register in enumerate(registers):
            try:
                register(rx)
            except ConfigurationError as exc:
                raise self._error(("handlers", index), f"{self.handlers[index]}: {exc}") from exc
        return rx

    def _provider(self, config: ProviderConfig, env: Mapping[str, str]) -> Provider:
        secrets: list[str] = []
        for index, var in enumerate(config.secrets_env):
            key: Key = ("providers", config.name, "secrets_env", index)
            value = env.get(var)
            if value is None:
                raise self._error(
                    key,
                    f"environment variable {var} is not set; export it with the provider's "
                    "secret (secrets are never read from the file)",
                )
            try:
                if config.scheme == "standard-webhooks":
                    _load_secret(value, f"the secret in {var}")
                else:
                    _key(value, f"the secret in {var}")
            except ConfigurationError as exc:
                raise self._error(key, str(exc)) from exc
            secrets.append(value)
        return Provider(
            config.name,
            verifier=_verifier(config.scheme, secrets, config.tolerance),
            schedule=config.window.schedule,
            review_margin=config.review_margin,
            ttl=config.ttl,
            lease=config.lease,
        )

    def _register_func(self, index: int, spec: str) -> RegisterFunc:
        module_name, _, attr = spec.partition(":")
        key: Key = ("handlers", index)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise self._error(key, f"cannot import {module_name}: {exc}") from exc
        func = getattr(module, attr or "register", None)
        if func is None:
            raise self._error(
                key,
                f"module {module_name} has no {attr or 'register'}(): define "
                f"def {attr or 'register'}(rx) there, registering the handlers on rx"
                + ("" if attr else f', or name the function: "{module_name}:setup"'),
            )
        if isinstance(func, Receiver) or not callable(func):
            raise self._error(
                key, f"{module_name}:{attr or 'register'} is not a function taking the Receiver"
            )
        register: RegisterFunc = func
        return register

    def _error(self, key: Key, message: str) -> ConfigurationError:
        return _error(self.path, self._lines, key, message)


def _verifier(scheme: str, secrets: list[str], tolerance: float | None) -> Verifier:
    timed = {} if tolerance is None else {"tolerance": tolerance}
    if scheme == "stripe":
        return Stripe(secrets, **timed)
    if scheme == "slack":
        return Slack(secrets, **timed)
    if scheme == "github":
        return GitHub(secrets)
    if scheme == "shopify":
        return Shopify(secrets)
    return StandardWebhooks(secrets, **timed)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a configuration file; raise ConfigurationError naming line and key.

    Reads neither the environment nor the handler modules: :meth:`Config.receiver` does.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {name}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigurationError(f"{name}:{line}: not UTF-8 text; TOML files are UTF-8") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(_syntax_error(name, exc)) from exc
    return _Parser(name, _scan(text)).config(doc)


class _Parser:
    """Checks a parsed document, key by key; every error carries its key path and line."""

    def __init__(self, path: str, lines: Mapping[tuple[str, ...], int]) -> None:
        self.path = path
        self.lines = lines

    def error(self, key: Key, message: str) -> ConfigurationError:
        return _error(self.path, self.lines, key, message)

    def config(self, doc: dict[str, Any]) -> Config:
        self.known_keys((), doc, _TOP_KEYS, "the file's top level")
        store = doc.get("store", DEFAULT_STORE)
        if not isinstance(store, str) or not store:
            raise self.error(("store",), f"expected a store URL (a string), got {_show(store)}")
        try:
            store_from_url(store)
        except ConfigurationError as exc:
            raise self.error(("store",), str(exc)) from exc
        handlers = doc.get("handlers", [])
        if not isinstance(handlers, list):
            raise self.error(
                ("handlers",),
                f'expected a list of modules, e.g. ["myapp.webhooks"], got {_show(handlers)}',
            )
        for index, spec in enumerate(handlers):
            if not isinstance(spec, str) or not _HANDLER.fullmatch(spec):
                raise self.error(
                    ("handlers", index),
                    'expected "module" (its register(rx) is called) or "module:function", '
                    f"got {_show(spec)}",
                )
        max_body_size = doc.get("max_body_size", DEFAULT_MAX_BODY)
        if isinstance(max_body_size, bool) or not isinstance(max_body_size, int):
            raise self.error(
                ("max_body_size",), f"expected a number of bytes, got {_show(max_body_size)}"
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
                f"got {_show(proxies)}",
            )
        try:
            TrustedProxies(proxies)
        except ConfigurationError as exc:
            raise self.error(("trusted_proxies",), str(exc)) from exc
        return Config(
            path=self.path,
            store=store,
            handlers=tuple(handlers),
            max_body_size=max_body_size,
            retry_after=int(retry_after),
            sweep_interval=None
            if sweep is False
            else self.duration(("sweep_interval",), sweep, positive=True),
            providers=self.providers(doc.get("providers")),
            trusted_proxies=tuple(proxies),
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
            raise self.error(("providers",), f"expected tables, got {_show(value)}")
        return tuple(self.provider(name, table) for name, table in value.items())

    def provider(self, name: str, table: object) -> ProviderConfig:
        key: Key = ("providers", name)
        if not isinstance(table, dict):
            raise self.error(key, f"expected a table [providers.{name}], got {_show(table)}")
        if not _NAME.match(name):
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
        if scheme not in SCHEMES:
            raise self.error(
                (*key, "scheme"),
                f"unknown scheme {_show(scheme)}; known schemes: {', '.join(sorted(SCHEMES))}",
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
        return ProviderConfig(
            name=name,
            scheme=scheme,
            secrets_env=secrets_env,
            tolerance=tolerance,
            review_margin=margin,
            ttl=ttl,
            lease=lease,
            window=window,
        )

    def env_names(self, key: Key, value: object, example: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise self.error(
                key,
                "expected a non-empty list of environment variable names, "
                f'e.g. ["{example}"], got {_show(value)}',
            )
        for index, item in enumerate(value):
            # Never echo the value: if it is not a name, it may well be the secret itself.
            if isinstance(item, str) and item.startswith(_SECRET_PREFIXES):
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
                f'["0s", "5s", "5m"], got {_show(value)}',
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
                f"got {_show(value)}",
            )
        try:
            seconds = parse_duration(value)
        except ConfigurationError as exc:
            raise self.error(key, str(exc)) from exc
        if positive and seconds <= 0:
            raise self.error(key, f"must be longer than 0s, got {_show(value)}")
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


# -- locating errors ------------------------------------------------------------------------------


def _error(
    path: str, lines: Mapping[tuple[str, ...], int], key: Key, message: str
) -> ConfigurationError:
    """``receiver.toml:12: providers.billing.ttl: message``; the line of the key itself, else
    of the closest enclosing table or key found in the source."""
    names = tuple(part for part in key if isinstance(part, str))
    while names and names not in lines:
        names = names[:-1]
    where = f"{path}:{lines[names]}" if names else path
    dotted = "".join(
        f"[{part}]"
        if isinstance(part, int)
        else ("." if i else "")
        + (part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else json.dumps(part))
        for i, part in enumerate(key)
    )
    return ConfigurationError(f"{where}: {dotted}: {message}" if dotted else f"{where}: {message}")


_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def _syntax_error(path: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    found = _AT.search(message)
    if found is None:
        return f"{path}: invalid TOML: {message}"
    reason = message[: found.start()]
    if found.group(1) is None:
        return f"{path}: invalid TOML at the end of the file: {reason}"
    return f"{path}:{found.group(1)}:{found.group(2)}: invalid TOML: {reason}"


_PART = r'[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\''
_DOTTED = rf"(?:{_PART})(?:\s*\.\s*(?:{_PART}))*"
_TABLE_LINE = re.compile(rf"\s*\[\[?\s*({_DOTTED})\s*\]")
_KEY_LINE = re.compile(rf"\s*({_DOTTED})\s*=")


def _parts(dotted: str) -> tuple[str, ...]:
    parts: list[str] = []
    for match in re.finditer(_PART, dotted):
        part = match.group()
        if part.startswith('"'):
            try:
                part = json.loads(part)  # TOML basic strings escape like JSON, \U aside
            except ValueError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _scan(text: str) -> dict[tuple[str, ...], int]:
    """The first line of every table header and key in ``text`` (and of their prefixes).

    Not a TOML parser: the text already parsed, this only says where things are. It skips
    the insides of multi-line strings and arrays; keys inside inline tables resolve to the line
    of the table's own key, which is close enough for an error message.
    """
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    inside: str | None = None  # the closing delimiter of the multi-line string we are in
    depth = 0  # how many arrays are open at the end of the line
    for number, line in enumerate(text.split("\n"), 1):
        if inside is not None:
            if line.count(inside) % 2:
                inside = None
            continue
        if depth > 0:
            depth += _brackets(line)
            continue
        if header := _TABLE_LINE.match(line):
            table = _parts(header.group(1))
            names = table
        elif assignment := _KEY_LINE.match(line):
            names = table + _parts(assignment.group(1))
            rest = line[assignment.end() :]
            inside = next((d for d in ('"""', "'''") if rest.count(d) % 2), None)
            depth = 0 if inside else _brackets(rest)
        else:
            continue
        for end in range(1, len(names) + 1):
            found.setdefault(names[:end], number)
    return found


_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'")


def _brackets(text: str) -> int:
    """Arrays opened minus arrays closed in ``text``, outside strings and comments."""
    code = _STRING.sub("", text).split("#", 1)[0]
    return code.count("[") - code.count("]")


def _show(value: object) -> str:
    """A value as TOML spells it, with its TOML type."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{json.dumps(value)} (a string)"
    if isinstance(value, int | float):
        return f"{value!r} ({'a float' if isinstance(value, float) else 'an integer'})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"{value} (a {type(value).__name__})"  # dates and times
