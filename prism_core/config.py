"""Every threshold of the inference in one object, and the TOML file an operator overrides it with.

Each stage keeps its parameters in its own frozen dataclass, next to the code that reads them
(`prism_core/<stage>/params.py` or the stage module), with each field's unit and why.
`PrismParams` gathers them; `load_params` reads a file such as

    [diagnosis]
    slow_step_delta = 1.2     # a step is slow above 1.2x its baseline

    [recognition]
    jaccard = 0.6

    [timeline]
    optimizer_share = 0.06    # a prior: used until the job's own traffic shows it

where a section is a stage and a key a field of its dataclass. An unknown section or key, or a
value of the wrong type, is a `ConfigError` naming it, never a silently ignored line.
"""

from __future__ import annotations

import tomllib
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path

from prism_core.diagnosis import DEFAULT_PARAMS as DIAGNOSIS_DEFAULTS
from prism_core.diagnosis import DiagnosisParams
from prism_core.parallelism import DEFAULT_PARAMS as PARALLELISM_DEFAULTS
from prism_core.parallelism import ParallelismParams
from prism_core.recognition import DEFAULT_PARAMS as RECOGNITION_DEFAULTS
from prism_core.recognition import RecognitionParams
from prism_core.resolution import DEFAULT_PARAMS as RESOLUTION_DEFAULTS
from prism_core.resolution import ResolutionParams
from prism_core.timeline import DEFAULT_PARAMS as TIMELINE_DEFAULTS
from prism_core.timeline import TimelineParams


class ConfigError(ValueError):
    """The parameters file cannot be used; the message names the section and field to fix."""


@dataclass(frozen=True)
class PrismParams:
    recognition: RecognitionParams = RECOGNITION_DEFAULTS
    parallelism: ParallelismParams = PARALLELISM_DEFAULTS
    timeline: TimelineParams = TIMELINE_DEFAULTS
    diagnosis: DiagnosisParams = DIAGNOSIS_DEFAULTS
    resolution: ResolutionParams = RESOLUTION_DEFAULTS


DEFAULT_PARAMS = PrismParams()


def load_params(path: str | Path) -> PrismParams:
    """The defaults with the overrides of the TOML file at `path`."""
    try:
        document = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not TOML ({error})") from None
    return override(DEFAULT_PARAMS, document, str(path))


def override(params: PrismParams, document: dict, source: str = "config") -> PrismParams:
    """`params` with each `[stage] field = value` of `document` replaced, every value checked."""
    stages = {f.name: f for f in fields(params)}
    changed = {}
    for section, values in document.items():
        if section not in stages:
            raise ConfigError(f"{source}: unknown section [{section}]; sections: {', '.join(stages)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table of field = value")
        stage = getattr(params, section)
        known = {f.name: f for f in fields(stage)}
        hints = typing.get_type_hints(type(stage))
        checked = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{source}: [{section}] has no field {key!r}; fields: {', '.join(known)}")
            checked[key] = _typed(value, hints[key], f"{source}: [{section}] {key}")
        changed[section] = replace(stage, **checked)
    return replace(params, **changed)


def _typed(value, hint, where: str):
    """`value` as the field's type: an int is a float where a float is asked, a list a tuple."""
    origin = typing.get_origin(hint)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (bool, str) and isinstance(value, hint):
        return value
    if origin is tuple and isinstance(value, list):
        items = typing.get_args(hint)
        element = items[0] if len(items) == 2 and items[1] is Ellipsis else None
        if element is not None:
            return tuple(_typed(v, element, where) for v in value)
        if len(items) == len(value):
            return tuple(_typed(v, t, where) for v, t in zip(value, items))
    raise ConfigError(f"{where} = {value!r}: expected {getattr(hint, '__name__', hint)}")
