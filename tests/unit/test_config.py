"""Configuration files: a full file, defaults, secrets from the environment, handler modules,
and every error with its exact message (file, line, key path)."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.datastructures import Headers

from receiver import (
    Backoff,
    Config,
    ConfigurationError,
    Connection,
    Event,
    GitHub,
    Provider,
    Receiver,
    Shopify,
    Slack,
    StandardWebhooks,
    Stripe,
    VerificationError,
    generate_secret,
    load_config,
    sign,
    sign_github,
    sign_stripe,
)
from receiver._config.loader import (
    DEFAULT_LEASE,
    DEFAULT_RETRY_AFTER,
    DEFAULT_SWEEP_INTERVAL,
    _app_from_environment,
)
from receiver._config.toml_source import scan as _scan

# -- handler modules: this test module is one (handlers = ["tests.unit.test_config"]) ----------


async def paid(event: Event, tx: Connection) -> object:
    return {"paid": event.id}


def register(rx: Receiver) -> None:
    rx.add_handler("invoice.paid", paid)


async def audit(event: Event, tx: Connection) -> None:
    pass


def register_audit(rx: Receiver) -> None:
    rx.add_handler("*", audit)


def register_billing_only(rx: Receiver) -> None:
    rx.add_handler("invoice.*", paid, provider="nowhere")  # an unknown provider: refused


def register_with_options(rx: Receiver, options: dict[str, str]) -> None:
    pass  # takes more than the Receiver: refused before it is called


not_a_function = 42

# -------------------------------------------------------------------------------------------------

SECRET = generate_secret()
OLD_SECRET = generate_secret()
NOW = 1_700_000_000

FULL = """\
# every key, every scheme
store = "sqlite:///receipts.db"
handlers = ["tests.unit.test_config", "tests.unit.test_config:register_audit"]
max_body_size = 65_536
retry_after = "10s"
sweep_interval = "5m"

[providers.billing]
scheme = "standard-webhooks"
secrets_env = ["BILLING_SECRET", "BILLING_SECRET_OLD"]
tolerance = "2m"
schedule = ["0s", "5s", "5m", "1h"]
review_margin = "12h"
lease = 30
ttl = "3d"

[providers.payments]
scheme = "stripe"
secrets_env = ["STRIPE_SECRET"]
tolerance = 60

[providers.gh]
scheme = "github"
secrets_env = ["GITHUB_SECRET"]

[providers.shop]
scheme = "shopify"
secrets_env = ["SHOPIFY_SECRET"]
schedule = "svix"

