"""The proxy of the proxy benchmark: ``IdempotencyProxy`` with its defaults, in front of
``BENCH_UPSTREAM``, on ``BENCH_STORE``."""

from __future__ import annotations

import os

from receiver import IdempotencyProxy, store_from_url

app = IdempotencyProxy(
    os.environ["BENCH_UPSTREAM"],
    store=store_from_url(os.environ["BENCH_STORE"]),
    store_owned=True,
)
