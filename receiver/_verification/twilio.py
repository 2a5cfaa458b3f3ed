"""Verifier for Twilio: ``X-Twilio-Signature``, HMAC-SHA1 over the URL and the parameters.

Twilio (https://www.twilio.com/docs/usage/webhooks/webhooks-security) signs the full URL it
requested, then each POST parameter's name and value, sorted by name (and, for a repeated name,
by value, as the SDKs sort), concatenated without separators; HMAC-SHA1 under the account's
Auth Token, base64. A JSON body is signed differently: Twilio adds ``bodySHA256=<hex SHA-256 of
the body>`` to the URL's query, signs that URL alone, and the body must hash to it.

The receiver does not see the URL the way Twilio does (a gateway, TLS offloading and the mount
point all rewrite it), so the verifier is given the URL configured in Twilio's console,
``url="https://example.com/webhooks/twilio"``. As Twilio's SDKs do, the URL is also tried with
its default port added or its port removed. Several Auth Tokens (primary, secondary) rotate.

Twilio signs no timestamp and no id. The ledger key is ``I-Twilio-Idempotency-Token``, which
Twilio sends with each request and keeps on its retries: two genuine requests can carry the
same parameters (a ``<Gather>`` answered with the same digits twice in one call), so the
signed content alone would merge them. A request without the token is keyed on what Twilio
signs: ``"sha256:"`` and the hex SHA-256 of the signed parameters (each name and value, sorted,
as signed; the URL is the provider's own and adds nothing), or of a JSON body. A captured
request re-sent under a new token gets a key of its own; the receiver reports the same content
under another key in the window (key drift), and ``Provider(same_content=...)`` can hold or
absorb it. The event type is ``event_type=`` when given,
else ``"call.<CallStatus>"`` or ``"message.<MessageStatus or SmsStatus>"`` from the
parameters, else ``"twilio"``; a JSON body's type is read from the body as usual.
Signatures made with a Webhooks Rule's shared key (``X-Twilio-Webhooks-Signature-Settings``)
are not supported: they fail as a forged signature would.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import orjson

from .._exceptions import ConfigurationError, MalformedRequest, VerificationError
from .ids import hint
from .schemes import _TOKEN, _header, _key, _token
from .spelling import NEVER, canonical_b64
from .verifier import VerifiedDelivery

if TYPE_CHECKING:
    from starlette.datastructures import Headers

__all__ = ["Twilio", "sign_twilio", "twilio_key"]

_B64_20 = re.compile(r"[A-Za-z0-9+/]{27}=")  # base64 of a 20-byte SHA-1 digest
_MAX_FIELDS = 1000
_PORTS = {"https": 443, "http": 80}


def _split(url: object) -> urllib.parse.SplitResult | None:
    """``url``'s parts, or None where it is no URL: not text, brackets unclosed, a port that
    is not 0-65535, a lone surrogate (the URL is signed as UTF-8: every delivery failed)."""
    if not isinstance(url, str):
        return None
    try:
        url.encode("utf-8")  # UnicodeEncodeError is a ValueError
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- parsed on access: raises ValueError when out of range
    except ValueError:
        return None
    return parts


def _urls(url: str) -> tuple[str, ...]:
    """The configured URL, and the same with its default port added or its port removed."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else "") + host
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    ported = urllib.parse.urlunsplit(
        parts._replace(netloc=f"{netloc}:{parts.port or _PORTS.get(parts.scheme, 443)}")
    )
    return tuple(dict.fromkeys((url, bare, ported)))


def _params(body: bytes) -> list[tuple[str, str]]:
    """The form parameters, sorted as Twilio signs them; MalformedRequest if not a form."""
    try:
        text = body.decode("utf-8")
        return sorted(
            urllib.parse.parse_qsl(
                text, keep_blank_values=True, strict_parsing=True, max_num_fields=_MAX_FIELDS
            )
        )
    except ValueError:  # also UnicodeDecodeError
        if not body:
            return []
        raise MalformedRequest(
            "body", "the body is neither a form (application/x-www-form-urlencoded) nor JSON"
        ) from None


def _signed(url: str, params: Iterable[tuple[str, str]]) -> bytes:
    return (url + "".join(name + value for name, value in params)).encode("utf-8")


def twilio_key(body: bytes, *, is_json: bool) -> str:
    """The ledger key of a Twilio request: the digest of what its signature covers besides the
    provider's URL (the parameters as signed, or a JSON body)."""
    signed = b"json\x00" + body if is_json else b"form\x00" + _signed("", _params(body))
    return "sha256:" + hashlib.sha256(signed).hexdigest()


def _with_body_hash(url: str, body: bytes) -> str:
    separator = "&" if urllib.parse.urlsplit(url).query else "?"
    return f"{url}{separator}bodySHA256={hashlib.sha256(body).hexdigest()}"


