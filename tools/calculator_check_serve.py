"""The calculator's serving tab against the library: ``window.vrammath.serve(setup)`` returns the
numbers of ``vrammath serve MODEL --json`` (computed here in-process, the CLI's own code) for random
serving setups, and refuses what the library refuses with its message.
(``tools/calculator_check.py`` runs :func:`check_serving`.)
"""

from __future__ import annotations

import random
from typing import Any

from vrammath.errors import InputError
from vrammath.inference import Serve, serve
from vrammath.presets import load_gpus, load_model, model_names
from vrammath.vocab import KV_DTYPES, SERVE_WEIGHTS

SERVE_SETUPS = 40  # valid serving setups compared byte for byte (the issue asks for at least 20)


def random_serve(rng: random.Random) -> dict[str, Any]:
    """Keyword arguments of a random Serve (valid or not), the model by preset name."""
    name = rng.choice(model_names())
    spec = load_model(name)
    return {
        "model": name,
        "context": rng.choice((1, 512, 4096, 32768, rng.randint(1, 2**20))),
        "batch": rng.choice((1, 8, 64, rng.randint(1, 512))),
        "weights": rng.choice(SERVE_WEIGHTS),
        "kv_dtype": rng.choice(KV_DTYPES),
        "tp": rng.choice((1, 1, 2, 4, 8, rng.randint(1, spec.heads + 1))),
        "block": rng.choice((None, 16, 16, 32, rng.randint(1, 256))),
        "gpu": rng.choice([None, *load_gpus(), *load_gpus()]),
        "gpu_util": rng.choice((0.9, 0.95, 0.5, 1.0, round(rng.uniform(0.05, 1), 3))),
    }


def expected_serve(kw: dict[str, Any]) -> dict[str, Any]:
    """``vrammath serve --json``'s numbers for ``kw`` (bytes as decimal strings)."""
    try:
        est = serve(Serve(load_model(kw["model"]), **{k: v for k, v in kw.items() if k != "model"}))
    except InputError as err:
        return {"error": str(err)}
    data: dict[str, Any] = {
        **est.as_dict(),
        "total_with_reserve_bytes": est.total_with_reserve_bytes,
    }
    keys = ("weights_bytes", "quant_constants_bytes", "kv_cache_bytes", "kv_bytes_per_token",
            "reserve_bytes", "total_bytes", "total_with_reserve_bytes")  # fmt: skip
    gpu = data["gpu"]
    return {
        "totals": {k: str(data[k]) for k in keys},
        "gpu": None
        if gpu is None
        else {k: str(v) if k.endswith("bytes") else v for k, v in gpu.items()},
    }


def check_serving(driver: Any, seed: int = 17) -> tuple[list[str], list[str]]:
    """Random serving setups: the page's ``serve`` against the library's; refusals likewise."""
    rng = random.Random(seed)
    compared = refused = refused_same = 0
    problems: list[str] = []
    with_gpu = 0
    while compared < SERVE_SETUPS:
        kw = random_serve(rng)
        want = expected_serve(kw)
        got = driver.execute_script(
            "const r = window.vrammath.serve(arguments[0]);"
            "return r.error ? {error: r.error} : {totals: r.totals, gpu: r.gpu};",
            kw,
        )
        if "error" in want:
            refused += 1
            if "error" not in got:
                problems.append(f"page served a refused setup {kw}: library says {want['error']}")
            elif got["error"] == want["error"]:
                refused_same += 1
            continue
        compared += 1
        with_gpu += kw["gpu"] is not None
        if got != want:
            problems.append(f"serve mismatch for {kw}:\n    page    {got}\n    library {want}")
    bad = len([p for p in problems if p.startswith("serve mismatch")])
    lines = [
        f"calculator: {compared} serving setups byte-equal to the library: {compared - bad}"
        f" ({with_gpu} with a GPU: max batch, max context)",
        f"calculator: {refused} refused serving setups, same message as the library: "
        f"{refused_same}",
    ]
    return lines, problems
