"""Root conftest: skip collecting the optional measurement code where its extra is missing."""

import importlib.util

collect_ignore_glob = ["docs/*", "tools/*", "benchmarks/*", "noxfile.py"]
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    collect_ignore_glob += ["vrammath/measure/*", "tests/measure/*"]
