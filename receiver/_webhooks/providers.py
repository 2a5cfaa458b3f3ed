"""A provider: one sender, with its route, its secrets, its retry schedule and its leases."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .._exceptions import ConfigurationError
from .._queue.backoff import Backoff
from .._verification.verifier import StandardWebhooks, Verifier
from .handlers import Mode
from .schedules import DAY, DedupWindow, RetrySchedule, dedup_window

DEFAULT_TOLERANCE = 300.0

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class Provider:
    """A webhook sender, served at ``POST {mount}/{name}``.

    ``secrets`` are Standard Webhooks secrets (``whsec_...`` for v1 HMAC, ``whpk_...`` ed25519
    public keys for v1a); list several to rotate. ``verifier`` replaces Standard Webhooks
    verification with another scheme. ``schedule`` (a preset name such as ``"svix"`` or
    ``"stripe"``, or a list of delays in seconds) and ``review_margin`` size the dedup window;
    ``ttl`` sets it explicitly and must not be shorter than the schedule's span. ``lease`` is how
    long an attempt owns a delivery before another attempt may take over. ``mode="queued"``
    answers every delivery 202 once it is recorded and leaves the handlers to workers, which
    retry a failure on the ``retry`` schedule (see :class:`~receiver.Backoff`).
    """

    def __init__(
        self,
        name: str,
        secrets: Sequence[str | bytes] = (),
        *,
        verifier: Verifier | None = None,
        tolerance: float | None = None,
        schedule: RetrySchedule | str | Sequence[float | str] = "svix",
        review_margin: float = DAY,
        ttl: float | None = None,
        lease: float = 60.0,
        mode: Mode = "inline",
        retry: Backoff | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"provider name {name!r} must be 1-64 letters, digits, '-' or '_' "
                "(it is a URL path segment)"
            )
        if isinstance(secrets, str | bytes):
            raise ConfigurationError(
                f"provider {name!r}: secrets must be a list, e.g. secrets=[secret]"
            )
        if verifier is None:
            if not secrets:
                raise ConfigurationError(
                    f"provider {name!r} has no secrets: pass secrets=['whsec_...'] (or a verifier=)"
                )
            verifier = StandardWebhooks(
                secrets, tolerance=DEFAULT_TOLERANCE if tolerance is None else tolerance
            )
        elif secrets or tolerance is not None:
            raise ConfigurationError(
                f"provider {name!r}: secrets= and tolerance= configure Standard Webhooks; with "
                "verifier=, give them to the verifier instead"
            )
        if not lease > 0:
            raise ConfigurationError(f"provider {name!r}: lease must be positive, not {lease!r}")
        if mode not in ("inline", "queued"):
            raise ConfigurationError(
                f"provider {name!r}: mode must be 'inline' or 'queued', not {mode!r}"
            )
        if retry is not None and not isinstance(retry, Backoff):
            raise ConfigurationError(
                f"provider {name!r}: retry must be a Backoff(attempts=, base=, cap=), not {retry!r}"
            )
        self.name = name
        self.mode: Mode = mode
        self.retry = retry if retry is not None else Backoff()
        self.verifier = verifier
        self.lease = float(lease)
        self.window: DedupWindow = dedup_window(
            schedule, review_margin=review_margin, ttl=ttl, provider=name
        )
        if self.window.window < self.lease:
            raise ConfigurationError(
                f"provider {name!r}: the dedup window ({self.window.window:g} s) is shorter than "
                f"the lease ({self.lease:g} s): a receipt would expire while an attempt still "
                "holds it; raise ttl or lower lease"
            )

    def __repr__(self) -> str:
        # Never the secrets: the verifier's own repr hides them too.
        return f"Provider({self.name!r}, window={self.window.window:.0f}s, lease={self.lease}s)"
