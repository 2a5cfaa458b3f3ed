"""Who may use the console, and proof that a state change came from its own page.

Served alone the console requires a token (from the environment or a file), or one token per
operator (each with a name and a role: ``operator`` or ``read-only``): a person signs in once
and gets a session cookie holding a random secret, whose row in the ledger says who they are
(receiver/_console/sessions.py: sign-out and expiry end it on the server; changing a token ends
the sessions it opened). A token is compared in constant time, as its sha256, so that neither
its content nor its length shows in the timing. Mounted inside an
application without a token, the console trusts the host's authentication: whoever reaches it
is the host's to decide.

Every state change is a POST that carries the CSRF token of its form: a random value kept in
a cookie (``SameSite=Strict``, ``HttpOnly``) that the form repeats, compared in constant time
(double submit), and refused outright when the browser says the request came from another
site (``Sec-Fetch-Site``). Nothing changes on a GET.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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

#: Sent with every page: nothing from elsewhere (the one script is the console's own, for the
#: live overview's updates), no framing, no referrer.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "script-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


ROLES = ("operator", "read-only")


@dataclass(frozen=True, slots=True)
class Credential:
    """Who a token signs in: a named operator (``name`` None: the shared token, whose holder
    types a name at sign-in), their role, and the token's fingerprint (a session keeps it, so
    that changing or removing a token ends the sessions it opened)."""

    name: str | None
    role: str
    fingerprint: str


class TokenAuth:
    """Sign-in with a token: the console's shared one, or one per operator (name and role).

    ``operators`` are mappings with ``name``, ``role`` (``operator`` or ``read-only``, default
    ``operator``) and either ``token`` or ``token_sha256`` (the hex sha256 of the token, so
    that the file naming the operators holds no secret).
    """

    def __init__(
        self, token: str | None = None, operators: Sequence[Mapping[str, str]] = ()
    ) -> None:
        self._entries: list[tuple[bytes, Credential]] = []
        if token is not None:
            self._add(_digest_of(token), None, "operator")
        names: set[str] = set()
        for entry in operators:
            name = " ".join(str(entry.get("name", "")).split())[:100]
            if not name or name in names:
                raise ConfigurationError(
                    f"each console operator needs a name of its own (got {name!r})"
                )
            names.add(name)
            role = str(entry.get("role", "operator"))
            if role not in ROLES:
                raise ConfigurationError(
                    f"operator {name!r}: role {role!r} is not one of {', '.join(ROLES)}"
                )
            if "token_sha256" in entry:
                try:
                    digest = bytes.fromhex(str(entry["token_sha256"]))
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise ConfigurationError(
                        f"operator {name!r}: token_sha256 must be 64 hex digits (the sha256 "
                        "of the token)"
                    )
            elif "token" in entry:
                digest = _digest_of(str(entry["token"]))
            else:
                raise ConfigurationError(f"operator {name!r} has no token (or token_sha256)")
            self._add(digest, name, role)
        if not self._entries:
            raise ConfigurationError("the console's sign-in needs a token or an operator")
        if len({d for d, _ in self._entries}) != len(self._entries):
            raise ConfigurationError("two console operators have the same token")
        self._fingerprints = {c.fingerprint: c for _, c in self._entries}

    def _add(self, digest: bytes, name: str | None, role: str) -> None:
        mark = hmac.digest(digest, b"receiver-console-session", "sha256").hex()[:32]
        self._entries.append((digest, Credential(name, role, mark)))

    @property
    def shared(self) -> bool:
        """A shared token is configured (its holder types a name at sign-in)."""
        return any(c.name is None for _, c in self._entries)

    @property
    def named_any(self) -> bool:
        """Some tokens name their operator."""
        return any(c.name is not None for _, c in self._entries)

    def check(self, given: str) -> Credential | None:
        """The credential of this token, or None. Every entry is compared, each in constant
        time in the token's content and length (as its sha256)."""
        digest = hashlib.sha256(given.strip().encode()).digest()
        found = None
        for known, credential in self._entries:
            if hmac.compare_digest(digest, known):
                found = credential
        return found

    def current(self, fingerprint: str) -> Credential | None:
        """The credential a session was opened with, if its token is still configured (its
        role as configured now)."""
        return self._fingerprints.get(fingerprint)


def _digest_of(token: str) -> bytes:
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"a console token must be at least {MIN_TOKEN_LENGTH} characters (it is "
            f"{len(token)}): generate one, e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )
    return hashlib.sha256(token.encode()).digest()


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
