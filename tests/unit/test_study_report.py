"""`iotune study` planning, the step-time prediction and `iotune report`, from the records of
a real study on an H100 (tests/data/study-h100: two studies, an AIO sweep and a thread
sweep, as the GPU machine wrote them). The figures are checked on the values their
artists draw, against the records."""

from __future__ import annotations

import base64
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate, zenflow_schedule
from iotune.model.presets import get_preset
from iotune.plan.measured import AdamRate, Bandwidth, Baseline, adam_rate, aio_bandwidth
from iotune.plan.predict import predict
from iotune.plan.rundoc import forward_backward
from iotune.report import document, figures, sweep_figures, tables
from iotune.report.load import load
from iotune.study import plan
from iotune.study.record import summarize_run
from iotune.units import GIB
from tests.unit.plots import values as _values

DATA = Path(__file__).resolve().parent.parent / "data" / "study-h100"
RUN_DOC = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-study-h100/opt_nvme_1b.json"


def records() -> list[dict[str, Any]]:
    out = []
    for s in ("study-1b", "study-3b"):
        out += [json.loads(line) for line in (DATA / s / "runs.jsonl").read_text().splitlines()]
    return out


def by_name() -> dict[str, dict[str, Any]]:
    return {r["preset"]: r for r in records()}


# ------------------------------------------------------------------------------ the grid


def test_the_grid_expands_size_major_ram_before_nvme_accumulation_inner() -> None:
    items = plan.expand(["1b"], ["opt_nvme", "opt_ram"], [1, 4], None, 3)
    assert [i.name for i in items] == [
        "opt_ram_1b",
        "opt_ram_1b_ga4",
        "opt_nvme_1b",
        "opt_nvme_1b_ga4",
    ]
    assert all(i.preset.steps == 3 for i in items)
    assert items[1].preset.ga == 4 and items[1].preset.tokens_per_step == 4 * 4096


def test_named_presets_take_any_accumulation() -> None:
    items = plan.expand(None, None, [1, 2], ["tiny_opt_ram", "tiny_opt_nvme"], 2)
    assert [i.name for i in items] == [
        "tiny_opt_ram",
        "tiny_opt_ram_ga2",
        "tiny_opt_nvme",
        "tiny_opt_nvme_ga2",
    ]
    assert items[1].preset.ga == 2 and items[1].preset.accelerator == "cpu"
    assert plan.with_ga(items[1].preset, 1).name == "tiny_opt_ram"


@pytest.mark.parametrize(
    ("sizes", "strategies", "names", "needle"),
    [
        (["5b"], None, None, "--sizes: 5b is not in the study's grid"),
        (None, ["opt_disk"], None, "--strategies: opt_disk"),
        (["1b"], None, ["tiny_opt_ram"], "--presets names the runs"),
        (None, None, ["tiny_opt_ram", "tiny_opt_ram"], "in the study twice"),
    ],
)
def test_bad_grids_are_usage_errors(
    sizes: list[str] | None, strategies: list[str] | None, names: list[str] | None, needle: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(needle)):
        plan.expand(sizes, strategies, None, names, None)


def test_eta_scales_the_remaining_weight_by_the_seconds_per_weight_so_far() -> None:
    assert plan.eta([], [5.0]) is None
    assert plan.eta([(2.0, 10.0), (2.0, 30.0)], [1.0, 3.0]) == pytest.approx(40.0)
    small = get_preset("tiny_opt_ram")
    big = get_preset("opt_nvme_1b")
    assert plan.weight(big, estimate(big, ds_config(big))) > 100 * plan.weight(
        small, estimate(small, ds_config(small))
    )


# ---------------------------------------------------------------------- the I/O model fix


@pytest.mark.parametrize(
    ("interval", "ga", "every", "per_step"),
    [(4, 1, 4, 1), (4, 4, 1, 1), (4, 8, 1, 2), (16, 4, 4, 1), (1, 1, 1, 1)],
)
def test_zenflow_counts_its_interval_in_micro_steps(
    interval: int, ga: int, every: int, per_step: int
) -> None:
    assert zenflow_schedule(interval, ga) == (every, per_step)


