"""A node's CPUs in the planner (iotune/plan/cpus.py, `estimate --cpu`): the table against its
own sources, the figures a user gives, the refusals, and CPU Adam with R ranks side by side,
each figure computed again by hand. Pure logic and CliRunner."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.plan.cpus import (
    STUDY_CPU,
    adam_bytes,
    cores_per_rank,
    fit_adam,
    load_cpus,
    node_adam,
    parse_cpu,
)
from iotune.plan.measured import AdamRate, study_adam


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli_mod.cli, list(args), prog_name="iotune")


def test_the_tables_bandwidth_is_its_sources_where_they_state_it() -> None:
    """channels x MT/s x 8 bytes, and where the maker's page states the bandwidth (AMD's
    "GB/s per socket") the same figure; every profile names its cores in its source."""
    table = load_cpus()
    assert table, "no CPU profiles"
    stated = 0
    for key, c in table.items():
        assert c.memory_bw == c.channels * c.mts * 8e6, key  # type: ignore[operator]
        assert f"{c.cores} cores" in c.source, key
        m = re.search(r"([\d.]+) GB/s per socket", c.source)
        if m:
            stated += 1
            assert c.memory_bw == pytest.approx(float(m.group(1)) * 1e9), key
    assert stated >= 3
    # the study's workstation: dual-channel DDR5-6400, 102.4 GB/s, as its text gives it
    assert table[STUDY_CPU].memory_bw == 102.4e9


def test_a_cpu_by_name_by_sockets_and_by_its_figures() -> None:
    two = parse_cpu("AMD-EPYC-9654, sockets=2")
    assert (two.node_cores, two.node_memory_bw) == (192, 921.6e9)
    assert two.describe() == (
        "2 x amd-epyc-9654: 192 cores, 24 channels of 4800 MT/s, 921.6 GB/s (theoretical)"
    )
    own = parse_cpu("cores=32,channels=8,mts=5600,sockets=2")
    assert (own.node_cores, own.node_memory_bw) == (64, 2 * 8 * 5600 * 8e6)
    assert (own.key, own.name, own.source, own.channels, own.mts, own.avx512) == (
        "--cpu",
        "a CPU of 32 cores",
        "--cpu",
        8,
        5600,
        None,
    )
    rated = parse_cpu("cores=24,memory=300GB/s")
    assert (rated.node_cores, rated.node_memory_bw, rated.channels) == (24, 300e9, None)
    assert (rated.source, parse_cpu("cores=24,memory=300GB/s,sockets=2").node_cores) == (
        "--cpu",
        48,
    )
    assert rated.describe() == "1 x a CPU of 24 cores: 24 cores, 300.0 GB/s (theoretical)"


FIGS = "e.g. --cpu cores=64,channels=12,mts=4800"


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        (
            "xeon-9999",
            r"--cpu 'xeon-9999' is not in iotune's CPU table \(amd-epyc-7763, amd-epyc-9554, ",
            "give its figures instead: --cpu cores=64,channels=12,mts=4800,sockets=2 (cores and "
            "memory channels of one socket, the DIMMs' MT/s), or memory=460.8GB/s for the "
            "bandwidth",
        ),
        (
            "amd-epyc-9654,cores=8",
            "a named CPU takes only sockets=",
            "--cpu amd-epyc-9654,sockets=2, or its figures alone: --cpu "
            "cores=64,channels=12,mts=4800",
        ),
        ("amd-epyc-9654,intel-xeon-8468", "names two CPUs", "one name, e.g. --cpu amd-epyc-9654"),
        (
            "cores=64",
            "needs cores and the memory",
            "e.g. --cpu cores=64,channels=12,mts=4800, or a name from configs/cpus.toml",
        ),
        (
            "cores=64,channels=12",
            "needs cores and the memory",
            "e.g. --cpu cores=64,channels=12,mts=4800, or a name from configs/cpus.toml",
        ),
        (
            "cores=64,memory=1TB/s,mts=4800",
            "gives the memory twice",
            "one of them: memory=460.8GB/s, or channels=12,mts=4800",
        ),
        (
            "cores=64,memory=1TB/s,channels=8",
            "gives the memory twice",
            "one of them: memory=460.8GB/s, or channels=12,mts=4800",
        ),
        ("cores=0,memory=1TB/s", "--cpu cores='0' is not a positive whole number", FIGS),
        ("cores=2,channels=0,mts=1", "--cpu channels='0' is not a positive whole number", FIGS),
        ("cores=2,channels=1,mts=x", "--cpu mts='x' is not a positive whole number", FIGS),
        (
            "cores=64,memory=fast",
            "--cpu memory='fast'",
            "write it with its unit, e.g. memory=460.8GB/s",
        ),
        ("cores=64,cores=32,memory=1TB/s", "gives cores twice", FIGS),
        (
            "cores=64,ghz=3,memory=1TB/s",
            "unknown figure 'ghz'",
            "the figures are cores, channels, mts, sockets, memory, e.g. --cpu "
            "cores=64,channels=12,mts=4800",
        ),
        ("amd-epyc-9654,sockets=x", "--cpu sockets='x' is not a positive whole number", FIGS),
    ],
)
def test_a_cpu_the_table_cannot_take_is_one_line_with_a_hint(
    text: str, message: str, hint: str
) -> None:
    with pytest.raises(UsageError, match=message) as err:
        parse_cpu(text)
    assert err.value.hint == hint
    assert "\n" not in str(err.value)


def _adam(spp: float = 5e-10, threads: int = 6) -> AdamRate:
    return AdamRate(spp, threads, 2_000_000_000, "sweep", source_label="measured")


def test_cpu_adam_on_the_studys_own_workstation_is_its_measure() -> None:
    """The memory bound is calibrated on the study's workstation: there, one rank's CPU Adam
    is the study's own figure, not bound by memory and not scaled."""
    ref = study_adam()
    assert ref is not None
    study = load_cpus()[STUDY_CPU]
    k = adam_bytes(ref, study)
    assert k == pytest.approx(1.09652 / ref.params * 102.4e9)
    assert 50 < k < 60  # bytes of theoretical bandwidth a parameter: Adam moves about 28
    fitted = fit_adam(ref, study, 1, k)
    assert fitted.seconds_per_param == ref.seconds_per_param
    assert fitted.threads == 6 and "bound by" not in (fitted.note or "")


