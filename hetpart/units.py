"""Sizes as hetpart prints them, one formula for every message, table and report (no torch)."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Bytes in binary units to three significant figures: "8.15 MiB", "13 MiB", "736 MiB", "140 GiB", "300 B"
    (a unit's thousands with separators: "1,234 TiB")."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:.3g} {unit}"
    return f"{n:,.0f} B"


def format_us(ns: float | None) -> str:
    """Nanoseconds as microseconds to a tenth, with separators: "1,234.5 us"; None (no time: no plan) as "no plan
    fits"."""
    return "no plan fits" if ns is None else f"{ns / 1000:,.1f} us"


def format_rate(per_s: float | None) -> str:
    """A rate (samples per second) as the plan tables print it: whole with separators from 100 up ("14,898"), three
    significant figures below ("2.87", "0.602"; review22: "{:,.0f}" printed a Llama-7B plan's 0.602 as "1")."""
    value = per_s or 0.0
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
