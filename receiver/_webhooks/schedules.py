"""Retry schedules of webhook senders, and the dedup window they imply.

A receipt must outlive every delivery of its event: a sender keeps retrying for the whole span of
its retry schedule, and after that a person may still press "resend" in the provider's dashboard.
So the dedup window (``expires_at - claimed_at``) is the schedule's span plus a human-review
margin, rounded up to a whole hour. An explicit TTL shorter than the span is a configuration error
at start-up: a receipt that expired before the last retry lets that retry run the handler twice.

Durations are seconds (floats) everywhere; :func:`parse_duration` and :func:`format_duration`
(:mod:`.timespans`, re-exported here) turn them into and out of the ``"1h30m"`` strings that
configuration files and ``receiver ttl`` use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType

from receiver._exceptions import ConfigurationError

from .timespans import DAY, HOUR, MINUTE, as_seconds, format_duration, parse_duration

__all__ = [
    "PRESETS",
    "DedupWindow",
    "RetrySchedule",
    "dedup_window",
    "describe",
    "exponential",
    "format_duration",
    "parse_duration",
]


# No provider retries for longer than a year; a span beyond that almost always means the delays
# were written in milliseconds. Refusing it here beats a receipt table that never expires.
_MAX_SPAN = 366 * DAY
# The most attempts exponential() builds: far more than any sender makes (Paddle, the most,
# makes 61), few enough to list.
_MAX_ATTEMPTS = 10_000


@dataclass(frozen=True)
class RetrySchedule:
    """When a sender delivers one event: the first attempt, then each retry.

    ``delays[i]`` is the wait in seconds before attempt ``i``, counted from attempt ``i - 1``;
    ``delays[0]`` is the wait before the first attempt and is normally 0 ("immediately"). Zero
    delays later on are allowed (Slack retries "nearly immediately").

    ``jitter`` is a fraction, not seconds: every wait may run late by up to ``jitter`` times its
    nominal length (0.1 = up to 10% late). A fraction because senders jitter proportionally to
    the backoff; a fixed number of seconds would be noise on a 10 h delay and dominate a 5 s one.
    It only ever lengthens the span, so it can only make the dedup window safer.
    """

    delays: tuple[float, ...]
    jitter: float = 0.0
    name: str = "custom"
    source: str = ""

    def __post_init__(self) -> None:
        raw: object = self.delays
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise ConfigurationError(
                f"retry schedule {self.name!r}: delays must be a list of seconds, got {raw!r}"
            )
        if not raw:
            raise ConfigurationError(
                f"retry schedule {self.name!r} has no attempts; give at least one delay,"
                " e.g. [0] for a sender that delivers once and never retries"
            )
        delays = tuple(
            as_seconds(d, f"retry schedule {self.name!r}: delay #{i}", limit=_MAX_SPAN)
            for i, d in enumerate(raw)
        )
        jitter = as_seconds(self.jitter, f"retry schedule {self.name!r}: jitter")
        if jitter > 1:
            raise ConfigurationError(
                f"retry schedule {self.name!r}: jitter is a fraction of each delay"
                f" (0.1 = up to 10% late), got {self.jitter!r}"
            )
        # Normalise to a tuple of floats so that a list argument still gives a hashable value.
        object.__setattr__(self, "delays", delays)
        object.__setattr__(self, "jitter", jitter)
        if self.span > _MAX_SPAN:
            raise ConfigurationError(
                f"retry schedule {self.name!r} spans {format_duration(self.span)}, more than"
                f" {format_duration(_MAX_SPAN)}; delays are in seconds (were these milliseconds?)"
            )

    @property
    def attempts(self) -> int:
        """Number of deliveries, the first one included."""
        return len(self.delays)

    @property
    def span(self) -> float:
        """Seconds from the event until the last retry at the latest, jitter included.

        Counting ``delays[0]`` too (measuring from the event, not from the first attempt) only
        ever overestimates, which is the safe side for a dedup window.
        """
        return sum(self.delays) * (1.0 + self.jitter)

    def offsets(self) -> tuple[float, ...]:
        """Nominal time of each attempt in seconds after the event (without jitter)."""
        total = 0.0
        out: list[float] = []
        for delay in self.delays:
            total += delay
            out.append(total)
        return tuple(out)

    @classmethod
    def preset(cls, name: str) -> RetrySchedule:
        """The published schedule of a provider, by name (see `PRESETS`)."""
        key = name.strip().lower().replace("_", "-")
        try:
            return PRESETS[key]
        except KeyError:
            known = ", ".join(sorted(PRESETS))
            raise ConfigurationError(
                f"unknown retry schedule preset {name!r}; known presets: {known}"
                " (or give an explicit list of delays, e.g. [0, 5, 300])"
            ) from None

    @classmethod
    def from_value(cls, value: str | Sequence[float | str] | RetrySchedule) -> RetrySchedule:
        """Build a schedule from configuration.

        Accepts a schedule as is, a preset name (``"svix"``), a list of delays whose items are
        seconds or duration strings (``[0, "5s", "5m"]``), or the same list as one
        comma-separated string (``"0, 5s, 5m"``, handy in environment variables).
        """
        if isinstance(value, RetrySchedule):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("_", "-")
            if key in PRESETS:
                return PRESETS[key]
            if not re.search(r"\d", key):
                # No digit, so not a list of durations: report it as an unknown preset.
                return cls.preset(value)
            items: Sequence[float | str] = value.split(",")
        elif isinstance(value, bytes) or not isinstance(value, Sequence):
            raise ConfigurationError(
                "a retry schedule is a preset name or a list of delays in seconds,"
                f" got {value!r} ({type(value).__name__})"
            )
        else:
            items = value
        delays = tuple(
            parse_duration(item) if isinstance(item, str) else item  # numbers checked below
            for item in items
        )
        return cls(delays=delays)


def exponential(
    base: float,
    factor: float,
    attempts: int,
    jitter: float = 0.0,
    cap: float | None = None,
) -> RetrySchedule:
    """Exponential backoff: an immediate attempt, then ``base``, ``base*factor``, ... seconds.

    ``attempts`` counts the first delivery, so ``exponential(60, 2, 4)`` waits 0, 1m, 2m, 4m.
    ``cap`` bounds every single delay (not the total).
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"exponential backoff needs attempts >= 1, got {attempts!r}")
    if attempts > _MAX_ATTEMPTS:
        # Each attempt is a delay built here: 2**70 of them never finished building.
        raise ConfigurationError(
            f"exponential backoff takes at most {_MAX_ATTEMPTS} attempts, got {attempts!r}"
        )
    base = as_seconds(base, "exponential backoff base", limit=_MAX_SPAN)
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise ConfigurationError(f"exponential backoff factor must be a number, got {factor!r}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ConfigurationError(
            f"exponential backoff factor must be a finite number >= 1 (delays never shrink),"
            f" got {factor!r}"
        )
    limit = math.inf if cap is None else as_seconds(cap, "exponential backoff cap", limit=_MAX_SPAN)
    delays = [0.0]
    delay = base
    for _ in range(attempts - 1):
        delays.append(min(delay, limit))
        # Stop growing once capped: keeps the value finite however many attempts are asked for.
        delay = min(delay * factor, limit) if delay < limit else limit
    name = f"exponential({format_duration(base)} x{factor:g})"
    return RetrySchedule(delays=tuple(delays), jitter=jitter, name=name)


