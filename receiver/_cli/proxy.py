"""``receiver proxy``: the idempotency proxy in front of one upstream, on uvicorn.

Each uvicorn worker builds its proxy from the options, passed to it as JSON in
``RECEIVER_PROXY_OPTIONS`` (set by the command, read by :func:`_app_from_environment`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging.config
import os
from collections.abc import Callable
from typing import Any

from .._exceptions import ReceiverError
from .._logging import FORMAT_HELP, FORMATS, logging_config, resolve_format
from .._proxy import forward
from .._proxy.app import IdempotencyProxy, authorization_principal
from .._store.url import store_from_url
from .._webhooks.app import DEFAULT_STORE
from . import values
from .loading import load_app

_OPTIONS = "RECEIVER_PROXY_OPTIONS"


def add_proxy_parser(sub: Any, add: Callable[..., None]) -> None:
    """The ``proxy`` subcommand (``add`` is the parser's option helper: env var defaults)."""
    p = sub.add_parser(
        "proxy",
        help="forward keyed requests to an upstream once each, replaying its stored answers",
    )
    add(p, "upstream", "the upstream's base URL (required): http(s)://host, optional port and path")
    add(p, "store", "store URL: sqlite:///path.db or postgresql://...", DEFAULT_STORE)
    add(p, "host", "interface to bind", "127.0.0.1")
    add(p, "port", "port to bind", 8080, type=values.port)
    add(p, "workers", "uvicorn worker processes", 1, type=values.count)
    add(p, "methods", "comma-separated methods that are keyed", "POST,PATCH")
    add(p, "paths", "comma-separated paths keyed (exact, or a prefix ending in /*); default all")
    add(p, "required", "comma-separated paths where a request without a key is 400", "")
    add(p, "key-header", "the header the upstream gets the key in ('' for none)", "Idempotency-Key")
    add(
        p,
        "forward-key",
        "derived (per principal and key) or client",
        "derived",
        choices=("derived", "client"),
    )
    add(p, "principal-header", "whose keys: this header's value (default: hash of Authorization)")
    add(p, "reconcile", "an async function module:attribute asking the upstream what happened")
    p.add_argument(
        "--upstream-deduplicates",
        action="store_true",
        default=os.environ.get("RECEIVER_UPSTREAM_DEDUPLICATES", "") not in ("", "0", "false"),
        help="the upstream deduplicates by the forwarded key: an interrupted attempt may be "
        "forwarded again [env RECEIVER_UPSTREAM_DEDUPLICATES]",
    )
    add(p, "retry-statuses", "upstream statuses meaning 'did not act': given back", "429,503")
    add(p, "timeout", "seconds for a whole upstream call", 30.0, type=values.positive)
    add(p, "connect-timeout", "seconds to connect to the upstream", 5.0, type=values.positive)
    lease = "seconds an attempt holds its key (more than --timeout)"
    add(p, "lease", lease, 60.0, type=values.positive)
    add(p, "ttl", "seconds a key and its answer are kept", 86_400.0, type=values.positive)
    wait = "seconds a concurrent retry waits for the first answer"
    add(p, "wait", wait, 0.0, type=values.not_negative)
    add(p, "max-body-size", "bytes of a keyed request's body", 1024 * 1024, type=values.count)
    add(p, "max-response-size", "bytes of an answer stored", 10 * 1024 * 1024, type=values.count)
    add(p, "namespace", "the ledger namespace of this proxy's keys (proxy:NAME)", "default")
    add(p, "upstream-ca", "a CA bundle to check the upstream's TLS certificate against")
    trusted = "comma-separated addresses or networks of proxies in front of this one, whose "
    add(p, "trusted-proxies", trusted + "X-Forwarded-* headers are passed on", "")
    add(
        p,
        "metrics-port",
        "serve Prometheus metrics here (0: none; one worker)",
        0,
        type=values.port,
    )
    add(p, "log-level", "log level", "info", type=values.log_level)
    add(p, "log-format", FORMAT_HELP, "auto", choices=FORMATS)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def proxy_command(args: argparse.Namespace) -> int:
    if not args.upstream:
        raise ReceiverError("--upstream is required: the base URL requests are forwarded to")
    if args.metrics_port and args.workers > 1:
        raise ReceiverError("--metrics-port needs --workers 1 (each worker has its own metrics)")
    if not args.timeout < args.lease <= args.ttl:
        # Said in the flags' names: the proxy's own message names its Python parameters.
        raise ReceiverError(
            f"need --timeout ({args.timeout:g} s) < --lease ({args.lease:g} s) <= --ttl "
            f"({args.ttl:g} s): an upstream call must end before its claim's lease does"
        )
    # Decided here, by the terminal the command runs in, for every worker process alike.
    args.log_format = resolve_format(args.log_format)
    options = {k: v for k, v in vars(args).items() if k != "command"}
    os.environ[_OPTIONS] = json.dumps(options)
    _app_from_environment()  # configuration errors before uvicorn starts

    import uvicorn

    uvicorn.run(
        "receiver._cli.proxy:_app_from_environment",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=logging_config(args.log_format, args.log_level),
        lifespan="on",
        proxy_headers=False,
        timeout_keep_alive=75,
        access_log=False,
    )
    return 0


_metrics_served = False


def _app_from_environment() -> IdempotencyProxy:
    global _metrics_served
    o = json.loads(os.environ[_OPTIONS])
    logging.config.dictConfig(logging_config(o["log_format"], o["log_level"]))
    principal: Callable[[Any], str] = authorization_principal
    if o["principal_header"]:
        # Any other name never arrives in a request: every caller would be "anonymous".
        wanted = forward.header_name(o["principal_header"], "--principal-header")

        def principal(scope: Any) -> str:
            found = next((v for k, v in scope["headers"] if k.lower() == wanted), b"")
            return "h:" + hashlib.sha256(found).hexdigest()[:32] if found else "anonymous"

    reconcile = load_app(o["reconcile"], "--reconcile") if o["reconcile"] else None
    try:
        statuses = [int(s) for s in _split(o["retry_statuses"])]
    except ValueError:
        raise ReceiverError("--retry-statuses takes comma-separated status codes") from None
    proxy = IdempotencyProxy(
        o["upstream"],
        store=store_from_url(o["store"]),
        store_owned=True,
        principal=principal,
        methods=_split(o["methods"]),
        paths=_split(o["paths"]) or None,
        required=_split(o["required"]),
        key_header=o["key_header"] or None,
        forward_key=o["forward_key"],
        reconcile=reconcile,
        upstream_deduplicates=o["upstream_deduplicates"],
        retry_statuses=statuses,
        timeout=o["timeout"],
        connect_timeout=o["connect_timeout"],
        lease=o["lease"],
        ttl=o["ttl"],
        wait=o["wait"],
        max_body_size=o["max_body_size"],
        max_response_size=o["max_response_size"],
        namespace=o["namespace"],
        verify=o["upstream_ca"] or True,
        trusted_proxies=o["trusted_proxies"],
    )
    if o["metrics_port"] and not _metrics_served and os.environ.get("RECEIVER_PROXY_SERVING"):
        from prometheus_client import start_http_server

        start_http_server(o["metrics_port"], addr=o["host"], registry=proxy.metrics.registry)
        _metrics_served = True
    os.environ["RECEIVER_PROXY_SERVING"] = "1"
    return proxy
