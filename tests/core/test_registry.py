"""``modelexport._registry.Registry``: order, aliases, duplicate refusal, and the one typed unknown-name error."""

from __future__ import annotations

import pytest

from modelexport._registry import Registry
from modelexport.errors import ConfigError, DatasetError, ModelExportError, TestTimeError


def _colours() -> Registry[int]:
    reg: Registry[int] = Registry("colour")
    reg.add("red", 1)
    reg.add("green", 2, aliases=("verde",))
    reg.add("blue", 3)
    return reg


def test_names_iteration_and_values_keep_registration_order() -> None:
    reg = _colours()
    assert reg.names() == list(reg) == ["red", "green", "blue"]
    assert reg.values() == [1, 2, 3]
    assert reg.items() == [("red", 1), ("green", 2), ("blue", 3)]
    assert len(reg) == 3
    assert reg.accepted() == ["red", "green", "verde", "blue"]


def test_decorator_registers_the_object_and_returns_it_unchanged() -> None:
    reg: Registry[object] = Registry("handler")

    @reg.register("double", "twice")
    def double(x: int) -> int:
        return 2 * x

    assert double(3) == 6
    assert reg.get("double") is double and reg.get("twice") is double
    assert reg.names() == ["double"]


def test_register_as_stores_a_spec_and_returns_the_function() -> None:
    reg: Registry[tuple[str, object]] = Registry("pass")

    @reg.register_as("fold", lambda fn: ("spec", fn))
    def fold() -> str:
        return "folded"

    assert fold() == "folded"
    assert reg["fold"] == ("spec", fold)


def test_aliases_resolve_to_the_registered_name() -> None:
    reg = _colours()
    assert reg.canonical("verde") == "green"
    assert reg["verde"] == reg.get("green") == 2
    assert "verde" in reg and "green" in reg and "purple" not in reg and 3 not in reg
    assert list(reg) == ["red", "green", "blue"]  # aliases are not entries


def test_unknown_name_raises_the_configured_error_with_kind_valid_names_and_a_guess() -> None:
    with pytest.raises(ConfigError) as caught:
        _colours().get("gren")
    assert (
        str(caught.value) == "unknown colour 'gren' (did you mean 'green'?); valid: red, green, verde, blue"
    )
    assert caught.value.hint == ConfigError.hint

    reg: Registry[int] = Registry("stream order", error=TestTimeError, hint="choose the order from the list")
    reg.add("shuffle", 1)
    with pytest.raises(TestTimeError, match=r"^unknown stream order 'zzz'; valid: shuffle$") as caught_tt:
        reg.get("zzz")
    assert caught_tt.value.hint == "choose the order from the list"
    with pytest.raises(TestTimeError):
        reg.canonical("zzz")


def test_find_returns_none_for_an_unknown_name() -> None:
    reg = _colours()
    assert reg.find("blue") == 3 and reg.find("verde") == 2
    assert reg.find("purple") is None


@pytest.mark.parametrize(
    ("name", "aliases"),
    [("red", ()), ("crimson", ("red",)), ("verde", ()), ("teal", ("teal",)), ("navy", ("marine", "marine"))],
)
def test_a_name_or_alias_taken_twice_is_refused(name: str, aliases: tuple[str, ...]) -> None:
    reg = _colours()
    with pytest.raises(ConfigError, match="registered twice"):
        reg.add(name, 9, aliases=aliases)
    assert reg.names() == ["red", "green", "blue"] and "crimson" not in reg and "navy" not in reg


def test_key_normalises_registration_and_lookup_and_the_error_quotes_the_given_name() -> None:
    reg: Registry[str] = Registry("task", key=lambda s: str(s).strip().lower(), error=DatasetError)
    reg.add("Fill-Mask", "mlm", aliases=("MLM",))
    assert reg.names() == ["fill-mask"]
    assert reg.get("  FILL-mask ") == reg.get("mlm") == "mlm"
    assert reg.canonical("Mlm") == "fill-mask"
    with pytest.raises(DatasetError, match=r"^unknown task 'Fil-Mask' \(did you mean 'fill-mask'\?\)"):
        reg.get("Fil-Mask")


def test_every_unknown_name_error_is_a_modelexport_error() -> None:
    with pytest.raises(ModelExportError):
        _colours().get("")


@pytest.mark.smoke
def test_every_config_refuses_an_unknown_option_by_name_with_a_guess() -> None:
    """``with_changes`` (and ``modelexport.export(**options)``) on every frozen config: an unknown option is a
    typed error that is also a ``ValueError``, naming the closest field, not ``replace``'s bare ``TypeError``."""
    import modelexport
    from modelexport.export.config import ExportConfig
    from modelexport.optimize.config import OptimizeConfig, QuantizeConfig, WeightOnlyConfig
    from modelexport.testtime import TestTimePolicy

    cases = [
        (lambda: ExportConfig().with_changes(devcie="cpu"), ConfigError, "export option 'devcie'", "device"),
        (lambda: modelexport.export("x", "out/", opst=17), ConfigError, "export option 'opst'", "opset"),
        (lambda: TestTimePolicy().with_changes(tt="bn"), TestTimeError, "policy option 'tt'", "ttt"),
        (
            lambda: QuantizeConfig().with_changes(per_chanel=True),
            ConfigError,
            "quantize option",
            "per_channel",
        ),
        (lambda: WeightOnlyConfig().with_changes(bits=4), ConfigError, "weight-only option 'bits'", None),
        (lambda: OptimizeConfig().with_changes(levl=2), ConfigError, "optimize option 'levl'", "level"),
    ]
    for call, error, message, guess in cases:
        with pytest.raises(error, match=message) as caught:
            call()
        assert isinstance(caught.value, ValueError)
        assert (f"did you mean {guess!r}" in str(caught.value)) == (guess is not None), caught.value
    assert TestTimePolicy().with_changes(ttt="bn").ttt == "bn"  # a known one still applies
