"""The pictures beside the YAML, and report after several processes."""

import json
import math
import struct

import matplotlib.pyplot as plt
import yaml
from conftest import run_cli, spec

import scalertune
from scalertune._amp._config import AmpConfig
from scalertune._review._plots import DPI, FIGURE_INCHES, run_figure


def test_pictures_are_4_by_3_with_whole_titles_and_legends_of_what_is_drawn(storage, tmp_path):
    result = scalertune.search(
        spec("forward_overflow"), storage=storage, n_trials=2, steps=30, device="cpu"
    )
    default = result.baselines["pytorch-default"]
    assert default.state == "pruned" and len(default.prune_reason) > 150
    # the picture written as the recommendation's: the AMP run recommended, or on a CPU,
    # where float32 is the answer, the best AMP config that held
    drawn = result.recommended or result.best_amp
    assert drawn is not None and drawn.config.dtype == "bfloat16"
    for outcome in (default, drawn):
        fig = run_figure(result, outcome)
        try:
            fig.canvas.draw()
            assert tuple(fig.get_size_inches()) == FIGURE_INCHES
            words = [
                *fig.texts,
                *(
                    t
                    for ax in fig.axes
                    for t in (
                        ax.title,
                        ax.xaxis.label,
                        ax.yaxis.label,
                        *ax.get_legend().get_texts(),
                    )
                ),
            ]
            for text in words:
                if text.get_text().strip():
                    assert _inside(fig, text), text.get_text()
            for ax in fig.axes:
                _legend_matches_what_is_drawn(ax)
            # a pruned float16 run: its curve ends where it went non-finite; bfloat16: no
            # scaler, so no scale panel
            assert len(fig.axes) == (2 if outcome.config.uses_scaler else 1)
        finally:
            plt.close(fig)
    (path,) = [
        p for n, p in result.write_pictures(str(tmp_path / "r.yaml")).items() if n == default.number
    ]
    with open(path, "rb") as f:
        width, height = struct.unpack(">II", f.read(24)[16:24])
    assert (width, height) == (FIGURE_INCHES[0] * DPI, FIGURE_INCHES[1] * DPI)


def test_report_after_two_processes_matches_the_last_search(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = run_cli(
        "search",
        spec("healthy"),
        "--storage",
        storage,
        "--n-trials",
        "2",
        "--steps",
        "40",
        "--device",
        "cpu",
        "-o",
        "first.yaml",
        cwd=tmp_path,
        process=True,
    )
    assert first.returncode == 0, first.stderr
    second = run_cli(
        "search",
        spec("healthy"),
        "--storage",
        storage,
        "--n-trials",
        "4",
        "--steps",
        "40",
        "--device",
        "cpu",
        "-o",
        "second.yaml",
        cwd=tmp_path,
        process=True,
    )
    assert second.returncode == 0, second.stderr
    report = run_cli(
        "report",
        "--storage",
        storage,
        "--study-name",
        "workloads:healthy",
        "--json",
        cwd=tmp_path,
        process=True,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    recommended = next(
        line for line in second.stdout.splitlines() if line.startswith("Recommended:")
    )
    # an AMP run by its number; float32, the answer on a CPU where AMP is slower, by its config
    named = (
        f"trial #{data['evidence']['trial']} "
        if "trial" in data["evidence"]
        else AmpConfig.from_dict(data["config"]).describe()
    )
    assert named in recommended
    assert data == yaml.safe_load((tmp_path / "second.yaml").read_text())


def _legend_matches_what_is_drawn(ax):
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    drawn = {
        a.get_label()
        for a in (*ax.lines, *ax.collections)
        if not a.get_label().startswith("_") and _has_finite_data(a)
    }
    assert set(labels) == drawn, (labels, drawn)


def _has_finite_data(artist):
    if hasattr(artist, "get_ydata"):
        ys = artist.get_ydata()
    else:
        ys = [y for _, y in artist.get_offsets()]
    return any(math.isfinite(float(y)) for y in ys)


def _inside(fig, text):
    box, page = text.get_window_extent(), fig.bbox
    return page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
