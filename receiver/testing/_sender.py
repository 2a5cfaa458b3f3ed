"""A sender for a configured provider: signs deliveries in that provider's scheme and sends
them to a real Receiver, in-process (ASGI) or over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .._exceptions import ConfigurationError
from .._verification.sending import Scheme, Webhook, scheme, scheme_of
from .._webhooks.app import Receiver
from ._faults import SimulatedCrash

# The receiver's own refusals (never a handler's answer): the JSON "error" codes it sends.
_REFUSALS = frozenset(
    {
        "payload_mismatch",
        "unknown_provider",
        "invalid_payload",
        "webhook_id",
        "timestamp",
        "signature",
        "event_id",
        "event_type",
        "content_length",
        "content_type",
        "body_too_large",
        "dedup_key",
        "body",
    }
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt as the sender saw it. ``status`` is None when the receiving process died
    before answering (an injected crash)."""

    webhook_id: str
    at: float
    status: int | None
    content_type: str = ""
    body: bytes = b""
    replayed: bool = False

    @property
    def outcome(self) -> str:
        """``executed`` (a fresh final answer: the handlers ran and it was stored),
        ``replayed``, ``in_flight`` (409), ``failed`` (5xx: the sender retries), ``refused``
        (verification, payload mismatch, ...), ``needs_review`` (an interrupted external
        handler without reconcile), or ``died``."""
        if self.status is None:
            return "died"
        if self.replayed:
            return "replayed"
        if self.status == 409:
            return "in_flight"
        if self.status >= 500:
            return "failed"
        if self.status == 202 and b'"needs_review"' in self.body:
            return "needs_review"
        code = self._error() or ""
        if self.status in (401, 404, 405, 413) or code in _REFUSALS:
            return "refused"
        if code.startswith(("missing_header:", "duplicate_header:")):
            return "refused"
        return "executed"

    @property
    def answer(self) -> tuple[int | None, str, bytes]:
        """What a replay must repeat byte for byte: status, content type, body."""
        return (self.status, self.content_type, self.body)

    def _error(self) -> str | None:
        if not self.content_type.startswith("application/json"):
            return None
        try:
            value = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        code = value.get("error") if isinstance(value, dict) else None
        return code if isinstance(code, str) else None

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 80 else self.body[:77] + b"..."
        return f"<{self.webhook_id} at {self.at:.0f}: {self.outcome} {self.status} {body!r}>"


