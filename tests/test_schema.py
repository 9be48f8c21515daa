"""tl_lab/ops/schema.py: config.json against docs/formats/config.schema.json, each violation said as
"field what is wrong — why the engine refuses it", all of them in one ConfigError."""

import json
import sys

import pytest

from tl_lab.ops import schema
from tl_lab.errors import ConfigError
from tl_lab.ops.schema import config_schema, validate_config

LLAMA = {"tl_arch": "llama", "tl_tokenizer": "bpe", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
         "num_hidden_layers": 1, "num_attention_heads": 2}


def refusal(raw) -> str:
    with pytest.raises(ConfigError) as e:
        validate_config(raw)
    assert str(e.value).startswith("config.json refused: ")
    return str(e.value).removeprefix("config.json refused: ")


def why(field: str) -> str:
    return " \N{EM DASH} " + config_schema()["properties"][field]["description"]


def test_a_valid_config_passes():
    validate_config(LLAMA)


def test_each_kind_of_violation_names_its_field_and_says_why():
    assert refusal({**LLAMA, "sliding_window": 4096}) == "sliding_window must be null, got 4096" + why("sliding_window")
    assert refusal({**LLAMA, "hidden_act": "gelu"}) == 'hidden_act must be "silu", got "gelu"' + why("hidden_act")
    without = dict(LLAMA)
    del without["tl_arch"]
    assert refusal(without) == "tl_arch is missing (required)" + why("tl_arch")
    # a field the schema gives no description: no why
    assert refusal({**LLAMA, "hidden_size": 0}) == "hidden_size 0 is less than the minimum of 1"
    assert refusal([]) == "(the whole file) [] is not of type 'object'"


def test_every_violation_is_listed_in_the_order_of_the_fields():
    assert refusal({**LLAMA, "hidden_size": 0, "attention_bias": True}) == (
        "attention_bias must be false, got true" + why("attention_bias")
        + "; hidden_size 0 is less than the minimum of 1")


def test_a_long_value_is_shortened_to_80_characters():
    def said(value):
        text = refusal({**LLAMA, "hidden_act": value})
        return text.removeprefix('hidden_act must be "silu", got ').removesuffix(why("hidden_act"))

    assert said("g" * 78) == json.dumps("g" * 78)  # 80 characters with its quotes: whole
    assert said("g" * 79) == '"' + "g" * 76 + "..."  # 81: the first 77, then ...


def test_the_validator_is_imported_without_the_format_only_packages_and_they_stay_importable(monkeypatch):
    """jsonschema is imported with those packages blocked (one of them costs 0.75 s at import), and
    the block is lifted after: sys.modules as it was."""
    monkeypatch.setattr(schema, "_FORMAT_ONLY_PACKAGES", ("tl_lab_no_such_package",))
    before = set(sys.modules)
    assert schema._import_validator().__name__ == "Draft202012Validator"
    assert "tl_lab_no_such_package" not in sys.modules and set(sys.modules) >= before


@pytest.mark.parametrize("field, value", [("eos_token_id", [-1] * 1_000_000), ("eos_token_id", [0] * 1_000_000),
                                          ("tl_source", {f"k{i}": [i] for i in range(20_000)})])
def test_a_config_of_a_million_values_is_refused_before_the_schema_walks_them(field, value, monkeypatch):
    """A 4 MB config.json of a million eos ids (bad or good) took the validator 33 s and 3 GB to refuse
    (7 s to accept): the values are counted first, the validator never sees them, and the field that
    passes the limit is named."""
    def validator():
        raise AssertionError("the schema's validator was reached")

    monkeypatch.setattr(schema, "_schema_validator", validator)
    said = refusal({**LLAMA, field: value})
    assert said == (f"{field} takes it past {schema.MAX_CONFIG_VALUES:,} JSON values (a real one has about 50); "
                    "refused before checking it against the schema")


def test_a_config_at_the_value_limit_still_reaches_the_schema():
    ids = [0] * (schema.MAX_CONFIG_VALUES - len(LLAMA) - 1)  # each field is 1 value, the list 1 + its items
    validate_config({**LLAMA, "eos_token_id": ids})
    assert refusal({**LLAMA, "eos_token_id": ids + [0]}).startswith("eos_token_id takes it past")