def test_ranks_share_the_nodes_memory_and_cores_by_hand() -> None:
    node = parse_cpu("intel-xeon-8480+,sockets=2")  # 112 cores, 614.4 GB/s
    k = 56.0
    # 8 ranks: 14 cores each, more than the 6 threads measured; memory: 8 x 56 B a parameter
    # of 614.4 GB/s = 7.29e-10 s, above the measured 5e-10: the memory bounds it
    eight = fit_adam(_adam(), node, 8, k)
    assert eight.threads == 6
    assert eight.seconds_per_param == pytest.approx(8 * 56 / 614.4e9)
    assert eight.source_label == "measured; bound by the node's memory"
    assert eight.note == (
        "CPU Adam on 2 x intel-xeon-8480+: 112 cores, 16 channels of 4800 MT/s, 614.4 GB/s "
        "(theoretical): 14 core(s) a rank of 8; bound by the node's memory: 8 rank(s) at once, "
        "56 bytes of its bandwidth a parameter (the study's Adam where its memory saturates), "
        "0.729 s a billion parameters a rank against 0.500 s at its threads"
    )
    # 2 ranks: 2 x 56 / 614.4e9 = 1.82e-10 < 5e-10: the measured rate stands
    two = fit_adam(_adam(), node, 2, k)
    assert two.seconds_per_param == 5e-10 and two.source_label == "measured"
    # 4 ranks on 8 cores: 2 threads each where Adam was measured at 6: 3x, the most it costs
    small = parse_cpu("cores=8,memory=1000GB/s")
    four = fit_adam(_adam(), small, 4, k)
    assert four.threads == 2
    assert four.seconds_per_param == pytest.approx(3 * 5e-10)
    assert "scaled by 6/2" in (four.note or "")
    # as many cores a rank as it was measured at: neither scaled nor bound
    six = fit_adam(_adam(), parse_cpu("cores=12,memory=1000GB/s"), 2, k)
    assert (six.threads, six.seconds_per_param, six.note) == (
        6,
        5e-10,
        "CPU Adam on 1 x a CPU of 12 cores: 12 cores, 1000.0 GB/s (theoretical): "
        "6 core(s) a rank of 2",
    )
    # a memory bound equal to the measured rate is the measure, not a bound
    even = fit_adam(_adam(), parse_cpu("cores=6,memory=1GB/s"), 1, 0.5)
    assert (even.seconds_per_param, even.source_label) == (5e-10, "measured")
    assert "bound by" not in (even.note or "")
    assert cores_per_rank(parse_cpu("cores=1,memory=1GB/s"), 1) == 1
    assert cores_per_rank(parse_cpu("cores=4,memory=1GB/s"), 0) == 4
    with pytest.raises(UsageError, match="9 ranks on a node of 8 cores") as err:
        fit_adam(_adam(), small, 9, k)
    assert str(err.value) == (
        "9 ranks on a node of 8 cores (1 x a CPU of 8 cores: 8 cores, 1000.0 GB/s "
        "(theoretical)): CPU Adam needs a core a rank"
    )
    assert err.value.hint == (
        "fewer ranks a node (--ranks), or the node's sockets (--cpu NAME,sockets=2)"
    )
    with pytest.raises(UsageError, match="9 ranks on a node of 8 cores"):
        node_adam(None, small, 9)
    assert node_adam(None, small, 8) is None


