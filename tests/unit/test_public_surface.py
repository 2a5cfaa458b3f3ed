"""The public surface, pinned: ``receiver.__all__`` and every command and option of the
``receiver`` CLI. Moving code between private modules must leave both as they are; changing
either is a decision, made here on purpose."""

from __future__ import annotations

import argparse

import receiver
from receiver._cli.main import build_parser

ALL = [
    "RUN_AGAIN",
    "Action",
    "ActionConflict",
    "ActionError",
    "ActionFailed",
    "ActionInProgress",
    "ActionMetrics",
    "ActionNeedsReview",
    "ActionResult",
    "Actions",
    "Backoff",
    "Config",
    "ConfigurationError",
    "Connection",
    "Console",
    "DedupWindow",
    "Event",
    "FailedAttempt",
    "GitHub",
    "Handler",
    "IdempotencyKeyMiddleware",
    "IdempotentRequest",
    "InvalidIdempotencyKey",
    "JSONFormatter",
    "KeyState",
    "LeaseLost",
    "Linear",
    "MalformedRequest",
    "Metrics",
    "Outcome",
    "Paddle",
    "PostgresStore",
    "Provider",
    "ProviderConfig",
    "Receipt",
    "Receiver",
    "ReceiverError",
    "ReplayRefused",
    "Reply",
    "RetrySchedule",
    "SQLiteStore",
    "SchemaOutdated",
    "Shopify",
    "Slack",
    "StandardWebhooks",
    "State",
    "Store",
    "StoreError",
    "StoreMisconfigured",
    "StoreReadOnly",
    "StoreUnavailable",
    "StoredResponse",
    "Stripe",
    "Tool",
    "ToolCall",
    "Twilio",
    "VerificationError",
    "VerifiedBody",
    "VerifiedDelivery",
    "Verifier",
    "Worker",
    "Zoom",
    "action_key",
    "dedup_window",
    "exponential",
    "generate_keypair",
    "generate_secret",
    "idempotent_request",
    "load_config",
    "sign",
    "sign_github",
    "sign_linear",
    "sign_paddle",
    "sign_shopify",
    "sign_slack",
    "sign_stripe",
    "sign_twilio",
    "sign_zoom",
    "store_from_url",
    "twilio_json_url",
]

#: Each command: its options, then its positional arguments.
CLI = {
    "console": [
        "--app",
        "--bulk-rate",
        "--config",
        "--console-operators",
        "--end-sessions",
        "--help",
        "--host",
        "--log-level",
        "--port",
        "--read-only",
        "--show-payloads",
        "--store",
        "--token-file",
        "-h",
    ],
    "failed": [
        "--help",
        "--limit",
        "--provider",
        "--store",
        "-h",
    ],
    "inspect": [
        "--help",
        "--principal",
        "--store",
        "-h",
        "provider",
        "webhook_id",
    ],
    "migrate": [
        "--check",
        "--config",
        "--help",
        "--store",
        "-h",
    ],
    "replay": [
        "--actor",
        "--all-failed",
        "--app",
        "--config",
        "--dry-run",
        "--filter",
        "--help",
        "--job",
        "--limit",
        "--provider",
        "--rate",
        "--reason",
        "--yes",
        "-h",
        "target",
    ],
    "send": [
        "--data",
        "--help",
        "--id",
        "--secret",
        "--timestamp",
        "--type",
        "--url",
        "-h",
    ],
    "serve": [
        "--app",
        "--config",
        "--help",
        "--host",
        "--log-format",
        "--log-level",
        "--port",
        "--store",
        "--workers",
        "-h",
    ],
    "sweep": [
        "--app",
        "--audit-retention",
        "--batch",
        "--config",
        "--dead-letter-retention",
        "--help",
        "--store",
        "-h",
    ],
    "ttl": [
        "--app",
        "--config",
        "--help",
        "-h",
    ],
    "worker": [
        "--app",
        "--concurrency",
        "--config",
        "--factory",
        "--grace",
        "--group",
        "--help",
        "--log-format",
        "--log-level",
        "--metrics-port",
        "--poll-interval",
        "--stale-interval",
        "--store",
        "-h",
    ],
}


def commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = sorted(o for a in sub._actions for o in a.option_strings)
                positional = sorted(a.dest for a in sub._actions if not a.option_strings)
                found[name] = options + positional
    return found


def test_the_public_api_is_pinned() -> None:
    assert receiver.__all__ == ALL


def test_the_cli_is_pinned() -> None:
    assert commands() == CLI


def test_the_outcomes_are_pinned() -> None:
    """Outcome members are public names (``Outcome.STORE_UNAVAILABLE``) and their values are
    the deliveries metric's labels: neither may change by accident."""
    assert {o.name: o.value for o in receiver.Outcome} == {
        "EXECUTED": "executed",
        "REPLAYED": "replayed",
        "IGNORED": "ignored",
        "IN_FLIGHT": "in_flight_conflict",
        "MISMATCH": "payload_mismatch",
        "REJECTED": "rejected",
        "INVALID": "invalid_payload",
        "HANDLER_FAILED": "handler_failed",
        "LEASE_LOST": "lease_lost",
        "RECONCILED": "reconciled",
        "NEEDS_REVIEW": "needs_review",
        "STORE_UNAVAILABLE": "store_unavailable",
        "QUEUED": "queued",
        "DEAD_LETTER": "dead_letter",
    }
