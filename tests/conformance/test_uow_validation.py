"""What the unit of work refuses before anything reaches the database
(unknown tables and columns, wrong types, hidden columns, checks without a
version, results read before ``retrieve()``), and that a refused or failed
unit writes nothing and is not retried.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import aiofragno as af
from tests.conformance.uow_env import (
    Env,
    seed_accounts,
)

pytestmark = pytest.mark.anyio


async def _c_create_unknown_table(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("nope", {"owner": "x"})


async def _c_find_unknown_table(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("nope")


async def _c_create_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "colour": "red"})


async def _c_update_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"colour": "red"})


async def _c_where_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where={"colour": "red"})
    await uow.retrieve()


async def _c_expr_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.count("accounts", where=af.c.colour == "red")
    await uow.retrieve()


async def _c_order_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", order_by=("colour", "asc"))


async def _c_create_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "balance": "ten"})


async def _c_update_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"owner": 5})


async def _c_where_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c.balance == "ten")
    await uow.retrieve()


async def _c_in_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c.balance.in_([1, "two"]))
    await uow.retrieve()


async def _c_reference_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("transfers", {"src": 12, "dst": ids["bob"], "amount": 1})


async def _c_bool_for_bigint(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"balance": True})


async def _c_missing_required(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"balance": 3})


async def _c_misspelled_required(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"ownr": "x"})  # the typo is the error, not the missing owner


async def _c_column_name_not_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {5: 1})  # type: ignore[dict-item]


async def _c_set_not_null_to_none(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"owner": None})


async def _c_check_update_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", str(ids["alice"]), {"balance": 1}, check=True)


async def _c_check_update_without_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", af.RowId(str(ids["alice"])), {"balance": 1}, check=True)


async def _c_check_delete_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.delete("accounts", str(ids["alice"]), check=True)


async def _c_check_op_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.check("accounts", str(ids["alice"]))  # type: ignore[arg-type]


async def _c_create_writes_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "id": "mine"})


async def _c_update_writes_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"id": "mine"})


async def _c_create_writes_internal_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "_id": 12345})


async def _c_update_writes_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"_version": 0})


async def _c_update_writes_internal_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"_id": 1})


async def _c_where_on_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c._version == 0)
    await uow.retrieve()


async def _c_find_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    op = uow.find("accounts")
    op.result  # noqa: B018


async def _c_count_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    op = uow.count("accounts")
    op.result  # noqa: B018


async def _c_find_first_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    first = uow.find_first("accounts", where={"owner": "alice"})
    await uow.retrieve()
    later = uow.find_first("accounts", where={"owner": "bob"})
    assert first.result is not None
    later.result  # noqa: B018  (queued after the last retrieve())


VALIDATION_CASES: list[tuple[Callable[..., Awaitable[None]], str]] = [
    (_c_create_unknown_table, r"'nope'"),
    (_c_find_unknown_table, r"'nope'"),
    (_c_create_unknown_column, r"accounts.*colour"),
    (_c_update_unknown_column, r"accounts.*colour"),
    (_c_where_unknown_column, r"accounts.*colour"),
    (_c_expr_unknown_column, r"accounts.*colour"),
    (_c_order_unknown_column, r"accounts.*colour"),
    (_c_create_wrong_type, r"accounts\.balance"),
    (_c_update_wrong_type, r"accounts\.owner"),
    (_c_where_wrong_type, r"accounts\.balance"),
    (_c_in_wrong_type, r"accounts\.balance"),
    (_c_reference_wrong_type, r"transfers\.src"),
    (_c_bool_for_bigint, r"accounts\.balance"),
    (_c_missing_required, r"accounts\.owner"),
    (_c_misspelled_required, r"accounts.*ownr"),
    (_c_column_name_not_str, r"'accounts'.*column names are str"),
    (_c_set_not_null_to_none, r"accounts\.owner"),
    (_c_check_update_with_str, r"accounts.*version"),
    (_c_check_update_without_version, r"accounts.*version"),
    (_c_check_delete_with_str, r"accounts.*version"),
    (_c_check_op_with_str, r"accounts.*version"),
    (_c_create_writes_id, r"accounts\.id"),
    (_c_update_writes_id, r"accounts\.id"),
    (_c_create_writes_internal_id, r"'_id'.*'accounts'"),
    (_c_update_writes_version, r"'_version'.*'accounts'"),
    (_c_update_writes_internal_id, r"'_id'.*'accounts'"),
    (_c_where_on_version, r"'_version'.*'accounts'"),
    (_c_find_result_early, r"'accounts'.*retrieve\(\)"),
    (_c_count_result_early, r"'accounts'.*retrieve\(\)"),
    (_c_find_first_result_early, r"'accounts'.*retrieve\(\)"),
]


@pytest.mark.parametrize(
    ("case", "message"),
    VALIDATION_CASES,
    ids=[case.__name__.removeprefix("_c_") for case, _ in VALIDATION_CASES],
)
async def test_validation_error_writes_nothing(
    shop: Env, case: Callable[..., Awaitable[None]], message: str
) -> None:
    ids = await seed_accounts(shop, "alice", "bob")
    before = await shop.snapshot()
    statements: list[af.CompiledQuery] = []
    attempts = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal attempts
        attempts += 1
        # Valid writes first: none of them may reach the database.
        uow.create("accounts", {"owner": "carol"})
        uow.update("accounts", ids["bob"], {"balance": 1}, check=True)
        await case(uow, ids)

    with pytest.raises(af.ValidationError, match=message):
        await shop.run(unit, on_query=statements.append)
    assert attempts == 1  # a validation error is not retried
    assert not any(q.sql.lstrip().upper().startswith(("INSERT", "UPDATE")) for q in statements)
    assert await shop.snapshot() == before


async def test_unknown_isolation_level_is_a_validation_error(shop: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "x"})

    with pytest.raises(af.ValidationError, match="isolation"):
        await shop.run(unit, isolation="chaotic")  # type: ignore[arg-type]
    assert await shop.count("accounts") == 0


async def test_function_exception_writes_nothing(shop: Env) -> None:
    calls = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        uow.create("accounts", {"owner": "x"})
        raise LookupError("my own failure")

    with pytest.raises(LookupError, match="my own failure"):
        await shop.run(unit)
    assert calls == 1
    assert await shop.count("accounts") == 0
