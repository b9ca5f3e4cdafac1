"""The transcript of docs/from-bare-drives.md: from six bare NVMe drives to a measured save
and a resume, every command as the page shows it, run in a QEMU guest of the
vm tier (tests/vm/guest.py: the distribution's kernel, QEMU's emulated NVMe drives, this
checkout and its virtualenv), its output written to OUT (Markdown, one block a command).

    python3 scripts/recipe_vm.py OUT

Needs what the vm tier needs (root, QEMU, virtme-ng: docs/tests.md). About 20 minutes on a
2-core host without KVM.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOP))

from tests.vm import guest_ops  # noqa: E402
from tests.vm.guest import Drive, Guest  # noqa: E402
from tests.vm.study_lab import SET_ARGS, ZYGOTE, wait_for  # noqa: E402

#: the offload drives, then the checkpoint drives (the page's nvme0n1..nvme5n1)
SERIALS = ("OFF0", "OFF1", "CK0", "CK1", "CK2", "CK3")
#: the runs' and the report's folders, in the guest (its /mnt is a tmpfs)
RUNS = "/mnt/runs"


def commands(names: dict[str, str]) -> list[list[str]]:
    off = [f"/dev/{names[s]}" for s in SERIALS[:2]]
    ck = [f"/dev/{names[s]}" for s in SERIALS[2:]]
    # the tiny preset cut as the lab cuts it (tests/vm/study_lab.py): the guest's CPU is
    # emulated, and its full step takes many minutes there
    run = ["tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/mnt/offload"]
    saves = ["--checkpoint-every", "1", "--checkpoint-copy", "reflink"]
    saves += ["--checkpoint-dir", "/mnt/offload/snap", "--checkpoint-persist", "/mnt/ckpt/ck"]
    # from the first save, two steps: the second shows Adam's state came back, not only the
    # weights (iotune.workers.checkpoints.restore_swapped_adam)
    resume = ["--resume-from", "/mnt/ckpt/ck/step1", "--checkpoint-copy", "aio"]
    offload = ["--name", "offload", "--mount", "/mnt/offload"]
    ckpt = ["--level", "6", "--name", "ckpt", "--mount", "/mnt/ckpt", "--yes"]
    return [
        ["iotune", "devices"],
        ["iotune", "raid", "create", *off, *offload],
        ["iotune", "raid", "create", *off, *offload, "--yes"],
        ["iotune", "raid", "create", *ck, *ckpt],
        ["mdadm", "--wait", "/dev/md/ckpt"],
        ["iotune", "raid", "status"],
        ["iotune", "trace", "--run", *run, "--steps", "3", *saves, "--out", f"{RUNS}/saving"],
        ["iotune", "run", *run, "--steps", "2", *resume, "--out", f"{RUNS}/resumed"],
        ["iotune", "report", f"{RUNS}/saving", f"{RUNS}/resumed", "--out", f"{RUNS}/report"],
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    env = {**guest_ops.build(guest_ops.default_dir()), "IOTUNE_ZYGOTE": ZYGOTE, "COLUMNS": "100"}
    env["MPLCONFIGDIR"] = (
        "/mnt/.matplotlib"  # the guest's home is the host's, read-only; /mnt a tmpfs
    )
    work = Path(tempfile.mkdtemp(prefix="iotune-recipe-vm-"))
    drives = [Drive(s, size_mib=2048 if s.startswith("OFF") else 1024) for s in SERIALS]
    guest = Guest(
        work,
        drives,
        memory="4G",
        qemu_opts=("-accel", "tcg,thread=multi,tb-size=1024"),
        rwdirs=(guest_ops.default_dir(),),
    )
    bin_dir = Path(sys.executable).parent
    try:
        guest.start(timeout=900)
        guest.spawn(
            [sys.executable, "-m", "iotune.workers.zygote", "serve", ZYGOTE],
            guest.share / "zygote.log",
            env,
        )
        # the guest's own plumbing, not the page's: the drivers, and /mnt writable
        guest.run(["modprobe", "-a", "nvme", "md_mod", "raid0", "raid456"]).check()
        guest.run(["mount", "-t", "tmpfs", "mnt", "/mnt"]).check()
        names = guest.by_serial()
        blocks = []
        for cmd in commands(names):
            if cmd[:3] == ["iotune", "trace", "--run"]:
                # the zygote's imports (minutes of emulated CPU) done before the first run
                wait_for(guest.share / "zygote.log", "imported in", 1800)
            t0 = time.monotonic()
            exe = str(bin_dir / cmd[0]) if cmd[0] == "iotune" else cmd[0]
            r = guest.run([exe, *cmd[1:]], timeout=3600, env=env)
            took = time.monotonic() - t0
            text = (r.stdout + r.stderr).rstrip()
            blocks.append(
                f"```\n$ {shlex.join(cmd)}\n{text}\n```\n<!-- rc {r.rc}, {took:.0f} s -->\n"
            )
            print(f"{shlex.join(cmd)}: rc {r.rc}, {took:.0f} s", file=sys.stderr, flush=True)
        report = guest.run(["cat", f"{RUNS}/report/report.md"], timeout=60)
        blocks.append(f"report.md:\n\n{report.stdout}\n")
        out.write_text(
            f"guest drives: {names}\n\n" + "\n".join(blocks),
        )
    finally:
        guest.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
