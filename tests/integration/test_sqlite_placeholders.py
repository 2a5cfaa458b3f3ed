"""Handlers write PostgreSQL's ``$N`` placeholders on every store; SQLite gets them as ``?N``,
but only where PostgreSQL would see a placeholder: never inside a string literal, a quoted
identifier or a comment. Checked against PostgreSQL itself."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from receiver import PostgresStore, SQLiteStore

# Text made of what the translation must get right: dollars, digits, both quotes, comment marks.
TRICKY = st.text(st.sampled_from(list("$12 9'\"-/*\n[]`ab")), max_size=30)


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def identifier(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=TRICKY, name=TRICKY.filter(lambda s: 0 < len(s.encode()) < 60), value=TRICKY)
@example(text="price: $2 off", name="a $1", value="x")
@example(text="it''s $1 -- $2 /* $3", name="$2", value="$1")
async def test_placeholders_in_literals_identifiers_and_comments_match_postgresql(
    pg_store: PostgresStore, sqlite_store: SQLiteStore, text: str, name: str, value: str
) -> None:
    # (PostgreSQL nests block comments and SQLite does not: keep their marks out of the comment.)
    block = text.replace("*", "")
    query = (
        f"SELECT {literal(text)} AS lit, $1 AS {identifier(name)} -- {text.replace(chr(10), ' ')}\n"
        f", /* {block} */ $2 AS second"
    )
    answers = []
    for store in (pg_store, sqlite_store):
        async with store.acquire() as conn:
            answers.append(await conn.fetch(query, value, "two"))
    postgres, sqlite = answers
    assert [dict(r) for r in sqlite] == [dict(r) for r in postgres]
    assert dict(postgres[0]) == {"lit": text, name: value, "second": "two"}


async def test_a_literal_keeps_its_dollar_through_a_write(sqlite_store: SQLiteStore) -> None:
    async with sqlite_store.acquire() as conn:
        await conn.execute("CREATE TABLE notes (id INTEGER, note TEXT)")
        await conn.execute("INSERT INTO notes VALUES ($1, 'price: $2 off')", 7)
        assert await conn.fetchval("SELECT note FROM notes WHERE id = $1", 7) == "price: $2 off"
