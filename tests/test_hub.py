"""A model named by its Hub id: only config.json is fetched, through huggingface_hub (its cache,
HF_TOKEN and HF_HUB_OFFLINE honoured); every failure is one line and exit 2. The Hub is a local
HTTP server on 127.0.0.1 (``HF_ENDPOINT``), never the real one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 10,
}
BODY = json.dumps(CONFIG).encode()
TOKEN = "hf_local_test_token"


class FakeHub(BaseHTTPRequestHandler):
    paths: list[str] = []  # noqa: RUF012 -- shared by the server's handler instances

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, head: bool) -> None:
        FakeHub.paths.append(self.path)
        parts = self.path.split("?")[0].strip("/").split("/")
        repo, tail = "/".join(parts[:2]), parts[2:]
        error = None
        if repo == "org/missing":
            error = (404, "RepoNotFound")
        elif repo == "org/gated" and self.headers.get("authorization") != f"Bearer {TOKEN}":
            error = (403, "GatedRepo")
        elif tail[:1] != ["resolve"] or tail[-1:] != ["config.json"]:
            error = (404, "EntryNotFound")
        if error is not None:
            self.send_response(error[0])
            self.send_header("X-Error-Code", error[1])
            self.send_header("X-Error-Message", error[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("ETag", '"0123456789abcdef"')
        self.send_header("X-Repo-Commit", "a" * 40)
        self.end_headers()
        if not head:
            self.wfile.write(BODY)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    pytest.importorskip("huggingface_hub", reason="the 'hub' extra is not installed")
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def vrammath(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, "-m", "vrammath", *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**clean, **env},
        timeout=120,
    )


def refused(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr


def test_fetches_only_config_json_and_uses_the_cache(hub: str, tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path)}
    FakeHub.paths.clear()
    proc = vrammath(["estimate", "org/tiny", "--seq", "16", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"] == "org/tiny"
    assert data["params"] == 10 * 64 * 2 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    files = [p.split("?")[0] for p in FakeHub.paths if "/resolve/" in p]
    assert files, "the local Hub was not asked"
    assert set(files) == {"/org/tiny/resolve/main/config.json"}, FakeHub.paths
    # offline, the cached copy answers
    proc = vrammath(["estimate", "org/tiny", "--seq", "16"], {**env, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr


def test_failures_are_one_line(hub: str, tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path)}
    refused(vrammath(["estimate", "org/missing"], env), "is not a repository on the Hub")
    refused(vrammath(["estimate", "org/gated"], env), "is a gated repository: set HF_TOKEN")
    proc = vrammath(["estimate", "org/gated", "--seq", "16"], {**env, "HF_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    refused(
        vrammath(["serve", "org/never-fetched"], {**env, "HF_HUB_OFFLINE": "1"}),
        "is not in the Hub cache and the Hub cannot be reached",
    )
    with socket.socket() as s:  # a port with nothing listening: no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused(
        vrammath(
            ["estimate", "org/tiny"],
            {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "empty")},
        ),
        "the Hub cannot be reached",
    )


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from vrammath.model.hub import fetch_config
    from vrammath.notation.errors import InputError

    real_import = builtins.__import__

    def no_hub(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(
        InputError, match=r"needs the 'hub' extra \(pip install 'vrammath\[hub\]'\)"
    ):
        fetch_config("Qwen/Qwen2.5-7B")
