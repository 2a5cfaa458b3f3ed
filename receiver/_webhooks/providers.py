"""A provider: one sender, with its route, its secrets, its dedup key, its retry schedule and
its leases, and how it is told to stop retrying."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from .._exceptions import ConfigurationError
from .._queue.backoff import Backoff
from .._verification.keys import KeyedVerifier, KeySource, stop_retry_of
from .._verification.keys import dedup_key as check_dedup_key
from .._verification.payload import attempt_field_of
from .._verification.verifier import StandardWebhooks, Verifier
from .handlers import Mode
from .outcomes import Outcome, Reply
from .schedules import DedupWindow, RetrySchedule, dedup_window
from .senders import sender_timeout
from .timespans import DAY

DEFAULT_TOLERANCE = 300.0

#: ``Provider(same_content=...)``: run it, hold it for review, or answer it as a duplicate.
SameContent = Literal["run", "hold", "absorb"]
SAME_CONTENT: tuple[SameContent, ...] = ("run", "hold", "absorb")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class Provider:
    """A webhook sender, served at ``POST {mount}/{name}``.

    ``secrets`` are Standard Webhooks secrets (``whsec_...`` for v1 HMAC, ``whpk_...`` ed25519
    public keys for v1a); list several to rotate. ``verifier`` replaces Standard Webhooks
    verification with another scheme. ``schedule`` (a preset name such as ``"svix"`` or
    ``"stripe"``, or a list of delays in seconds) and ``review_margin`` size the dedup window;
    ``ttl`` sets it explicitly and must not be shorter than the schedule's span. ``lease`` is how
    long an attempt owns a delivery before another attempt may take over. ``mode="queued"``
    answers every delivery 202 once it is recorded and leaves the handlers to workers, which
    retry a failure on the ``retry`` schedule (see `Backoff`).

    ``timeout`` is how long the sender waits for an answer (seconds): by default the published
    limit of the sender whose schedule preset is used (Slack 3 s, Shopify 5 s, GitHub 10 s,
    ...; None for a custom schedule), None for no limit. A delivery that has waited so long
    that it cannot be answered within it is not started (503, nothing claimed).
    ``shed_status`` is the answer to a delivery shed under load: 503 (default) or 429.
    ``handoff=True`` (inline mode, with a ``timeout``): a delivery whose handlers are still
    running when the sender's time is nearly spent is answered 202, as queued mode answers, and
    finishes in the background in its own transaction (`.handoff`).

    ``same_content`` is what happens to a delivery whose signed content (payload and event
    type) is already in the window under another id: ``"run"`` (default: it is its own event,
    run as any other, and reported as key drift), ``"hold"`` (recorded as needing review, 202
    to the sender; an operator replays it from the console or ``receiver replay``) or
    ``"absorb"`` (answered with the other receipt's stored answer, as a duplicate). Inline
    deliveries only. See docs/explanation/keys.md for which senders repeat content.
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
        dedup_key: KeySource = None,
        timeout: float | str | None = "preset",
        shed_status: int = 503,
        handoff: bool = False,
        same_content: SameContent = "run",
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
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
        elif isinstance(verifier, type):
            # The class, not a verifier: accepted, every delivery would fail verifying (500).
            raise ConfigurationError(
                f"provider {name!r}: verifier= takes a verifier, not its class: pass an "
                f"instance, e.g. {verifier.__name__}([secret])"
            )
        elif not callable(getattr(verifier, "verify", None)):
            raise ConfigurationError(
                f"provider {name!r}: verifier= takes an object with verify(headers, body, now), "
                f"not {type(verifier).__name__}"
            )
        elif secrets or tolerance is not None:
            raise ConfigurationError(
                f"provider {name!r}: secrets= and tolerance= configure Standard Webhooks; with "
                "verifier=, give them to the verifier instead"
            )
        # A bool is an int: lease=True would be one second.
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
            raise ConfigurationError(
                f"provider {name!r}: lease must be positive seconds, not {lease!r}"
            )
        if mode not in ("inline", "queued"):
            raise ConfigurationError(
                f"provider {name!r}: mode must be 'inline' or 'queued', not {mode!r}"
            )
        if retry is not None and not isinstance(retry, Backoff):
            raise ConfigurationError(
                f"provider {name!r}: retry must be a Backoff(attempts=, base=, cap=), not {retry!r}"
            )
        if shed_status not in (429, 503):
            raise ConfigurationError(
                f"provider {name!r}: shed_status must be 503 or 429, not {shed_status!r}"
            )
        if not isinstance(handoff, bool):
            raise ConfigurationError(
                f"provider {name!r}: handoff must be True or False, not {handoff!r}"
            )
        if same_content not in SAME_CONTENT:
            raise ConfigurationError(
                f"provider {name!r}: same_content must be 'run' (the default), 'hold' (for "
                f"review) or 'absorb' (answered as a duplicate), not {same_content!r}"
            )
        if same_content != "run" and mode == "queued":
            raise ConfigurationError(
                f"provider {name!r}: same_content={same_content!r} applies to inline "
                "deliveries; with mode='queued' leave it 'run'"
            )
        key = check_dedup_key(dedup_key, name)
        self.name = name
        self.shed_status = shed_status
        #: Answer 202 and finish in the background when the sender's time is nearly spent.
        self.handoff = handoff
        self.mode: Mode = mode
        self.retry = retry if retry is not None else Backoff()
        #: The scheme's verifier as configured (the kit's sender signs for it).
        self.scheme: Verifier = verifier
        #: What the pipeline calls: the scheme's verifier, its id replaced by the dedup key.
        self.verifier: Verifier = verifier if key is None else KeyedVerifier(verifier, key)
        #: Headers that tell this sender not to retry (empty if it documents none).
        self.stop_retry = stop_retry_of(verifier)
        #: The per-attempt field left out of this sender's fingerprints (Linear's), or None.
        self.attempt_field = attempt_field_of(self.verifier)
        #: What a delivery whose content is already in the window under another id gets.
        self.same_content: SameContent = same_content
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
        #: Seconds the sender waits for an answer (None: no known limit).
        self.timeout: float | None
        if timeout == "preset":
            self.timeout = sender_timeout(self.window.schedule.name)
        elif timeout is None:
            self.timeout = None
        elif (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and 0 < timeout < float("inf")
        ):
            self.timeout = float(timeout)
        else:
            raise ConfigurationError(
                f"provider {name!r}: timeout must be positive seconds, None (no limit) or "
                f"'preset' (the sender's published limit), not {timeout!r}"
            )

    def stop_retries(self, reply: Reply) -> Reply:
        """The reply, with this sender's "do not retry" answer added when the delivery failed
        for good: a payload mismatch (422), an invalid payload (400), or a final 4xx answer a
        handler gave (or its replay), but never 408, 409, 425 or 429, which ask for a retry.
        Every other reply is returned as it is."""
        if not self.stop_retry or not _permanent(reply):
            return reply
        for name, value in self.stop_retry:
            reply.response.headers[name] = value
        return reply

    def __repr__(self) -> str:
        # Never the secrets: the verifier's own repr hides them too.
        return f"Provider({self.name!r}, window={self.window.window:.0f}s, lease={self.lease}s)"


# 4xx answers that ask the sender to come back later: never told to stop.
_RETRYABLE = frozenset({408, 409, 425, 429})
_FINAL = frozenset({Outcome.EXECUTED, Outcome.REPLAYED, Outcome.MISMATCH, Outcome.INVALID})


def _permanent(reply: Reply) -> bool:
    status = reply.response.status_code
    return reply.outcome in _FINAL and 400 <= status < 500 and status not in _RETRYABLE
