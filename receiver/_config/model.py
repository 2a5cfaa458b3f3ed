"""A checked configuration (:class:`Config`), and the Receiver it builds.

:meth:`Config.receiver` reads the secrets from the named environment variables, imports the
handler modules, and builds the Receiver. Secrets never come from the file: files get
committed, copied and pasted into tickets; deployments already keep secrets in the environment.
"""

from __future__ import annotations

import importlib
import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._exceptions import ConfigurationError
from .._ops.sweeper import AUDIT_RETENTION, DEAD_LETTER_RETENTION
from .._queue.backoff import Backoff
from .._store.app_migrations import apply_app
from .._store.base import Store
from .._verification.schemes import GitHub, Shopify, Slack, Stripe, _key
from .._verification.senders import Linear, Paddle, Zoom
from .._verification.twilio import Twilio
from .._verification.verifier import StandardWebhooks, Verifier, _load_secret
from .._webhooks.app import Receiver
from .._webhooks.handlers import Mode
from .._webhooks.providers import Provider, SameContent
from .._webhooks.schedules import DedupWindow
from .toml_source import Key, located

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
    #: "inline", or "queued": answered 202, handlers run on workers with these retries.
    mode: Mode = "inline"
    retry: Backoff = field(default_factory=Backoff)
    #: Dotted paths into the payload the ledger's id is made of; None: the scheme's own id.
    dedup_key: tuple[str, ...] | None = None
    #: Twilio only: the webhook URL as configured in Twilio (it signs the URL).
    url: str | None = None
    #: Seconds the sender waits for an answer (None: no limit).
    timeout: float | None = None
    #: The answer to a delivery shed under load: 503 or 429.
    shed_status: int = 503
    #: Inline deliveries still running near the sender's limit are answered 202.
    handoff: bool = False
    #: The same content already in the window under another id: run, hold or absorb it.
    same_content: SameContent = "run"


@dataclass(frozen=True)
class Config:
    """A checked configuration file. `receiver` builds the Receiver it describes."""

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
    #: In-process worker slots for queued deliveries (0: run ``receiver worker`` instead).
    workers: int = 0
    #: Seconds a dead letter is kept after its window, and an audit record after its action.
    dead_letter_retention: float = DEAD_LETTER_RETENTION
    audit_retention: float = AUDIT_RETENTION
    #: The bound on deliveries in progress per process (None: derived from the pool; 0: none).
    max_in_progress: int | None = None
    #: The wait an admitted delivery is kept within, seconds (the derived bound's target).
    max_queue_wait: float = 0.5
    #: The app's own migrations: a directory of .sql files (relative to the file), or None.
    migrations: str | None = None
    _lines: Mapping[tuple[str, ...], int] = field(default_factory=dict, repr=False, compare=False)

    def receiver(
        self,
        *,
        store: Store | str | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> Receiver:
        """Build the Receiver: secrets from ``environ`` (default ``os.environ``), then each
        handler module's ``register(rx)``. ``store`` overrides the file's store; ``clock`` is
        the Receiver's (a test's fake clock; the real time by default)."""
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
            workers=self.workers,
            dead_letter_retention=self.dead_letter_retention,
            audit_retention=self.audit_retention,
            max_in_progress=self.max_in_progress,
            max_queue_wait=self.max_queue_wait,
            clock=time.time if clock is None else clock,
        )
        for index, register in enumerate(registers):
            try:
                inspect.signature(register).bind(rx)
            except TypeError as exc:  # a register() that cannot be called with the Receiver
                raise self._error(
                    ("handlers", index),
                    f"{self.handlers[index]} must take one argument, the Receiver ({exc})",
                ) from None
            try:
                register(rx)
            except ConfigurationError as exc:
                raise self._error(("handlers", index), f"{self.handlers[index]}: {exc}") from exc
        return rx

    @property
    def migrations_dir(self) -> Path | None:
        """The app's migrations directory (``migrations``, relative to the file), or None."""
        if self.migrations is None:
            return None
        return Path(self.path).parent / self.migrations

    async def migrate(self, store: Store) -> list[str]:
        """Apply the app's own migrations (the ``migrations`` directory's .sql files) that
        ``store`` lacks, as ``receiver migrate`` does after the ledger's; the files applied.
        A test calls it on its throwaway store before building the Receiver."""
        directory = self.migrations_dir
        if directory is None:
            return []
        try:
            return await apply_app(store, directory)
        except ConfigurationError as exc:
            raise self._error(("migrations",), str(exc)) from exc

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
            verifier=_verifier(config.scheme, secrets, config.tolerance, config.url),
            dedup_key=config.dedup_key,
            schedule=config.window.schedule,
            review_margin=config.review_margin,
            ttl=config.ttl,
            lease=config.lease,
            mode=config.mode,
            retry=config.retry,
            timeout=config.timeout,
            shed_status=config.shed_status,
            handoff=config.handoff,
            same_content=config.same_content,
        )

    def _register_func(self, index: int, spec: str) -> RegisterFunc:
        module_name, _, attr = spec.partition(":")
        key: Key = ("handlers", index)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise self._error(key, f"cannot import {module_name}: {exc}") from exc
        except SyntaxError as exc:
            where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
            raise self._error(key, f"cannot import {module_name}: {where}: {exc.msg}") from exc
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
        return located(self.path, self._lines, key, message)


def _verifier(
    scheme: str, secrets: list[str], tolerance: float | None, url: str | None = None
) -> Verifier:
    timed = {} if tolerance is None else {"tolerance": tolerance}
    if scheme == "stripe":
        return Stripe(secrets, **timed)
    if scheme == "slack":
        return Slack(secrets, **timed)
    if scheme == "paddle":
        return Paddle(secrets, **timed)
    if scheme == "zoom":
        return Zoom(secrets, **timed)
    if scheme == "linear":
        return Linear(secrets, **timed)
    if scheme == "twilio":
        assert url is not None  # the loader requires it
        return Twilio(secrets, url=url)
    if scheme == "github":
        return GitHub(secrets)
    if scheme == "shopify":
        return Shopify(secrets)
    return StandardWebhooks(secrets, **timed)
