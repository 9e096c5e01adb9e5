"""gateway.args: what the model sends is read strictly, and every mistake says what to send instead."""

import pytest

from gateway.args import Args, ToolInputError


def test_types_bounds_and_defaults() -> None:
    args = Args({"n": "12", "flag": "true", "name": "세션", "keys": "a, b,,c", "none": None}, "t")
    assert args.int("n", lo=1, hi=20) == 12  # digits in a string are accepted (small models send them)
    assert args.bool("flag") is True
    assert args.str("name", required=True) == "세션"
    assert args.str_list("keys") == ["a", "b", "c"]
    assert args.int("none", 5) == 5 and args.str("missing") is None


@pytest.mark.parametrize(
    ("raw", "read", "message"),
    [
        ({"n": 0}, lambda a: a.int("n", lo=1, hi=9), "`n` must be between 1 and 9, got 0"),
        ({"n": True}, lambda a: a.int("n"), "`n` must be a whole number"),
        ({"n": 1.5}, lambda a: a.int("n"), "`n` must be a whole number"),
        ({}, lambda a: a.str("q", required=True), "`q` is required"),
        ({"q": "  "}, lambda a: a.str("q", required=True), "`q` must not be empty"),
        ({"q": 3}, lambda a: a.str("q"), "`q` must be a string, got int"),
        ({"m": "x"}, lambda a: a.choice("m", ("a", "b")), "`m` must be one of a, b; got 'x'"),
        ({"b": "yes"}, lambda a: a.bool("b"), "`b` must be true or false"),
        ({"k": [1]}, lambda a: a.str_list("k"), "`k` must be a list of strings"),
    ],
)
def test_mistakes_name_the_argument_and_the_fix(raw: dict, read, message: str) -> None:
    with pytest.raises(ToolInputError, match="^t: " + message.replace("(", r"\(").replace(")", r"\)")):
        read(Args(raw, "t"))


def test_arguments_must_be_an_object() -> None:
    with pytest.raises(ToolInputError, match="arguments must be an object"):
        Args(["not", "an", "object"], "t")
