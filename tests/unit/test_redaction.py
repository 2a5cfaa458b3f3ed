"""Which JSON field names the console masks: names split into words (camelCase, acronyms,
``_``, ``-``, ``.``) and matched word by word, over real field names from providers' payloads,
both the ones that must be masked and the ones that must stay readable."""

from __future__ import annotations

import orjson
import pytest

from receiver._console.redaction import MASK, error_line, secret_field, show_body, words

MASKED = [
    # what the console's docs name
    "key",
    "password",
    "secret",
    "token",
    "authorization",
    "cookie",
    "session",
    "cvc",
    "iban",
    "ssn",
    "pin",
    "otp",
    # camelCase, acronyms and every separator
    "privateKey",
    "PrivateKey",
    "private_key",
    "private-key",
    "private.key",
    "privatekey",
    "PRIVATE_KEY",
    "accessKey",
    "APIKey",
    "apiKey",
    "x-api-key",
    "X-API-KEY",
    "signing_key",
    "userPin",
    "userPIN",
    "customerSSN",
    "newPassword",
    "cvv2",
    # Stripe
    "client_secret",
    "idempotency_key",
    "publishable_key",
    "card",
    # Shopify
    "cart_token",
    "checkout_token",
    "credit_card_number",
    # Slack
    "bot_token",
    # Twilio
    "AuthToken",
    # OAuth answers relayed by providers (PayPal, Auth0)
    "access_token",
    "refresh_token",
    "id_token",
    # Zoom's endpoint validation
    "plainToken",
    "encryptedToken",
    # a session's id is the session itself
    "session_id",
    "sessionId",
    "clientsecret",
    # plurals
    "passwords",
    "api_keys",
    "cards",
    "accessTokens",
    "authorizations",  # Slack's: only ids, masked all the same (the rule is by words)
]

SHOWN = [
    # words that merely contain a secret word
    "monkey",
    "keyboard",
    "turkey",
    "keynote",
    "author",
    "company",
    "discard",
    "spinner",
    "pinned_to",  # Slack
    "expansion",
    "three_d_secure",  # Stripe: secure is not secret
    # a name that describes a secret without holding it
    "key_id",
    "token_type",  # OAuth
    "keys_url",  # GitHub
    "access_tokens_url",  # GitHub
    "password_changed_at",
    "card_brand",
    "key_ids",
    "token_types",
    # Stripe
    "livemode",
    "payment_method",
    "last4",
    "api_version",
    "pending_webhooks",
    # Shopify
    "browser_ip",
    "total_discounts",
    "admin_graphql_api_id",
    # GitHub
    "private",
    "node_id",
    "pusher",
    # Slack
    "api_app_id",
    "team_id",
    # Twilio
    "AccountSid",
    "MessageSid",
    "ApiVersion",
    # Linear
    "webhookTimestamp",
    "webhookId",
]


@pytest.mark.parametrize("name", MASKED)
def test_a_secret_fields_value_is_masked(name: str) -> None:
    assert secret_field(name), words(name)


@pytest.mark.parametrize("name", SHOWN)
def test_an_ordinary_fields_value_is_shown(name: str) -> None:
    assert not secret_field(name), words(name)


def test_names_split_on_case_separators_and_digits() -> None:
    assert words("x-api-key") == words("xApiKey") == words("X_API.KEY") == ["x", "api", "key"]
    assert words("customerSSN") == ["customer", "ssn"]
    assert words("APIKey") == ["api", "key"]
    assert words("cvv2") == ["cvv", "2"]


def test_the_operators_names_match_as_words_in_a_row() -> None:
    extra = ["customer_email"]
    for name in ("customer_email", "customerEmail", "customer-email", "billing.customer_email"):
        assert secret_field(name, extra), name
    for name in ("email", "customer", "email_customer"):
        assert not secret_field(name, extra), name


def test_a_payload_is_masked_at_every_depth() -> None:
    body = orjson.dumps(
        {
            "type": "payment_intent.succeeded",
            "data": {
                "object": {
                    "client_secret": "pi_1_secret_2",
                    "amount": 1200,
                    "charges": [{"card": {"last4": "4242"}, "privateKey": "pk"}],
                    "metadata": {"monkey": "banana", "x-api-key": "abc"},
                }
            },
        }
    )
    shown = orjson.loads(show_body(body) or "")
    obj = shown["data"]["object"]
    assert obj["client_secret"] == MASK
    assert obj["amount"] == 1200
    assert obj["charges"] == [{"card": MASK, "privateKey": MASK}]
    assert obj["metadata"] == {"monkey": "banana", "x-api-key": MASK}


def test_an_error_is_masked_before_it_is_cut() -> None:
    text = "x" * 110 + " card 4111 1111 1111 1111 declined\nsecond line"
    line = error_line(text)
    assert "4111" not in line
    assert "1111" not in line
    assert "second line" not in line
    assert error_line(None) == ""
    assert "second line" in error_line(text, None)
