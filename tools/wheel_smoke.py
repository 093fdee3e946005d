"""Run by `nox -s build` inside a fresh venv holding only the built wheel."""

import subprocess
import sys
from pathlib import Path

import vrammath
from vrammath.model.presets import conf_dir, load_model, model_names

assert "site-packages" in str(Path(vrammath.__file__)), vrammath.__file__
assert conf_dir().parent == Path(vrammath.__file__).parent, conf_dir()
assert "qwen2-72b" in model_names()
assert vrammath.param_count(load_model("qwen2-72b")) == 72_706_203_648
out = subprocess.run(
    [sys.executable, "-m", "vrammath", "estimate", "llama-7b", "--json"],
    check=True,
    capture_output=True,
    text=True,
).stdout
assert '"gpu_bytes"' in out
print(f"wheel smoke test passed: {vrammath.__file__}; conf at {conf_dir()}")
