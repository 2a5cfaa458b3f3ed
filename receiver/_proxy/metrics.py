"""Prometheus metrics of the idempotency proxy (``proxy.metrics``), in a registry of their own
unless one is given: ``receiver proxy --metrics-port`` serves it on a port of its own, since
every path of the proxy's own port belongs to the upstream."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

#: The ``outcome`` label of ``receiver_proxy_requests``.
OUTCOMES = (
    "forwarded",  # a keyed request forwarded, its answer stored
    "replayed",  # answered with a stored answer
    "passed",  # no key needed: streamed to the upstream and back, nothing stored
    "in_flight",  # 409: another attempt holds the key
    "mismatch",  # 422: the key was used with another request
    "refused",  # 400, 413: a bad or missing key, a body too large
    "released",  # the upstream was not reached or said it did not act: the key given back
    "unknown",  # the upstream may have acted and no answer was stored: kept for reconcile
    "reconciled",  # an interrupted attempt settled by reconcile()
    "needs_review",  # stored as a failure a person must look at
    "unavailable",  # 503: the store is down
)


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "receiver_proxy_requests",
            "Requests through the proxy, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "receiver_proxy_upstream_errors",
            "Upstream calls that failed, by kind (connect, connect_timeout, pool: not sent; "
            "timeout, read, write: may have acted; 5xx; too_large).",
            ["kind"],
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "receiver_proxy_upstream_seconds",
            "Time of keyed upstream calls, from the request sent to the whole answer read.",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()
