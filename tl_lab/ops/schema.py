"""config.json against its JSON Schema: the validator and its messages (given, not the learner's).

Chapter L10.1, section 2.3. What the engine refuses is `tl_lab.model.ModelConfig`'s (the learner's
part: the cross-field checks and the rules a schema cannot say); this module checks a parsed
config.json against ``docs/formats/config.schema.json`` with ``jsonschema`` and says each violation
as "field: what is wrong (why)".
"""

from __future__ import annotations

import json
import re
from functools import cache

from tl_lab.errors import ConfigError
from tl_lab.ops.paths import FORMATS_DIR

__all__ = ["CONFIG_SCHEMA_PATH", "config_schema", "validate_config"]

CONFIG_SCHEMA_PATH = FORMATS_DIR / "config.schema.json"
# JSON values in a config.json, counted before the schema walks them: SmolLM2's has about 50 (its chat
# template is one string). jsonschema builds an error object, a few KB, for each bad value, and checks
# every item of eos_token_id against each branch of its oneOf: a million ids in a 4 MB file took 7 s
# to accept and 33 s and 3 GB to refuse.
MAX_CONFIG_VALUES = 10_000


@cache
def _schema_validator():
    """The validator of config.json. The schema is a file of this package, checked against JSON
    Schema's own metaschema by tests/test_model.py (test_config_schema_is_a_real_json_schema), not
    again in every process: that check was 8 ms of a 0.2 s load."""
    Draft202012Validator = _import_validator()
    from jsonschema import validators

    # JSON Schema counts 64.0 as an integer; ModelConfig does not (2.0 is refused, see _check_types)
    strict = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, v: isinstance(v, int) and not isinstance(v, bool))
    Validator = validators.extend(Draft202012Validator, type_checker=strict)
    return Validator(json.loads(CONFIG_SCHEMA_PATH.read_text()))


# Packages jsonschema imports, when installed, only for its "format" checks (jsonschema/_format.py).
# config.schema.json checks no format (tests/test_model.py says so), so none of them is needed.
_FORMAT_ONLY_PACKAGES = ("fqdn", "idna", "isoduration", "jsonpointer", "rfc3339_validator",
                         "rfc3986_validator", "rfc3987", "rfc3987_syntax", "uri_template", "webcolors")


def _import_validator():
    """jsonschema's Draft202012Validator, imported without its optional format-checking packages.

    jsonschema imports each of `_FORMAT_ONLY_PACKAGES` that is installed, for its format checks:
    `rfc3987_syntax` alone builds a lark parser at import (0.75 s, most of a model's load time,
    measured here), the others together took 0.02 s of a 0.2 s load. config.schema.json checks no
    format, so they are kept out (jsonschema skips a check whose package is missing); a later
    import of any of them elsewhere in the process works as usual.
    """
    import sys

    blocked = [name for name in _FORMAT_ONLY_PACKAGES if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # makes `import name` raise ImportError
    try:
        from jsonschema import Draft202012Validator
    finally:
        for name in blocked:
            del sys.modules[name]
    return Draft202012Validator


def config_schema() -> dict:
    """The JSON Schema of config.json (docs/formats/config.schema.json) as a dict."""
    return _schema_validator().schema


def validate_config(raw) -> None:
    """Raise ConfigError listing every schema violation, each naming its field (after
    `_check_value_count`: no more than MAX_CONFIG_VALUES values reach the validator)."""
    _check_value_count(raw)
    validator = _schema_validator()  # first: it imports jsonschema without its slow optional part
    from jsonschema.exceptions import best_match
    errors = sorted(validator.iter_errors(raw), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if not errors:
        return
    lines = [_describe(best_match([e]), validator.schema) for e in errors]
    raise ConfigError("config.json refused: " + "; ".join(dict.fromkeys(lines)))


def _check_value_count(raw) -> None:
    """Refuse a config.json of more than MAX_CONFIG_VALUES JSON values, naming the top-level field that
    passes the limit; counted a container at a time, stopping there (a million ids cost no walk)."""
    items = raw.items() if isinstance(raw, dict) else [("(the whole file)", raw)]
    count = 0
    for key, value in items:
        count += 1 + _values_in(value, MAX_CONFIG_VALUES - count)
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"config.json refused: {key} takes it past {MAX_CONFIG_VALUES:,} JSON values (a real one "
                "has about 50); refused before checking it against the schema")


def _values_in(value, budget: int) -> int:
    """The values nested in `value` (lists and objects, at any depth), counted until past `budget`."""
    n, stack = 0, [value]
    while stack and n <= budget:
        v = stack.pop()
        inner = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else []
        n += len(inner)
        if n <= budget:
            stack.extend(inner)
    return n


def _js(value) -> str:
    """A value as it appears in config.json (true, null, "silu"), shortened."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(err, schema: dict) -> str:
    """One schema error as "field: what is wrong (why the engine refuses it)"."""
    path = list(err.absolute_path)
    if err.validator == "required":  # the missing property is the field to name
        missing = re.match(r"'([^']*)'", err.message)
        path = path + [missing.group(1) if missing else "?"]
        what = "is missing (required)"
    elif err.validator == "const":
        what = f"must be {_js(err.validator_value)}, got {_js(err.instance)}"
    elif err.validator == "type" and err.validator_value == "null":
        what = f"must be null, got {_js(err.instance)}"
    else:
        what = err.message
    name = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))
    why = schema.get("properties", {}).get(path[0], {}).get("description") if path else None
    return f"{name or '(the whole file)'} {what}" + (f" \N{EM DASH} {why}" if why else "")
