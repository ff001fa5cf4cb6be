"""Refit schedules' cron expressions, read by cronsim: five fields (minute hour day month weekday), one minute apart.

A cron schedule fires in each minute its expression names; `refits.claim_minute` makes that once across refit
loops. cronsim also reads a sixth (seconds) field, which a minute-by-minute loop cannot honour, so it is refused.
"""

from __future__ import annotations

from datetime import datetime, timedelta

FIELDS = "minute hour day month weekday"


def check_cron(expr: str) -> None:
    """A ValueError (the API answers 422 with the field path) saying what is wrong with ``expr``, if anything."""
    from cronsim import CronSim, CronSimError  # the worker extra: a light install plans, and imports the schemas

    if len(expr.split()) != 5:
        raise ValueError(f"cron {expr!r}: needs 5 fields ({FIELDS}), got {len(expr.split())}")
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as e:
        raise ValueError(f"cron {expr!r}: {e} ({FIELDS})") from None


def fires_at(expr: str, minute: datetime) -> bool:
    """Whether ``expr`` names ``minute`` (a datetime whose seconds are zero): its next time after the minute
    before is this one."""
    from cronsim import CronSim

    return next(CronSim(expr, minute - timedelta(minutes=1))) == minute
