"""--policy NAME[:key=value,...]: a registered policy's name and its constructor's options, each
value typed as the constructor takes it (its default's type, else its annotation's). DropMatch's
p also takes auto or auto:LEVEL, calibrated on the prompt by the command line
(minispec.lab.dropout_calibration). Every mistake is one line naming the policy and the key."""

from __future__ import annotations

import math

from minispec.cli import parse_options
from minispec.errors import MinispecError

DROPMATCH_POLICIES = ("dropmatch", "dropmatch-lazy")  # their p may be auto (or auto:LEVEL): calibrated per prompt


def policy_spec(text: str, field: str = "--policy") -> tuple[str, dict]:
    """--policy NAME[:key=value,...] -> (NAME, {key: value}), each value converted to the type of the
    registered policy's constructor parameter (its default's type, else its annotation): bool from
    true/false, int, float, str; None from none. Unknown names and options are one line each, naming
    `field` (the flag that gave the text: --policy here, a script's --policies there)."""
    from minispec import acceptance
    from minispec.acceptance.base import constructor_options

    name, texts = parse_options(text, field)
    if name not in acceptance.available():
        raise MinispecError(f"{field} {name!r}: unknown acceptance policy; expected a registered name (minispec's "
                            f"own: {', '.join(acceptance.BUILT_IN)})")
    parameters = constructor_options(name)
    options = {}
    for key, value in texts.items():
        if key not in parameters:
            expected = f"its options are {sorted(parameters)}" if parameters else "it takes no options"
            raise MinispecError(f"{field} {name}: unknown option {key!r}; {expected}")
        if name in DROPMATCH_POLICIES and key == "p" and value.partition(":")[0] == "auto":
            options[key] = auto_level(value, field)
        else:
            options[key] = option_value(f"{field} {name}", key, value, parameters[key])
    return name, options


def auto_level(text: str, field: str = "--policy") -> tuple[str, float]:
    """DropMatch's p=auto[:LEVEL] -> ("auto", LEVEL): the share of positions where all K heads keep the
    clean argmax, in (0, 1] (default minispec.lab.dropout_calibration.DEFAULT_LEVEL)."""
    from minispec.lab.dropout_calibration import DEFAULT_LEVEL

    _, colon, level = text.partition(":")
    try:
        value = float(level) if colon else DEFAULT_LEVEL
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:  # also nan
        raise MinispecError(f"{field} dropmatch: p = {text!r}; expected a number in [0, 1), auto, or auto:LEVEL with "
                            "LEVEL in (0, 1] (the share of positions where every head keeps the clean argmax)")
    return "auto", value


def option_value(where: str, key: str, text: str, kind: type | None):
    """One --policy option's text as `kind` (bool, int, float or str; None: a number if it reads as one);
    `where` begins a refusal (e.g. "--policy fly")."""
    if text.lower() == "none":
        return None
    if kind is bool:
        if text.lower() in ("true", "yes", "1", "false", "no", "0"):
            return text.lower() in ("true", "yes", "1")
        raise MinispecError(f"{where}: {key} = {text!r}; expected true or false")
    for number in ((int,) if kind is int else (float,) if kind is float else (int, float) if kind is None else ()):
        try:
            return number(text)
        except ValueError:
            if kind is not None:
                raise MinispecError(f"{where}: {key} = {text!r}; expected {'an integer' if kind is int else 'a number'}") from None
    return text