def test_zenflow_at_ga4_moves_a_whole_offloaded_step_every_step_as_measured() -> None:
    p = get_preset("opt_nvme_zenflow_1b_ga4")
    e = estimate(p, ds_config(p))
    n = e.swapped
    assert e.update_interval == 1
    assert e.steady_step.read == 12 * n.n_s + 4 * n.n_g
    # measured on the H100: every step read and wrote 18.41 GiB (16N)
    measured = [
        s
        for s in json.loads(
            (
                Path(__file__).resolve().parents[2]
                / "benchmarks/results/gpu-study-grid-h100/study-1b/runs/opt_nvme_zenflow_1b_ga4/run.json"
            ).read_text()
        )["io_steps"]
        if s["label"] in ("step:2", "step:3", "step:4")
    ]
    for s in measured:
        assert s["read"]["bytes"] == pytest.approx(e.steady_step.read, rel=0.001)
        assert s["write"]["bytes"] == pytest.approx(e.steady_step.write, rel=0.001)


# ---------------------------------------------------------------------- the prediction


def test_prediction_is_reads_cpu_writes_one_after_the_other() -> None:
    p = get_preset("opt_nvme_1b")
    e = estimate(p, ds_config(p))
    sw = e.swapped
    bw = Bandwidth(2 * GIB, 4 * GIB, {}, {"read": 3, "write": 3}, "sweep")
    adam = AdamRate(2e-10, 16, 10**9, "threads")
    pr = predict(p, e, bw, adam, None)
    rd, wr = 12 * sw.n_s + 4 * sw.n_g, 12 * sw.n_s
    assert pr.optimizer_s == pytest.approx(rd / (2 * GIB) + 2e-10 * e.params + wr / (4 * GIB))
    assert pr.step_s is None and "--baseline" in pr.notes[0]
    base = Baseline(1.5, 0.9, "opt_ram_1b, measured")
    pr = predict(p, e, bw, adam, base)
    # the RAM run's optimizer step stands for everything but the swapping
    assert pr.optimizer_s == pytest.approx(rd / (2 * GIB) + 0.9 + wr / (4 * GIB))
    assert pr.optimizer_s is not None
    assert pr.step_s == pytest.approx(1.5 + pr.optimizer_s + 4 * sw.n_g / (4 * GIB))
    # the gradients' writing hides behind the last micro-step's backward a reduce bucket at a
    # time (DeepSpeed's 500M elements: 1.236B parameters are two full buckets and a last of
    # the rest): the first bucket is written from 0.405 of the backward on, the last only
    # after it, so the step is longer by the writing less what the 0.595 of the backward
    # after the first bucket hides, and by the last bucket's writing at least
    grads = 4 * sw.n_g / (4 * GIB)
    share = 500_000_000 / e.params
    last = 1 - 2 * share
    over = predict(p, e, bw, adam, Baseline(1.5, 0.9, "opt_ram_1b", backward_s=0.5))
    assert over.step_s == pytest.approx(1.5 + pr.optimizer_s + grads - (1 - share) * 0.5)
    hid = predict(p, e, bw, adam, Baseline(9.0, 0.9, "opt_ram_1b", backward_s=8.0))
    assert hid.step_s == pytest.approx(9.0 + pr.optimizer_s + last * grads)
    assert "a reduce bucket at a time (3)" in hid.terms[-1].label, hid.terms[-1]
    p4 = plan.with_ga(p, 4)
    e4 = estimate(p4, ds_config(p4))
    ga4 = predict(p4, e4, bw, adam, Baseline(3.0, 0.9, "opt_ram_1b_ga4", backward_s=2.0))
    assert ga4.step_s == pytest.approx(3.0 + pr.optimizer_s + grads - (1 - share) * 0.5)
    # a model within one bucket writes all its gradients after backward, however long
    one = replace(e, reduce_bucket=e.params)
    assert predict(p, one, bw, adam, Baseline(9.0, 0.9, "x", backward_s=8.0)).step_s == (
        pytest.approx(9.0 + pr.optimizer_s + grads)
    )


