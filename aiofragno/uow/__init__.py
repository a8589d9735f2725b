"""The unit of work: a retrieval phase of reads, then a mutation phase that
applies every write in one transaction with optimistic-concurrency checks,
retried as a whole on conflict."""

from .bulk import ALL, BulkWrite
from .executor import UowHooks, execute_uow
from .expr import Col, Expr, c
from .ops import FindResult
from .retry import ExponentialBackoff, NoRetry, RetryPolicy
from .unit import UnitOfWork

__all__ = [
    "ALL",
    "BulkWrite",
    "Col",
    "ExponentialBackoff",
    "Expr",
    "FindResult",
    "NoRetry",
    "RetryPolicy",
    "UnitOfWork",
    "UowHooks",
    "c",
    "execute_uow",
]
