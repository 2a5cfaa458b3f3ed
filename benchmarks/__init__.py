"""Benchmarks of the receiver against a bare Starlette endpoint: ``python -m benchmarks``.

Never part of the test suite, and never asserting timings: they measure, and they fail only when
a correctness check (no double execution, no 2xx without a committed receipt) does.
See benchmarks/README.md.
"""
