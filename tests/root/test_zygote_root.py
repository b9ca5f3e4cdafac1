"""The tier's zygote (tests/root/conftest.py) loads DeepSpeed's ops once, so a worker forked
from it finds them in DeepSpeed's own cache and a run's op check returns at once; a worker
whose environment names other builds (another extension folder, another compiler) loads its
own and never the zygote's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from iotune.proc import ZYGOTE_ENV, command, worker_env
from iotune.workers.zygote import OPS


def _prepare(env: dict[str, str]) -> dict[str, object]:
    argv = command(
        "iotune.workers.torch_probe",
        *("--prepare", "--ops", ",".join(OPS), "--no-warm", "--accelerator", "cpu"),
    )
    assert argv[2:5] == ["iotune.workers.zygote", "client", os.environ[ZYGOTE_ENV]], argv
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_forked_worker_finds_the_zygotes_ops_and_one_with_other_builds_does_not(
    tmp_path: Path,
) -> None:
    env = {**os.environ, **worker_env()}
    env.pop("DS_ACCELERATOR", None)  # as the tier's zygote was started
    # unset, and set to the accelerator DeepSpeed chose (as iotune's runs set it on a host
    # without a GPU): the same builds, and DeepSpeed's table of them kept from the zygote,
    # so that no worker compiles and links its test programs again
    for accelerator in ({}, {"DS_ACCELERATOR": "cpu"}):
        report = _prepare({**env, **accelerator})
        ops = report["ops"]
        assert isinstance(ops, dict) and set(ops) == set(OPS)
        for name, entry in ops.items():
            assert entry["loaded"] is True and entry["cached"] is True, (accelerator, name, entry)
        assert report["ops_table_kept"] is True, accelerator
    # another extension folder and a compiler that fails: the worker builds its own, and fails
    other = {**env, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CXX": "/bin/false"}
    report = _prepare(other)
    assert report["ops_table_kept"] is False  # worked out again for its own compiler
    ops = report["ops"]
    assert isinstance(ops, dict)
    for name, entry in ops.items():
        assert entry["cached"] is False and entry["loaded"] is False, (name, entry)
        assert "error" in entry, (name, entry)