def test_parameter_offload_adds_its_fetches_and_its_write_back() -> None:
    """params_opt_nvme: the steady step's reads beyond the optimizer's are the parameter
    fetches of forward and backward, its writes beyond optimizer state and gradients the
    updated parameters; both at the sweep's bandwidth, one after the other."""
    p, q = get_preset("opt_nvme_1b"), get_preset("params_opt_nvme_1b")
    ep, eq = estimate(p, ds_config(p)), estimate(q, ds_config(q))
    bw = Bandwidth(2 * GIB, 4 * GIB, {}, {"read": 3, "write": 3}, "sweep")
    base = Baseline(1.5, 0.9, "opt_ram_1b, measured", backward_s=1.0)
    pp, pq = predict(p, ep, bw, None, base), predict(q, eq, bw, None, base)
    sw = eq.swapped
    fetch = eq.steady_step.read - (12 * sw.n_s + 4 * sw.n_g)
    back = eq.steady_step.write - 12 * sw.n_s - 4 * sw.n_g
    assert fetch > 0 and back == 2 * sw.n_p
    assert pp.optimizer_s is not None and pp.step_s is not None
    assert pq.optimizer_s == pytest.approx(pp.optimizer_s + back / (4 * GIB))
    assert pq.step_s == pytest.approx(pp.step_s + back / (4 * GIB) + fetch / (2 * GIB))
    assert any("parameters in forward + backward" in w for w, *_ in pq.terms)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu_baseline_1b", "no offload"),
        ("opt_ram_zenflow_1b", "ZenFlow"),
    ],
)
def test_what_the_model_does_not_cover_says_so(name: str, why: str) -> None:
    p = get_preset(name)
    pr = predict(p, estimate(p, ds_config(p)), None, AdamRate(1e-10, 1, 1, "x"), None)
    assert pr.optimizer_s is None and why in pr.notes[0]


def test_sweep_bandwidth_is_the_median_of_every_measurement_at_the_runs_block() -> None:
    recs = [json.loads(x) for x in (DATA / "sweep-aio/points.jsonl").read_text().splitlines()]
    aio = {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1}
    bw = aio_bandwidth(DATA / "sweep-aio", aio)
    for op in ("read", "write"):
        at = next(
            r
            for r in recs
            if r["op"] == op and r["block_size"] == 1 << 20 and r["queue_depth"] == 8
        )
        assert getattr(bw, op) == statistics.median(at["bw_bytes_s_all"])
    assert bw.note is None
    near = aio_bandwidth(DATA / "sweep-aio", {**aio, "block_size": 256 << 10})
    assert near.note and "nearest 512 KiB qd 8" in near.note


def test_adam_rate_per_parameter_at_the_runs_thread_count() -> None:
    doc = json.loads((DATA / "threads/threads.json").read_text())
    row16 = next(r for r in doc["rows"] if r["threads"] == 16)
    rate = adam_rate(DATA / "threads", 16)
    assert rate.seconds_per_param == pytest.approx(row16["step_ms_median"] / 1000 / 1e9)
    assert rate.note is None
    assert adam_rate(DATA / "threads", 12).note == "CPU Adam timed at 8 thread(s), the run uses 12"


# ------------------------------------------------------------------------------ records


def test_a_run_document_becomes_the_studys_record() -> None:
    doc = json.loads(RUN_DOC.read_text())
    r = summarize_run(doc)
    steady = next(t for t in doc["table"] if t["case"].startswith("steady"))
    assert r["status"] == "ok" and r["preset"] == "opt_nvme_1b"
    assert r["measured"]["step_s"] == steady["step_s"]
    assert r["measured"]["read_gib"] == steady["read_gib"]
    assert r["estimate"]["read_gib"] == pytest.approx(16 * doc["params"] / GIB, rel=1e-3)
    fb = [e["forward_s"] + e["backward_s"] for e in doc["events"] if e.get("event") == "step"][1:]
    assert forward_backward(doc) == pytest.approx(statistics.median(fb), abs=1e-4)


