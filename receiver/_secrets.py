"""What is a secret, by its name or by its look, and masking it in text.

One rule for every place that shows or keeps what a sender, a client or a handler handed over:
the console's payloads (a field's value is masked when its name says it is a secret), the errors
stored as ``last_error`` and an attempt's error, and the logs (a ``name=value`` or
``name: value`` pair in free text is masked by the same name rule, and so are URL passwords and
strings that look like credentials or card numbers wherever they appear).

A name is split into words (``x-api-key``, ``xApiKey`` and ``X_API.KEY`` are ``x api key``) and
matched word by word, never by substring: ``pass`` masks ``pass`` and ``user_pass`` but not
``passenger`` or ``compass``; ``key`` masks ``api_key`` but not ``monkey``.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable

MASK = "•••"

#: Words that make a field's value secret, wherever they stand in its name: ``token``,
#: ``access_token``, ``accessToken`` and ``X-Auth-Token`` alike. Matched as whole words after
#: the name is split (see :func:`words`), so ``key`` masks ``api_key``, ``privateKey`` and
#: ``x-api-key`` but not ``monkey`` or ``keyboard``.
SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pw",
        "pass",
        "passphrase",
        "passcode",
        "secret",
        "token",
        "auth",
        "authorization",
        "credential",
        "key",
        "apikey",
        "signature",
        "cookie",
        "session",
        "jwt",
        "card",
        "cvc",
        "cvv",
        "csc",
        "cvn",
        "pan",
        "iban",
        "ssn",
        "pin",
        "otp",
        "totp",
    }
)

#: Words that end a compound written without a separator (``accesstoken``, ``clientsecret``,
#: ``newpassword``): long enough that no ordinary word ends with them by chance, unlike
#: ``key`` (monkey), ``pin`` (spin) or ``pass`` (compass), which are matched as whole words only.
SECRET_ENDINGS = ("password", "passwd", "secret", "token", "apikey", "signature", "credential")

#: Names of two words, neither a secret alone: a card's ``securityCode`` (the CVV by another
#: name), a login's ``verification_code``. Also matched written as one word (``securitycode``).
SECRET_PHRASES = frozenset(
    {
        ("security", "code"),
        ("verification", "code"),
        ("recovery", "code"),
        ("backup", "code"),
        ("access", "code"),
        ("security", "answer"),
    }
)

#: Compounds of ``key`` written as one word, and the phrases above written as one.
SECRET_COMPOUNDS = frozenset(
    {"accesskey", "privatekey", "secretkey", "signingkey", "sessionkey", "encryptionkey"}
    | {"".join(phrase) for phrase in SECRET_PHRASES}
)

#: A last word that says the field describes a secret without holding it: ``key_id``,
#: ``token_type``, ``keys_url``, ``password_changed_at``, ``card_brand``, ``KeyError``: such a
#: field is shown.
ABOUT_WORDS = frozenset(
    {
        "id",
        "url",
        "uri",
        "href",
        "type",
        "name",
        "count",
        "length",
        "hint",
        "at",
        "expires",
        "expiry",
        "expiration",
        "brand",
        "present",
        "enabled",
        "required",
        "error",
    }
)

# Where a field name splits into words: camelCase and acronyms (``customerSSN``,
# ``APIKey``), letters and digits (``cvv2``), and any run of other characters (``_ - . ``).
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

# Credentials by their look: Standard Webhooks and Stripe-like secrets, bearer tokens, JWTs,
# and 13-19 digit runs (card numbers, with spaces or dashes between groups).
_LOOKS_SECRET = re.compile(
    r"(?:whsec_|whsk_|whpk_|sk_live_|sk_test_|rk_live_|rk_test_|xox[abpr]-|ghp_|gho_|github_pat_)"
    r"[A-Za-z0-9_\-+/=]+"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=\-]+"
    r"|eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+"
    r"|\b(?:\d[ -]?){12,18}\d\b"
)

# The password of a URL's userinfo: scheme://user:PASSWORD@host.
_USERINFO = re.compile(r"(?<=://)([^\s/:@]*):[^\s/@]*@")

# The name of a pair in free text (``password=``, ``"apiKey": ``, ``X-Api-Key:``): an identifier
# not inside a longer one, perhaps closing a quote, then ``=`` or ``:``.
_PAIR_NAME = re.compile(r"(?<![\w.\-])([A-Za-z][\w.\-]*)([\"']?)[ \t]*[:=][ \t]*")
# The value after it: a quoted string (to its closing quote, or the end of the text), or a run
# to the next space or delimiter, with an HTTP auth scheme before it (``Basic dXNl...``).
_PAIR_VALUE = re.compile(
    r""""(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?"""
    r"""|(?i:(?:basic|bearer|digest|token)[ \t]+)?[^\s,;&'"()\[\]{}<>]+"""
)


