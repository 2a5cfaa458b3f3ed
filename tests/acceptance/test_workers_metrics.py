"""``receiver serve --workers 2``: a scrape of /metrics, whichever worker answers it, counts the
deliveries of both workers (prometheus-client's multiprocess mode, set up by ``serve``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import running
from tests.support import PROVIDER, SECRET, body_of, signed

pytestmark = pytest.mark.slow


def executed(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "receiver_deliveries"
        for sample in family.samples
        if sample.name == "receiver_deliveries_total"
        and sample.labels == {"provider": PROVIDER, "outcome": "executed", "reason": ""}
    )


def test_every_scrape_counts_the_deliveries_of_every_worker(tmp_path: Path) -> None:
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": f"sqlite:///{tmp_path}/r.db",
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
    }
    with running(env, tmp_path / "serve.log", workers=2) as server:
        sent = 0
        # A new connection per delivery, until both workers have served some (the kernel hands
        # each accepted connection to one of them).
        while (
            sent < 10 or len({line.split()[2] for line in invocations.read_text().splitlines()}) < 2
        ):
            assert sent < 400, "one worker served every delivery"
            body = body_of(order=f"o-{sent}")
            answer = httpx.post(
                f"{server.url}/{PROVIDER}",
                content=body,
                headers=signed(f"msg_{sent}", body),
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            sent += 1
        scrapes = [httpx.get(f"{server.url}/metrics", timeout=10) for _ in range(10)]
    assert all(scrape.status_code == 200 for scrape in scrapes)
    assert [executed(scrape.text) for scrape in scrapes] == [sent] * len(scrapes)
