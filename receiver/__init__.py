"""receiver: receive webhooks so that each event takes effect exactly once."""

from ._app import Receiver
from ._backoff import Backoff
from ._config import load_config
from ._config_model import Config, ProviderConfig
from ._events import Event
from ._exceptions import (
    ConfigurationError,
    LeaseLost,
    MalformedRequest,
    ReceiverError,
    SchemaOutdated,
    StoreError,
    StoreUnavailable,
    VerificationError,
)
from ._handlers import Handler
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
    "Backoff",
    "Config",
    "ConfigurationError",
    "Connection",
    "DedupWindow",
    "Event",
    "GitHub",
    "Handler",
    "JSONFormatter",
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
    "StoreUnavailable",
    "StoredResponse",
    "Stripe",
    "VerificationError",
    "VerifiedDelivery",
    "Verifier",
    "Worker",
    "dedup_window",
    "exponential",
    "generate_keypair",
    "generate_secret",
    "load_config",
    "sign",
    "sign_github",
    "sign_shopify",
    "sign_slack",
    "sign_stripe",
    "store_from_url",
]
