import enum
from dataclasses import dataclass
from pathlib import Path

from iotune.records import append_record, dumps, host_facts, read_records


class Color(enum.StrEnum):
    RED = "red"


@dataclass(frozen=True)
class Point:
    name: str
    color: Color
    where: Path
    sizes: tuple[int, ...]


def test_append_then_read_back(tmp_path: Path) -> None:
    f = tmp_path / "run" / "records.jsonl"
    append_record(f, {"a": 1, "p": Point("x", Color.RED, Path("/tmp"), (1, 2))})
    append_record(f, {"a": 2})
    got = list(read_records(f))
    assert got == [
        {"a": 1, "p": {"name": "x", "color": "red", "where": "/tmp", "sizes": [1, 2]}},
        {"a": 2},
    ]


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    append_record(f, {"a": 1})
    with f.open("a") as fh:
        fh.write('{"a": 2, "b"')  # a kill mid-write
    assert list(read_records(f)) == [{"a": 1}]


def test_dumps_and_host_facts() -> None:
    assert '"color": "red"' in dumps(Point("x", Color.RED, Path("/"), ()))
    facts = host_facts()
    assert facts["kernel"] and facts["machine"]