def test_a_failed_runs_record_names_the_workers_exception() -> None:
    doc = json.loads(RUN_DOC.read_text())
    failed = {
        **doc,
        "exit_code": 1,
        "steps_done": 1,
        "error": "AssertionError: param 7 already assigned swap buffer id 18",
    }
    r = summarize_run(failed)
    assert r["status"] == "failed"
    assert r["error"] == (
        "the training worker exited 1 after 1 step(s): "
        "AssertionError: param 7 already assigned swap buffer id 18"
    )
    assert summarize_run({**failed, "error": None})["error"] == (
        "the training worker exited 1 after 1 step(s)"
    )
    # stopped because a fabrics namespace lost its path: that is what the record says
    lost = "nvme9n1 lost its path to nvme-tcp 10.0.0.2:4420: connecting for 10 s"
    r = summarize_run({**doc, "exit_code": -9, "steps_done": 1, "lost_path": lost})
    assert r["status"] == "failed" and r["error"] == f"stopped after 1 step(s): {lost}"


# ------------------------------------------------------------------------------- report


def test_report_loads_studies_and_sweeps_from_one_parent_directory() -> None:
    data = load([DATA])
    assert len(data.runs) == 10 and len(data.sweeps) == 1 and len(data.threads) == 1
    with pytest.raises(UsageError, match="holds no study"):
        load([DATA / "sweep-aio" / "points.jsonl"])


def test_size_table_rows_are_the_records() -> None:
    header, rows = tables.size_table(records(), "1b")
    assert [r[0] for r in rows[:2]] == ["gpu_baseline", "gpu_baseline"]
    rec = by_name()["opt_nvme_1b"]
    row = next(r for r in rows if r[0] == "opt_nvme" and r[1] == "1")
    col = dict(zip(header, row, strict=True))
    assert col["Step s"] == f"{rec['measured']['step_s']:.2f}"
    assert col["Read GiB/step (est.)"] == (
        f"{rec['measured']['read_gib']:.2f} ({rec['estimate']['read_gib']:.2f})"
    )
    assert col["R other"] == f"{rec['measured']['read_other']:,}"


def _rectangles(ax: Axes) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def _bars(ax: Axes, gid: str) -> list[tuple[float, float]]:
    return [
        (p.get_x() + p.get_width() / 2, p.get_height())
        for p in _rectangles(ax)
        if p.get_gid() == gid
    ]


def test_step_time_figure_draws_each_runs_step_and_optimizer() -> None:
    d = figures.step_time(records())
    assert d is not None
    axes = d.fig.axes
    assert [a.get_title() for a in axes] == [
        "Performance for 1B model size",
        "Performance for 3B model size",
    ]
    want = sorted(r["measured"]["step_s"] for r in records() if r["size"] == "1b")
    assert sorted(h for _, h in _bars(axes[0], "step")) == pytest.approx(want)
    want_opt = sorted(r["measured"]["optimizer_s"] for r in records() if r["size"] == "1b")
    assert sorted(h for _, h in _bars(axes[0], "optimizer")) == pytest.approx(want_opt)
    preds = [ln for ln in axes[0].lines if ln.get_gid() == "pred"]
    want_pred = sorted(
        r["prediction"]["step_s"]
        for r in records()
        if r["size"] == "1b" and (r.get("prediction") or {}).get("step_s")
    )
    assert sorted(y for ln in preds for y in _values(ln.get_ydata())) == pytest.approx(want_pred)


def test_nvme_bytes_figure_draws_measured_beside_estimated() -> None:
    d = figures.nvme_bytes(records())
    assert d is not None
    ax = d.fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    recs = by_name()
    assert names == [n for n in names if recs[n]["measured"]["read_gib"]]
    for gid, which, key in (
        ("read, measured", "measured", "read_gib"),
        ("write, estimated", "estimate", "write_gib"),
    ):
        heights = [h for _, h in sorted(_bars(ax, gid))]
        assert heights == pytest.approx([recs[n][which][key] for n in names])


def test_optimizer_share_figure_is_optimizer_over_step() -> None:
    d = figures.optimizer_share(records())
    assert d is not None
    ax = d.fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    widths = [p.get_width() for p in _rectangles(ax) if p.get_gid() == "optimizer"]
    recs = by_name()
    assert widths == pytest.approx(
        [100 * recs[n]["measured"]["optimizer_s"] / recs[n]["measured"]["step_s"] for n in names]
    )


