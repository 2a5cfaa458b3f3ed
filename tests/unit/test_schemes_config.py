"""The new senders as configuration sees them: their retry-schedule presets and the dedup
windows they imply, the configuration file's ``scheme``, ``url`` and ``dedup_key`` keys, the
``dedup_key=`` checks at start-up, each verifier's "do not retry" headers, and the kit signing
for a keyed provider's scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from receiver import (
    ConfigurationError,
    MalformedRequest,
    Provider,
    Slack,
    StandardWebhooks,
    Stripe,
    load_config,
)
from receiver._verification.keys import KeyedVerifier, key_from_parts
from receiver._verification.senders import Linear, Paddle, Zoom
from receiver._verification.twilio import Twilio
from receiver._webhooks.schedules import PRESETS, RetrySchedule, dedup_window
from receiver.testing import Sender

H = 3600.0
SPANS = {"paddle": 72 * H, "zoom": 85 * 60.0, "linear": 7 * H + 60, "twilio": 0.0}


@pytest.mark.parametrize(("name", "span"), sorted(SPANS.items()))
def test_new_presets(name: str, span: float) -> None:
    schedule = RetrySchedule.preset(name)
    assert schedule is PRESETS[name]
    assert schedule.span == span
    assert schedule.delays[0] == 0
    assert schedule.source.startswith(("Paddle", "Zoom", "Linear", "Twilio"))
    assert dedup_window(name).window >= span + 24 * H


def test_paddle_retries_sixty_times_and_zoom_three() -> None:
    assert PRESETS["paddle"].attempts == 1 + 60
    assert PRESETS["zoom"].offsets() == (0, 300, 1500, 5100)
    assert PRESETS["linear"].attempts == 1 + 3


def test_the_file_configures_the_new_schemes_and_dedup_keys(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(
        """
[providers.paddle]
scheme = "paddle"
secrets_env = ["PADDLE_SECRET"]

[providers.zoom]
scheme = "zoom"
secrets_env = ["ZOOM_SECRET"]
tolerance = "1m"

[providers.linear]
scheme = "linear"
secrets_env = ["LINEAR_SECRET"]

[providers.twilio]
scheme = "twilio"
secrets_env = ["TWILIO_TOKEN"]
url = "https://example.com/webhooks/twilio"

[providers.supabase]
secrets_env = ["SUPABASE_SECRET"]
dedup_key = ["record.id", "commit_timestamp"]
""",
        encoding="utf-8",
    )
    config = load_config(path)
    by_name = {p.name: p for p in config.providers}
    assert by_name["paddle"].window.schedule.name == "paddle"
    assert by_name["twilio"].tolerance is None
    assert by_name["supabase"].dedup_key == ("record.id", "commit_timestamp")
    env = {
        "PADDLE_SECRET": "pdl_ntfset_x",
        "ZOOM_SECRET": "zoomsecret",
        "LINEAR_SECRET": "linearsecret",
        "TWILIO_TOKEN": "authtoken",
        "SUPABASE_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    }
    rx = config.receiver(store=f"sqlite:///{tmp_path / 'r.db'}", environ=env)
    kinds = {name: type(p.scheme) for name, p in rx.providers.items()}
    assert kinds == {
        "paddle": Paddle,
        "zoom": Zoom,
        "linear": Linear,
        "twilio": Twilio,
        "supabase": StandardWebhooks,
    }
    assert isinstance(rx.providers["supabase"].verifier, KeyedVerifier)
    assert rx.providers["zoom"].scheme.tolerance == 60.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('scheme = "twilio"', r"providers\.p\.url: missing: Twilio signs the URL"),
        ('scheme = "twilio"\nurl = "ftp://x"', r"providers\.p\.url: url must be the webhook URL"),
        ('scheme = "paddle"\nurl = "https://x"', r"providers\.p\.url: paddle signatures do not"),
        ('dedup_key = ""', r"providers\.p\.dedup_key: dedup_key path '' is not a dotted path"),
        ("dedup_key = 5", r"providers\.p\.dedup_key: expected a dotted path"),
        ('dedup_key = ["a b"]', r"providers\.p\.dedup_key: dedup_key path 'a b'"),
        ('scheme = "twilio"\nurl = "https://x"\ntolerance = 5', r"twilio signatures carry no"),
    ],
)
def test_configuration_errors_name_the_key(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(f'[providers.p]\nsecrets_env = ["S"]\n{table}\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match=message):
        load_config(path)


@pytest.mark.parametrize("key", ["", [], ["a..b"], [" x"], ["a"] * 9, b"record.id", 7, ["ok", 3]])
def test_dedup_key_is_checked_at_start_up(key: object) -> None:
    with pytest.raises(ConfigurationError, match="dedup_key"):
        Provider("p", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], dedup_key=key)  # type: ignore[arg-type]


async def _async_key(body: object) -> str:
    return "k"


class _AsyncKey:
    async def __call__(self, body: object) -> str:
        return "k"


@pytest.mark.parametrize("key", [_async_key, _AsyncKey()])
def test_an_async_dedup_key_function_is_refused_at_start_up(key: object) -> None:
    # The key is read while verifying, with nothing to await: every delivery was a final 400.
    with pytest.raises(ConfigurationError, match="dedup_key must be a plain function"):
        Provider("p", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], dedup_key=key)  # type: ignore[arg-type]


def test_a_number_without_a_fraction_is_the_integer_it_is() -> None:
    # As the docs say: only a fractional value is refused; 1200.0 is 1200 however it is written.
    assert key_from_parts([1200.0, "a"], "k") == key_from_parts([1200, "a"], "k") == "1200|a"
    assert key_from_parts([-0.0], "k") == "0"
    for bad in (12.5, float("nan"), float("inf")):
        with pytest.raises(MalformedRequest, match="not a whole number"):
            key_from_parts([bad], "k")


def test_keys_are_readable_when_they_can_be() -> None:
    assert key_from_parts([42, "2026-05-01T10:00:00Z"], "k") == "42|2026-05-01T10:00:00Z"
    assert key_from_parts([True], "k") == "true"
    hashed = key_from_parts(["a|b"], "k")
    assert hashed.startswith("sha256||")
    assert key_from_parts(["a", "b"], "k") != key_from_parts(["a|b"], "k")
    assert key_from_parts(["é"], "k").startswith("sha256||")
    assert len(key_from_parts(["x" * 200, "y" * 200], "k")) <= 255


def test_each_verifier_names_its_senders_do_not_retry_answer() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert Provider("a", [secret]).stop_retry == (("webhook-delivery", "abort-message"),)
    assert Provider("s", verifier=Slack(["x"])).stop_retry == (("x-slack-no-retry", "1"),)
    for verifier in (
        Stripe(["x"]),
        Paddle(["x"]),
        Zoom(["x"]),
        Linear(["x"]),
        Twilio(["x"], url="https://e.com"),
    ):
        assert Provider("p", verifier=verifier).stop_retry == ()
    # A dedup key keeps the scheme's answer.
    assert Provider("k", [secret], dedup_key="id").stop_retry == (
        ("webhook-delivery", "abort-message"),
    )


async def test_the_kit_signs_for_a_keyed_providers_scheme(tmp_path: Path) -> None:
    from receiver import Receiver

    rx = Receiver(
        f"sqlite:///{tmp_path / 'k.db'}",
        [Provider("t", verifier=Twilio(["tok"], url="https://e.com/t"), dedup_key="MessageSid")],
    )
    async with Sender(rx, "t", "tok") as sender:
        assert sender.scheme.name == "twilio"
        assert sender.url == "https://e.com/t"