def _preset(name: str, delays: Sequence[float], source: str) -> RetrySchedule:
    return RetrySchedule(delays=tuple(delays), name=name, source=source)


_SVIX = _preset(
    "svix",
    # "Immediately, 5 seconds, 5 minutes, 30 minutes, 2 hours, 5 hours, 10 hours, 10 hours (in
    # addition to the previous)": each period starts after the previous attempt failed.
    [0, 5, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR],
    "Svix docs, Retry Schedule: https://docs.svix.com/retries",
)

_STANDARD_WEBHOOKS = _preset(
    "standard-webhooks",
    # The spec's "Example retry schedule" table, last row 75:35:05 after the start. It has ONE
    # 10 h step (Svix has two) followed by 14 h, 20 h and 24 h.
    [0, 5, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 5 * HOUR, 10 * HOUR, 14 * HOUR, 20 * HOUR, 24 * HOUR],
    "Standard Webhooks spec v1.0.0, Deliverability and reliability: "
    "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md",
)

_STRIPE = _preset(
    "stripe",
    # Stripe documents only the bound ("in live mode, Stripe attempts to deliver a given event
    # ... for up to 3 days with an exponential back off"), not the intervals. Modelled as
    # doubling from 1 h, capped at 24 h, with the last retry placed exactly at 72 h:
    # attempts at 0, 1, 3, 7, 15, 31, 55, 72 h. Only the 3-day span feeds the dedup window.
    # (Sandbox mode retries three times over a few hours, well inside this.)
    [0, 1 * HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 16 * HOUR, 24 * HOUR, 17 * HOUR],
    "Stripe docs, Receive Stripe events in your webhook endpoint, Automatic retries: "
    "https://docs.stripe.com/webhooks#automatic-retries",
)

