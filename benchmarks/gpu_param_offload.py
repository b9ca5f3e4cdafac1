"""GPU tier: which parameters DeepSpeed reads back from the drive with the parameters on NVMe,
measured against iotune's I/O model (iotune/model/swapfiles.py parameter_placement).

A Hugging Face Trainer script (tests/data/custom/trainer_script.py: TrainingArguments with
the DeepSpeed config, gradient checkpointing, bf16 on a GPU, random tokens) trains a 0.29B
Llama-geometry model (h1024 i3584 L16, vocab 32000, random init, no download) under the
Trainer's documented ZeRO-3 template with the parameters on NVMe
(tests/data/custom/hf_zero3_params_nvme.json: offload_param buffer_count 5, buffer_size 1e8,
stage3_max_live_parameters and stage3_max_reuse_distance 1e9, "auto" elsewhere), micro-batch
1, GA 4, 3 optimizer steps, each run under `iotune trace --model --ds-config -- ...`, in these
settings (--settings picks some):

    template      the template as documented: max_in_cpu is DeepSpeed's default (1e9
                  elements), the whole model stays in CPU memory: 16N each way a step
    max_in_cpu_0  offload_param.max_in_cpu 0: every parameter is read back from the drive at
                  each use and written after each step (buffers sized to hold them all)
    max_live      max_in_cpu 0 and stage3_max_live_parameters 9,175,040 (2.5 x h x i,
                  where the template's is 1e9): the live limit only bounds the prefetch,
                  the bytes are max_in_cpu_0's
    persist       max_in_cpu 0 and stage3_param_persistence_threshold 3,670,016 (h x i):
                  the layers' matrices persist (read once a step), the embedding and output
                  layer do not; the prefetch off (DeepSpeed 0.19.8 fails with it here)
    half          (not in the default four) max_in_cpu N/2 with sub-groups of N/8: the first
                  sub-groups stay in CPU memory, the rest on the drive

One command on one H100 or H200 (about 6 minutes), from the repository root with .whl/,
.debs/ and .bpf/ carried (benchmarks/gpu_carry.sh fills them), as root:

    . benchmarks/gpu_env.sh && . benchmarks/gpu_libbpf.sh && python3 benchmarks/gpu_param_offload.py

$OUT (or --out) gets param_offload.json and param_offload.md: each setting's steady steps'
measured read and write bytes beside the estimate's, the first step and initialisation too;
and per setting its DeepSpeed config, the trace's JSON and the tail of its stderr. A setting
that would not finish within --budget seconds (480) is skipped and says so.

--cpu runs the same on a CPU host with a tiny model of the same geometry's shape (h256 L2,
float32, 32 tokens: a check of this script, not a measurement of interest); --dry prints the
configs and commands and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from iotune.model.geometry import Geometry  # noqa: E402

TEMPLATE = REPO / "tests" / "data" / "custom" / "hf_zero3_params_nvme.json"
TRAINER = REPO / "tests" / "data" / "custom" / "trainer_script.py"
GIB = 2**30
STEPS = 3
GA = 4
MICRO_BATCH = 1

#: the model trained: 292,062,208 parameters (untied); and the CPU check's
GPU_MODEL = Geometry(
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    vocab_size=32000,
    max_position_embeddings=2048,
)
CPU_MODEL = Geometry(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    vocab_size=4096,
    max_position_embeddings=512,
)


@dataclass(frozen=True)
class Setting:
    name: str
    about: str
    zero: dict[str, Any] = field(default_factory=dict)  # zero_optimization keys
    param: dict[str, Any] = field(default_factory=dict)  # offload_param keys


def settings(g: Geometry, element: int) -> dict[str, Setting]:
    """The settings, for a model of geometry *g* whose parameters have *element* bytes."""
    tensors = [n for _, n in g.tensors()]
    largest = max(tensors)
    # every parameter of at least 1 MiB gets a file; at reuse distance 1e9 (the template's)
    # DeepSpeed holds each one's buffer from forward to backward, and persistent ones from
    # the step's gather to the next step: one buffer each, two spare
    files = sum(1 for n in tensors if element * n >= 1 << 20)
    stream = {"max_in_cpu": 0, "buffer_count": files + 2, "buffer_size": largest}
    layer = g.hidden_size * g.intermediate_size  # the largest matrix of a layer
    live = 10 * layer // 4  # a few layers' worth: the prefetch is cut short
    n = sum(tensors)
    return {
        s.name: s
        for s in (
            Setting("template", "the Trainer's template as documented (max_in_cpu: default 1e9)"),
            Setting("max_in_cpu_0", "offload_param.max_in_cpu 0", param=stream),
            Setting(
                "max_live",
                f"max_in_cpu 0, stage3_max_live_parameters {live:,}",
                zero={"stage3_max_live_parameters": live},
                param=stream,
            ),
            # DeepSpeed 0.19.8's NVMe prefetch takes a persistent parameter's file again
            # once its gather has freed the swap buffer, and stops ("param 7 already
            # assigned swap buffer id 6", seen on the CPU): no prefetch here
            Setting(
                "persist",
                f"max_in_cpu 0, stage3_param_persistence_threshold {layer:,}, "
                "stage3_prefetch_bucket_size 0",
                zero={
                    "stage3_param_persistence_threshold": layer,
                    "stage3_prefetch_bucket_size": 0,
                },
                param=stream,
            ),
            Setting(
                "half",
                f"max_in_cpu {n // 2:,}, sub_group_size {n // 8:,}",
                zero={"sub_group_size": n // 8},
                param={**stream, "max_in_cpu": n // 2},
            ),
        )
    }


def ds_config(s: Setting, swap: Path) -> dict[str, Any]:
    """The template with the setting's changes and this run's swap folder."""
    cfg: dict[str, Any] = json.loads(TEMPLATE.read_text())
    zo = cfg["zero_optimization"]
    zo.update(s.zero)
    zo["offload_param"].update(s.param)
    for sec in ("offload_optimizer", "offload_param"):
        zo[sec]["nvme_path"] = str(swap)
    return cfg


def model_dir(g: Geometry, where: Path) -> Path:
    """A config.json transformers builds the model from (random init: no weights)."""
    where.mkdir(parents=True, exist_ok=True)
    doc = {
        **g.llama_config(),
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "use_cache": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (where / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return where


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return subprocess.CompletedProcess(
            argv, 124, out, err + f"\ntimed out after {timeout:.0f} s"
        )


def gib(b: float) -> float:
    return round(b / GIB, 4)


def diff(measured: float, predicted: float) -> float | None:
    return round(100 * (measured - predicted) / predicted, 2) if predicted else None


def summarise(trace: dict[str, Any], est: dict[str, Any]) -> dict[str, Any]:
    """The trace's steps (cut where DeepSpeed rewrote its swap files) beside the estimate."""
    script = trace.get("script") or {}
    rows = script.get("rows") or []
    steady = [r for r in rows if r["label"].startswith("step:") and int(r["label"][5:]) >= 2]
    out: dict[str, Any] = {
        "steps_found": script.get("steps_found"),
        "late_cuts": script.get("late_cuts"),
        "estimate_from": script.get("estimate_from"),
        "rows": rows,
    }
    n = est["params"]
    if steady:
        out["steady"] = {
            op: {
                "measured": int(statistics.median(r["measured"][op] for r in steady)),
                "predicted": steady[0]["predicted"][op],
                "estimate": est["steady_step"][op],
            }
            for op in ("read", "write")
        }
        for op, v in out["steady"].items():
            v["measured_per_n"] = round(v["measured"] / n, 3)
            v["predicted_per_n"] = round(v["predicted"] / n, 3)
            v["diff_pct"] = diff(v["measured"], v["predicted"])
            out["steady"][op] = v
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Parameters on NVMe: steady steps measured vs estimated ({doc['device']})",
        "",
        f"Model: {doc['model']['describe']}, N = {doc['model']['params']:,}; micro-batch "
        f"{MICRO_BATCH}, GA {GA}, {doc['seq_len']} tokens, {STEPS} steps, {doc['dtype']}; "
        "bytes of the median steady step (steps 2 and 3).",
        "",
        "| setting | what changes | N_r / N_k (of N_p) | read measured | predicted | diff "
        "| write measured | predicted | diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["results"]:
        s = r.get("steady")
        sw = (r.get("estimate") or {}).get("swapped") or {}
        kept = f"{sw.get('n_r', 0):,} / {sw.get('n_k', 0):,} (of {sw.get('n_p', 0):,})"
        if not s:
            why = r.get("skipped") or f"exit {r.get('exit_code')}: no steady step traced"
            lines.append(f"| {r['setting']} | {r['about']} | {kept} | {why} | | | | | |")
            continue
        rd, wr = s["read"], s["write"]
        lines.append(
            f"| {r['setting']} | {r['about']} | {kept} "
            f"| {gib(rd['measured'])} GiB ({rd['measured_per_n']}N) "
            f"| {gib(rd['predicted'])} GiB ({rd['predicted_per_n']}N) | {rd['diff_pct']}% "
            f"| {gib(wr['measured'])} GiB ({wr['measured_per_n']}N) "
            f"| {gib(wr['predicted'])} GiB ({wr['predicted_per_n']}N) | {wr['diff_pct']}% |"
        )
    lines += ["", "Every traced interval (GiB, measured / predicted):", ""]
    for r in doc["results"]:
        for row in r.get("rows") or []:
            m, p = row["measured"], row["predicted"]
            lines.append(
                f"- {r['setting']} {row['label']}: read {gib(m['read'])} / {gib(p['read'])}, "
                f"write {gib(m['write'])} / {gib(p['write'])}"
            )
    return "\n".join(lines) + "\n"


