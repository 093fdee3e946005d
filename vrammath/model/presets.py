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
vrammath.notation.errors.InputError: model: must be one of ... (got 'gpt-5')
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vrammath.model.hub import fetch_config, is_hub_id
from vrammath.model.readers import from_hf_config
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of


@cache
def conf_dir() -> Path:
    """The folder holding ``models/`` and ``gpus.toml`` (wheel copy first, then the checkout's)."""
    package = Path(__file__).resolve().parents[1]  # vrammath/, this file being vrammath/model/
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "gpus.toml").is_file():
            return candidate
    raise FileNotFoundError("vrammath's conf/ folder is missing from this installation")


def model_names() -> list[str]:
    """Names of the model presets (the stems of ``conf/models/*.json``), sorted."""
    return sorted(p.stem for p in (conf_dir() / "models").glob("*.json"))


#: the largest config.json accepted (real ones are a few kB; ``id2label`` tables reach ~100 kB)
MAX_CONFIG_BYTES = 4 * 2**20
#: the deepest nesting of objects and arrays accepted (real configs nest 2-4 levels)
MAX_CONFIG_DEPTH = 64
#: the largest integer accepted in a config (int64, what every JSON reader in the chain holds)
MAX_CONFIG_INT = 2**63 - 1


def _nesting(text: str) -> int:
    """The deepest nesting of ``{``/``[`` outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


def parse_config_text(text: str, source: str) -> dict[str, object]:
    """Parse a config.json's text; malformed or non-object JSON is an :class:`InputError`, and so
    is one past the size, nesting or integer limits (:data:`MAX_CONFIG_BYTES`,
    :data:`MAX_CONFIG_DEPTH`, :data:`MAX_CONFIG_INT`), or holding NaN or Infinity.

    >>> parse_config_text('{"vocab_size": 1' + "0" * 30 + "}", "config.json")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: config.json: integers must be at most 2**63 - 1 (got a 31-digit number)
    >>> parse_config_text("[" * 100 + "]" * 100, "config.json")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: config.json: must nest at most 64 levels (got 100)
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise InputError(source, f"must be at most {MAX_CONFIG_BYTES} bytes", f"{len(text)} bytes")
    deepest = _nesting(text)
    if deepest > MAX_CONFIG_DEPTH:
        raise InputError(source, f"must nest at most {MAX_CONFIG_DEPTH} levels", got=deepest)

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > 19 or abs(int(digits)) > MAX_CONFIG_INT:
            raise InputError(
                source,
                "integers must be at most 2**63 - 1",
                got=_Shown(f"a {len(digits.lstrip('-'))}-digit number"),
            )
        return int(digits)

    def number(digits: str) -> float:
        value = float(digits)
        if value in (float("inf"), float("-inf")):
            raise InputError(source, "numbers must be finite", got=_Shown(digits[:40]))
        return value

    def constant(name: str) -> object:
        raise InputError(source, "must not hold NaN or Infinity (not JSON)", got=_Shown(name))

    try:
        data = json.loads(text, parse_int=integer, parse_float=number, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # the depth check above keeps this out of reach; kept as a guard
        raise InputError(source, f"must nest at most {MAX_CONFIG_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise InputError(source, "must hold a JSON object", got=type(data).__name__)
    return data


class _Shown(str):
    """Text shown as is in an error's ``(got ...)``, not quoted."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def load_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a preset name (see :func:`model_names`).

    >>> load_model(["llama-7b"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: model: must be one of deepseek-v3, ... (got ['llama-7b'])
    """
    names = model_names()
    if not isinstance(name, str) or name not in names:  # checked before the cache hashes it
        raise one_of("model", name, names)
    return _load_preset(name)


@cache
def _load_preset(name: str) -> ModelSpec:
    path = conf_dir() / "models" / f"{name}.json"
    return from_hf_config(parse_config_text(path.read_text(encoding="utf-8"), path.name), name=name)


def raw_config(name: str) -> dict[str, object]:
    """The verbatim config.json of a preset, as parsed JSON."""
    if not isinstance(name, str) or name not in model_names():
        raise one_of("model", name, model_names())
    path = conf_dir() / "models" / f"{name}.json"
    return parse_config_text(path.read_text(encoding="utf-8"), path.name)


def _read_limited(file: Path, field: str) -> str:
    """A config file's text, refused past :data:`MAX_CONFIG_BYTES` before it is read."""
    try:
        size = file.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InputError(
                field, f"must be at most {MAX_CONFIG_BYTES} bytes", got=_Shown(f"{size} bytes")
            )
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            field, f"cannot be read ({exc.__class__.__name__})", got=str(file)
        ) from None


def load_config_file(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a config.json on disk (the file's parent folder names it)."""
    file = Path(path)
    if not _is_file(str(path)):
        raise InputError(
            "config", "must be a preset name or an existing config.json", got=str(path)
        )
    text = _read_limited(file, "config")
    name = file.parent.name if file.name == "config.json" else file.stem
    name = name or file.stem
    if not name.isprintable():
        name = repr(name)[1:-1]  # a heading must stay one line
    return from_hf_config(parse_config_text(text, file.name), name=name)


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or else a config.json by path, or else a Hugging Face Hub id
    (``owner/name``: only its config.json is fetched, see :mod:`vrammath.model.hub`)."""
    if not isinstance(name_or_path, str):
        raise InputError("model", "must be a preset name, a path or a Hub id", got=name_or_path)
    if name_or_path in model_names():
        return load_model(name_or_path)
    if name_or_path.endswith(".json") or _is_file(name_or_path):
        return load_config_file(name_or_path)
    if is_hub_id(name_or_path):
        path = fetch_config(name_or_path)
        text = _read_limited(path, "config")
        return from_hf_config(
            parse_config_text(text, f"{name_or_path}/config.json"), name=name_or_path
        )
    raise one_of(
        "model", name_or_path, [*model_names(), "<path to config.json>", "<owner/name on the Hub>"]
    )


@dataclass(frozen=True)
class GPU:
    """A GPU preset: its memory as sold (bytes) and where the figure comes from; optionally the
    CUDA context and the cuBLAS / cuBLASLt workspaces PyTorch takes on it
    (:mod:`vrammath.terms.allocator`), with their source; optionally the total a process sees
    (``usable_bytes``: ``torch.cuda.mem_get_info()[1]``, less than nvidia-smi's figure on
    data-centre cards; 0 where no measurement was found), with its source."""

    name: str
    bytes: int
    label: str
    source: str
    context_bytes: int = 0
    cublas_workspace_bytes: int = 0
    cublaslt_workspace_bytes: int = 0
    runtime_source: str = ""
    usable_bytes: int = 0
    usable_source: str = ""

    @property
    def usable(self) -> int:
        """The total a process sees where it was measured, else the nominal total."""
        return self.usable_bytes or self.bytes


@cache
def load_gpus() -> dict[str, GPU]:
    """All GPU presets from ``conf/gpus.toml``, by name."""
    data = tomllib.loads((conf_dir() / "gpus.toml").read_text(encoding="utf-8"))
    return {
        name: GPU(
            name=name,
            bytes=int(row["bytes"]),
            label=str(row["label"]),
            source=str(row["source"]),
            context_bytes=int(row.get("context_bytes", 0)),
            cublas_workspace_bytes=int(row.get("cublas_workspace_bytes", 0)),
            cublaslt_workspace_bytes=int(row.get("cublaslt_workspace_bytes", 0)),
            runtime_source=str(row.get("runtime_source", "")),
            usable_bytes=int(row.get("usable_bytes", 0)),
            usable_source=str(row.get("usable_source", "")),
        )
        for name, row in data["gpu"].items()
    }


def gpu(name: str) -> GPU:
    """A GPU preset by name (case-insensitive)."""
    gpus = load_gpus()
    if not isinstance(name, str):
        raise one_of("gpu", name, list(gpus))
    for key, value in gpus.items():
        if key.lower() == name.lower():
            return value
    raise one_of("gpu", name, list(gpus))


__all__ = [
    "GPU",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_INT",
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
