"""plugins.offload.fit: a value cut to a token budget says what it left out."""

from gateway.services.tokens import estimate_tokens
from plugins.offload.fit import cost, fit


def test_small_values_pass_untouched() -> None:
    value = {"a": [1, 2, 3], "b": "세션"}
    assert fit(value, 100) == (value, False)


def test_big_list_is_cut_with_a_count_and_fits() -> None:
    value = [{"id": i, "name": f"customer {i}"} for i in range(500)]
    shown, cut = fit(value, 200)
    assert cut and shown[-1].startswith("…(+") and shown[:2] == value[:2]
    assert cost(shown) <= 200


def test_long_string_and_wide_object_are_cut() -> None:
    text, cut = fit("가나다라 " * 2000, 100)
    assert cut and "…(+" in text and estimate_tokens(text) <= 100
    obj, cut = fit({f"k{i}": "v" * 50 for i in range(200)}, 150)
    assert cut and "…" in obj and cost(obj) <= 150
