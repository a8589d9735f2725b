"""The unit of work: a retrieval phase of reads, then a mutation phase that
applies every write in one transaction with optimistic-concurrency checks,
retried as a whole on conflict."""

from .executor import UowHooks, execute_uow
from .expr import Col, Expr, c
from .joins import Many, One, many, one
from .ops import FindResult
from .retry import ExponentialBackoff, NoRetry, RetryPolicy
from .unit import UnitOfWork

__all__ = [
    "Col",
    "ExponentialBackoff",
    "Expr",
    "FindResult",
    "Many",
    "NoRetry",
    "One",
    "RetryPolicy",
    "UnitOfWork",
    "UowHooks",
    "c",
    "execute_uow",
    "many",
    "one",
]
