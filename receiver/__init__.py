"""receiver: receive webhooks so that each event takes effect exactly once."""

from ._actions.action import Action, ActionResult, Tool, ToolCall, action_key
from ._actions.executor import Actions
from ._actions.metrics import ActionMetrics
from ._config.loader import load_config
from ._config.model import Config, ProviderConfig
from ._console import Console
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
from ._idempotency.middleware import IdempotencyKeyMiddleware, IdempotentRequest, idempotent_request
from ._ledger.keyed import FailedAttempt, KeyState
from ._ledger.receipts import Receipt, State, StoredResponse
from ._ledger.results import RUN_AGAIN
from ._logging import JSONFormatter
from ._ops.metrics import Metrics
from ._proxy.app import IdempotencyProxy
from ._proxy.attempt import ProxyAttempt
from ._queue.backoff import Backoff
from ._store.base import Connection, Store
from ._store.postgres import PostgresStore
from ._store.sqlite import SQLiteStore
from ._store.url import store_from_url
from ._verification.keys import VerifiedBody
from ._verification.schemes import (
    GitHub,
    Shopify,
    Slack,
    Stripe,
    sign_github,
    sign_shopify,
    sign_slack,
    sign_stripe,
)
from ._verification.senders import Linear, Paddle, Zoom, sign_linear, sign_paddle, sign_zoom
from ._verification.twilio import Twilio, sign_twilio, twilio_json_url
from ._verification.verifier import (
    StandardWebhooks,
    VerifiedDelivery,
    Verifier,
    generate_keypair,
    generate_secret,
    sign,
)
from ._webhooks.app import Receiver
from ._webhooks.events import Event
from ._webhooks.handlers import Handler
from ._webhooks.outcomes import Outcome, Reply
from ._webhooks.providers import Provider
from ._webhooks.replay import ReplayRefused
from ._webhooks.schedules import DedupWindow, RetrySchedule, dedup_window, exponential
from ._webhooks.worker import Worker

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
    "Console",
    "DedupWindow",
    "Event",
    "FailedAttempt",
    "GitHub",
    "Handler",
    "IdempotencyKeyMiddleware",
    "IdempotencyProxy",
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
    "ProxyAttempt",
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