_GITHUB = _preset(
    "github",
    # GitHub never retries on its own ("GitHub does not automatically redeliver failed
    # deliveries"), but a person can redeliver any delivery from the past 3 days, by hand or via
    # the REST API. The second "attempt" is that last possible redelivery at 3 days.
    # GitHub Enterprise Server keeps 7 days: configure [0, "7d"] there.
    [0, 3 * DAY],
    "GitHub docs, Redelivering webhooks / Handling failed webhook deliveries: "
    "https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks",
)

_SHOPIFY = _preset(
    "shopify",
    # "Webhooks will now be retried a total of 8 times over 4 hours using an exponential backoff
    # schedule" (effective 2024-09-10; earlier posts say 19 times over 48 h). The intervals are
    # not published: modelled as doubling from 1 min with the 8th retry exactly at 4 h
    # (retries at 1, 3, 7, 15, 31, 63, 127, 240 min).
    [0, 1 * MINUTE, 2 * MINUTE, 4 * MINUTE, 8 * MINUTE, 16 * MINUTE, 32 * MINUTE, 64 * MINUTE,
     113 * MINUTE],
    "Shopify docs, Troubleshooting webhooks, and changelog 'Updates to webhook retry mechanism': "
    "https://shopify.dev/docs/apps/build/webhooks/troubleshooting-webhooks",
)  # fmt: skip

_SLACK = _preset(
    "slack",
    # The original delivery, then up to 3 retries: nearly immediately, after 1 minute, after
    # 5 minutes. Read as 5 minutes after the previous retry (6 min in total), the longer and
    # therefore safe reading.
    [0, 0, 1 * MINUTE, 5 * MINUTE],
    "Slack docs, Using the Events API, Retries: https://docs.slack.dev/apis/events-api/#retries",
)

_PADDLE = _preset(
    "paddle",
    # "For live accounts, Paddle retries failed deliveries up to 60 times over 3 days using
    # exponential backoff" (sandbox retries fewer times). The intervals are not published:
    # modelled as 60 equal waits of 72 minutes, so that the last retry lands at 3 days; only
    # the span feeds the dedup window.
    [0, *[72 * MINUTE] * 60],
    "Paddle docs, Handle webhook delivery: "
    "https://developer.paddle.com/webhooks/about/respond-to-webhooks",
)

_ZOOM = _preset(
    "zoom",
    # Without a 200 or 204 within 3 s, Zoom sends the event 3 more times: 5 minutes after the
    # first attempt, 20 minutes after the first retry, 60 minutes after the second.
    [0, 5 * MINUTE, 20 * MINUTE, 60 * MINUTE],
    "Zoom Developer Support, Webhook delays: "
    "https://devsupport.zoom.us/hc/en-us/articles/360059893812-Webhook-delays",
)

_LINEAR = _preset(
    "linear",
    # A delivery that fails (unavailable, slower than 5 s, or not 200) "will be retried a
    # maximum of 3 times ... after 1 minute, 1 hour, and 6 hours".
    [0, 1 * MINUTE, 1 * HOUR, 6 * HOUR],
    "Linear docs, Webhooks: https://linear.app/developers/webhooks",
)

_TWILIO = _preset(
    "twilio",
    # Twilio does not retry a webhook that answered: it retries only a failed connection or a
    # timeout, and only when the URL's connection overrides ask for it (#rc=, at most 5
    # retries, within the request's total timeout of seconds). One attempt, then; the review
    # margin covers a request replayed by hand.
    [0],
    "Twilio docs, Webhook connection overrides: "
    "https://www.twilio.com/docs/usage/webhooks/webhooks-connection-overrides",
)

