"""plugins.offload.paths: dotted paths and JSONPath split into streamable steps and a remainder."""

import pytest

from plugins.offload.paths import PathError, format_path, parse_path, step_into


@pytest.mark.parametrize(
    ("path", "steps", "remainder"),
    [
        ("data.0.name", ["data", 0, "name"], None),
        ("$.data[0].name", ["data", 0, "name"], None),
        ("data.-1", ["data", -1], None),
        ("$['a.b'][2]", ["a.b", 2], None),
        ("$", [], None),
        (None, [], None),
        ("data[*].name", ["data"], "$[*].name"),
        ("$..id", [], "$..id"),
    ],
)
def test_parse(path: str | None, steps: list, remainder: str | None) -> None:
    assert parse_path(path) == (steps, remainder)


def test_format_round_trip_and_step_errors() -> None:
    assert format_path(["data", 0, "a.b"]) in ("data.0['a.b']", 'data.0["a.b"]')
    assert step_into({"7": "x"}, 7, []) == "x"  # a numeric step also addresses an object's numeric key
    with pytest.raises(PathError, match="out of range"):
        step_into([1, 2], 5, ["data"])
    with pytest.raises(PathError):
        parse_path(5)  # type: ignore[arg-type]
