"""A 5-field cron matcher (minute hour day-of-month month day-of-week) for refit schedules.

No cron library is installed in the project's environment, and refits need only matching a minute, so this is
the small subset: `*`, `N`, `A-B`, `*/S`, `A-B/S` and comma lists; day-of-week 0-7 with 0 and 7 Sunday. As in
Vixie cron, when both day fields are restricted a day matches if either does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
NAMES = ("minute", "hour", "day of month", "month", "day of week")


@dataclass(frozen=True)
class Cron:
    fields: tuple[frozenset[int], ...]
    restricted: tuple[bool, ...]

    def matches(self, t: datetime) -> bool:
        minute, hour, dom, month, dow = self.fields
        weekday = (t.weekday() + 1) % 7  # cron: Sunday = 0
        day_ok = (t.day in dom or weekday in dow) if self.restricted[2] and self.restricted[4] else \
            (t.day in dom and weekday in dow)
        return t.minute in minute and t.hour in hour and t.month in month and day_ok


def _field(text: str, lo: int, hi: int, name: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        rng, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if rng == "*":
                a, b = lo, hi
            elif "-" in rng:
                a, b = (int(x) for x in rng.split("-", 1))
            else:
                a = b = int(rng)
        except ValueError:
            raise ValueError(f"cron {name} field {text!r}: use *, N, A-B, */S or lists of them") from None
        if not (lo <= a <= b <= hi) or step < 1:
            raise ValueError(f"cron {name} field {text!r}: values must lie in {lo}-{hi}, steps >= 1")
        out.update(range(a, b + 1, step))
    return frozenset(out)


def parse_cron(expr: str) -> Cron:
    """Parse a 5-field expression; ValueError says which field is wrong."""
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError(f"cron {expr!r}: needs 5 fields (minute hour day month weekday), got {len(parts)}")
    fields = [_field(p, lo, hi, n) for p, (lo, hi), n in zip(parts, RANGES, NAMES, strict=True)]
    fields[4] = frozenset(d % 7 for d in fields[4])
    return Cron(tuple(fields), tuple(p != "*" for p in parts))
