"""Which JSON field names the console masks: names split into words (camelCase, acronyms,
``_``, ``-``, ``.``) and matched word by word, over real field names from providers' payloads,
both the ones that must be masked and the ones that must stay readable; and the same rule over
``name=value`` and ``name: value`` pairs in free text (errors, log lines), with URL passwords."""

from __future__ import annotations

import orjson
import pytest

from receiver._console.redaction import error_line, show_body
from receiver._ops.redact import describe
from receiver._secrets import MASK, mask_text, secret_field, words

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
    # the short and the other names of a password, a card's code, a one-time code
    "pw",
    "pwd",
    "passwd",
    "pass",
    "user_pass",
    "PASS",
    "userPw",
    "passphrase",
    "securityCode",
    "security_code",
    "security-code",
    "SecurityCode",
    "securitycode",
    "cardSecurityCode",
    "verificationCode",
    "recovery_codes",
    "csc",
    "cvn",
    "cvv",
    "totp",
    "otp_code",
    "api_key",
    "apiKey",
    "Authorization",
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
    # ordinary words that contain pass, pw or code
    "passenger",
    "passengers",
    "compass",
    "bypass",
    "passage",
    "passport",
    "password_hint",
    "pass_count",
    "zip_code",
    "country_code",
    "code",
    "security",
    "security_level",
    "postal_code",
    # an exception's name describes, it does not hold
    "KeyError",
    "TokenError",
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


#: Free text as exception messages and log lines carry secrets, and what must be left of it.
TEXT_PAIRS = [
    ("login failed: password=hunter2", "login failed: password=•••"),
    ("password: hunter2 (retry)", "password: ••• (retry)"),
    ("password = hunter2", "password = •••"),
    ("pw=opensesame pass=letmein pwd=x", "pw=••• pass=••• pwd=•••"),
    ("{'password': 'hunter2', 'user': 'bob'}", "{'password': '•••', 'user': 'bob'}"),
    ('{"securityCode": "737", "cvv": 123}', '{"securityCode": "•••", "cvv": •••}'),
    ("card cvc: 737, pin=1234, otp: 999999", "card cvc: •••, pin=•••, otp: •••"),
    ("GET /v1?api_key=AIza-9&page=2", "GET /v1?api_key=•••&page=2"),
    ("X-Api-Key: k-1; apiKey=k-2", "X-Api-Key: •••; apiKey=•••"),
    ("client_secret=cs_1 access-token: at.1", "client_secret=••• access-token: •••"),
    ("Authorization: Basic dXNlcjpwYXNz done", "Authorization: ••• done"),
    ("Cookie: session=abc; theme=dark", "Cookie: •••; theme=dark"),
    ("postgresql://app:s3cret@db:5432/app down", "postgresql://app:•••@db:5432/app down"),
    ("https://user:p%40ss@host/x", "https://user:•••@host/x"),
    ("secret='it''s'", "secret='•••''s'"),
    # left alone: names that are not a secret's, prose, identifiers
    ("passenger=Ann compass=north turn: 3", "passenger=Ann compass=north turn: 3"),
    ("KeyError: 'order' at key_id=k1", "KeyError: 'order' at key_id=k1"),
    ("https://bank.example/pay?order=o-1", "https://bank.example/pay?order=o-1"),
    ("the password was wrong", "the password was wrong"),
    ("zip_code=12345 country_code: DE", "zip_code=12345 country_code: DE"),
]


@pytest.mark.parametrize(("text", "masked"), TEXT_PAIRS)
def test_a_pair_with_a_secrets_name_is_masked_in_text(text: str, masked: str) -> None:
    assert mask_text(text) == masked
    assert error_line(text) == masked


def test_a_stored_error_is_masked_by_the_same_rule() -> None:
    error = ValueError("login failed: password=hunter2 securityCode=737 passenger=Ann")
    assert (
        describe(error) == "ValueError: login failed: password=••• securityCode=••• passenger=Ann"
    )
    assert describe(RuntimeError("card 4111 1111 1111 1111")) == f"RuntimeError: card {MASK}"


def test_a_payloads_strings_are_masked_by_the_same_rule() -> None:
    body = orjson.dumps(
        {
            "pw": "x",
            "pass": "y",
            "securityCode": "737",
            "passenger": "Ann",
            "compass": "N",
            "note": "callback https://u:hunter2@hooks.example?token=t1",
        }
    )
    shown = orjson.loads(show_body(body) or "")
    assert shown == {
        "pw": MASK,
        "pass": MASK,
        "securityCode": MASK,
        "passenger": "Ann",
        "compass": "N",
        "note": f"callback https://u:{MASK}@hooks.example?token={MASK}",
    }
