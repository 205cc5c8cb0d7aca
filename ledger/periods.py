"""Calendar periods in a budget's timezone, as aware UTC datetimes."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

LIFETIME_START = datetime(1970, 1, 1, tzinfo=UTC)


def period_bounds(*, period: str, tz: str, now: datetime) -> tuple[datetime, datetime | None]:
    """The [start, end) of the period containing `now`; end is None for lifetime."""
    if period == "lifetime":
        return LIFETIME_START, None
    zone = ZoneInfo(tz)
    local = now.astimezone(zone)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start = midnight
        end = _add_days(start, 1, zone)
    elif period == "week":  # ISO weeks: Monday to Monday
        start = _add_days(midnight, -midnight.weekday(), zone)
        end = _add_days(start, 7, zone)
    elif period == "month":
        start = midnight.replace(day=1)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    else:
        raise ValueError(f"unknown period {period!r}")
    return start.astimezone(UTC), end.astimezone(UTC)


def _add_days(local_midnight: datetime, days: int, zone: ZoneInfo) -> datetime:
    # Add calendar days in local time (a DST day is 23 or 25 hours), then re-attach the zone.
    naive = local_midnight.replace(tzinfo=None) + timedelta(days=days)
    return naive.replace(tzinfo=zone)
