"""Java ``SimpleDateFormat`` fields for name patterns: format a run of letters, or match its output.

A run is one letter repeated ``count`` times (``yyyy``, ``MM``, ``d``).  Output follows Java 17's
``SimpleDateFormat`` in the ``en_US`` locale (checked against it for the zones and dates in the
tests), whatever the machine's locale:

* numbers are zero-padded to ``count`` digits (``y`` with ``count == 2`` keeps the last two);
* ``M`` with 3 letters gives ``Jul``, with 4 or more ``July``; ``E`` below 4 gives ``Tue``, else
  ``Tuesday``; ``G`` is ``AD``; ``a`` is ``AM``/``PM``;
* weeks (``w``, ``W``) start on Sunday and the first week of a year or month is the one holding
  its first day (Java's US rules), so 31 December can be in week 1;
* ``Z`` is ``+hhmm``; ``z`` is the zone's abbreviation from zoneinfo (``UTC``, ``CET``, ``PDT``), or
  ``GMT+hh:mm`` when zoneinfo has only a numeric one (``+04``); ``zzzz`` is the long name for the
  common zones in :data:`LONG_ZONE_NAMES`, else ``GMT+hh:mm``.  Java knows more long names and
  a few abbreviations zoneinfo lacks (it says ``GST`` for Asia/Dubai): those are where the two
  differ.

Not guaranteed: years before 1000 or after 9999 (``datetime`` cannot hold the latter anyway).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

LETTERS = "GyMdhHmsSEDFwWakKzZ"

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

#: (abbreviation, UTC offset in minutes) -> Java's long name.  Keyed on the offset too because
#: abbreviations are ambiguous (IST is India, Ireland and Israel).
LONG_ZONE_NAMES: dict[tuple[str, int], str] = {
    ("UTC", 0): "Coordinated Universal Time",
    ("GMT", 0): "Greenwich Mean Time",
    ("BST", 60): "British Summer Time",
    ("IST", 60): "Irish Standard Time",
    ("WET", 0): "Western European Standard Time",
    ("WEST", 60): "Western European Summer Time",
    ("CET", 60): "Central European Standard Time",
    ("CEST", 120): "Central European Summer Time",
    ("EET", 120): "Eastern European Standard Time",
    ("EEST", 180): "Eastern European Summer Time",
    ("MSK", 180): "Moscow Standard Time",
    ("IST", 330): "India Standard Time",
    ("CST", 480): "China Standard Time",
    ("HKT", 480): "Hong Kong Standard Time",
    ("JST", 540): "Japan Standard Time",
    ("KST", 540): "Korean Standard Time",
    ("AEST", 600): "Australian Eastern Standard Time",
    ("AEDT", 660): "Australian Eastern Daylight Time",
    ("NZST", 720): "New Zealand Standard Time",
    ("NZDT", 780): "New Zealand Daylight Time",
    ("EST", -300): "Eastern Standard Time",
    ("EDT", -240): "Eastern Daylight Time",
    ("CST", -360): "Central Standard Time",
    ("CDT", -300): "Central Daylight Time",
    ("MST", -420): "Mountain Standard Time",
    ("MDT", -360): "Mountain Daylight Time",
    ("PST", -480): "Pacific Standard Time",
    ("PDT", -420): "Pacific Daylight Time",
    ("AKST", -540): "Alaska Standard Time",
    ("AKDT", -480): "Alaska Daylight Time",
    ("HST", -600): "Hawaii-Aleutian Standard Time",
}

#: letter -> the most digits its number can take (Java pads to ``count``, never truncates except yy)
_MAX_DIGITS = {"y": 4, "M": 2, "w": 2, "W": 1, "D": 3, "d": 2, "F": 1, "H": 2, "k": 2, "K": 2,
               "h": 2, "m": 2, "s": 2, "S": 3}


def _sunday_index(day: date) -> int:
    """0 for Sunday .. 6 for Saturday (Java's US week)."""
    return (day.weekday() + 1) % 7


def _week_of_year(day: date) -> int:
    # Java US rules: weeks start on Sunday and week 1 is the week holding 1 January, so the last
    # days of December belong to week 1 of the next year when that week holds the next 1 January.
    saturday = day + timedelta(days=6 - _sunday_index(day))
    if saturday.year > day.year:
        return 1
    jan1 = date(day.year, 1, 1)
    return (day.timetuple().tm_yday - 1 + _sunday_index(jan1)) // 7 + 1


def _week_of_month(day: date) -> int:
    first = day.replace(day=1)
    return (day.day - 1 + _sunday_index(first)) // 7 + 1


def _offset_minutes(dt: datetime) -> int:
    offset = dt.utcoffset()
    return 0 if offset is None else int(offset.total_seconds()) // 60


def _gmt_offset(minutes: int) -> str:
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return f"GMT{sign}{hours:02d}:{mins:02d}"


def _zone_name(dt: datetime, long: bool) -> str:
    minutes = _offset_minutes(dt)
    abbr = dt.tzname() or "UTC"
    if abbr[:1] in "+-" or abbr[:1].isdigit():
        return _gmt_offset(minutes)
    if not long:
        return abbr
    return LONG_ZONE_NAMES.get((abbr, minutes), _gmt_offset(minutes))


def _number(letter: str, dt: datetime) -> int:
    hour = dt.hour
    values = {
        "y": dt.year, "M": dt.month, "d": dt.day, "H": hour, "m": dt.minute, "s": dt.second,
        "S": dt.microsecond // 1000, "D": dt.timetuple().tm_yday, "F": (dt.day - 1) // 7 + 1,
        "k": hour or 24, "K": hour % 12, "h": hour % 12 or 12,
    }
    if letter == "w":
        return _week_of_year(dt.date())
    if letter == "W":
        return _week_of_month(dt.date())
    return values[letter]


def format_field(letter: str, count: int, dt: datetime) -> str:
    """``letter`` repeated ``count`` times, formatted for ``dt`` (already in the wanted zone)."""
    if letter == "G":
        return "AD"
    if letter == "a":
        return "AM" if dt.hour < 12 else "PM"
    if letter == "E":
        name = DAYS[dt.weekday()]
        return name if count >= 4 else name[:3]
    if letter == "M" and count >= 3:
        name = MONTHS[dt.month - 1]
        return name if count >= 4 else name[:3]
    if letter == "z":
        return _zone_name(dt, long=count >= 4)
    if letter == "Z":
        minutes = _offset_minutes(dt)
        hours, mins = divmod(abs(minutes), 60)
        return f"{'-' if minutes < 0 else '+'}{hours:02d}{mins:02d}"
    value = _number(letter, dt)
    if letter == "y" and count == 2:
        return f"{value % 100:02d}"
    return f"{value:0{count}d}"


def _alternatives(names: tuple[str, ...] | list[str]) -> str:
    return "(?:" + "|".join(names) + ")"


def field_regex(letter: str, count: int) -> str:
    """A regular expression (no groups) matching every text ``format_field(letter, count, ...)`` gives."""
    if letter == "G":
        return "(?:AD|BC)"
    if letter == "a":
        return "(?:AM|PM)"
    if letter == "E":
        return _alternatives([d if count >= 4 else d[:3] for d in DAYS])
    if letter == "M" and count >= 3:
        return _alternatives([m if count >= 4 else m[:3] for m in MONTHS])
    if letter == "z":
        word = "[A-Z][A-Za-z]*"
        name = f"{word}(?:[ -]{word})*" if count >= 4 else word
        return f"(?:GMT[+-][0-9]{{2}}:[0-9]{{2}}|{name})"
    if letter == "Z":
        return "[+-][0-9]{4}"
    if letter == "y" and count == 2:
        return "[0-9]{2}"
    most = max(count, _MAX_DIGITS[letter])
    return f"[0-9]{{{count}}}" if most == count else f"[0-9]{{{count},{most}}}"


def is_fixed_width(letter: str, count: int) -> bool:
    """True when every output of the run has the same length (so it can sit next to digits)."""
    if letter in "GaZ":
        return True
    if letter in "Ez" or (letter == "M" and count >= 3):
        return False
    if letter == "y" and count == 2:
        return True
    return count >= _MAX_DIGITS[letter]
