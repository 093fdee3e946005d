"""The one loader: reads presets from ``conf/`` (models, GPUs) and user config files.

``conf/`` is the single source of presets. In a source checkout it sits beside the package; in a
wheel it is shipped as ``vrammath/conf``. Nothing else in vrammath reads files.

Examples
========

>>> load_model("llama-7b").hidden
4096
>>> gpu("A100-80GB").bytes
85899345920
>>> load_model("gpt-5")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
vrammath.errors.InputError: model: must be one of ... (got 'gpt-5')
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vrammath.errors import InputError, one_of
from vrammath.model import ModelSpec, from_hf_config


@cache
def conf_dir() -> Path:
    """The folder holding ``models/`` and ``gpus.toml`` (wheel copy first, then the checkout's)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "gpus.toml").is_file():
            return candidate
    raise FileNotFoundError("vrammath's conf/ folder is missing from this installation")


def model_names() -> list[str]:
    """Names of the model presets (the stems of ``conf/models/*.json``), sorted."""
    return sorted(p.stem for p in (conf_dir() / "models").glob("*.json"))


def parse_config_text(text: str, source: str) -> dict[str, object]:
    """Parse a config.json's text; malformed or non-object JSON is an :class:`InputError`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InputError(source, "must hold a JSON object", got=type(data).__name__)
    return data


@cache
def load_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a preset name (see :func:`model_names`)."""
    names = model_names()
    if name not in names:
        raise one_of("model", name, names)
    path = conf_dir() / "models" / f"{name}.json"
    return from_hf_config(parse_config_text(path.read_text(encoding="utf-8"), path.name), name=name)


def raw_config(name: str) -> dict[str, object]:
    """The verbatim config.json of a preset, as parsed JSON."""
    if name not in model_names():
        raise one_of("model", name, model_names())
    path = conf_dir() / "models" / f"{name}.json"
    return parse_config_text(path.read_text(encoding="utf-8"), path.name)


def load_config_file(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a config.json on disk (the file's parent folder names it)."""
    file = Path(path)
    if not file.is_file():
        raise InputError(
            "config", "must be a preset name or an existing config.json", got=str(path)
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            "config", f"cannot be read ({exc.__class__.__name__})", got=str(path)
        ) from None
    name = file.parent.name if file.name == "config.json" else file.stem
    return from_hf_config(parse_config_text(text, file.name), name=name or file.stem)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or else a config.json by path."""
    if name_or_path in model_names():
        return load_model(name_or_path)
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return load_config_file(name_or_path)
    raise one_of("model", name_or_path, [*model_names(), "<path to config.json>"])


@dataclass(frozen=True)
class GPU:
    """A GPU preset: its memory as sold (bytes) and where the figure comes from."""

    name: str
    bytes: int
    label: str
    source: str


@cache
def load_gpus() -> dict[str, GPU]:
    """All GPU presets from ``conf/gpus.toml``, by name."""
    data = tomllib.loads((conf_dir() / "gpus.toml").read_text(encoding="utf-8"))
    return {
        name: GPU(
            name=name, bytes=int(row["bytes"]), label=str(row["label"]), source=str(row["source"])
        )
        for name, row in data["gpu"].items()
    }


def gpu(name: str) -> GPU:
    """A GPU preset by name (case-insensitive)."""
    gpus = load_gpus()
    for key, value in gpus.items():
        if key.lower() == name.lower():
            return value
    raise one_of("gpu", name, list(gpus))


__all__ = [
    "GPU",
    "conf_dir",
    "gpu",
    "load_config_file",
    "load_gpus",
    "load_model",
    "model_names",
    "parse_config_text",
    "raw_config",
    "resolve_model",
]