def words(name: str) -> list[str]:
    """A field name's words, lower-cased: ``x-api-key`` and ``xApiKey`` both give
    ``["x", "api", "key"]``, ``customerSSN`` gives ``["customer", "ssn"]``."""
    return [w.lower() for w in _WORD.findall(name)]


def _singular(word: str) -> str:
    # Plurals by their "s" only: keys, tokens, passwords, cards, urls, ids.
    return word[:-1] if len(word) > 2 and word.endswith("s") else word


def _secret_word(word: str) -> bool:
    return any(
        w in SECRET_WORDS or w in SECRET_COMPOUNDS or any(w.endswith(e) for e in SECRET_ENDINGS)
        for w in {word, _singular(word)}
    )


def _secret_phrase(found: list[str]) -> bool:
    return any(
        (first, second) in SECRET_PHRASES or (first, _singular(second)) in SECRET_PHRASES
        for first, second in itertools.pairwise(found)
    )


def secret_field(name: str, extra: Iterable[str] = ()) -> bool:
    """True when a field's value must not be shown: a word of its name is a secret word, or
    two words in a row are a secret phrase (unless its last word says it only describes one:
    ``token_type``, but not a session's id), or the words of one of ``extra`` (the operator's
    own names, matched without that exception) appear in it in a row."""
    found = words(name)
    for marker in extra:
        wanted = words(marker)
        if wanted and any(
            found[i : i + len(wanted)] == wanted for i in range(len(found) - len(wanted) + 1)
        ):
            return True
    if not any(_secret_word(w) for w in found) and not _secret_phrase(found):
        return False
    if "session" in found:  # a session's id is the session itself
        return True
    named = [w for w in found if not w.isdigit()]
    about = len(named) > 1 and bool({named[-1], _singular(named[-1])} & ABOUT_WORDS)
    return not about


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    # Text repeats its names (a traceback, a query string): each is judged once.
    return secret_field(name)


def mask_text(text: str) -> str:
    """``text`` with every secret in it masked: the value of each ``name=value`` or
    ``name: value`` pair whose name is a secret's (:func:`secret_field`), a URL's password, and
    anything that looks like a credential or a card number."""
    if ":" not in text and "=" not in text:  # no pair, no URL: the common log line, fast
        return _LOOKS_SECRET.sub(MASK, text)
    text = _USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    out: list[str] = []
    at = 0
    while (pair := _PAIR_NAME.search(text, at)) is not None:
        value = _PAIR_VALUE.match(text, pair.end())
        if value is None or not _secret_name(pair.group(1)):
            out.append(text[at : pair.end()])
            at = pair.end()
            continue
        quote = value.group(0)[0] if value.group(0)[0] in "\"'" else ""
        out.append(f"{text[at : pair.end()]}{quote}{MASK}{quote}")
        at = value.end()
    out.append(text[at:])
    return _LOOKS_SECRET.sub(MASK, "".join(out))