def machine() -> str:
    if shutil.which("nvidia-smi"):
        p = run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            dict(os.environ),
            30,
        )
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0]
    return "CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="template,max_in_cpu_0,max_live,persist")
    ap.add_argument("--out", default=os.environ.get("OUT", "param-offload-out"))
    # the GPU machines' own disk, as the other GPU scripts use it
    ap.add_argument("--nvme-path", default="/var/tmp/offload/param-offload")  # noqa: S108
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all settings")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--cpu", action="store_true", help="a tiny model on the CPU (a check)")
    ap.add_argument("--dry", action="store_true", help="print configs and commands only")
    args = ap.parse_args()
    start = time.monotonic()
    g = CPU_MODEL if args.cpu else GPU_MODEL
    dtype = "fp32" if args.cpu else "bf16"
    element = 4 if args.cpu else 2
    seq = args.seq_len or (32 if args.cpu else 1024)
    table = settings(g, element)
    names = [x for x in args.settings.split(",") if x]
    unknown = [x for x in names if x not in table]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(table)}")
    out = Path(args.out).resolve()
    work = out / "work"
    model = model_dir(g, work / "model")
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu" if args.cpu else "cuda",
        "PYTHONUNBUFFERED": "1",
    }
    # DeepSpeed's ops built once for all runs: a virtualenv's own cache where iotune keeps
    # them (iotune.proc.worker_env), else the folder the other GPU scripts build into
    venv_ops = Path(sys.prefix) / "var" / "torch_extensions"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(venv_ops) if venv_ops.is_dir() else "/tmp/tx")  # noqa: S108
    common = [
        *("--model", str(model), "--seq-len", str(seq)),
        *("--micro-batch", str(MICRO_BATCH), "--ga", str(GA), "--set", f"dtype={dtype}"),
        *(("--set", "accelerator=cpu") if args.cpu else ()),
    ]
    iot = [sys.executable, "-m", "iotune", "--json"]
    plans = []
    for name in names:
        s = table[name]
        swap = Path(args.nvme_path) / name
        here = work / name
        here.mkdir(parents=True, exist_ok=True)
        cfg_path = here / "ds.json"
        cfg_path.write_text(json.dumps(ds_config(s, swap), indent=2) + "\n")
        child = [sys.executable, str(TRAINER), str(model), str(cfg_path), str(STEPS), str(seq)]
        child += [str(MICRO_BATCH), str(GA)]
        trace = [*iot, "trace", *common, "--ds-config", str(cfg_path), "--out", str(here / "run")]
        trace += ["--", *child]
        estimate = [*iot, "estimate", *common, "--ds-config", str(cfg_path)]
        plans.append((s, swap, here, trace, estimate))
        if args.dry:
            print(f"== {name}: {s.about}\n{cfg_path.read_text()}{' '.join(estimate)}")
            print(" ".join(trace))
    if args.dry:
        return
    # DeepSpeed's ops built once, before any timed run, while iotune estimates each setting
    build = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; "
            "AsyncIOBuilder().load(); CPUAdamBuilder().load()",
        ],
        stdout=(work / "build.txt").open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        futures = {s.name: pool.submit(run, e, env, 300) for s, _, _, _, e in plans}
        estimates = {name: f.result() for name, f in futures.items()}
    print(f"estimated at {time.monotonic() - start:.0f} s", flush=True)
    print(f"ops built: exit {build.wait(timeout=600)} at {time.monotonic() - start:.0f} s")
    results = []
    for i, (s, swap, here, trace, _) in enumerate(plans):
        rec: dict[str, Any] = {
            "setting": s.name,
            "about": s.about,
            "zero": s.zero,
            "param": s.param,
        }
        e = estimates[s.name]
        rec["estimate"] = json.loads(e.stdout) if e.returncode == 0 else None
        if rec["estimate"] is None:
            rec["estimate_error"] = e.stderr[-2000:]
        left = args.budget - (time.monotonic() - start)
        if left < 60:
            rec["skipped"] = f"skipped: {left:.0f} s of the budget left"
            results.append(rec)
            print(f"== {s.name}: {rec['skipped']}", flush=True)
            continue
        shutil.rmtree(swap, ignore_errors=True)
        swap.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        p = run(trace, {**env, "MASTER_PORT": str(29541 + i)}, left)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec["exit_code"] = p.returncode
        (here / "trace.json").write_text(p.stdout)
        (here / "trace.err").write_text(p.stderr[-20000:])
        shutil.rmtree(swap, ignore_errors=True)
        try:
            doc = json.loads(p.stdout)
        except json.JSONDecodeError:
            doc = None
        if doc is not None and rec["estimate"] is not None:
            rec.update(summarise(doc, rec["estimate"]))
        results.append(rec)
        st = rec.get("steady") or {}
        print(
            f"== {s.name}: exit {p.returncode} in {rec['seconds']} s; steady "
            + ", ".join(
                f"{op} {v['measured_per_n']}N measured, {v['predicted_per_n']}N predicted"
                for op, v in st.items()
            ),
            flush=True,
        )
    doc = {
        "device": machine(),
        "dtype": dtype,
        "seq_len": seq,
        "model": {"describe": g.describe(), "params": g.param_count()},
        "command": " ".join(sys.argv),
        "seconds": round(time.monotonic() - start, 1),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "param_offload.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "param_offload.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