def test_request_size_figure_counts_every_request_of_each_drive() -> None:
    d = figures.request_sizes(records())
    assert d is not None
    first = next(r for r in tables.sorted_runs(records()) if r["status"] == "ok" and r["drives"])
    drive = first["drives"][0]
    ax = d.fig.axes[0]
    assert ax.get_title().startswith(
        f"{first['preset']} on {drive['name']} (AIO block 1 MiB, max_sectors_kb 512"
    )
    for op in ("read", "write"):
        drawn = sum(h for _, h in _bars(ax, f"{op}-other")) + sum(
            h for _, h in _bars(ax, f"{op}-focus")
        )
        assert drawn == sum(drive[f"{op}_sizes"].values())


def test_sweep_heatmap_cells_are_the_best_bandwidth_at_each_block_and_depth() -> None:
    data = load([DATA / "sweep-aio"])
    d = sweep_figures.sweep_heatmap(data.sweeps[0])
    assert d is not None
    ax = d.fig.axes[0]
    assert ax.get_title().startswith("read, GiB/s")
    grid = ax.images[0].get_array()
    assert grid is not None
    recs = [r for r in data.sweeps[0].records if r["op"] == "read"]
    bss = sorted({r["block_size"] for r in recs})
    qds = sorted({r["queue_depth"] for r in recs})
    for r in recs:
        cell = grid[qds.index(r["queue_depth"])][bss.index(r["block_size"])]
        assert cell == pytest.approx(r["bw_bytes_s"] / GIB)


def test_adam_threads_figure_is_ms_per_billion_parameters() -> None:
    doc = json.loads((DATA / "threads/threads.json").read_text())
    d = sweep_figures.adam_threads([doc], document.study_threads())
    assert d is not None
    (measured,) = [ln for ln in d.fig.axes[0].lines if ln.get_gid() == "measured"]
    assert _values(measured.get_xdata()) == [4, 8, 16]
    assert _values(measured.get_ydata()) == pytest.approx(
        [r["step_ms_median"] * 1e9 / r["params"] for r in doc["rows"]]
    )
    (study,) = [ln for ln in d.fig.axes[0].lines if ln.get_gid() == "study"]
    assert _values(study.get_xdata()) == [1, 2, 4, 6]


def test_report_writes_markdown_pngs_and_a_self_contained_html(tmp_path: Path) -> None:
    code = CliRunner().invoke(
        cli_mod.cli, ["--json", "report", str(DATA), "--out", str(tmp_path)], prog_name="iotune"
    )
    assert code.exit_code == 0, code.stderr
    out = json.loads(code.stdout)
    assert out["runs"] == 10 and out["md"] == "report.md" and out["html"] == "report.html"
    assert set(out["figures"]) == {
        "step_time.png",
        "optimizer_share.png",
        "nvme_bytes.png",
        "request_sizes.png",
        "sweep_sweep-aio.png",
        "adam_threads.png",
    }
    for f in out["figures"]:
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "## Model size 1b" in md and "## Model size 3b" in md
    assert "| opt_nvme | 1 | ok | 19.68 |" in md
    html = (tmp_path / "report.html").read_text()
    imgs = re.findall(r"src='data:image/png;base64,([^']+)'", html)
    assert len(imgs) == len(out["figures"])
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    assert "<img src='file" not in html and "http" not in html.split("<body>")[1]


def test_resume_takes_no_grid_options() -> None:
    r = CliRunner().invoke(
        cli_mod.cli,
        ["study", "--resume", str(DATA / "study-1b"), "--sizes", "3b"],
        prog_name="iotune",
    )
    assert r.exit_code == 2
    assert "--resume goes on with the study as it was asked: drop --sizes" in r.stderr


# ------------------------------------------------------------------------- swap rehearsal


