"""Charts read as a person would read them, at several data sizes and label lengths: every
title and label fully inside the picture, no two texts on top of each other, long labels cut,
the "none" bar of the histogram at 0 in a panel of its own, no stray labels. Layout facts of
the drawn figures (text bounding boxes), not pixels."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from ctxprec.storage.report.charts import chart_figures, short_label
from ctxprec.storage.report.compare import chart_figure
from ctxprec.storage.report.summary import BANDS
from ctxprec.storage.report.trend import trend_figure

# (groups, label length, positions, scored rows, exact zeros, scale, nights)
CASES = {
    "small": (2, 3, 3, 12, 3, 1.0, 2),
    "long_labels": (5, 80, 10, 5_000, 400, 1.0, 9),
    "many": (20, 25, 40, 2_000_000, 150_000, 1.0, 60),
    "scale_10": (4, 12, 5, 300, 0, 10.0, 20),
}


def summary(groups: int, label: int, positions: int, rows: int, zero: int, scale: float) -> Any:
    rnd = random.Random(groups * 31 + label)
    by_group = []
    for i in range(groups):
        q = sorted(rnd.random() * scale for _ in range(5))
        name = (f"g{i}-" + "long_retriever_name_" * 5)[: max(label, 3)]
        by_group.append({"group": name, "rows": 1000 * (groups - i), "failed": 0,
                         "mean_score": sum(q) / 5, "median": q[2], "p10": q[0], "p25": q[1],
                         "p75": q[3], "p90": q[4]})  # fmt: skip
    column = "retriever_configuration_name_of_the_experiment" if label > 20 else "retriever"
    counts = [rnd.randint(0, max(1, rows // 20)) for _ in range(20)]
    return {
        "scale": scale,
        "rows": {"total": rows, "ok": rows - zero, "empty_context": zero, "failed": 0},
        "bands": [{"band": b, "lower": lo, "upper": hi} for b, lo, hi, *_ in BANDS],
        "score_histogram": {
            "edges": [scale * i / 20 for i in range(21)], "counts": counts, "zero": zero
        },
        "relevance_by_position": [
            {"position": p, "items": rows * 7, "relevant_rate": max(0.0, 0.8 - p * 0.02)}
            for p in range(1, positions + 1)
        ],
        "by_group": {"column": column, "groups": by_group, "groups_total": groups},
    }  # fmt: skip


def trend(nights: int) -> dict[str, Any]:
    rows = []
    for i in range(nights):
        mean = 0.5 + 0.05 * ((i % 5) - 2)
        night = f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}"
        moved = "up" if i % 7 == 3 else None
        rows.append({"night": night, "mean_score": mean, "ci95": [mean - 0.04, mean + 0.04],
                     "moved": moved})  # fmt: skip
    return {"column": "dt", "nights": rows}


def compare_report(case: tuple[Any, ...]) -> dict[str, Any]:
    s = summary(*case[:6])

    def delta(x: float) -> dict[str, Any]:
        return {"mean_delta": x, "ci95": [x - 0.03, x + 0.03]}

    metrics = ["reciprocal_rank", "precision_at_1", "hit_at_1", "ndcg_at_1", "ndcg_at_3"]
    groups = s["by_group"]["groups"]
    return {
        "n_pairs": case[3], **delta(0.02),
        "metrics": {m: delta(0.01 * j - 0.02) for j, m in enumerate(metrics)},
        "by_group": {"column": s["by_group"]["column"],
                     "groups": [{"group": g["group"], **delta(0.02 * k - 0.05)}
                                for k, g in enumerate(groups)]},
    }  # fmt: skip


def figures(case: tuple[Any, ...]) -> dict[str, Figure]:
    out: dict[str, Figure] = dict(chart_figures(summary(*case[:6])))
    out["trend.png"] = trend_figure(trend(case[6]))
    out["compare.png"] = chart_figure(compare_report(case))
    return out


def _axes_texts(ax: Axes) -> list[Text]:
    texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    texts += [*ax.texts, *_tick_labels(ax.xaxis), *_tick_labels(ax.yaxis)]
    if (legend := ax.get_legend()) is not None:
        texts += legend.get_texts()
    for child in ax.child_axes:
        texts += _axes_texts(child)
    return texts


def _tick_labels(axis: Any) -> list[Text]:
    """Labels of the ticks inside the axis' view (matplotlib keeps others around, not drawn)."""
    lo, hi = sorted(axis.get_view_interval())
    slack = (hi - lo) * 1e-9
    ticks = [t for t in axis.get_major_ticks() if lo - slack <= t.get_loc() <= hi + slack]
    return [label for t in ticks for label in (t.label1, t.label2)]


def drawn_texts(fig: Figure) -> list[tuple[str, Any]]:
    """(text, bounding box in pixels) of every visible, non-empty text, as drawn."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [*fig.texts, *(t for ax in fig.axes for t in _axes_texts(ax))]
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in dict.fromkeys(texts)
        if t.get_visible() and t.get_text().strip()
    ]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_text_is_inside_the_picture_and_none_overlap(case: tuple[Any, ...]) -> None:
    for name, fig in figures(case).items():
        boxes = drawn_texts(fig)
        assert boxes, name
        frame = fig.bbox
        for text, box in boxes:
            inside = box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1
            inside = inside and box.y0 >= frame.y0 - 1 and box.y1 <= frame.y1 + 1
            assert inside, f"{name}: {text!r} is cut ({box} outside {frame})"
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
            overlap = box_a.shrunk(0.98, 0.9).overlaps(box_b.shrunk(0.98, 0.9))
            assert not overlap, f"{name}: {a!r} and {b!r} overlap"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_long_labels_are_cut_and_no_stray_label(case: tuple[Any, ...]) -> None:
    for name, fig in figures(case).items():
        texts = [t for t, _ in drawn_texts(fig)]
        assert "metric" not in texts, name  # compare's left panel had a stray "metric" title
        assert all(len(t) <= 90 for line in texts for t in line.splitlines()), (name, texts)


def test_the_zeros_stand_at_0_in_a_panel_of_their_own() -> None:
    fig = chart_figures(summary(*CASES["long_labels"][:6]))["score_distribution.png"]
    zero_panel, histogram = fig.axes[:2]
    assert histogram.get_xlim()[0] == 0  # the histogram covers (0, scale] only
    assert all(bar.get_x() >= 0 for bar in histogram.patches if bar.get_height() > 0)
    (bar,) = [p for p in zero_panel.patches if p.get_height() > 0]
    assert bar.get_x() < 0 < bar.get_x() + bar.get_width()  # centred on the tick "0"
    assert [t.get_text() for t in zero_panel.get_xticklabels()] == ["0"]


def test_short_label_keeps_both_ends() -> None:
    assert short_label("bm25") == "bm25"
    cut = short_label("dense-retriever-" + "x" * 50 + "-v2", 20)
    assert len(cut) == 20
    assert cut.startswith("dense-retr")
    assert cut.endswith("-v2")
    assert "…" in cut
