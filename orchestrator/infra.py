"""Whose fault a failure is: the infrastructure's (Ray gone, a full disk, a locked or unreachable store), which a
later attempt on a healed cluster gets past, or the segment's own (a bad value), which no retry mends.

The scheduler and the sweep loop ask this before they spend anything: an infrastructure failure never counts as one
of a segment's attempts and never marks a sweep failed or cancelled; the work waits, backed off, and resumes once
the cluster is back. A deterministic failure is recorded once and not retried. Anything else (a worker that crashed,
an injected fault) is transient and retried within the store's attempts.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import ray.exceptions
from sqlalchemy.exc import InterfaceError, OperationalError

# Errors of the machine, not of the work: no space, no quota, a read-only or failing disk.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
RAY_DOWN = (ray.exceptions.RaySystemError, ray.exceptions.LocalRayletDiedError, ray.exceptions.NodeDiedError,
            ray.exceptions.GetTimeoutError, ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError,
            ray.exceptions.RpcError)
# An OperationalError is the store failing only with one of these (SQLite's and PostgreSQL's wording); others, e.g.
# two workers creating Optuna's tables at once ("table trials already exists"), are the work's own.
STORE_DOWN = ("database is locked", "database or disk is full", "disk i/o error", "unable to open database",
              "readonly database", "no space left", "could not connect", "connection refused", "server closed",
              "terminating connection", "connection reset", "could not receive data", "the database system is")
# A bad value in the spec or a checkpoint: the same attempt fails the same way (WorkerError and StorageError are
# ValueErrors).
DETERMINISTIC = (ValueError, TypeError)


class InfrastructureError(RuntimeError):
    """The cluster, disk or store failed under sound work; the message says what, and the work resumes by itself."""


class ClusterUnavailable(InfrastructureError):
    """No Ray cluster to run segments on right now (HTTP 503): a submission cannot be checked against it."""


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e``, the worker exception a RayTaskError carries, and their causes and contexts, each once."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [getattr(x, "cause", None), x.__cause__, x.__context__]


def is_infrastructure(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) is Ray, the disk or the store failing rather than the work."""
    for x in _chain(e):
        if isinstance(x, (InfrastructureError, *RAY_DOWN, InterfaceError)):
            return True
        if isinstance(x, OperationalError) and any(m in str(x).lower() for m in STORE_DOWN):
            return True
        if isinstance(x, OSError) and x.errno in DISK_ERRNOS:
            return True
    return False


def node_lost(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) says the Ray node a task ran on died. On a cluster whose other nodes still
    answer, that is one machine gone, not Ray: the task goes back to the queue for the others."""
    return any(isinstance(x, ray.exceptions.NodeDiedError) for x in _chain(e))


def is_deterministic(e: BaseException) -> bool:
    """Whether the worker's exception is a bad value (WorkerError, StorageError, a ValueError or TypeError from the
    spec or a checkpoint) that the same attempt would raise again."""
    cause = getattr(e, "cause", None) or e
    return isinstance(cause, DETERMINISTIC) and not is_infrastructure(e)
