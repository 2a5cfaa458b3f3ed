"""The senders' own verifiers, asked for a verdict on the bytes the receiver is given.

Python: Svix's and Standard Webhooks' ``Webhook.verify``, Stripe's ``WebhookSignature``, Slack's
``SignatureVerifier``, Twilio's ``RequestValidator`` and Paddle's ``Verifier``. Node (through
tests/node/verdicts.mjs, installed by scripts/ensure-tools): GitHub's
``@octokit/webhooks-methods``, Shopify's ``@shopify/shopify-api`` and Linear's
``@linear/sdk/webhooks``. Zoom publishes no library: its documented check (compare
``x-zm-signature`` with ``"v0=" + hex HMAC-SHA256 of "v0:{timestamp}:{body}"``) is written out
here, as Zoom's sample does it.

Each reference takes the headers as a framework would hand them to it, a mapping of one value per
name. When node or the Node packages are missing the comparison fails, with what to run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import standardwebhooks
import stripe
import svix
from paddle_billing.Notifications import Secret, Verifier
from slack_sdk.signature import SignatureVerifier
from twilio.request_validator import RequestValidator

Pairs = Sequence[tuple[str, str]]

NODE_DIR = Path(__file__).parent / "node"


def _mapping(pairs: Pairs) -> dict[str, str]:
    """One value per name, the last one winning, as a dict built from a request's headers."""
    return {name: value for name, value in pairs}


def _lower(pairs: Pairs) -> dict[str, str]:
    return {name.lower(): value for name, value in pairs}


def _accepted(call: Callable[[], object], *errors: type[BaseException]) -> bool:
    try:
        return call() is not False
    except errors:
        return False


def svix_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    return _accepted(
        lambda: svix.Webhook(secret).verify(body, _mapping(pairs)), svix.WebhookVerificationError
    )


def standard_webhooks_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    hook = standardwebhooks.Webhook(secret)
    return _accepted(
        lambda: hook.verify(body, _mapping(pairs), json_parse=False),
        standardwebhooks.webhooks.WebhookVerificationError,
    )


def stripe_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    header = _lower(pairs).get("stripe-signature")
    return _accepted(
        lambda: stripe.WebhookSignature.verify_header(body, header, secret, tolerance=300),
        stripe.SignatureVerificationError,
    )


class _Clock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def slack_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    verifier = SignatureVerifier(secret, clock=_Clock(now))
    # int() of a timestamp that is not a number raises: Slack's own apps then answer 500, which
    # is a refusal all the same.
    return _accepted(lambda: verifier.is_valid_request(body, _mapping(pairs)), ValueError)


def twilio_accepts(token: str, url: str, pairs: Pairs, body: bytes) -> bool:
    signature = _lower(pairs).get("x-twilio-signature", "")
    params = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
    return RequestValidator(token).validate(url, params, signature)


class _PaddleRequest:
    def __init__(self, pairs: Pairs, body: bytes) -> None:
        # Paddle's SDK looks the header up as "Paddle-Signature", the way its framework
        # integrations hand it headers.
        self.headers = {name.title(): value for name, value in pairs}
        self.body = body


def paddle_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    # maximum_variance=300: the receiver's default tolerance, so that only the parsing differs.
    verifier = Verifier(maximum_variance=300)
    return _accepted(
        lambda: verifier.verify(_PaddleRequest(pairs, body), Secret(secret)),
        ValueError,  # its parser's refusal of an element it does not know
    )


def zoom_accepts(secret: str, pairs: Pairs, body: bytes, now: float) -> bool:
    """Zoom's documented check, written as its sample writes it (a string comparison)."""
    headers = _lower(pairs)
    message = f"v0:{headers.get('x-zm-request-timestamp')}:{body.decode()}"
    digest = hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()
    return headers.get("x-zm-signature") == f"v0={digest}"


def _node(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node is not None, "node is not installed: run scripts/ensure-tools"
    assert (NODE_DIR / "node_modules" / "@octokit" / "webhooks-methods").is_dir(), (
        "the Node packages are not installed: run scripts/ensure-tools (npm ci in tests/node)"
    )
    done = subprocess.run(
        [node, str(NODE_DIR / "verdicts.mjs")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(answers) == len(cases)
    return answers


def node_accepts(
    scheme: str, secret: str, cases: Sequence[tuple[Pairs, bytes]], now: float
) -> list[bool]:
    """The verdicts of GitHub's, Shopify's or Linear's Node library, one per (headers, body)."""
    asked = [
        {
            "scheme": scheme,
            "secret": secret,
            "body": base64.b64encode(body).decode(),
            "headers": [list(pair) for pair in pairs],
            "now": now,
        }
        for pairs, body in cases
    ]
    return [answer["accepted"] for answer in _node(asked)]


def octokit_sign(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256`` as @octokit/webhooks-methods' sign() makes it."""
    body_b64 = base64.b64encode(body).decode()
    asked = {"scheme": "github", "sign": True, "secret": secret, "body": body_b64}
    signature: str = _node([asked])[0]["signature"]
    return signature
