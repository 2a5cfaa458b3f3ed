"""The commands that set things up or try them: ``receiver ttl`` (dedup windows from retry
schedules), ``receiver migrate`` and ``receiver send`` (a signed test delivery)."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

import httpx
import orjson

from .._config.loader import load_config
from .._exceptions import ConfigurationError, ReceiverError
from .._store import partitions
from .._store.base import Store
from .._store.sqlite import SQLiteStore
from .._store.url import store_from_url
from .._verification import sending
from .._webhooks.schedules import PRESETS, DedupWindow, dedup_window, describe
from .loading import (
    check_config_alone,
    existing_store,
    load_receiver,
    read,
    store_url,
    text_argument,
)
from .output import emit


def ttl_command(args: argparse.Namespace) -> int:
    first = "provider"
    if args.config:
        if args.app:
            check_config_alone(args)
        windows = [p.window for p in load_config(args.config).providers]
    elif args.app:
        windows = [p.window for p in load_receiver(args.app).providers.values()]
    else:
        # No receiver named: what each preset would give with the default review margin.
        first = "preset"
        windows = [dedup_window(schedule, provider=name) for name, schedule in PRESETS.items()]
    rows = [describe(window) for window in windows]
    for row in rows:
        row[first] = row.pop("provider")
    columns = [first, "schedule", "span", "margin", "window", "source"]
    if args.json:
        emit({"windows": [_window(first, w) for w in windows]})
        return 0
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())
    return 0


def _window(first: str, window: DedupWindow) -> dict[str, Any]:
    """A window for scripts (``ttl --json``): the table's facts, durations in seconds."""
    return {
        first: window.provider,
        "schedule": window.schedule.name,
        "attempts": window.schedule.attempts,
        "jitter": window.schedule.jitter,
        "span": window.span,
        "margin": window.margin,
        "window": window.window,
        "explicit_ttl": window.explicit_ttl,
        "source": window.schedule.source or "configured",
    }


def migrate(args: argparse.Namespace) -> int:
    if args.json and not args.check:
        raise ReceiverError("--json reports a check: give --check too")
    url = store_url(args)
    # --check changes nothing: a SQLite file that is not there is reported, not created.
    store = existing_store(url) if args.check else store_from_url(url)
    if isinstance(store, SQLiteStore):
        store.auto_migrate = False  # this command applies (or checks) them itself

    async def run() -> int:
        async with store:
            if args.check:
                return await check(store)
            for name in await store.migrate():
                print(f"applied {name}")
            if args.config:  # the app's own tables, as this (the owner's) role
                for name in await load_config(args.config).migrate(store):
                    print(f"applied {name} (the app's)")
            if args.layout is not None:
                async with store.acquire() as conn:
                    changed = await partitions.convert(conn, args.layout)
                state = "now has" if changed else "already had"
                print(f"receiver_receipts {state} the {args.layout} layout")
            print(f"schema ready in {store.url}")
            return 0

    async def check(store: Store) -> int:
        missing = await store.missing_migrations()
        found = None
        if args.layout is not None and not missing:
            async with store.acquire() as conn:
                found = await partitions.layout(conn)
        if args.json:
            up_to_date = not missing and found == args.layout
            emit(
                {"store": store.url, "up_to_date": up_to_date, "missing": missing, "layout": found}
            )
        if missing:
            print(
                f"receiver: the schema in {store.url} is behind: missing "
                f"{', '.join(missing)} (run `receiver migrate`)",
                file=sys.stderr,
            )
            return 1
        if found != args.layout:
            print(
                f"receiver: receiver_receipts in {store.url} has the {found} layout, "
                f"not {args.layout} (run `receiver migrate --layout {args.layout}`)",
                file=sys.stderr,
            )
            return 1
        if not args.json:
            print(f"schema up to date in {store.url}")
        return 0

    # A file that is not a SQLite database, a role without rights: one line, not a traceback.
    return read(store, run, "check" if args.check else "migrate")


def send(args: argparse.Namespace) -> int:
    """Sign and POST one delivery in a sender's scheme (receiver/_verification/sending.py, the
    testing kit's envelopes). Exit status: 0 for a 2xx answer, 1 for any other answer or no
    answer (as ``curl --fail``), 2 for a mistake on the command line."""
    if not args.secret:
        print("receiver send: --secret (or RECEIVER_SECRET) is required", file=sys.stderr)
        return 2
    shape = sending.scheme(args.scheme)
    webhook_id = args.id or f"{shape.id_prefix}{uuid.uuid4().hex}"
    if not (webhook_id.isascii() and webhook_id.isprintable()):
        # An HTTP header is ASCII; the senders' ids are too.
        print(f"receiver send: --id must be printable ASCII, not {webhook_id!a}", file=sys.stderr)
        return 2
    try:
        httpx.URL(args.url)
    except httpx.InvalidURL as exc:
        print(f"receiver send: --url is not a URL: {exc}", file=sys.stderr)
        return 2
    if args.data is None:
        # Named after the id: a new id is a new event, never the same payload under another id
        # (which the receiver reports as key drift), and the same id is the same payload.
        name = webhook_id.removeprefix(shape.id_prefix)
        data: Any = {"order_id": f"o-{name}", "amount_cents": 1250}
    else:
        try:
            data = orjson.loads(args.data)
        except orjson.JSONDecodeError as exc:
            print(f"receiver send: --data is not JSON: {exc}", file=sys.stderr)
            return 2
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    event_type = text_argument("--type", args.type, "a JSON body is UTF-8")
    # The event's own date inside the body (Stripe's created, Slack's event_time, ...) is fixed,
    # so that a second send with the same --id repeats the same bytes, as a sender's retry does.
    body = shape.body(webhook_id, event_type, data, 0)
    key = shape.id_of(webhook_id, body)
    webhook = sending.Webhook("", key, event_type, body, "" if key == webhook_id else webhook_id)
    body = shape.attempt(body, timestamp)
    try:
        signed = shape.headers(webhook, body, timestamp, args.secret, args.url)
    except ConfigurationError:
        print(
            "receiver send: --secret is not a signing secret: give the provider's whsec_... "
            "secret (or whsk_... for ed25519) exactly as the receiver has it, e.g. the one "
            "`receiver serve` printed",
            file=sys.stderr,
        )
        return 2
    headers = [*signed, ("content-type", shape.content_type)]
    try:
        response = httpx.post(args.url, content=body, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"receiver send: {args.url}: {exc}", file=sys.stderr)
        return 1
    label = "webhook-id" if shape.name == "standard-webhooks" else f"{shape.name} event id"
    print(f"POST {args.url}  {label}: {key}")
    print(f"HTTP {response.status_code}")
    for name in ("content-type", "idempotent-replayed", "retry-after"):
        if name in response.headers:
            print(f"{name}: {response.headers[name]}")
    print()
    print(response.text)
    return 0 if response.is_success else 1
