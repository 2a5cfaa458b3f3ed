"""Micro-benchmark of signature verification: ``receiver.StandardWebhooks.verify`` against
``standardwebhooks.Webhook.verify`` on the same deliveries (``python -m benchmarks.verifier``).

Each side verifies the same list of distinct, validly signed 1 KiB deliveries, with the headers
in the form its caller has them: raw ASGI header bytes (Starlette ``Headers``) for the receiver,
a ``dict`` of str for the package. The package's verify also parses the JSON body, so a third
line times the receiver's verify followed by the parse it does next (``orjson.loads``). Before
timing, both must agree on every delivery: all valid ones accepted, all forged ones refused.
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson
import standardwebhooks
from starlette.datastructures import Headers

from receiver import StandardWebhooks, VerificationError, generate_secret

from .load import Ids, Signer, Template, forged_signature


def _deliveries(secret: str, count: int, size: int, *, forged: bool = False) -> list[Any]:
    ids = Ids("verify" if not forged else "forged")
    template = Template.make(size, ids.length)
    signer = Signer(secret)
    now = int(time.time())
    out = []
    for webhook_id in ids.take(count):
        body = template.body(webhook_id)
        sig = forged_signature() if forged else signer.sign(webhook_id, now, body)
        pairs = [
            ("host", "127.0.0.1:8000"),
            ("user-agent", "receiver-bench"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("webhook-id", webhook_id),
            ("webhook-timestamp", str(now)),
            ("webhook-signature", sig),
        ]
        raw = Headers(raw=[(k.encode(), v.encode()) for k, v in pairs])
        out.append((raw, dict(pairs), body))
    return out


def _agree(ours: StandardWebhooks, theirs: standardwebhooks.Webhook, items: list[Any]) -> int:
    """How many deliveries both accept; raises if they ever disagree."""
    accepted = 0
    for raw, plain, body in items:
        try:
            ours.verify(raw, body, time.time())
            a = True
        except VerificationError:
            a = False
        try:
            theirs.verify(body, plain)
            b = True
        except standardwebhooks.WebhookVerificationError:
            b = False
        if a != b:
            raise AssertionError(f"the verifiers disagree on {plain['webhook-id']}: {a} != {b}")
        accepted += a
    return accepted


def _rates(funcs: dict[str, Callable[[], None]], count: int, seconds: float) -> dict[str, float]:
    """Deliveries per second of each function: the best of interleaved repeats (a, b, c, a, b,
    c, ...), so that all of them see the same noise of a shared machine."""
    timers = {name: timeit.Timer(func) for name, func in funcs.items()}
    loops = {name: timer.autorange()[0] for name, timer in timers.items()}
    best = dict.fromkeys(funcs, 0.0)
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < 5 or time.perf_counter() < deadline:
        for name, timer in timers.items():
            elapsed = timer.timeit(loops[name])
            best[name] = max(best[name], loops[name] * count / elapsed)
        rounds += 1
    return best


def run(seconds: float = 10.0, count: int = 1000, size: int = 1024) -> dict[str, Any]:
    secret = generate_secret()
    ours = StandardWebhooks([secret])
    theirs = standardwebhooks.Webhook(secret)
    valid = _deliveries(secret, count, size)
    forged = _deliveries(secret, count, size, forged=True)
    if _agree(ours, theirs, valid) != count or _agree(ours, theirs, forged) != 0:
        raise AssertionError("the verifiers must accept every valid and refuse every forged one")

    def receiver_verify() -> None:
        now = time.time()
        for raw, _, body in valid:
            ours.verify(raw, body, now)

    def receiver_verify_parse() -> None:
        now = time.time()
        for raw, _, body in valid:
            ours.verify(raw, body, now)
            orjson.loads(body)

    def package_verify() -> None:
        for _, plain, body in valid:
            theirs.verify(body, plain)

    rates = _rates(
        {"ours": receiver_verify, "ours_parse": receiver_verify_parse, "theirs": package_verify},
        count,
        seconds,
    )
    ours_rate, ours_parse_rate, theirs_rate = rates["ours"], rates["ours_parse"], rates["theirs"]
    return {
        "body_bytes": size,
        "deliveries": count,
        "agreement": f"{count} valid accepted and {count} forged refused by both",
        "statistic": "best of interleaved repeats",
        "receiver_verify_per_s": round(ours_rate),
        "receiver_verify_and_parse_per_s": round(ours_parse_rate),
        "standardwebhooks_verify_per_s": round(theirs_rate),
        "ratio": round(ours_rate / theirs_rate, 2),
        "ratio_with_parse": round(ours_parse_rate / theirs_rate, 2),
    }


def describe(result: dict[str, Any]) -> str:
    r = result
    return (
        f"verifier ({r['body_bytes']} B bodies; {r['agreement']}):\n"
        f"  receiver.StandardWebhooks.verify        {r['receiver_verify_per_s']:>9,} /s  "
        f"{1e6 / r['receiver_verify_per_s']:6.2f} us\n"
        f"  receiver verify + orjson.loads          {r['receiver_verify_and_parse_per_s']:>9,} /s  "
        f"{1e6 / r['receiver_verify_and_parse_per_s']:6.2f} us\n"
        f"  standardwebhooks.Webhook.verify (+json) {r['standardwebhooks_verify_per_s']:>9,} /s  "
        f"{1e6 / r['standardwebhooks_verify_per_s']:6.2f} us\n"
        f"  ratio {r['ratio']:.2f}x (verify alone), {r['ratio_with_parse']:.2f}x (both parsing)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(describe(run(args.seconds)))


if __name__ == "__main__":
    main()
