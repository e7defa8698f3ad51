"""Chart data of training curves for ``static/js/charts.js`` (uPlot): a job's metric series over
training steps, and evaluation curves (ROC, calibration), one or several overlaid. uPlot wants
aligned columns, so overlaid curves share one x axis with nulls where a curve has no point."""

from __future__ import annotations

from typing import Any

REFERENCE_COLOUR = "#9ca3af"


def step_chart(points: list[list[float]], *, label: str, colour: str, units: str = "") -> dict:
    """One metric's [[step, value], ...] as chart data (empty while the job has none)."""
    if not points:
        return {"x": [], "series": []}
    return {
        "x": [p[0] for p in points],
        "series": [
            {"label": label, "values": [p[1] for p in points], "color": colour, "units": units}
        ],
    }


def _step_curve(points: list[list[float]]) -> dict[float, float]:
    """x -> y with one y per x (the highest: a ROC's vertical run keeps its top)."""
    out: dict[float, float] = {}
    for x, y in points:
        out[float(x)] = max(float(y), out.get(float(x), float("-inf")))
    return out


def overlay(curves: list[tuple[str, list[list[float]], str]], *, reference: str, kind: str):
    """Several (label, [[x, y]], colour) curves on one x axis (uPlot needs aligned columns:
    a curve has null where it has no point) plus the y = x reference line."""
    mapped = [(label, _step_curve(points), colour) for label, points, colour in curves if points]
    if not mapped:
        return {"x": [], "series": []}
    xs = sorted({x for _, curve, _ in mapped for x in curve} | {0.0})
    top = max(xs[-1], max(y for _, curve, _ in mapped for y in curve.values()))
    xs = sorted(set(xs) | {1.0 if kind == "roc" else top})
    drawn = "line" if kind == "roc" else "points"
    series = [
        {"label": label, "values": [curve.get(x) for x in xs], "color": colour, "kind": drawn}
        for label, curve, colour in mapped
    ]
    series.append(
        {
            "label": reference,
            "values": list(xs),
            "color": REFERENCE_COLOUR,
            "dash": [5, 4],
            "kind": "edge",
        }
    )
    return {"x": xs, "series": series}


def roc_chart(curves: list[tuple[str, list[list[float]], str]]) -> dict[str, Any]:
    return overlay(curves, reference="Random (AUC 0.5)", kind="roc")


def calibration_chart(curves: list[tuple[str, list[dict], str]]) -> dict[str, Any]:
    return overlay(
        [(label, [[b["predicted"], b["observed"]] for b in bins], c) for label, bins, c in curves],
        reference="Perfectly calibrated",
        kind="calibration",
    )


def epoch_overlay(curves: list[tuple[str, list[list[float]]]], *, units: str = "") -> dict:
    """Several (label, [[epoch, value], ...]) curves on one epoch axis (a tuning job's trials'
    validation curves): a curve has null at an epoch it did not reach (a pruned trial)."""
    drawn = [(label, {float(x): float(y) for x, y in points}) for label, points in curves if points]
    if not drawn:
        return {"x": [], "series": []}
    xs = sorted({x for _, curve in drawn for x in curve})
    return {
        "x": xs,
        "series": [
            {"label": label, "values": [curve.get(x) for x in xs], "units": units}
            for label, curve in drawn
        ],
    }
