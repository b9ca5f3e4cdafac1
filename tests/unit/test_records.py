import enum
import json
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from iotune.records import append_record, dumps, host_facts, read_records, to_jsonable


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


def _reference(obj: object) -> object:
    """to_jsonable as it was before its plain-type fast path: every value through the
    general checks."""
    import dataclasses
    from collections.abc import Mapping

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _reference(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _reference(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | frozenset | set):
        return [_reference(v) for v in obj]
    return obj


class Level(enum.IntEnum):
    LOW = 1


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.sampled_from([Color.RED, Level.LOW, Path("/tmp/x")]),
    st.builds(Point, st.text(max_size=3), st.just(Color.RED), st.just(Path("/")), st.tuples()),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.frozensets(st.integers(), max_size=3),
        st.dictionaries(
            st.one_of(st.text(max_size=3), st.integers(), st.booleans()), inner, max_size=3
        ),
    ),
    max_leaves=12,
)


@given(_values)
def test_to_jsonable_with_its_fast_path_is_what_it_was(value: object) -> None:
    got = to_jsonable(value)
    assert got == _reference(value)
    assert json.dumps(got) == json.dumps(_reference(value))