def test_estimate_with_the_nodes_cpu_prices_adam_and_names_the_memory() -> None:
    """The buyer's command with the node's CPUs: the CPU Adam term is each rank's share at
    the fitted rate, the host memory a limit with its source, nothing said "not known"."""
    r = _cli(
        "--json", "estimate", "opt_nvme_16b", "--ranks", "8", "--baseline", "study",
        "--drive", "samsung-pm9a3-3.84tb", "--drives", "8", "--cpu", "intel-xeon-8480+,sockets=2",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    plan = doc["drives"]
    (row,) = plan["plans"]
    adam = next(t for t in row["terms"] if t["kind"] == "adam")
    share = doc["params"] // 8
    k = adam_bytes(study_adam(), load_cpus()[STUDY_CPU])  # type: ignore[arg-type]
    assert adam["seconds"] == pytest.approx(share * k * 8 / 614.4e9, rel=1e-3)
    assert "bound by the node's memory" in adam["what"]
    mem = next(x for x in plan["limits"] if x["what"].startswith("host memory"))
    assert (mem["value"], mem["unit"], mem["source"]) == (614.4e9, "B/s", "--cpu")
    assert not any("memory bandwidth: not known" in m for m in plan["missing"])
    bad = _cli("estimate", "opt_nvme_16b", "--ranks", "8", "--cpu", "epyc")
    assert bad.exit_code == 2
    assert bad.output.count("\n") == 2 and "give its figures instead" in bad.output


def test_the_tables_rows_as_written(tmp_path: Path) -> None:
    """Each profile's name and AVX-512 as its row gives them; a row without avx512 says
    nothing of it; a table that cannot be read is one line naming the file."""
    table = load_cpus()
    assert table["amd-epyc-9654"].name == "AMD EPYC 9654 (Genoa)"
    assert (table["amd-epyc-9654"].avx512, table["amd-epyc-7763"].avx512) == (True, False)
    assert table["amd-epyc-9654"].sockets == 1
    own = tmp_path / "cpus.toml"
    own.write_text(
        '[cpu.x]\nname = "X"\ncores = 4\nchannels = 2\nmts = 3200\nsource = "s"\n', "utf-8"
    )
    (x,) = load_cpus(own).values()
    assert (x.key, x.name, x.cores, x.avx512, x.memory_bw) == ("x", "X", 4, None, 51.2e9)
    # a name typed for a table of one's own: what parse_cpu looks up
    assert parse_cpu("x,,sockets=3", own).node_cores == 12
    own.write_text("[cpu.x]\nname = 1\n", "utf-8")
    with pytest.raises(UsageError, match=f"cannot read the CPU profiles in {own}") as err:
        load_cpus(own)
    assert err.value.hint == "reinstall iotune"


def test_figures_at_their_edges() -> None:
    """One core is a CPU; an empty part between commas is nothing; a doubled '=' is the
    figure's own (its value refused), not a figure named 'sockets='."""
    assert parse_cpu("cores=1,memory=1GB/s").node_cores == 1
    with pytest.raises(UsageError, match="sockets='=2' is not a positive whole number"):
        parse_cpu("amd-epyc-9654,sockets==2")
    # a spec built by hand with channels but no speed describes no channels
    c = replace(parse_cpu("cores=2,memory=10GB/s"), channels=8)
    assert c.describe() == "1 x a CPU of 2 cores: 2 cores, 10.0 GB/s (theoretical)"


# ------------------------------------------------------------ sweep-threads --ranks, measured


def _threads_doc(tmp_path: Path, rows: list[dict[str, Any]], memory: Any = None) -> Path:
    """A sweep-threads run of the rows given (figures chosen to count by hand)."""
    doc = {"params": 20_000_000, "rows": rows, "best_threads": 2, "memory": memory}
    (tmp_path / "threads.json").write_text(json.dumps(doc))
    return tmp_path


def _row(ranks: int | None, threads: int, params: int, ms: float) -> dict[str, Any]:
    row = {"threads": threads, "params": params, "step_ms_median": ms, "status": "ok"}
    return row if ranks is None else {**row, "ranks": ranks}


def test_cpu_adam_is_taken_with_as_many_ranks_at_once_as_the_run_has(tmp_path: Path) -> None:
    from iotune.plan.measured import adam_rate

    run = _threads_doc(
        tmp_path,
        [
            _row(1, 1, 20_000_000, 20.0),
            _row(1, 2, 20_000_000, 12.0),
            _row(2, 1, 10_000_000, 9.0),
            _row(2, 2, 10_000_000, 8.0),
            _row(4, 2, 5_000_000, 7.0),
            {"threads": 4, "ranks": 2, "params": 10_000_000, "status": "failed"},
        ],
    )
    two = adam_rate(run, 2, ranks=2)
    # 8 ms for each rank's 10M parameters: 0.8 ns a parameter, timed with 2 ranks at once
    assert two.seconds_per_param == pytest.approx(8e-10)
    assert (two.threads, two.params, two.ranks) == (2, 10_000_000, 2)
    assert two.note is None and two.source == str(run / "threads.json")
    assert adam_rate(run, 1, ranks=1).seconds_per_param == pytest.approx(1e-9)
    # 3 ranks: the nearest count timed, the fewer of two as near; said
    three = adam_rate(run, 2, ranks=3)
    assert three.ranks == 2 and three.seconds_per_param == pytest.approx(8e-10)
    assert three.note == (
        "CPU Adam timed with 2 rank(s) at once, the run has 3 (sweep-threads --ranks 3 "
        "times them side by side)"
    )
    eight = adam_rate(run, 4, ranks=8)
    assert (eight.ranks, eight.threads) == (4, 2)
    assert eight.note == (
        "CPU Adam timed at 2 thread(s), the run uses 4; CPU Adam timed with 4 rank(s) at "
        "once, the run has 8 (sweep-threads --ranks 8 times them side by side)"
    )
    # a sweep from before --ranks: its rows are one rank's
    (tmp_path / "old").mkdir()
    old = _threads_doc(tmp_path / "old", [_row(None, 2, 20_000_000, 12.0)])
    alone = adam_rate(old, 2, ranks=2)
    assert alone.ranks == 1 and alone.seconds_per_param == pytest.approx(6e-10)
    assert alone.note is not None and alone.note.startswith("CPU Adam timed with 1 rank(s)")


def test_the_hosts_memory_bandwidth_from_a_thread_sweep(tmp_path: Path) -> None:
    from iotune.records import threads_memory

    best = {"threads": 2, "triad_bytes_s": 45.5e9}
    run = _threads_doc(tmp_path, [_row(1, 1, 10, 1.0)], {"rows": [], "best": best})
    assert threads_memory(run) == (45.5e9, f"{run / 'threads.json'}: STREAM triad at 2 thread(s)")
    for memory in (None, {"error": "killed"}, {"best": {"threads": 1, "triad_bytes_s": 0}}):
        assert threads_memory(_threads_doc(tmp_path, [_row(1, 1, 10, 1.0)], memory)) is None


def test_cpu_adam_timed_with_the_nodes_ranks_is_not_fitted_again() -> None:
    """Timed with R ranks at once, CPU Adam has the cores and the memory they share in its
    figure: --cpu does not scale it or bound it again, and still refuses more ranks than
    cores; timed with fewer ranks, it is fitted."""
    node = parse_cpu("intel-xeon-8480+,sockets=2")
    timed = replace(_adam(7e-10, 14), ranks=8)
    got = node_adam(timed, node, 8)
    assert got is not None
    assert (got.seconds_per_param, got.threads, got.ranks) == (7e-10, 14, 8)
    assert got.note == (
        "CPU Adam timed with 8 ranks at once (sweep), not fitted to 2 x intel-xeon-8480+: "
        "112 cores, 16 channels of 4800 MT/s, 614.4 GB/s (theoretical) (14 core(s) a rank)"
    )
    assert got.source_label == "measured"
    noted = node_adam(replace(timed, note="CPU Adam timed at 2 thread(s)"), node, 8)
    assert noted is not None and noted.note is not None
    assert noted.note.startswith("CPU Adam timed at 2 thread(s); CPU Adam timed with 8 ranks")
    # timed alone: fitted (its threads cut to the 14 cores a rank gets is no cut; memory is)
    fitted = node_adam(_adam(5e-10, 6), node, 8)
    assert fitted is not None and fitted.seconds_per_param != 5e-10
    # one rank timed alone, one rank planned: fitted, as before
    one = node_adam(_adam(5e-10, 6), node, 1)
    assert one is not None and "a rank of 1" in (one.note or "")
    # two ranks, the fewest a node shares: timed with two, taken as timed
    pair = node_adam(replace(_adam(7e-10, 14), ranks=2), node, 2)
    assert pair is not None and pair.seconds_per_param == 7e-10
    assert (pair.note or "").startswith("CPU Adam timed with 2 ranks at once")
    with pytest.raises(UsageError, match="9 ranks on a node of 8 cores"):
        node_adam(replace(_adam(), ranks=9), parse_cpu("cores=8,memory=100GB/s"), 9)


def test_estimate_takes_cpu_adam_and_the_memory_from_a_sweep_of_the_nodes_ranks(
    tmp_path: Path,
) -> None:
    """`estimate --ranks 2 --threads-config RUN` where RUN timed 2 ranks at once: the CPU
    Adam term is each rank's share at that rate, said so; the host memory is RUN's triad;
    with --cpu as well, CPU Adam stays as timed and the memory is --cpu's."""
    run = _threads_doc(
        tmp_path,
        [_row(1, 2, 20_000_000, 12.0), _row(2, 2, 10_000_000, 9.0)],
        {"rows": [], "best": {"threads": 2, "triad_bytes_s": 40e9}},
    )
    args = ("--json", "estimate", "opt_nvme_16b", "--ranks", "2", "--baseline", "study")
    plan_args = ("--threads-config", str(run), "--drive", "samsung-pm9a3-3.84tb", "--drives", "8")
    docs = []
    for extra in ((), ("--cpu", "amd-epyc-9654")):
        r = _cli(*args, *plan_args, *extra)
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.stdout))
    measured, with_cpu = docs
    for doc in (measured, with_cpu):
        (row,) = doc["drives"]["plans"]
        adam = next(t for t in row["terms"] if t["kind"] == "adam")
        share = doc["params"] // 2
        assert adam["seconds"] == pytest.approx(share * 9.0e-3 / 10_000_000, rel=1e-3)
        assert (
            f"each of 2 ranks' {share / 1e9:.2f}B parameters at 2 thread(s), timed with 2 "
            in (adam["what"])
        )
    mem = [
        next((x["value"], x["source"]) for x in d["drives"]["limits"] if "memory" in x["what"])
        for d in (measured, with_cpu)
    ]
    assert mem == [
        (40e9, f"{run / 'threads.json'}: STREAM triad at 2 thread(s)"),
        (460.8e9, "--cpu"),
    ]