@pytest.mark.parametrize("name", ["tiny_opt_nvme", "opt_nvme_1b", "opt_nvme_3b", "opt_nvme_16b"])
def test_swap_layout_is_the_models_swapped_state_and_gradients(name: str) -> None:
    from iotune.model.dsconfig import min_aio_bytes
    from iotune.model.swapfiles import swap_layout, swapped_counts

    p = get_preset(name)
    cfg = ds_config(p)
    layout = swap_layout(p, cfg)
    sw = swapped_counts(p, cfg)
    assert sum(s for s, _ in layout) == sw.n_s > 0
    assert sum(sum(gs) for _, gs in layout) == sw.n_g > 0
    assert max(s for s, _ in layout) <= sw.largest_subgroup
    # independently of the grouping: every gradient of at least DeepSpeed's minimum swap
    # size, in model order, each in one file; no parameter split between sub-groups
    tensors = [n for _, n in p.geometry.tensors()]
    small = min_aio_bytes(cfg)
    assert [n for _, gs in layout for n in gs] == [n for n in tensors if 4 * n >= small]
    assert sum(s for s, _ in layout) <= sum(tensors)


def _swap_record(preset: str, aio: dict[str, Any], read: float, write: float) -> dict[str, Any]:
    return {
        "preset": preset,
        "block_size": aio["block_size"],
        "queue_depth": aio["queue_depth"],
        "threads": aio["intra_op_parallelism"],
        "single_submit": aio["single_submit"],
        "overlap_events": aio["overlap_events"],
        "status": "ok",
        "read_bytes": 19_767_000_000,
        "read_bw_bytes_s": read,
        "write_bw_bytes_s": write,
        "rounds": [{}, {}],
    }


def test_prediction_takes_the_swap_rehearsal_before_the_file_bandwidth(tmp_path: Path) -> None:
    from iotune.plan.measured import measured_inputs

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for f in ("points.jsonl", "result.json"):
        (sweep / f).write_text((DATA / "sweep-aio" / f).read_text())
    aio = json.loads((sweep / "result.json").read_text())["aio"]
    rec = _swap_record("opt_nvme_1b", aio, 1.5 * GIB, 1.25 * GIB)
    (sweep / "swap.jsonl").write_text(json.dumps(rec) + "\n")
    p = get_preset("opt_nvme_1b")
    cfg = ds_config(p, aio=aio)
    bw, _, _ = measured_inputs(p, cfg, str(sweep), None, None)
    assert bw is not None and bw.pattern == "swap" and bw.note is None
    assert (bw.read, bw.write) == (1.5 * GIB, 1.25 * GIB)
    pred = predict(p, estimate(p, cfg), bw, AdamRate(1e-9, 16, 10**9, "t"))
    sw = estimate(p, cfg).swapped
    reads = 12 * sw.n_s + 4 * sw.n_g
    assert pred.terms[0][:2] == (
        f"read {reads / GIB:.2f} GiB at 1.50 GiB/s (swap rehearsal)",
        reads / (1.5 * GIB),
    )
    # the accumulation variant is the same preset's swapping
    p4 = plan.with_ga(p, 4)
    bw4, _, _ = measured_inputs(p4, ds_config(p4, aio=aio), str(sweep), None, None)
    assert bw4 is not None and bw4.pattern == "swap" and bw4.note is None
    # another preset takes it with a note naming whose swapping it was
    p3 = get_preset("opt_nvme_3b")
    bw3, _, _ = measured_inputs(p3, ds_config(p3, aio=aio), str(sweep), None, None)
    assert bw3 is not None and bw3.pattern == "swap"
    assert bw3.note is not None and "opt_nvme_1b" in bw3.note
    # a rehearsal at another aio block is not the run's: the file bandwidth stands
    other = {**aio, "queue_depth": aio["queue_depth"] * 2}
    (sweep / "swap.jsonl").write_text(
        json.dumps(_swap_record("opt_nvme_1b", other, 1.5 * GIB, 1.25 * GIB)) + "\n"
    )
    bw, _, _ = measured_inputs(p, cfg, str(sweep), None, None)
    assert bw is not None and bw.pattern == "file"
    assert bw.read == aio_bandwidth(sweep, aio).read


