"""A number the planner uses, with how it was obtained: measured, looked up or assumed.

Every input of the capacity and step-time models is a Figure, so that the
report can say, next to each printed value, where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass

HOW = ("measured", "looked up", "assumed", "given")  # "given": on the command line


@dataclass(frozen=True)
class Figure:
    """One input value.

    Parameters
    ----------
    value : float
    unit : str
        e.g. "GB/s" (decimal: 1e9 bytes per second), "GiB", "us".
    how : str
        One of HOW.
    source : str
        Where it comes from: a datasheet, a file, a measurement, a reason.
    """

    value: float
    unit: str
    how: str
    source: str

    def __post_init__(self):
        if self.how not in HOW:
            raise ValueError(f"how must be one of {HOW}, got {self.how!r}")

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.value:g}{unit} ({self.how}: {self.source})"

    def as_dict(self) -> dict:
        return {"value": self.value, "unit": self.unit, "how": self.how, "source": self.source}
