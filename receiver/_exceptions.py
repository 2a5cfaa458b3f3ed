"""The exception tree of receiver. Every error the library raises derives from one root:

    ReceiverError
     +-- ConfigurationError        bad settings, raised at start-up or registration
     |    +-- SchemaOutdated       the database lacks migrations: run `receiver migrate`
     +-- VerificationError         a delivery failed a check before touching the store (401)
     |    +-- MalformedRequest     its headers are structurally broken (400)
     +-- StoreError                the ledger could not do what was asked
     |    +-- StoreUnavailable     the database is unreachable or timed out (503)
     |    |    +-- StoreReadOnly        it accepts no writes: a standby, after a failover (503)
     |    |    +-- StoreMisconfigured   its database, role, tables or privileges are wrong (503)
     |    +-- LeaseLost            a newer claim owns the key: the fence moved on
     +-- InvalidIdempotencyKey     an Idempotency-Key header that cannot be read as one key (400)
     +-- ActionError               an agent action could not be executed as asked
          +-- ActionConflict       its key was used before with another request
          +-- ActionInProgress     another attempt still runs it after the bounded wait
          +-- ActionFailed         it failed for good (stored, and raised again on every retry)
          +-- ActionNeedsReview    a person must look: an external tool may have acted and
                                   nothing can say (never an ActionFailed: not for the model)

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

    #: The ``kind`` label of the store-errors metric.
    kind: str = "unavailable"


class StoreReadOnly(StoreUnavailable):
    """The receipt store is read-only (a standby, after a failover?); the sender should retry
    later, when the receiver reaches the primary again."""

    kind = "read_only"


class StoreMisconfigured(StoreUnavailable):
    """The receipt store is not set up for the receiver; the message says what to fix. The
    sender is answered 503 and retries, so nothing is lost while it is fixed."""

    kind = "misconfigured"


class LeaseLost(StoreError):
    """A newer claim owns this key; this attempt's work was rolled back."""


class InvalidIdempotencyKey(ReceiverError):
    """The Idempotency-Key header cannot be read as one key."""


class ActionError(ReceiverError):
    """The agent action could not be executed as asked."""


class ActionConflict(ActionError):
    """This action key was already used with a different request (another fingerprint): the
    action id is being reused for a different effect. Nothing was executed."""


class ActionInProgress(ActionError):
    """Another attempt of this action is still running; retry later."""

    def __init__(self, message: str | None = None, *, retry_after: float = 1.0) -> None:
        #: Seconds after which a retry may find the first attempt's result.
        self.retry_after = retry_after
        super().__init__(message)


class ActionFailed(ActionError):
    """The action failed for good. Raise it from a tool to make a failure final: it is stored,
    and every retry of the action raises it again instead of running the tool."""


class ActionNeedsReview(ActionError):
    """An attempt of an external tool was interrupted (or returned what cannot be stored) and
    no reconcile() can say what happened: it is never re-run blindly; the action is marked
    failed, an operator is alerted, and every retry raises this again.

    Deliberately not an `ActionFailed`: an agent loop that hands ``ActionFailed`` to the
    model as an ordinary tool error must not swallow a case that needs a person. Stop the run
    (or escalate) on this one."""