def test_study_table_shows_no_estimate_beside_a_run_that_swaps_nothing() -> None:
    from iotune.cli.study import result_table

    recs = by_name()
    table = result_table([recs["opt_ram_1b"], recs["opt_nvme_1b"]])
    cells = {c.header: list(c.cells) for c in table.columns}
    assert cells["READ GiB/step (est.)"][0] == "-"
    assert cells["WRITE GiB/step (est.)"][0] == "-"
    m, e = recs["opt_nvme_1b"]["measured"], recs["opt_nvme_1b"]["estimate"]
    assert cells["READ GiB/step (est.)"][1] == f"{m['read_gib']:.2f} ({e['read_gib']:.2f})"


def test_swap_rehearsal_with_sets_swaps_the_runs_files_and_is_found_by_them(
    tmp_path: Path,
) -> None:
    from iotune.model.presets import preset_with
    from iotune.model.swapfiles import swapped_counts
    from iotune.records import SWAP_REHEARSALS
    from iotune.sweep import swap

    aio = get_preset("tiny_opt_nvme").aio
    sets = ("model.num_hidden_layers=1", "model.vocab_size=1024")
    whole, need_whole = swap.plan("tiny_opt_nvme", aio)
    cut, need_cut = swap.plan("tiny_opt_nvme", aio, sets)
    p = preset_with("tiny_opt_nvme", sets)
    sw = swapped_counts(p, ds_config(p, aio=aio))
    assert cut["sets"] == list(sets) and whole["sets"] == []
    assert sum(s for s, _ in cut["layout"]) == sw.n_s
    assert need_cut == 12 * sw.n_s + 4 * sw.n_g < need_whole
    # find() tells the two rehearsals apart by their sets
    base = {"status": "ok", "preset": "tiny_opt_nvme", **swap.config_of(cut)}
    (tmp_path / SWAP_REHEARSALS).write_text(json.dumps({**base, "sets": list(sets)}) + "\n")
    assert swap.find(tmp_path, "tiny_opt_nvme", swap.config_of(cut), sets) is not None
    assert swap.find(tmp_path, "tiny_opt_nvme", swap.config_of(cut)) is None


def test_prediction_notes_a_rehearsal_of_other_files_than_the_runs(tmp_path: Path) -> None:
    """The same preset's rehearsal with other --set values (another size) is taken with a
    note; the rehearsal of the run's own bytes is taken before it, without one."""
    from iotune.plan.measured import measured_inputs

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for f in ("points.jsonl", "result.json"):
        (sweep / f).write_text((DATA / "sweep-aio" / f).read_text())
    aio = json.loads((sweep / "result.json").read_text())["aio"]
    p = get_preset("opt_nvme_1b")
    cfg = ds_config(p, aio=aio)
    small = {**_swap_record("opt_nvme_1b", aio, 1.0 * GIB, 1.0 * GIB), "read_bytes": 10**9}
    (sweep / "swap.jsonl").write_text(json.dumps(small) + "\n")
    bw, _, _ = measured_inputs(p, cfg, str(sweep), None, None)
    assert bw is not None and bw.pattern == "swap" and bw.read == 1.0 * GIB
    assert bw.note is not None and "0.931 GiB read per step" in bw.note
    own = _swap_record("opt_nvme_1b", aio, 1.5 * GIB, 1.25 * GIB)
    with (sweep / "swap.jsonl").open("a") as out:
        out.write(json.dumps(own) + "\n")
    bw, _, _ = measured_inputs(p, cfg, str(sweep), None, None)
    assert bw is not None and bw.read == 1.5 * GIB and bw.note is None


def test_sweep_set_without_a_swap_pattern_is_refused() -> None:
    r = CliRunner().invoke(
        cli_mod.cli,
        ["sweep-aio", "--target", "/tmp", "--set", "model.num_hidden_layers=1"],
        prog_name="iotune",
    )
    assert r.exit_code == 2, r.output
    assert "--set changes the --swap-pattern preset" in r.output
    assert "Traceback" not in r.output


def test_amounts_and_rates_take_the_unit_that_shows_them() -> None:
    from iotune.units import amount, scale_for

    assert amount(1.5 * GIB, "/s") == "1.50 GiB/s"
    assert amount(2 * 2**20, "/s") == "2.0 MiB/s"
    assert amount(26_223_616) == "25.0 MiB"
    assert amount(4096) == "4.0 KiB"
    assert scale_for(0.9 * GIB) == ("MiB", 2.0**20)
