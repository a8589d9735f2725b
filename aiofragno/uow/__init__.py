"""The unit of work: a retrieval phase of reads, then a mutation phase that
applies every write in one transaction with optimistic-concurrency checks,
retried as a whole on conflict."""

from .aggregates import Aggregate, AggregateFn, fn
from .bulk import ALL, BulkWrite
from .executor import UowHooks, execute_uow
from .expr import Col, Expr, c
from .joins import Many, One, many, one
from .ops import Find, FindFirst, FindResult
from .retry import ExponentialBackoff, NoRetry, RetryPolicy
from .unit import UnitOfWork
from .upsert import Upserted

__all__ = [
    "ALL",
    "Aggregate",
    "AggregateFn",
    "BulkWrite",
    "Col",
    "ExponentialBackoff",
    "Expr",
    "Find",
    "FindFirst",
    "FindResult",
    "Many",
    "NoRetry",
    "One",
    "RetryPolicy",
    "UnitOfWork",
    "UowHooks",
    "Upserted",
    "c",
    "execute_uow",
    "fn",
    "many",
    "one",
]