#: Published retry schedules by provider name. Read-only.
PRESETS: Mapping[str, RetrySchedule] = MappingProxyType(
    {
        s.name: s
        for s in (
            _SVIX,
            _STANDARD_WEBHOOKS,
            _STRIPE,
            _GITHUB,
            _SHOPIFY,
            _SLACK,
            _PADDLE,
            _ZOOM,
            _LINEAR,
            _TWILIO,
        )
    }
)


# --------------------------------------------------------------------------------------------
# Dedup window
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DedupWindow:
    """How long a provider's receipts are kept, and why (all values in seconds)."""

    provider: str
    schedule: RetrySchedule
    #: The schedule's span: the last automatic retry comes at most this long after the event.
    span: float
    #: Headroom after the span. With an explicit TTL this is what the TTL leaves (``ttl - span``).
    margin: float
    #: ``expires_at - claimed_at``.
    window: float
    #: True when the window is a configured TTL rather than derived from span + margin.
    explicit_ttl: bool = False

    @property
    def seconds(self) -> int:
        """The window as whole seconds, rounded up (for SQL intervals)."""
        return math.ceil(self.window)

    def as_timedelta(self) -> timedelta:
        """The window as a `datetime.timedelta`."""
        return timedelta(seconds=self.window)


def _ceil_to_hour(seconds: float) -> float:
    """The smallest whole number of hours, in seconds, that is >= ``seconds``.

    ``math.ceil(x / 3600)`` alone can land one hour short (or long) when the division rounds, so
    the result is corrected with exact int/float comparisons; this also keeps it monotone.
    """
    hours = math.ceil(seconds / HOUR)
    while hours * 3600 < seconds:
        hours += 1
    while hours > 0 and (hours - 1) * 3600 >= seconds:
        hours -= 1
    return float(hours * 3600)


def dedup_window(
    schedule: RetrySchedule | str | Sequence[float | str],
    *,
    review_margin: float = DAY,
    ttl: float | None = None,
    floor: float = 0.0,
    provider: str = "?",
) -> DedupWindow:
    """The dedup window for a provider's receipts.

    Without ``ttl``: ``span + review_margin`` rounded up to a whole hour, at least one hour,
    and at least ``floor`` (also rounded up to a whole hour). The margin covers a person
    pressing "resend" after the automatic retries are over.

    With ``ttl``: the window is exactly ``ttl``. A TTL shorter than the span raises
    ConfigurationError, since a receipt would expire while the sender still retries. A TTL
    between the span and span + margin is allowed: the margin is advice, the span is a hard
    bound. ``floor`` does not apply to an explicit TTL; the operator chose that number.
    """
    sched = RetrySchedule.from_value(schedule)
    margin = as_seconds(review_margin, f"provider {provider!r}: review margin")
    minimum = as_seconds(floor, f"provider {provider!r}: floor")
    span = sched.span
    if ttl is None:
        # At least one hour: a window of 0 s (schedule [0], no margin) would forget a delivery
        # before its own attempt ended.
        window = max(HOUR, _ceil_to_hour(max(span + margin, minimum)))
        return DedupWindow(provider, sched, span, margin, window)
    chosen = as_seconds(ttl, f"provider {provider!r}: ttl")
    if chosen <= 0:
        raise ConfigurationError(
            f"provider {provider!r}: ttl must be positive; leave it unset to derive it from the"
            f" retry span ({format_duration(span)}) plus the review margin"
        )
    if chosen < span:
        raise ConfigurationError(
            f"provider {provider!r}: ttl {format_duration(chosen)} is"
            f" {format_duration(span - chosen)} shorter than its retry span"
            f" {format_duration(span)} (schedule {sched.name!r}); raise ttl to at least"
            f" {format_duration(math.ceil(span))} or pick another schedule"
        )
    return DedupWindow(provider, sched, span, chosen - span, chosen, explicit_ttl=True)


def describe(window: DedupWindow) -> dict[str, str]:
    """Human-readable fields of a window, one table row for ``receiver ttl``."""
    sched = window.schedule
    schedule = f"{sched.name} ({sched.attempts} attempt{'s' if sched.attempts != 1 else ''})"
    if sched.jitter:
        schedule += f", jitter {sched.jitter:.0%}"
    return {
        "provider": window.provider,
        "schedule": schedule,
        "span": format_duration(window.span),
        "margin": format_duration(window.margin),
        "window": format_duration(window.window)
        + (" (explicit ttl)" if window.explicit_ttl else ""),
        "source": sched.source or "configured",
    }
