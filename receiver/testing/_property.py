"""Running one of the kit's property tests: a plain test, an event loop and a fresh store per
example, the user's example count raised under the deep profile."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TypeVar

from hypothesis import HealthCheck, settings

from .._exceptions import ConfigurationError
from ._strategies import examples

T = TypeVar("T")


def refuse_running_loop(name: str) -> None:
    """Each example runs in an event loop of its own: a running one means an async test."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ConfigurationError(
        f"{name} runs an event loop per example: call it from a plain `def` test, not an "
        "`async def` one"
    )


def property_settings(max_examples: int) -> settings:
    """The kit's property settings: ``max_examples`` (the deep profile's count in a deep run),
    no deadline (a real store is slow now and then), fixtures welcome."""
    return settings(
        max_examples=examples(max_examples),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


async def built(value: T | Awaitable[T]) -> T:
    """What a user's factory made: a value, or an awaitable of one (an ``async def`` build)."""
    if inspect.isawaitable(value):
        return await value
    return value
