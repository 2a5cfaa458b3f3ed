"""Handler registration and the order handlers run in."""

from typing import Any

import pytest

from receiver import ConfigurationError, Provider, Receiver, Stripe
from receiver._webhooks.handlers import Registry


async def a(event: Any, tx: Any) -> None: ...
async def b(event: Any, tx: Any) -> None: ...
async def c(event: Any, tx: Any) -> None: ...
async def d(event: Any, tx: Any) -> None: ...


def test_exact_then_longer_prefixes_then_everything() -> None:
    registry = Registry()
    registry.add("*", a)
    registry.add("invoice.*", b)
    registry.add("invoice.paid", c)
    registry.add("invoice.paid.*", d)
    assert [h.func for h in registry.match("p", "invoice.paid")] == [c, b, a]
    assert [h.func for h in registry.match("p", "invoice.paid.late")] == [d, b, a]
    assert [h.func for h in registry.match("p", "customer.created")] == [a]
    assert registry.match("p", "invoice") == registry.match("p", "x")  # "invoice.*" needs the dot


def test_registration_order_within_a_group() -> None:
    registry = Registry()
    registry.add("order.*", b)
    registry.add("order.*", a)
    assert [h.func for h in registry.match("p", "order.x")] == [b, a]


def test_shopify_topics_take_slash_prefixes() -> None:
    registry = Registry()
    registry.add("orders/*", a)
    assert [h.func for h in registry.match("shop", "orders/create")] == [a]


def test_provider_filter() -> None:
    registry = Registry()
    registry.add("*", a, provider="stripe")
    assert registry.match("github", "push") == ()
    assert [h.func for h in registry.match("stripe", "charge.succeeded")] == [a]


@pytest.mark.parametrize("pattern", ["", "in*voice", "invoice.*.paid", "**", "has space", "a.*b"])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigurationError, match="pattern"):
        Registry().add(pattern, a)


def test_same_function_twice_for_one_type_is_refused() -> None:
    rx = Receiver("sqlite:///:memory:", [Provider("p", ["whsec_" + "A" * 32])])
    rx.on("invoice.paid")(a)
    with pytest.raises(ConfigurationError, match="already registered"):
        rx.on("invoice.paid")(a)
    rx.on("invoice.*")(a)  # another type is fine


def test_handlers_must_be_async() -> None:
    def sync(event: Any, tx: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="async def"):
        Registry().add("x", sync)  # type: ignore[arg-type]


def test_reconcile_only_for_external_handlers() -> None:
    async def fix(event: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="external"):
        Registry().add("x", a, reconcile=fix)
    Registry().add("x", a, effects="external", reconcile=fix)
    with pytest.raises(ConfigurationError, match="effects"):
        Registry().add("x", a, effects="sometimes")  # type: ignore[arg-type]


def test_unknown_provider_in_a_handler_is_refused() -> None:
    rx = Receiver("sqlite:///:memory:", [Provider("p", ["whsec_" + "A" * 32])])
    with pytest.raises(ConfigurationError, match="unknown provider"):
        rx.on("x", provider="q")(a)


def test_provider_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="no secrets"):
        Provider("p")
    with pytest.raises(ConfigurationError, match="must be a list"):
        Provider("p", "whsec_" + "A" * 32)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="URL path segment"):
        Provider("a/b", ["whsec_" + "A" * 32])
    with pytest.raises(ConfigurationError, match="shorter than its retry span"):
        Provider("p", ["whsec_" + "A" * 32], schedule="stripe", ttl=3600)
    with pytest.raises(ConfigurationError, match="configured twice"):
        Receiver("sqlite:///:memory:", [Provider("p", ["whsec_" + "A" * 32])] * 2)
    assert "whsec" not in repr(Provider("p", ["whsec_" + "A" * 32]))


def test_a_verifier_class_is_refused_for_an_instance() -> None:
    # Accepted, every delivery was a 500: the class's verify is unbound.
    with pytest.raises(ConfigurationError, match=r"pass an instance, e\.g\. Stripe\(\[secret\]\)"):
        Provider("p", verifier=Stripe)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="verify"):
        Provider("p", verifier="whsec_" + "A" * 32)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"retry_after": "5"}, "retry_after is whole seconds"),
        ({"retry_after": None}, "retry_after is whole seconds"),
        ({"retry_after": 5.5}, "retry_after is whole seconds"),
        ({"retry_after": True}, "retry_after is whole seconds"),
        ({"retry_after": -1}, "retry_after"),
        ({"retry_after": 10**400}, "retry_after"),
        ({"sweep_interval": True}, "sweep_interval"),
        ({"sweep_interval": "60"}, "sweep_interval"),
        ({"sweep_interval": float("inf")}, "sweep_interval"),
        ({"replay_cache": True}, "replay_cache"),
        ({"replay_cache": 1.5}, "replay_cache"),
    ],
)
def test_receiver_settings_of_the_wrong_type_are_refused(
    options: dict[str, Any], says: str
) -> None:
    # retry_after="5" or None was accepted, then every duplicate got a 500, not its 409.
    with pytest.raises(ConfigurationError, match=says):
        Receiver("sqlite:///:memory:", **options)


@pytest.mark.parametrize("lease", [True, "60", float("nan")])
def test_a_lease_that_is_no_number_of_seconds_is_refused(lease: Any) -> None:
    with pytest.raises(ConfigurationError, match="lease must be positive seconds"):
        Provider("p", ["whsec_" + "A" * 32], lease=lease)
    with pytest.raises(ConfigurationError, match="lease"):
        Registry().add("x", a, lease=lease)
