"""The CLI's contract: exit codes, one-line errors with a hint, JSON on stdout."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune import doctor
from iotune.checks import Check, Family, Status
from iotune.cli import devices as devices_cli
from iotune.cli.options import interrupted_exit, workload_exit, workload_failed
from iotune.probes.host import RecordedHost

DATA = Path(__file__).resolve().parent.parent / "data"


def invoke(*args: str) -> tuple[int, str, str]:
    runner = CliRunner()
    result = runner.invoke(cli_mod.cli, list(args), prog_name="iotune")
    return result.exit_code, result.stdout, result.stderr


def one_error(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    assert len(lines) == 2, stderr
    assert lines[0].startswith("iotune: error: ")
    assert lines[1].startswith("hint: ")
    return lines


def test_help_explains_the_commands() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    assert "doctor" in out and "devices" in out and "--json" in out


def test_unknown_option_is_a_usage_error() -> None:
    code, _, err = invoke("devices", "--bogus")
    assert code == 2
    lines = one_error(err)
    assert "--bogus" in lines[0]
    assert "iotune devices --help" in lines[1]


def test_unknown_command_is_a_usage_error() -> None:
    code, _, err = invoke("frobnicate")
    assert code == 2
    assert "frobnicate" in one_error(err)[0]


def test_nonexistent_device_path() -> None:
    code, _, err = invoke("devices", "/dev/iotune-does-not-exist")
    assert code == 2
    lines = one_error(err)
    assert "no block device '/dev/iotune-does-not-exist'" in lines[0]
    assert "iotune devices --all" in lines[1]


def test_devices_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = invoke("devices")
    assert code == 1
    assert out == ""
    assert "iotune devices needs root" in one_error(err)[0]


def test_devices_json_from_a_recorded_guest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(devices_cli, "LiveHost", lambda: RecordedHost(DATA / "qemu-nvme"))
    code, out, _ = invoke("devices", "--json")
    assert code == 0
    doc = json.loads(out)
    serials = [d["serial"] for d in doc["devices"]]
    assert serials == ["IOT0", "IOT1", "IOT2", "IOT3", "IOT4", "IOT5"]
    iot2 = doc["devices"][2]
    assert {r["kind"] for r in iot2["in_use"]} == {"signature", "holders", "busy"}


def test_devices_table_shows_state_and_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(devices_cli, "LiveHost", lambda: RecordedHost(DATA / "qemu-nvme"))
    code, out, _ = invoke("devices")
    assert code == 0
    assert "QEMU NVMe Ctrl" in out and "md127" not in out.split("\n\n")[0]
    assert "nvme3n1 is mounted at /tmp/iot3 (ext4)" in out
    assert "held by md127" in out


def test_devices_all_includes_the_md_array(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(devices_cli, "LiveHost", lambda: RecordedHost(DATA / "qemu-nvme"))
    code, out, _ = invoke("--json", "devices", "--all")
    assert code == 0
    names = [d["name"] for d in json.loads(out)["devices"]]
    assert "md127" in names


def _fake_checks(*_: object, **__: object) -> list[Check]:
    return [
        Check("md raid0", Status.FAIL, "no raid0", "boot another kernel", frozenset({Family.RAID})),
        Check("fio", Status.PASS, "fio 3.33", needed_by=frozenset({Family.SWEEP})),
    ]


def test_doctor_for_family_sets_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "run_checks", _fake_checks)
    code, out, err = invoke("doctor", "--for", "raid")
    assert code == 1
    assert "not ready for raid: md raid0" in out
    assert "fix: boot another kernel" in out
    assert "not ready for 'raid'" in one_error(err)[0]
    code, out, _ = invoke("doctor", "--for", "sweep")
    assert code == 0
    code, _, err = invoke("doctor", "--for", "nonsense")
    assert code == 2 and "nonsense" in one_error(err)[0]


def test_doctor_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "run_checks", _fake_checks)
    code, out, _ = invoke("doctor", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ready"] == {"raid": False, "sweep": True, "trace": True, "train": True}
    assert doc["checks"][0] == {
        "name": "md raid0",
        "status": "FAIL",
        "found": "no raid0",
        "fix": "boot another kernel",
        "needed_by": ["raid"],
    }


def test_exit_status_of_a_workload() -> None:
    assert (interrupted_exit("SIGINT"), interrupted_exit("SIGTERM")) == (130, 143)
    assert (workload_exit(3), workload_exit(-9), workload_exit(-15)) == (3, 137, 143)


def test_a_failed_command_is_named_with_when_it_failed() -> None:
    """A command, a script before its first step, a script after its steps (most often
    DeepSpeed's async I/O threads aborting Python's shutdown): each line says which."""
    cmd = ["/usr/bin/python", "train.py", "a b"]
    line, hint = workload_failed(cmd, 2, None)
    assert line == "iotune: python exited 2; the trace above is what ran until then"
    assert hint == "hint: its own output is above (/usr/bin/python train.py 'a b')"
    line, hint = workload_failed(cmd, 1, 0)
    assert line.startswith("iotune: python exited 1 before its first step;")
    assert "async I/O" not in hint
    line, hint = workload_failed(cmd, 1, 3)
    assert line.startswith("iotune: python exited 1 after 3 steps;")
    assert "the 3 traced steps are whole" in hint and "async I/O threads" in hint
    assert "python was killed by SIGABRT after 1 step;" in workload_failed(cmd, -6, 1)[0]
    assert "was killed by signal 99;" in workload_failed(cmd, -99, None)[0]
    assert "the 1 traced step is whole" in workload_failed(cmd, 1, 1)[1]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("steps=3", "--set steps=... : the study's runs take it from --steps"),
        ("ga=2", "--set ga=... : the study's runs take it from --ga"),
        ("nonsense", "--set 'nonsense' is not key=value"),
        ("model.bogus=1", "unknown model field 'bogus'"),
    ],
)
def test_study_set_refuses_bad_overrides_before_anything_runs(
    setting: str, message: str, tmp_path: Path
) -> None:
    out = tmp_path / "study"
    code, _, err = invoke(
        "study", "--presets", "tiny_opt_nvme", "--set", setting, "--out", str(out)
    )
    assert code == 2
    assert message in one_error(err)[0]
    assert not out.exists()


def test_trace_needs_one_of_its_two_tracers() -> None:
    """libbpf's chain or bcc's: where one passes, the other's failures are warnings trace
    does not need, and the last check names the tracer; where neither does, both fail."""
    from iotune.checks import Check, Family, Status

    trace = frozenset({Family.TRACE})

    def checks(libbpf: Status, bcc: Status) -> list[Check]:
        return [
            Check("libbpf", Status.PASS, "libbpf 1.1", needed_by=trace),
            Check("libbpf load", libbpf, "no kernel BTF", "a BTF kernel", trace),
            Check("kernel headers", bcc, "no /lib/modules/x/build", "apt-get ...", trace),
            Check("bcc", Status.PASS, "bcc 0.26.0", needed_by=trace),
        ]

    got = doctor.settle_tracer(checks(Status.PASS, Status.FAIL))
    assert doctor.ready(got, Family.TRACE) == []
    headers = next(c for c in got if c.name == "kernel headers")
    assert headers.status is Status.WARN and Family.TRACE not in headers.needed_by
    assert got[-1].name == "tracer" and got[-1].found.startswith("trace uses libbpf")
    got = doctor.settle_tracer(checks(Status.FAIL, Status.PASS))
    assert doctor.ready(got, Family.TRACE) == []
    assert got[-1].found == "trace uses bcc: libbpf cannot (no kernel BTF)"
    assert next(c for c in got if c.name == "libbpf load").status is Status.WARN
    got = doctor.settle_tracer(checks(Status.FAIL, Status.FAIL))
    assert [c.name for c in doctor.ready(got, Family.TRACE)] == [
        "libbpf load",
        "kernel headers",
        "tracer",
    ]
