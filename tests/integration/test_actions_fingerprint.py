"""The action fingerprint, by property: what a model may reword never changes it, what decides
the effect always does (no store needed: the fingerprint is computed before the claim)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import Actions, SQLiteStore

VOLATILE = ("explanation", "meta.generated_at")

scalars = st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.text(max_size=8).map(str.strip))
requests = st.dictionaries(
    st.text(alphabet="abcdefghij", min_size=1, max_size=6).filter(
        lambda k: k not in ("explanation", "meta")
    ),
    scalars,
    min_size=1,
    max_size=6,
)


def executor() -> Actions:
    actions = Actions(SQLiteStore(":memory:"), metrics=False)

    async def refund(call: Any, tx: Any) -> Any:
        return None

    actions.add_tool("refund", refund, volatile=VOLATILE)
    return actions


ACTIONS = executor()


def shuffled(d: dict[str, Any], seed: int) -> dict[str, Any]:
    items = list(d.items())
    random.Random(seed).shuffle(items)
    return dict(items)


def padded(value: Any) -> Any:
    return f"  {value}\t" if isinstance(value, str) else value


def fingerprint(request: dict[str, Any]) -> bytes:
    return ACTIONS.propose("refund", scope="t", action_id="a-1", request=request).fingerprint


@settings(max_examples=60)
@given(request=requests, seed=st.integers(0, 1000), prose=st.text(), at=st.text())
def test_order_whitespace_and_volatile_fields_do_not_change_it(
    request: dict[str, Any], seed: int, prose: str, at: str
) -> None:
    reworded = shuffled({k: padded(v) for k, v in request.items()}, seed)
    reworded["explanation"] = prose
    reworded["meta"] = {"generated_at": at}
    base = dict(request, meta={"generated_at": "2026-01-01"})
    assert fingerprint(reworded) == fingerprint(base)


@settings(max_examples=60)
@given(request=requests, data=st.data())
def test_an_effect_determining_change_always_changes_it(
    request: dict[str, Any], data: st.DataObject
) -> None:
    field = data.draw(st.sampled_from(sorted(request)))
    other = data.draw(scalars.filter(lambda v: v != request[field]))
    changed = dict(request, **{field: other})
    assert fingerprint(changed) != fingerprint(request)


def test_the_key_ignores_the_request() -> None:
    a = ACTIONS.propose("refund", scope="t", action_id="a-1", request={"amount": 1})
    b = ACTIONS.propose("refund", scope="t", action_id="a-1", request={"amount": 2})
    assert a.key == b.key == "t:refund:a-1:v1"
    assert a.fingerprint != b.fingerprint
