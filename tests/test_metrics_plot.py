"""`posttrain plot`: panels chosen from metrics.jsonl keys, runs overlaid, smoothing, the PNG."""

from __future__ import annotations

import pytest

from posttrain.entrypoints.cli import EXIT_RUN_ERROR, main
from posttrain.metrics import open_sinks
from posttrain.metrics.plot import (
    DEFAULT_METRICS,
    PlotError,
    build_figure,
    choose_panels,
    ema,
    load_runs,
    parse_smoothing,
    plot_runs,
    select_metrics,
    trailing_mean,
)

GRPO_KEYS = {
    "train/reward_mean": 0.1,
    "train/loss": 1.0,
    "train/pg/kl_ref": 0.01,
    "train/pg/approx_kl_old": 0.0,
    "train/pg/clip_frac_low": 0.0,
    "train/pg/clip_frac_high": 0.02,
    "train/pg/ratio_max": 1.1,
    "train/reward_response_length_mean": 3.0,
    "train/reward_fn/my_rewards:bonus_mean": 0.5,
    "train/lr": 1e-3,
}


def _run(root, name, steps=4, scale=1.0, keys=GRPO_KEYS):
    sink = open_sinks(root / name)
    sink.write(0, {"val/accuracy": 0.0})
    for step in range(1, steps + 1):
        sink.write(step, {k: v * step * scale for k, v in keys.items()})
    sink.write(steps, {"val/accuracy": 0.5 * scale})  # an eval record at the last step
    sink.close()
    return root / name


def test_default_panels_put_the_researchers_metrics_first_then_the_objectives(tmp_path):
    runs = load_runs([_run(tmp_path, "a")])
    assert select_metrics(runs) == [
        "train/reward_mean",
        "val/accuracy",
        "train/loss",
        "train/pg/kl_ref",
        "train/pg/clip_frac_high",
        "train/reward_response_length_mean",
        "train/pg/ratio_max",  # the objective's own, found by its namespace
    ]  # approx_kl_old and clip_frac_low are 0 at every step: left out
    assert "train/lr" not in select_metrics(runs)  # neither a default nor namespaced
    assert len(DEFAULT_METRICS) == 7


def test_metrics_take_names_and_globs_and_reject_what_matches_nothing(tmp_path):
    runs = load_runs([_run(tmp_path, "a")])
    assert select_metrics(runs, ["train/lr", "train/pg/clip*"]) == [
        "train/lr",
        "train/pg/clip_frac_high",
        "train/pg/clip_frac_low",
    ]
    with pytest.raises(PlotError, match="'train/nope\\*' matches no key of metrics.jsonl; keys: "):
        select_metrics(runs, ["train/nope*"])


def test_runs_are_overlaid_with_a_legend_and_their_own_data(tmp_path):
    runs = load_runs([_run(tmp_path, "base"), _run(tmp_path, "tuned", scale=2.0)])
    fig = build_figure(runs, ["train/reward_mean", "val/accuracy"])
    reward, accuracy = fig.axes[:2]
    assert reward.get_title() == "train/reward_mean"
    assert [line.get_label() for line in reward.get_lines()] == ["base", "tuned"]
    base, tuned = reward.get_lines()
    assert list(base.get_xdata()) == [1, 2, 3, 4]
    assert list(tuned.get_ydata()) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert list(accuracy.get_lines()[1].get_xdata()) == [0, 4]  # eval steps only
    assert list(accuracy.get_lines()[1].get_ydata()) == [0.0, 1.0]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["base", "tuned"]


def test_smoothing_draws_the_raw_line_faint_and_the_smoothed_one_labelled(tmp_path):
    runs = load_runs([_run(tmp_path, "a")])
    fig = build_figure(runs, ["train/loss"], parse_smoothing("ema:0.5"))
    raw, smooth = fig.axes[0].get_lines()
    assert list(raw.get_ydata()) == [1.0, 2.0, 3.0, 4.0] and raw.get_alpha() == 0.25
    assert list(smooth.get_ydata()) == [1.0, 1.5, 2.25, 3.125]
    assert smooth.get_label() == "a"