def test_nodes_split_the_model_and_each_plans_its_own_drives() -> None:
    """`--nodes 2` of 8 ranks: ZeRO partitions over 16 ranks, so a node swaps half of what
    one node of 8 swaps (the hand count: 16 bytes a parameter of its ranks' shares, read and
    written each step); K drives are a node's, shown per GPU and in all."""
    args = (
        *("estimate", "opt_nvme_16b", "--ranks", "8", "--baseline", "study"),
        *("--drive", "samsung-pm9a3-3.84tb", "--drives", "8,16"),
    )
    one, two = (
        json.loads(_cli("--json", *args, *extra).stdout) for extra in ((), ("--nodes", "2"))
    )
    assert (one["ranks"], one["world"], two["ranks"], two["world"]) == (8, 8, 8, 16)
    assert two["drives"]["node"] == {"ranks": 8, "nodes": 2}
    assert one["drives"]["node"] == {"ranks": 8, "nodes": 1}
    assert all(type(v) is int for v in two["drives"]["node"].values())
    lone = json.loads(_cli("--json", *args[:2], *args[4:], "--nodes", "2").stdout)
    assert lone["drives"]["node"] == {"ranks": 1, "nodes": 2}  # one GPU a node, two nodes
    for doc in (one, two):
        sw = doc["swapped"]
        assert doc["steady_step"]["read"] == (12 * sw["n_s"] + 4 * sw["n_g"]) * 8
    assert two["swapped"]["n_s"] * 2 == one["swapped"]["n_s"]  # each rank's share halves
    assert two["steady_step"]["read"] == one["steady_step"]["read"] // 2

    # the swaps' time halves with the bytes, at the same K; what the gradients' writes add
    # after backward at most halves: the backward they hide behind stays (each end of
    # predict.gradient_tail is the writing's share less a part of backward)
    def swaps(p: dict[str, Any]) -> float:
        return float(sum(t["seconds"] for t in p["terms"] if t["kind"] in ("read", "write")))

    def grads(p: dict[str, Any]) -> float:
        return float(sum(t["seconds"] for t in p["terms"] if t["kind"] == "gradients"))

    for a, b in zip(one["drives"]["plans"], two["drives"]["plans"], strict=True):
        assert swaps(b) == pytest.approx(swaps(a) / 2, abs=2e-3)
        assert 0 < grads(b) <= grads(a) / 2 + 2e-3, (a["terms"], b["terms"])
        assert b["io_s"] == pytest.approx(swaps(b) + grads(b), abs=2e-3)
        assert grads(a) > 0
    text = _cli(*args, "--nodes", "2").stdout
    assert re.search(r"^DRIVES  PER GPU  IN ALL  READ GiB/s", text, re.M)
    assert re.search(r"^     8        1      16 ", text, re.M)
    assert re.search(r"^    16        2      32 ", text, re.M)
    assert (
        "  K drives on each node, shared by its 8 rank(s), a GPU each; 2 nodes, each with " in text
    )
    assert "PER GPU" not in _cli(*args[:2], "--baseline", "study", "--drives", "8",
                                 "--drive", "samsung-pm9a3-3.84tb").stdout  # fmt: skip
    bad = _cli("estimate", "opt_nvme_16b", "--nodes", "0")
    assert bad.exit_code == 2 and "--nodes" in bad.output