class Sender:
    """Signs and sends deliveries of one provider, as that provider would.

    ``target`` is the user's `Receiver` (deliveries go through its ASGI app,
    in this process) or the base URL of a running one (``"http://127.0.0.1:8000/webhooks"``;
    each delivery is ``POST {url}/{provider}``). With a Receiver the scheme is read from the
    provider's verifier; with a URL give ``scheme=`` (``"standard-webhooks"``, ``"svix"``
    (Standard Webhooks under Svix's default ``svix-*`` header names), ``"stripe"``,
    ``"github"``, ``"shopify"``, ``"slack"``, ``"paddle"``, ``"zoom"``, ``"linear"`` or
    ``"twilio"``). ``secret`` is the signing secret: a ``whsec_...`` (v1) or ``whsk_...`` (v1a)
    for Standard Webhooks, the Auth Token for Twilio, the shared secret otherwise. Twilio signs
    the URL it requests: the Twilio verifier's ``url`` in-process, ``{url}/{provider}`` over
    HTTP. ``clock`` dates every signature; give the test's `FakeClock`.
    """

    def __init__(
        self,
        target: Receiver | str,
        provider: str,
        secret: str | bytes,
        *,
        scheme: str | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 30.0,
    ) -> None:
        self.provider = provider
        self.secret = secret
        self.clock = clock
        self.receiver = target if isinstance(target, Receiver) else None
        self.scheme: Scheme = self._scheme(target, provider, scheme)
        self._ids = itertools.count(1)
        if isinstance(target, Receiver):
            transport: httpx.AsyncBaseTransport = httpx.ASGITransport(app=target)
            base = "http://receiver.test"
        else:
            transport = httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=200)
            )
            base = target.rstrip("/")
        #: The URL the provider's sender requests (Twilio signs it).
        self.url = self._url(target, provider, f"{base}/{provider}")
        self._client = httpx.AsyncClient(transport=transport, base_url=base, timeout=timeout)

    @staticmethod
    def _url(target: Receiver | str, provider: str, default: str) -> str:
        if isinstance(target, Receiver):
            found = target.providers.get(provider)
            url = getattr(found.scheme, "url", None) if found is not None else None
            if isinstance(url, str):
                return url
        return default

    @staticmethod
    def _scheme(target: Receiver | str, provider: str, name: str | None) -> Scheme:
        if name is not None:
            return scheme(name)
        if not isinstance(target, Receiver):
            raise ConfigurationError(
                "sending to a URL: pass scheme= (the Receiver behind it is not in this process)"
            )
        found = target.providers.get(provider)
        if found is None:
            raise ConfigurationError(
                f"the receiver has no provider {provider!r}; configured: {sorted(target.providers)}"
            )
        return scheme_of(found.scheme)  # as configured, before any dedup key

    # -- events ----------------------------------------------------------------------------------

    def event(self, type: str, data: Any = None, *, id: str | None = None) -> Webhook:
        """A new event of ``type`` carrying ``data`` (a JSON object), in this provider's
        envelope, so a handler reads ``data`` where that sender puts it: Standard Webhooks'
        ``payload["data"]``, Stripe's ``payload["data"]["object"]``, Slack's
        ``payload["event"]``, Paddle's ``payload["data"]``, Zoom's
        ``payload["payload"]["object"]``, Linear's ``payload["data"]``, and the top level of a
        GitHub or Shopify body or of Twilio's form. Its body is fixed now; every `send`
        repeats it."""
        webhook_id = id if id is not None else f"{self.scheme.id_prefix}{next(self._ids):06d}"
        body = self.scheme.body(webhook_id, type, data if data is not None else {}, self.clock())
        key = self.scheme.id_of(webhook_id, body)
        return Webhook(self.provider, key, type, body, "" if key == webhook_id else webhook_id)

    def headers(self, webhook: Webhook) -> list[tuple[str, str]]:
        """Signed headers for one attempt of ``webhook``, dated now."""
        return self.attempt(webhook)[1]

    def attempt(self, webhook: Webhook) -> tuple[bytes, list[tuple[str, str]]]:
        """The body and signed headers of one attempt of ``webhook``, dated now (the body is
        the event's, except where the sender dates each attempt inside it: Linear)."""
        ts = int(self.clock())
        body = self.scheme.attempt(webhook.body, ts)
        signed = self.scheme.headers(webhook, body, ts, self.secret, self.url)
        return body, [*signed, ("content-type", self.scheme.content_type)]

    # -- sending ---------------------------------------------------------------------------------

    async def send(self, webhook: Webhook) -> Delivery:
        """Deliver ``webhook`` once. An injected crash comes back as a ``died`` Delivery."""
        at = self.clock()
        body, headers = self.attempt(webhook)
        try:
            response = await self._client.post(
                f"/{webhook.provider}", content=body, headers=headers
            )
        except SimulatedCrash:
            return Delivery(webhook.id, at, None)
        return Delivery(
            webhook.id,
            at,
            response.status_code,
            response.headers.get("content-type", ""),
            response.content,
            response.headers.get("idempotent-replayed") == "true",
        )

    async def twins(self, webhook: Webhook, copies: int = 10) -> list[Delivery]:
        """``copies`` concurrent deliveries of ``webhook``, released together through one
        barrier (over HTTP, every connection is opened first, so that they race in the
        receiver and not in the TCP handshake)."""
        if copies < 1:
            raise ConfigurationError(f"twins needs at least one copy, not {copies}")
        if self.receiver is None:
            await asyncio.gather(*(self._client.get("/") for _ in range(copies)))
        barrier = asyncio.Barrier(copies)

        async def one() -> Delivery:
            await barrier.wait()
            return await self.send(webhook)

        return list(await asyncio.gather(*(one() for _ in range(copies))))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:  # never the secret
        where = "in-process" if self.receiver is not None else str(self._client.base_url)
        return f"Sender({self.provider!r}, scheme={self.scheme.name!r}, {where})"