class Twilio:
    """Verifies Twilio's ``X-Twilio-Signature`` for the webhook URL ``url``."""

    __slots__ = ("_macs", "_urls", "event_type", "url")

    #: Twilio documents no answer that stops a retry (it retries only on connection failures,
    #: and only when the URL's connection overrides ask for it).
    stop_retry: tuple[tuple[str, str], ...] = ()

    def __init__(
        self, auth_tokens: Sequence[str | bytes], *, url: str, event_type: str | None = None
    ) -> None:
        if isinstance(auth_tokens, str | bytes):
            raise ConfigurationError("Twilio: auth_tokens must be a list, e.g. [auth_token]")
        if not auth_tokens:
            raise ConfigurationError("Twilio: no auth tokens configured; give at least one")
        self._macs = tuple(
            hmac.new(_key(token, f"Twilio auth_tokens[{i}]"), digestmod=hashlib.sha1)
            for i, token in enumerate(auth_tokens)
        )
        parts = _split(url)
        if parts is None or parts.scheme not in _PORTS or not parts.hostname or parts.fragment:
            raise ConfigurationError(
                "Twilio: url must be the webhook URL exactly as configured in Twilio, e.g. "
                "'https://example.com/webhooks/twilio' (http or https, no #fragment)"
            )
        if event_type is not None and _TOKEN.fullmatch(event_type) is None:
            raise ConfigurationError("Twilio: event_type must be 1-255 visible ASCII characters")
        self.url = url
        self._urls = _urls(url)
        self.event_type = event_type

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "x-twilio-signature", "signature")
        if _B64_20.fullmatch(value) is None:
            raise MalformedRequest("signature", "X-Twilio-Signature must be base64 of 20 bytes")
        # Canonical only, as Twilio's SDKs compare the text: NEVER matches no signature.
        given = canonical_b64(value.encode("ascii")) or NEVER
        is_json = headers.get("content-type", "").split(";")[0].strip().lower() == (
            "application/json"
        )
        params = [] if is_json else _params(body)
        contents = (
            [_signed(_with_body_hash(u, body), ()) for u in self._urls]
            if is_json
            else [_signed(u, params) for u in self._urls]
        )
        if not any(
            hmac.compare_digest(self._mac(keyed, content), given)
            for keyed in self._macs
            for content in contents
        ):
            raise VerificationError("signature", "no valid signature for the configured secrets")
        found = dict(params)
        token = hint(headers, "i-twilio-idempotency-token")
        key = token if token is not None else twilio_key(body, is_json=is_json)
        return VerifiedDelivery(key, None, self.event_type or self._type(found, is_json))

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key of a request the caller vouches for: ``sender_id``, its
        ``I-Twilio-Idempotency-Token``."""
        return _token(sender_id, "webhook_id", "the I-Twilio-Idempotency-Token")

    def legacy_key(self, body: bytes) -> str:
        """The key this request had in ledgers written when every request was keyed on what
        Twilio signs (and still has without a token): a body that is a JSON object is keyed
        as a JSON request, any other as a form."""
        try:
            is_json = isinstance(orjson.loads(body), dict)
        except orjson.JSONDecodeError:
            is_json = False
        return twilio_key(body, is_json=is_json)

    @staticmethod
    def _mac(keyed: hmac.HMAC, content: bytes) -> bytes:
        mac = keyed.copy()
        mac.update(content)
        return mac.digest()

    @staticmethod
    def _type(params: dict[str, str], is_json: bool) -> str | None:
        if is_json:
            return None  # the pipeline reads the JSON body's "type"
        if params.get("CallStatus"):
            kind = "call." + params["CallStatus"]
        elif params.get("MessageStatus") or params.get("SmsStatus"):
            kind = "message." + (params.get("MessageStatus") or params["SmsStatus"])
        else:
            kind = "twilio"
        return _token(kind, "event_type", "the Twilio status")

    def __repr__(self) -> str:
        return f"Twilio(auth_tokens={len(self._macs)}, url={self.url!r})"


def sign_twilio(
    auth_token: str | bytes,
    url: str,
    params: Iterable[tuple[str, str]] = (),
    *,
    body: bytes | None = None,
) -> str:
    """Return an ``X-Twilio-Signature`` value for a form request to ``url`` with ``params``,
    or, with ``body=``, for a JSON request (``url`` then gets ``bodySHA256`` added: post to
    the URL this returns alongside, see `twilio_json_url`)."""
    if body is not None:
        content = _signed(_with_body_hash(url, body), ())
    else:
        content = _signed(url, sorted(params))
    digest = hmac.new(_key(auth_token, "auth_token"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def twilio_json_url(url: str, body: bytes) -> str:
    """The URL Twilio requests for a JSON ``body``: ``url`` with ``bodySHA256`` added."""
    return _with_body_hash(url, body)