def test_ema_and_window_by_hand():
    steps = [1, 2, 3]
    assert ema(steps, [1.0, 3.0, 5.0], 0.0) == [1.0, 3.0, 5.0]
    assert ema(steps, [1.0, 3.0, 5.0], 0.9) == pytest.approx([1.0, 1.2, 1.58])
    assert trailing_mean([1, 2, 3, 4], [1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean(steps[:2], [1.0, 3.0], 1) == [1.0, 3.0]
    smooth = parse_smoothing("window:3")
    assert smooth([1, 2, 3, 4], [3.0, 6.0, 9.0, 0.0]) == [3.0, 4.5, 6.0, 5.0]


def test_smoothing_counts_steps_not_points():
    # a metric logged every 250 steps is barely smoothed by a per-step EMA or a 10-step window
    assert ema([0, 250, 500], [0.0, 0.5, 1.0], 0.9) == pytest.approx([0.0, 0.5, 1.0])
    assert ema([0, 2], [0.0, 1.0], 0.5) == [0.0, 0.75]  # two steps: weight 0.5 ** 2 on the past
    assert trailing_mean([0, 250, 500], [0.0, 0.5, 1.0], 10) == [0.0, 0.5, 1.0]
    assert trailing_mean([0, 5, 12], [0.0, 1.0, 2.0], 10) == [0.0, 0.5, 1.5]


@pytest.mark.parametrize("spec", ["ema:1", "ema:-0.1", "window:0", "window:2.5", "gauss:3", "ema"])
def test_bad_smoothing_spec(spec):
    with pytest.raises(PlotError, match="expected ema:A with 0 <= A < 1, or window:N"):
        parse_smoothing(spec)


def test_a_step_written_twice_keeps_its_last_value(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "train/loss": 5.0}\n{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/lo'
    )
    (run,) = load_runs([tmp_path / "metrics.jsonl"])  # a live run's torn last line is skipped
    assert run.series("train/loss") == ([1], [2.0])


def test_cli_writes_a_png_whose_size_follows_the_panels(tmp_path, capsys):
    import matplotlib.image

    a, b = _run(tmp_path, "a"), _run(tmp_path, "b", scale=0.5)
    out = tmp_path / "cmp.png"
    argv = ["plot", str(a), str(b), "--metrics", "train/reward_mean,val/*", "--out", str(out)]
    assert main([*argv, "--smooth", "window:2"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    two_panels = matplotlib.image.imread(out)
    assert main(["plot", str(a)]) == 0  # defaults: 7 panels in 3 rows, next to the run
    seven_panels = matplotlib.image.imread(a / "curves.png")
    assert two_panels.shape[2] == 4 and two_panels.std() > 0  # drawn, not blank
    assert seven_panels.shape[0] > 2.5 * two_panels.shape[0]
    assert seven_panels.shape[1] > two_panels.shape[1]


def test_cli_user_errors_are_one_line(tmp_path, capsys):
    run = _run(tmp_path, "a")
    assert main(["plot", str(run), "--metrics", "train/nope"]) == EXIT_RUN_ERROR
    err = capsys.readouterr().err
    assert err.startswith("posttrain: error: PlotError: --metrics 'train/nope' matches no key")
    assert err.count("\n") == 1
    assert main(["plot", str(tmp_path / "missing")]) == EXIT_RUN_ERROR
    assert "no metrics.jsonl there; is this a run directory?" in capsys.readouterr().err


def test_runs_with_the_same_name_are_told_apart_by_their_parents(tmp_path):
    a, b = _run(tmp_path / "x" / "grpo", "run"), _run(tmp_path / "y" / "grpo", "run")
    assert [r.label for r in load_runs([a, b])] == ["x/grpo/run", "y/grpo/run"]
    other = _run(tmp_path / "y", "other")
    assert [r.label for r in load_runs([a / "metrics.jsonl", other])] == ["run", "other"]
    assert plot_runs([a, b], tmp_path / "o.png").is_file()


#: A demo-like GRPO run with one update per batch: ratios at 1, clip fractions and the KL to
#: pi_old at 0 at every step.
FLAT = {"train/pg/ratio_mean": 1.0, "train/pg/ratio_max": 1.0, "train/pg/clip_frac_low": 0.0,
        "train/pg/clip_frac_high": 0.0, "train/pg/approx_kl_old": 0.0}  # fmt: skip


def _rows(root, name, rows):
    sink = open_sinks(root / name)
    for step, record in rows:
        sink.write(step, record)
    sink.close()
    return root / name


def test_default_panels_leave_out_constant_series_and_say_which(tmp_path, capsys):
    rows = [(s, {"train/reward_mean": 0.1 * s, "train/loss": 1.0 / s, **FLAT}) for s in (1, 2, 3)]
    run = _rows(tmp_path, "a", [(0, {"val/accuracy": 0.0}), *rows, (3, {"val/accuracy": 0.0})])
    keys, left_out = choose_panels(load_runs([run]))
    assert keys == ["train/reward_mean", "val/accuracy", "train/loss"]  # flat accuracy: a result
    assert left_out == FLAT
    assert main(["plot", str(run)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("posttrain plot: left out 5 series constant over the run (")
    assert "train/pg/ratio_mean=1)" in err and "train/pg/clip_frac_low=0," in err
    assert err.count("\n") == 1 and "name them with --metrics" in err
    # named explicitly, a flat series is drawn
    assert select_metrics(load_runs([run]), ["train/pg/ratio_*"]) == [
        "train/pg/ratio_max", "train/pg/ratio_mean"
    ]  # fmt: skip


def test_a_series_constant_in_one_run_but_not_across_runs_is_kept(tmp_path):
    a = _rows(tmp_path, "a", [(s, {"train/loss": 1.0, "train/pg/ratio_mean": 1.0}) for s in (1, 2)])
    b = _rows(tmp_path, "b", [(s, {"train/loss": 2.0, "train/pg/ratio_mean": 1.0}) for s in (1, 2)])
    assert choose_panels(load_runs([a, b])) == (["train/loss"], {"train/pg/ratio_mean": 1.0})


def test_single_points_and_all_flat_runs_still_plot(tmp_path):
    one = _rows(tmp_path, "one", [(1, {"train/loss": 1.0, **FLAT})])
    assert choose_panels(load_runs([one]))[1] == {}  # one point is not "constant over the run"
    flat = _rows(tmp_path, "flat", [(s, {"train/loss": 1.0}) for s in (1, 2)])
    assert choose_panels(load_runs([flat])) == (["train/loss"], {})  # nothing else to draw


def test_dpo_panels_include_its_validation_metrics(tmp_path):
    rows = [(s, {"train/loss": 0.7 - 0.01 * s, "train/grad_norm": s}) for s in (1, 2, 3)]
    evals = [(s, {"val/scorer_mean": 0.3 + 0.1 * s, "val/validity": 0.9}) for s in (0, 3)]
    run = _rows(tmp_path, "dpo", [evals[0], *rows, evals[1]])
    assert select_metrics(load_runs([run])) == ["val/scorer_mean", "val/validity", "train/loss"]
