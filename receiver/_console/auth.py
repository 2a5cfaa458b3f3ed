"""Who may use the console, and proof that a state change came from its own page.

Served alone the console requires a token (from the environment or a file): a person signs in
once with it and a name, and gets a session cookie signed with a key derived from the token
(changing the token ends every session). The token is compared in constant time, as its
sha256, so that neither its content nor its length shows in the timing. Mounted inside an
application without a token, the console trusts the host's authentication: whoever reaches it
is the host's to decide.

Every state change is a POST that carries the CSRF token of its form: a random value kept in
a cookie (``SameSite=Strict``, ``HttpOnly``) that the form repeats, compared in constant time
(double submit), and refused outright when the browser says the request came from another
site (``Sec-Fetch-Site``). Nothing changes on a GET.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import ConfigurationError

SESSION_COOKIE = "receiver_console_session"
CSRF_COOKIE = "receiver_console_csrf"
#: A session lasts a working day; then the operator signs in again.
SESSION_SECONDS = 12 * 3600
#: Shorter tokens are refused at start-up: the token is the only secret between the console
#: and anyone who can reach its port.
MIN_TOKEN_LENGTH = 16

#: Sent with every page: nothing from elsewhere (no script at all), no framing, no referrer.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class TokenAuth:
    """Sign-in with a shared token, and the signed session cookie that follows."""

    def __init__(self, token: str) -> None:
        token = token.strip()
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"the console token must be at least {MIN_TOKEN_LENGTH} characters (it is "
                f"{len(token)}): generate one, e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'"
            )
        self._digest = hashlib.sha256(token.encode()).digest()
        self._key = hmac.digest(self._digest, b"receiver-console-session", "sha256")

    def check(self, given: str) -> bool:
        """Constant time in the token's content and length."""
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest)

    def issue(self, name: str, now: float) -> str:
        payload = orjson.dumps(
            {"name": name, "until": int(now) + SESSION_SECONDS, "nonce": secrets.token_hex(8)}
        )
        body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def session(self, cookie: str | None, now: float) -> str | None:
        """The signed-in operator's name, or None for a missing, forged or expired cookie."""
        if not cookie or "." not in cookie:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._sign(body)):
            return None
        try:
            data = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            name, until = str(data["name"]), int(data["until"])
        except (ValueError, KeyError, TypeError):
            return None
        return name if until > now else None

    def _sign(self, body: str) -> str:
        return hmac.digest(self._key, body.encode(), "sha256").hex()


def csrf_token(request: Request) -> str:
    """The CSRF token of this browser (made on its first page, see :func:`set_cookies`)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if len(token) < 32:
        token = request.state.csrf = getattr(request.state, "csrf", None) or new_token()
    return token


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_refusal(request: Request, form: Mapping[str, object]) -> str | None:
    """Why this POST is refused as a possible forgery, or None if it came from our form."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {site})"
    cookie = request.cookies.get(CSRF_COOKIE, "")
    field = form.get("csrf")
    if not isinstance(field, str) or not field:
        return "the form carried no CSRF token"
    if len(cookie) < 32 or not hmac.compare_digest(cookie.encode(), field.encode()):
        return "the form's CSRF token does not match this browser's"
    return None


def cookie_path(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/") + "/"


def set_cookies(request: Request, response: Response) -> None:
    """The CSRF cookie, where this browser has none yet, and the security headers."""
    made = getattr(request.state, "csrf", None)
    if made is not None:
        response.set_cookie(
            CSRF_COOKIE,
            made,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    response.headers.update(SECURITY_HEADERS)
