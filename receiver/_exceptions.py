"""The exception tree of receiver. Every error the library raises derives from one root:

    ReceiverError
     +-- ConfigurationError        bad settings, raised at start-up or registration
     |    +-- SchemaOutdated       the database lacks migrations: run `receiver migrate`
     +-- VerificationError         a delivery failed a check before touching the store (401)
     |    +-- MalformedRequest     its headers are structurally broken (400)
     +-- StoreError                the ledger could not do what was asked
          +-- StoreUnavailable     the database is unreachable or timed out (503)
          +-- LeaseLost            a newer claim owns the key: the fence moved on

Lower-level errors (asyncpg, sqlite3, OSError, ValueError from decoding) are translated at one
boundary each and re-raised ``from`` the original.
"""

from __future__ import annotations


class ReceiverError(Exception):
    """Base class of every error raised by receiver."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(ReceiverError):
    """The receiver is configured in a way that cannot work."""


class SchemaOutdated(ConfigurationError):
    """The ledger's schema is older than this version of receiver: run `receiver migrate`."""


class VerificationError(ReceiverError):
    """The delivery could not be verified."""

    #: HTTP status the receiver answers with.
    status_code: int = 401

    def __init__(self, check: str, message: str | None = None) -> None:
        #: Short machine-readable name of the check that failed, e.g. ``"signature"``.
        self.check = check
        super().__init__(message)


class MalformedRequest(VerificationError):
    """The delivery's webhook headers are malformed."""

    status_code = 400


class StoreError(ReceiverError):
    """The receipt ledger failed."""


class StoreUnavailable(StoreError):
    """The receipt store is unavailable; the sender should retry later."""


class LeaseLost(StoreError):
    """A newer claim owns this key; this attempt's work was rolled back."""