[providers.chat]
scheme = "slack"
secrets_env = ["SLACK_SECRET"]
"""

ENV = {
    "BILLING_SECRET": SECRET,
    "BILLING_SECRET_OLD": OLD_SECRET,
    "STRIPE_SECRET": "whsec_stripe_text_secret",
    "GITHUB_SECRET": "github secret",
    "SHOPIFY_SECRET": "shpss_client_secret",
    "SLACK_SECRET": "8f742231b10e8888abcd99yyyzzz85a5",
}

Write = Callable[[str], str]


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Write:
    """Writes ``receiver.toml`` in a fresh working directory, so messages name it plainly."""
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> str:
        Path("receiver.toml").write_text(textwrap.dedent(text), encoding="utf-8")
        return "receiver.toml"

    return write


def error(write: Write, text: str) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_config(write(text))
    return str(caught.value)


def build_error(write: Write, text: str, env: dict[str, str]) -> str:
    config = load_config(write(text))
    with pytest.raises(ConfigurationError) as caught:
        config.receiver(environ=env)
    return str(caught.value)


# -- a valid file ---------------------------------------------------------------------------------


def test_a_full_file(write: Write) -> None:
    config = load_config(write(FULL))
    assert isinstance(config, Config)
    assert config.store == "sqlite:///receipts.db"
    assert config.handlers == ("tests.unit.test_config", "tests.unit.test_config:register_audit")
    assert (config.max_body_size, config.retry_after, config.sweep_interval) == (65536, 10, 300)
    billing, payments, gh, shop, chat = config.providers
    assert [p.name for p in config.providers] == ["billing", "payments", "gh", "shop", "chat"]
    assert billing.scheme == "standard-webhooks"
    assert billing.secrets_env == ("BILLING_SECRET", "BILLING_SECRET_OLD")
    assert (billing.tolerance, billing.review_margin, billing.lease, billing.ttl) == (
        120,
        12 * 3600,
        30,
        3 * 86400,
    )
    assert billing.window.schedule.delays == (0, 5, 300, 3600)
    assert billing.window.window == 3 * 86400
    assert billing.window.explicit_ttl
    # Each scheme's own preset unless the file names one; no tolerance without a timestamp.
    assert [p.window.schedule.name for p in (payments, gh, shop, chat)] == [
        "stripe",
        "github",
        "svix",
        "slack",
    ]
    assert (payments.tolerance, gh.tolerance, shop.tolerance, chat.tolerance) == (
        60,
        None,
        None,
        300,
    )


def test_the_full_file_builds_a_receiver(write: Write) -> None:
    rx = load_config(write(FULL)).receiver(environ=ENV)
    assert rx.store.url == "sqlite:///receipts.db"
    assert (rx.max_body_size, rx.pipeline.retry_after, rx.sweep_interval) == (65536, 10, 300)
    assert list(rx.providers) == ["billing", "payments", "gh", "shop", "chat"]
    verifiers = [type(p.verifier) for p in rx.providers.values()]
    assert verifiers == [StandardWebhooks, Stripe, GitHub, Shopify, Slack]
    billing = rx.providers["billing"]
    assert (billing.lease, billing.window.window) == (30, 3 * 86400)
    assert repr(rx.providers["payments"].verifier) == "Stripe(secrets=1, tolerance=60.0)"
    assert [h.func for h in rx.registry.match("gh", "invoice.paid")] == [paid, audit]


def test_defaults(write: Write) -> None:
    config = load_config(write('[providers.demo]\nsecrets_env = ["DEMO_SECRET"]\n'))
    assert config.store == "sqlite:///receiver.db"
    assert config.handlers == ()
    assert (config.max_body_size, config.retry_after, config.sweep_interval) == (
        1024 * 1024,
        5,
        60,
    )
    (demo,) = config.providers
    assert (demo.scheme, demo.tolerance, demo.review_margin, demo.ttl, demo.lease) == (
        "standard-webhooks",
        300,
        86400,
        None,
        60,
    )
    assert demo.window.schedule.name == "svix"  # as Provider("demo", ...) in code
    assert demo.window.window == Provider("demo", [SECRET]).window.window


def test_the_stated_defaults_are_those_of_receiver_and_provider() -> None:
    receiver_defaults = inspect.signature(Receiver).parameters
    assert receiver_defaults["retry_after"].default == DEFAULT_RETRY_AFTER
    assert receiver_defaults["sweep_interval"].default == DEFAULT_SWEEP_INTERVAL
    assert inspect.signature(Provider).parameters["lease"].default == DEFAULT_LEASE


def test_sweep_interval_false_turns_the_sweeper_off(write: Write) -> None:
    config = load_config(write('sweep_interval = false\n[providers.a]\nsecrets_env = ["A"]\n'))
    assert config.sweep_interval is None
    assert config.receiver(environ={"A": SECRET}).sweep_interval is None


def test_the_store_can_be_overridden(write: Write) -> None:
    config = load_config(write('[providers.a]\nsecrets_env = ["A"]\n'))
    rx = config.receiver(store="sqlite:///other.db", environ={"A": SECRET})
    assert rx.store.url == "sqlite:///other.db"


# -- secrets from the environment -----------------------------------------------------------------


def test_every_named_secret_verifies(write: Write) -> None:
    rx = load_config(write(FULL)).receiver(environ=ENV)
    verifier = rx.providers["billing"].verifier
    body = b'{"type": "invoice.paid"}'
    for secret in (SECRET, OLD_SECRET):
        headers = Headers(
            {
                "webhook-id": "msg_1",
                "webhook-timestamp": str(NOW),
                "webhook-signature": sign(secret, "msg_1", NOW, body),
            }
        )
        assert verifier.verify(headers, body, NOW).webhook_id == "msg_1"
    forged = Headers(
        {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(NOW),
            "webhook-signature": sign(generate_secret(), "msg_1", NOW, body),
        }
    )
    with pytest.raises(VerificationError):
        verifier.verify(forged, body, NOW)


def test_scheme_secrets_and_tolerance_come_through(write: Write) -> None:
    rx = load_config(write(FULL)).receiver(environ=ENV)
    body = b'{"id": "evt_1", "type": "invoice.paid"}'
    stripe = rx.providers["payments"].verifier
    headers = Headers({"stripe-signature": sign_stripe(ENV["STRIPE_SECRET"], NOW, body)})
    assert stripe.verify(headers, body, NOW + 60).webhook_id == "evt_1"
    with pytest.raises(VerificationError, match="too old"):
        stripe.verify(headers, body, NOW + 61)  # tolerance = 60 in the file
    github = Headers(
        {
            "x-hub-signature-256": sign_github(ENV["GITHUB_SECRET"], body),
            "x-github-delivery": "d-1",
            "x-github-event": "push",
        }
    )
    assert rx.providers["gh"].verifier.verify(github, body, NOW).webhook_id == "d-1"


def test_missing_environment_variable(write: Write) -> None:
    env = {k: v for k, v in ENV.items() if k != "BILLING_SECRET_OLD"}
    assert build_error(write, FULL, env) == (
        "receiver.toml:10: providers.billing.secrets_env[1]: environment variable "
        "BILLING_SECRET_OLD is not set; export it with the provider's secret (secrets are never "
        "read from the file)"
    )


def test_malformed_secret_in_the_environment(write: Write) -> None:
    assert build_error(write, FULL, {**ENV, "BILLING_SECRET": "not-a-whsec"}) == (
        "receiver.toml:10: providers.billing.secrets_env[0]: the secret in BILLING_SECRET has no "
        "whsec_, whpk_ or whsk_ prefix: give the secret as the sender shows it (whsec_ followed "
        "by base64); a raw HMAC key without a prefix can be given in code, as bytes"
    )
    assert build_error(write, FULL, {**ENV, "GITHUB_SECRET": "secret\n"}) == (
        "receiver.toml:24: providers.gh.secrets_env[0]: the secret in GITHUB_SECRET starts or "
        "ends with whitespace (a newline from an env file?): strip it, or pass bytes if the "
        "whitespace really is part of the secret"
    )
    assert build_error(write, FULL, {**ENV, "SLACK_SECRET": ""}) == (
        "receiver.toml:33: providers.chat.secrets_env[0]: the secret in SLACK_SECRET is empty; "
        "give the secret from the sender"
    )


def test_errors_never_show_a_secret(write: Write) -> None:
    message = build_error(write, FULL, {**ENV, "BILLING_SECRET": "whsec_!!!" + SECRET})
    assert SECRET not in message
    assert "!!!" not in message
    assert message.startswith("receiver.toml:10: providers.billing.secrets_env[0]: ")


# -- handler modules ------------------------------------------------------------------------------


def test_handler_modules_register_on_the_receiver(write: Write) -> None:
    for spec in ("tests.unit.test_config", "tests.unit.test_config:register"):
        text = f'handlers = ["{spec}"]\n[providers.a]\nsecrets_env = ["A"]\n'
        rx = load_config(write(text)).receiver(environ={"A": SECRET})
        assert [h.func for h in rx.registry.match("a", "invoice.paid")] == [paid]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "tests.unit.nowhere",
            "receiver.toml:1: handlers[0]: cannot import tests.unit.nowhere: No module named "
            "'tests.unit.nowhere'",
        ),
        (
            "tests.unit",
            "receiver.toml:1: handlers[0]: module tests.unit has no register(): define "
            "def register(rx) there, registering the handlers on rx, or name the function: "
            '"tests.unit:setup"',
        ),
        (
            "tests.unit.test_config:setup",
            "receiver.toml:1: handlers[0]: module tests.unit.test_config has no setup(): define "
            "def setup(rx) there, registering the handlers on rx",
        ),
        (
            "tests.unit.test_config:not_a_function",
            "receiver.toml:1: handlers[0]: tests.unit.test_config:not_a_function is not a "
            "function taking the Receiver",
        ),
        (
            "tests.unit.test_config:register_with_options",
            "receiver.toml:1: handlers[0]: tests.unit.test_config:register_with_options must "
            "take one argument, the Receiver (missing a required argument: 'options')",
        ),
        (
            "tests.unit.test_config:register_billing_only",
            "receiver.toml:1: handlers[0]: tests.unit.test_config:register_billing_only: handler "
            "paid names unknown provider 'nowhere'; configured: ['a']",
        ),
    ],
)
def test_handler_module_errors(write: Write, spec: str, message: str) -> None:
    text = f'handlers = ["{spec}"]\n[providers.a]\nsecrets_env = ["A"]\n'
    assert build_error(write, text, {"A": SECRET}) == message


def test_a_handler_module_that_does_not_parse_is_named_with_its_line(
    write: Write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_handlers.py").write_text("def register(rx:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = 'handlers = ["broken_handlers"]\n[providers.a]\nsecrets_env = ["A"]\n'
    message = build_error(write, text, {"A": SECRET})
    assert message.startswith("receiver.toml:1: handlers[0]: cannot import broken_handlers: ")
    assert "broken_handlers.py:1: " in message


def test_the_uvicorn_factory_reads_the_environment(
    write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write('[providers.a]\nsecrets_env = ["A"]\n')
    monkeypatch.delenv("RECEIVER_CONFIG", raising=False)
    with pytest.raises(ConfigurationError, match="RECEIVER_CONFIG is not set"):
        _app_from_environment()
    monkeypatch.setenv("RECEIVER_CONFIG", path)
    monkeypatch.setenv("RECEIVER_STORE", "sqlite:///from-env.db")
    monkeypatch.setenv("A", SECRET)
    rx = _app_from_environment()
    assert (rx.store.url, list(rx.providers)) == ("sqlite:///from-env.db", ["a"])


# -- errors in the file: exact messages -----------------------------------------------------------

P = '[providers.b]\nsecrets_env = ["A"]\n'  # a minimal valid provider, appended where needed

ERRORS = [
    # syntax: tomllib's own line and column
    ('store = "x"\nmax_body_size = = 3\n', "receiver.toml:2:17: invalid TOML: Invalid value"),
    (
        '[providers.a]\nsecrets_env = ["A"\n',
        "receiver.toml: invalid TOML at the end of the file: Unclosed array",
    ),
    (
        '[providers.a]\nsecrets_env = ["A"]\n[providers.a]\n',
        "receiver.toml:3:13: invalid TOML: Cannot declare ('providers', 'a') twice",
    ),
    # unknown keys
    (
        'stor = "x"\n' + P,
        "receiver.toml:1: stor: unknown key (did you mean store?); the file's top level takes "
        "store, handlers, migrations, max_body_size, retry_after, sweep_interval, "
        "trusted_proxies, workers, dead_letter_retention, audit_retention, max_in_progress, "
        "max_queue_wait, providers",
    ),
    (
        'scheme = "stripe"\n' + P,
        "receiver.toml:1: scheme: unknown key (provider settings go in a [providers.NAME] "
        "table); the file's top level takes store, handlers, migrations, max_body_size, "
        "retry_after, sweep_interval, trusted_proxies, workers, dead_letter_retention, "
        "audit_retention, max_in_progress, max_queue_wait, providers",
    ),
    (
        P + "max_body_size = 10\n",
        "receiver.toml:3: providers.b.max_body_size: unknown key (top-level keys must come "
        "before the first [table] header); a provider takes scheme, secrets_env, tolerance, "
        "schedule, review_margin, ttl, lease, mode, retry_attempts, retry_base, retry_cap, "
        "dedup_key, url, timeout, shed_status, handoff, same_content",
    ),
    (
        P + 'shedule = "svix"\n',
        "receiver.toml:3: providers.b.shedule: unknown key (did you mean schedule?); a provider "
        "takes scheme, secrets_env, tolerance, schedule, review_margin, ttl, lease, mode, "
        "retry_attempts, retry_base, retry_cap, dedup_key, url, timeout, shed_status, handoff, "
        "same_content",
    ),
    # secrets never in the file
    (
        '[providers.billing]\nsecrets = ["whsec_abc"]\n',
        "receiver.toml:2: providers.billing.secrets: secrets are never read from the file: put "
        "each in an environment variable and name the variables instead, e.g. secrets_env = "
        '["BILLING_SECRET"]',
    ),
    (
        '[providers.billing]\nschedule = "svix"\n',
        "receiver.toml:1: providers.billing.secrets_env: missing: name the environment variables "
        'that hold this provider\'s secrets, e.g. secrets_env = ["BILLING_SECRET"]',
    ),
    (
        '[providers.my-app]\nsecrets_env = "A"\n',
        "receiver.toml:2: providers.my-app.secrets_env: expected a non-empty list of environment "
        'variable names, e.g. ["MY_APP_SECRET"], got "A" (a string)',
    ),
    (
        '[providers.b]\nsecrets_env = "whsec_c2VjcmV0"\n',
        "receiver.toml:2: providers.b.secrets_env: expected a non-empty list of environment "
        'variable names, e.g. ["B_SECRET"], got a secret',
    ),
    (
        "[providers.b]\nsecrets_env = []\n",
        "receiver.toml:2: providers.b.secrets_env: expected a non-empty list of environment "
        'variable names, e.g. ["B_SECRET"], got an array',
    ),
    (
        '[providers.b]\nsecrets_env = ["A", "whsec_c2VjcmV0"]\n',
        "receiver.toml:2: providers.b.secrets_env[1]: this is a secret, not the name of an "
        "environment variable: put it in a variable, name the variable here, and rotate the "
        "secret (it was in a file)",
    ),
    (
        '[providers.b]\nsecrets_env = ["my-secret"]\n',
        "receiver.toml:2: providers.b.secrets_env[0]: expected the name of an environment "
        "variable (letters, digits and '_', not starting with a digit)",
    ),
    (
        '[providers.b]\nsecrets_env = ["A", "A"]\n',
        "receiver.toml:2: providers.b.secrets_env[1]: A is listed twice",
    ),
    # schemes
    (
        '[providers.b]\nscheme = "stripee"\nsecrets_env = ["A"]\n',
        'receiver.toml:2: providers.b.scheme: unknown scheme "stripee" (a string); known '
        "schemes: github, linear, paddle, shopify, slack, standard-webhooks, stripe, twilio, "
        "zoom",
    ),
    (
        '[providers.b]\nscheme = []\nsecrets_env = ["A"]\n',
        "receiver.toml:2: providers.b.scheme: unknown scheme an array; known schemes: github, "
        "linear, paddle, shopify, slack, standard-webhooks, stripe, twilio, zoom",
    ),
    (
        '[providers.t]\nscheme = "twilio"\nurl = "https://[::1/hook"\nsecrets_env = ["A"]\n',
        "receiver.toml:3: providers.t.url: url must be the webhook URL exactly as configured in "
        "Twilio, e.g. 'https://example.com/webhooks/twilio' (http or https, no #fragment)",
    ),
    (
        '[providers.t]\nscheme = "twilio"\nurl = "https://h:99999/hook"\nsecrets_env = ["A"]\n',
        "receiver.toml:3: providers.t.url: url must be the webhook URL exactly as configured in "
        "Twilio, e.g. 'https://example.com/webhooks/twilio' (http or https, no #fragment)",
    ),
    (
        '[providers.gh]\nscheme = "github"\nsecrets_env = ["A"]\ntolerance = 30\n',
        "receiver.toml:4: providers.gh.tolerance: github signatures carry no timestamp, so "
        "there is no tolerance to set; remove this key",
    ),
    # durations
    (
        P + "tolerance = true\n",
        "receiver.toml:3: providers.b.tolerance: expected a duration: seconds, or a string such "
        'as "90s", "5m", "2h", "3d", got true (a boolean)',
    ),
    (
        P + 'lease = "5 minutes"\n',
        "receiver.toml:3: providers.b.lease: invalid duration '5 minutes': use seconds (90) or "
        "units d/h/m/s such as 90s, 5m, 2h, 3d, 1h30m",
    ),
    (
        P + 'lease = "0s"\n',
        'receiver.toml:3: providers.b.lease: must be longer than 0s, got "0s" (a string)',
    ),
    (
        P + "review_margin = -1\n",
        "receiver.toml:3: providers.b.review_margin: duration must be a finite number of "
        "seconds >= 0, got -1",
    ),
    (
        P + "lease = 1979-05-27\n",
        "receiver.toml:3: providers.b.lease: expected a duration: seconds, or a string such as "
        '"90s", "5m", "2h", "3d", got 1979-05-27 (a date)',
    ),
    # schedules and windows
    (
        P + 'schedule = "svixx"\n',
        "receiver.toml:3: providers.b.schedule: unknown retry schedule preset 'svixx'; known "
        "presets: github, linear, paddle, shopify, slack, standard-webhooks, stripe, svix, "
        "twilio, zoom (or give an explicit list of delays, e.g. [0, 5, 300])",
    ),
    (
        P + "schedule = 5\n",
        'receiver.toml:3: providers.b.schedule: expected a preset name such as "svix" or a list '
        'of delays such as ["0s", "5s", "5m"], got 5 (an integer)',
    ),
    (
        P + 'schedule = [\n  "0s",\n  "5x",\n]\n',
        "receiver.toml:3: providers.b.schedule[1]: invalid duration '5x': use seconds (90) or "
        "units d/h/m/s such as 90s, 5m, 2h, 3d, 1h30m",
    ),
    (
        P + "schedule = []\n",
        "receiver.toml:3: providers.b.schedule: retry schedule 'custom' has no attempts; give at "
        "least one delay, e.g. [0] for a sender that delivers once and never retries",
    ),
    (
        '[providers.billing]\nsecrets_env = ["A"]\nschedule = "svix"\nttl = "1h"\n',
        "receiver.toml:4: providers.billing.ttl: ttl 1h is 26h 35m 5s shorter than its retry "
        "span 27h 35m 5s (schedule 'svix'); raise ttl to at least 27h 35m 5s or pick another "
        "schedule",
    ),
    (
        P + "ttl = 0\n",
        "receiver.toml:3: providers.b.ttl: ttl must be positive; leave it unset to derive it "
        "from the retry span (27h 35m 5s) plus the review margin",
    ),
    # top-level values
    (
        'max_body_size = "1MB"\n' + P,
        'receiver.toml:1: max_body_size: expected a number of bytes, got "1MB" (a string)',
    ),
    ("max_body_size = 0\n" + P, "receiver.toml:1: max_body_size: must be positive, got 0"),
    (
        "retry_after = 1.5\n" + P,
        "receiver.toml:1: retry_after: must be whole seconds: it is sent as a Retry-After header",
    ),
    (
        "sweep_interval = true\n" + P,
        "receiver.toml:1: sweep_interval: expected a duration, or false to run no background "
        "sweeper",
    ),
    (
        "sweep_interval = 0\n" + P,
        "receiver.toml:1: sweep_interval: must be longer than 0s, got 0 (an integer)",
    ),
    (
        "store = 5\n" + P,
        "receiver.toml:1: store: expected a store URL (a string), got 5 (an integer)",
    ),
    (
        'store = "mysql://u:password@db/x"\n' + P,
        "receiver.toml:1: store: unsupported store URL scheme 'mysql': use "
        "postgresql://user@host/db or sqlite:///path/to/receiver.db",
    ),
    (
        'store = "receiver.db"\n' + P,
        "receiver.toml:1: store: store URL 'receiver.db' has no scheme: for a SQLite file write "
        "sqlite:///receiver.db, for PostgreSQL postgresql://user@host/db",
    ),
    (
        'handlers = "myapp"\n' + P,
        'receiver.toml:1: handlers: expected a list of modules, e.g. ["myapp.webhooks"], got '
        '"myapp" (a string)',
    ),
    (
        'handlers = ["myapp", "my app"]\n' + P,
        'receiver.toml:1: handlers[1]: expected "module" (its register(rx) is called) or '
        '"module:function", got "my app" (a string)',
    ),
    # providers
    (
        'store = "sqlite:///a.db"\n',
        "receiver.toml: providers: no providers: add a [providers.NAME] table with secrets_env "
        '= ["NAME_SECRET"]',
    ),
    (
        '[[providers]]\nname = "a"\n',
        "receiver.toml:1: providers: write one [providers.NAME] table per provider (NAME is its "
        "URL path), not [[providers]]",
    ),
    ("providers = 1\n", "receiver.toml:1: providers: expected tables, got 1 (an integer)"),
    (
        "providers.a = 1\n",
        "receiver.toml:1: providers.a: expected a table [providers.a], got 1 (an integer)",
    ),
    (
        '[providers."a.b"]\nsecrets_env = ["A"]\n',
        "receiver.toml:1: providers.\"a.b\": a provider name is 1-64 letters, digits, '-' or "
        "'_' (it is a URL path)",
    ),
    # where the line comes from: inline tables, dotted keys, comments and multi-line strings
    (
        '[providers]\n\nb = { secrets_env = ["A"], lease = -1 }\n',
        "receiver.toml:3: providers.b.lease: duration must be a finite number of seconds >= 0, "
        "got -1",
    ),
    (
        'providers.b.secrets_env = ["A"]\n# lease = 1\nproviders.b.lease = "x"\n',
        "receiver.toml:3: providers.b.lease: invalid duration 'x': use seconds (90) or units "
        "d/h/m/s such as 90s, 5m, 2h, 3d, 1h30m",
    ),
]


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_error_messages(write: Write, text: str, message: str) -> None:
    assert error(write, text) == message


def test_file_errors(write: Write) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_config("missing.toml")
    assert str(caught.value) == "cannot read missing.toml: No such file or directory"
    Path("latin1.toml").write_bytes(b'store = "x"\n# caf\xe9\n')
    with pytest.raises(ConfigurationError) as caught:
        load_config("latin1.toml")
    assert str(caught.value) == "latin1.toml:2: not UTF-8 text; TOML files are UTF-8"
    # Both were tracebacks: ValueError (embedded null byte) and RecursionError.
    with pytest.raises(ConfigurationError) as caught:
        load_config("receiver\x00.toml")
    assert str(caught.value) == (
        "cannot read receiver\\x00.toml: a path cannot hold a NUL character"
    )
    Path("deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    Path("deeper.toml").write_text("a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n")
    for name in ("deep.toml", "deeper.toml"):
        with pytest.raises(ConfigurationError) as caught:
            load_config(name)
        assert str(caught.value) == (
            f"{name}: invalid TOML: arrays or inline tables nested too deeply"
        )


def test_a_store_error_never_shows_its_password(write: Write) -> None:
    message = error(write, 'store = "mysql://u:hunter2@db/x"\n' + P)
    assert "hunter2" not in message


def test_scan_finds_keys_outside_multiline_strings_and_arrays() -> None:
    lines = _scan(
        'a = """\n[not.a.table]\nb = 1\n"""\n'
        "[providers.'x']\n"
        '"quoted key" = 2\n'
        'schedule = [  # [\n  ["0s"],\n  "e = ]",\n]\n'
        "[[arr]]\nc.d = 3\n"
    )
    assert lines == {
        ("a",): 1,
        ("providers",): 5,
        ("providers", "x"): 5,
        ("providers", "x", "quoted key"): 6,
        ("providers", "x", "schedule"): 7,
        ("arr",): 11,
        ("arr", "c"): 12,
        ("arr", "c", "d"): 12,
    }


def test_trusted_proxies_reach_the_receiver(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(
        'trusted_proxies = ["10.0.0.0/8", "::1"]\n[providers.billing]\nsecrets_env = ["B"]\n'
    )
    rx = load_config(path).receiver(environ={"B": "whsec_" + "A" * 32})
    assert rx.trusted_proxies
    assert [str(n) for n in rx.trusted_proxies.networks] == ["10.0.0.0/8", "::1/128"]


def test_bad_trusted_proxies_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('trusted_proxies = ["not-an-ip"]\n')
    with pytest.raises(ConfigurationError, match=r"r.toml:1: trusted_proxies: .*not an IP"):
        load_config(path)


# -- queued mode ----------------------------------------------------------------------------------


def test_queued_mode_and_its_retries(write: Write) -> None:
    config = load_config(
        write(
            'workers = 2\n[providers.a]\nsecrets_env = ["A"]\nmode = "queued"\n'
            'retry_attempts = 3\nretry_base = "5s"\nretry_cap = "2m"\n'
        )
    )
    (provider,) = config.providers
    assert (provider.mode, provider.retry) == ("queued", Backoff(attempts=3, base=5.0, cap=120.0))
    rx = config.receiver(environ={"A": SECRET})
    assert rx.workers == 2
    assert rx.providers["a"].mode == "queued"
    assert rx.providers["a"].retry == Backoff(attempts=3, base=5.0, cap=120.0)
    defaults = load_config(write('[providers.a]\nsecrets_env = ["A"]\n')).providers[0]
    assert (defaults.mode, defaults.retry) == ("inline", Backoff())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('mode = "later"\n', 'providers.a.mode: expected "inline"'),
        ("retry_attempts = 0\n", "providers.a.retry_attempts: expected a whole number"),
        ('retry_base = "-1s"\n', "providers.a.retry_base"),
        ('retry_base = "2h"\nretry_cap = "1h"\n', "providers.a.retry_cap: retry cap"),
    ],
)
def test_queued_mode_mistakes(write: Write, text: str, message: str) -> None:
    assert message in error(write, '[providers.a]\nsecrets_env = ["A"]\n' + text)


def test_workers_must_be_a_count(write: Write) -> None:
    assert "workers: expected a number" in error(write, "workers = -1\n")


def test_same_content_reaches_the_provider(write: Write) -> None:
    config = load_config(write('[providers.a]\nsecrets_env = ["A"]\nsame_content = "hold"\n'))
    assert config.providers[0].same_content == "hold"
    assert config.receiver(environ={"A": SECRET}).providers["a"].same_content == "hold"
    defaults = load_config(write('[providers.a]\nsecrets_env = ["A"]\n')).providers[0]
    assert defaults.same_content == "run"
    assert "providers.a.same_content: expected" in error(
        write, '[providers.a]\nsecrets_env = ["A"]\nsame_content = "drop"\n'
    )
