"""receiver: receive webhooks so that each event takes effect exactly once."""

from ._actions import Action, ActionResult, Actions, Tool, ToolCall, action_key
from ._agent_metrics import ActionMetrics
from ._app import Receiver
from ._backoff import Backoff
from ._config import load_config
from ._config_model import Config, ProviderConfig
from ._events import Event
from ._exceptions import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    ConfigurationError,
    InvalidIdempotencyKey,
    LeaseLost,
    MalformedRequest,
    ReceiverError,
    SchemaOutdated,
    StoreError,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
    VerificationError,
)
from ._handlers import Handler
from ._idempotency import IdempotencyKeyMiddleware, IdempotentRequest, idempotent_request
from ._keyed import FailedAttempt, KeyState
from ._ledger import Receipt, State, StoredResponse
from ._logging import JSONFormatter
from ._metrics import Metrics
from ._pipeline import RUN_AGAIN, Outcome, Reply
from ._postgres import PostgresStore
from ._providers import Provider
from ._replay import ReplayRefused
from ._schedules import DedupWindow, RetrySchedule, dedup_window, exponential
from ._schemes import (
    GitHub,
    Shopify,
    Slack,
    Stripe,
    sign_github,
    sign_shopify,
    sign_slack,
    sign_stripe,
)
from ._sqlite import SQLiteStore
from ._store import Connection, Store
from ._store_url import store_from_url
from ._verification import (
    StandardWebhooks,
    VerifiedDelivery,
    Verifier,
    generate_keypair,
    generate_secret,
    sign,
)
from ._worker import Worker

__version__ = "0.1.0"

__all__ = [
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
    "MalformedRequest",
    "Metrics",
    "Outcome",
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
    "VerificationError",
    "VerifiedDelivery",
    "Verifier",
    "Worker",
    "action_key",
    "dedup_window",
    "exponential",
    "generate_keypair",
    "generate_secret",
    "idempotent_request",
    "load_config",
    "sign",
    "sign_github",
    "sign_shopify",
    "sign_slack",
    "sign_stripe",
    "store_from_url",
]
