"""The CPU presets' dtype: `tiny_opt_nvme`'s steady step against the same model's plain-torch
forward + backward plus its swap time at the drive's bandwidth, side by side in one run.

Each round, for each host variant (this CPU as it is, and oneDNN capped at AVX2 with
ONEDNN_MAX_CPU_ISA=AVX2, which emulates bf16 as a CPU without AVX-512 BF16/AMX does):
  * plain torch: the tiny Llama (h512 i1536 L4, vocab 32000, 512 tokens, gradient
    checkpointing) forward + backward in float32 and bf16, median of 5 after a warm-up;
  * `iotune run tiny_opt_nvme` (dtype auto) on an ext4 loop device with direct I/O over a
    file under --dir, its steady step (median of steps 2..N), and with --bf16-too the same
    run forced to bf16;
  * the drive's bandwidth, by fio (512 KiB sequential reads and writes, O_DIRECT, iodepth 8),
    so that swap time = steady read bytes / read bandwidth + write bytes / write bandwidth.

Goal: with bf16 emulated, steady step <= 1.5 x (float32 forward + backward + swap time);
on this CPU as it is, dtype auto is no slower than bf16 was.

    sudo .venv/bin/python benchmarks/cpu_dtype.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.loopdev import loop_device

IOTUNE = str(Path(sys.executable).parent / "iotune")
EMULATED = {"ONEDNN_MAX_CPU_ISA": "AVX2"}

PLAIN = r"""
import json, statistics, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from iotune.model.presets import get_preset
p = get_preset("tiny_opt_nvme")
out = {}
reps = {"fp32": int(sys.argv[1]), "bf16": int(sys.argv[2])}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    torch.manual_seed(0)
    cfg = LlamaConfig(**p.geometry.llama_config()); cfg.use_cache = False
    m = LlamaForCausalLM(cfg).to(dt)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    ids = torch.randint(0, cfg.vocab_size, (1, p.seq_len))
    runs = []
    for i in range(reps[name] + 1):
        t0 = time.perf_counter(); loss = m(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter(); loss.backward(); t2 = time.perf_counter()
        m.zero_grad(set_to_none=True)
        if i:
            runs.append((t1 - t0, t2 - t1))
    out[name] = {"forward_s": statistics.median(r[0] for r in runs),
                 "backward_s": statistics.median(r[1] for r in runs)}
print(json.dumps(out))
"""


def plain(env: dict[str, str], reps: int) -> dict[str, dict[str, float]]:
    """Median forward and backward seconds per dtype; emulated bf16 (~35 s a backward) is
    timed once after its warm-up."""
    bf16_reps = 1 if env else reps
    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(reps), str(bf16_reps)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    times: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return times


def fio_bw(directory: Path) -> dict[str, float]:
    """Bytes per second, sequential 512 KiB direct I/O (write first: reads need the data)."""
    out = {}
    for rw in ("write", "read"):
        done = subprocess.run(
            [
                "fio",
                "--name=bw",
                f"--directory={directory}",
                "--size=512M",
                "--bs=512k",
                f"--rw={rw}",
                "--direct=1",
                "--ioengine=libaio",
                "--iodepth=8",
                "--runtime=8",
                "--time_based",
                "--output-format=json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        job = json.loads(done.stdout)["jobs"][0][rw]
        out[rw] = job["bw_bytes"]
    for f in directory.glob("bw.*"):
        f.unlink()
    return out


def run(mnt: Path, env: dict[str, str], steps: int, sets: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [IOTUNE, "--json", "run", "tiny_opt_nvme", "--nvme-path", str(mnt)]
        argv += ["--steps", str(steps), "--out", f"{tmp}/r", *sets]
        done = subprocess.run(
            argv, capture_output=True, text=True, check=True, env={**os.environ, **env}
        )
    doc = json.loads(done.stdout)
    steady = [e for e in doc["events"] if e["event"] == "step"][1:]
    return {
        "dtype": doc["dtype"]["name"],
        "step_s": statistics.median(e["step_s"] for e in steady),
        "forward_s": statistics.median(e["forward_s"] for e in steady),
        "backward_s": statistics.median(e["backward_s"] for e in steady),
        "optimizer_s": statistics.median(e["optimizer_s"] for e in steady),
        "read": doc["estimate"]["steady_step"]["read"],
        "write": doc["estimate"]["steady_step"]["write"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="plain-torch repetitions")
    ap.add_argument(
        "--dir",
        default="/var/tmp",  # noqa: S108 - a disk-backed folder, on purpose
        help="the loop device's backing file's folder",
    )
    ap.add_argument("--bf16-too", action="store_true", help="also force bf16 (slow if emulated)")
    args = ap.parse_args()
    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    print(f"host: {os.cpu_count()} cpus, native bf16 in cpuinfo: {native}")
    rows: dict[str, list[dict[str, float]]] = {}
    with loop_device(args.dir, mib=3072, filled=False, direct_io=True) as dev:
        mnt = Path(tempfile.mkdtemp(prefix="iotune-dtype-"))
        subprocess.run(["mkfs.ext4", "-q", dev], check=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
        try:
            for r in range(args.rounds):
                bw = fio_bw(mnt)
                print(f"round {r + 1}: drive read {bw['read'] / 2**20:.0f} MiB/s, "
                      f"write {bw['write'] / 2**20:.0f} MiB/s")  # fmt: skip
                for variant, env in (("as is", {}), ("AVX2 (bf16 emulated)", EMULATED)):
                    torch_s = plain(env, args.reps)
                    variants: list[tuple[str, list[str]]] = [("auto", [])]
                    if args.bf16_too:
                        variants.append(("bf16", ["--set", "dtype=bf16"]))
                    for label, sets in variants:
                        got = run(mnt, env, args.steps, sets)
                        dt = str(got["dtype"])
                        ref = torch_s["fp32"]["forward_s"] + torch_s["fp32"]["backward_s"]
                        swap = float(got["read"]) / bw["read"] + float(got["write"]) / bw["write"]
                        row = {
                            "step_s": float(got["step_s"]),
                            "fwd_bwd_s": float(got["forward_s"]) + float(got["backward_s"]),
                            "torch_fp32_s": ref,
                            "torch_bf16_s": torch_s["bf16"]["forward_s"]
                            + torch_s["bf16"]["backward_s"],
                            "swap_s": swap,
                            "ratio": float(got["step_s"]) / (ref + swap),
                        }
                        key = f"{variant}, dtype {label} -> {dt}"
                        rows.setdefault(key, []).append(row)
                        print(f"  {key}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
            mnt.rmdir()
    print()
    head = ("variant", "step s", "fwd+bwd s", "torch fp32 s", "torch bf16 s", "swap s", "ratio")
    print(f"{head[0]:42s}" + "".join(f"{h:>14s}" for h in head[1:]))
    for key, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        cols = ("step_s", "fwd_bwd_s", "torch_fp32_s", "torch_bf16_s", "swap_s", "ratio")
        print(f"{key:42s}" + "".join(f"{med[c]:14.3f}" for c in cols))
    print("ratio = steady step / (plain-torch float32 forward + backward + swap time at the "
          "drive's bandwidth); goal <= 1.5 with bf16 emulated")  # fmt: skip


if __name__ == "__main__":
    main()
