"""How long each sender waits for an answer before it hangs up (and, for most, retries later).

A delivery's answer is worth something only if it arrives within that time: past it, the
sender has recorded a failure and will deliver the event again on its retry schedule
(receiver/_webhooks/schedules.py), whatever the receiver does. The receiver uses the limit as
a budget (receiver/_webhooks/admission.py): a delivery that has waited so long that its
handlers cannot finish in time is not started.

Keyed by the retry-schedule preset's name, so that ``Provider(..., schedule="slack")`` (what a
configuration file's ``scheme = "slack"`` sets) brings Slack's limit along.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class SenderTimeout:
    """A sender's published (or, where unpublished, observed) time limit for an answer."""

    seconds: float
    source: str
    #: Whether the sender delivers again after a timeout or a 5xx on its own. One that does
    #: not (GitHub, Twilio) loses a shed delivery until someone redelivers it.
    retries: bool = True


#: Sender time limits by retry-schedule preset name. Read-only.
SENDER_TIMEOUTS: Mapping[str, SenderTimeout] = MappingProxyType(
    {
        "slack": SenderTimeout(
            3.0,
            # "Your app should respond to the event request with an HTTP 2xx within three
            # seconds"; a slower answer counts as a failure and is retried.
            "Slack docs, Using the Events API, Responding to events: "
            "https://docs.slack.dev/apis/events-api/#responding",
        ),
        "zoom": SenderTimeout(
            3.0,
            # Without a 200 or 204 within 3 s, Zoom retries (the schedule's source).
            "Zoom Developer Support, Webhook delays: "
            "https://devsupport.zoom.us/hc/en-us/articles/360059893812-Webhook-delays",
        ),
        "shopify": SenderTimeout(
            5.0,
            # A one-second connection timeout and five seconds in all.
            "Shopify docs, Troubleshooting webhooks: "
            "https://shopify.dev/docs/apps/build/webhooks/troubleshooting-webhooks",
        ),
        "paddle": SenderTimeout(
            5.0,
            # "Responding within five seconds."
            "Paddle docs, Handle webhook delivery: "
            "https://developer.paddle.com/webhooks/about/respond-to-webhooks",
        ),
        "linear": SenderTimeout(
            5.0,
            # A delivery "slower than 5 s" is retried (the schedule's source).
            "Linear docs, Webhooks: https://linear.app/developers/webhooks",
        ),
        "github": SenderTimeout(
            10.0,
            # "Your server should respond with a 2XX response within 10 seconds"; GitHub
            # terminates the connection then, and never redelivers on its own.
            "GitHub docs, Best practices for using webhooks: "
            "https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks",
            retries=False,
        ),
        "svix": SenderTimeout(
            15.0,
            # Svix waits 15 s for a 2xx before it counts the attempt as failed.
            "Svix docs, Retry Schedule: https://docs.svix.com/retries",
        ),
        "standard-webhooks": SenderTimeout(
            15.0,
            # The spec leaves the number to the sender; Svix, its reference sender, waits 15 s.
            "Standard Webhooks spec v1.0.0 (with Svix's 15 s): "
            "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md",
        ),
        "twilio": SenderTimeout(
            15.0,
            # The default total request timeout; connection overrides (#rt=) change it. Twilio
            # retries only failed connections, and only when the URL asks (#rc=).
            "Twilio docs, Webhook connection overrides: "
            "https://www.twilio.com/docs/usage/webhooks/webhooks-connection-overrides",
            retries=False,
        ),
        "stripe": SenderTimeout(
            20.0,
            # Stripe publishes no number: its delivery log shows "Timed out" for slow answers,
            # and measurements reported by others range from 20 to 30 s. The lower one is taken.
            "Stripe docs, Webhooks (no published number; 20-30 s observed): "
            "https://docs.stripe.com/webhooks",
        ),
    }
)


def sender_timeout(preset: str) -> float | None:
    """The time limit of the sender whose retry-schedule preset is ``preset`` (None: none
    known, as for a custom schedule)."""
    found = SENDER_TIMEOUTS.get(preset)
    return None if found is None else found.seconds
