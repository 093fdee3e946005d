"""A model named by its Hugging Face Hub id: only its ``config.json`` is fetched.

Needs the optional extra ``hub`` (``pip install 'vrammath[hub]'``, which brings
``huggingface_hub``). The download goes through ``huggingface_hub.hf_hub_download``, so its cache,
``HF_TOKEN`` (gated and private repositories), ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` are honoured.
Every failure -- the extra missing, an unknown or gated repository, no network -- is one
:class:`~vrammath.notation.errors.InputError`.

Examples
========

>>> is_hub_id("Qwen/Qwen2.5-7B"), is_hub_id("llama-7b"), is_hub_id("a/b/c")
(True, False, False)
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from vrammath.notation.errors import InputError

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub repository id, ``owner/name``."""
    return _HUB_ID.fullmatch(text) is not None and ".." not in text


def fetch_config(repo_id: str) -> Path:
    """The local path of ``repo_id``'s ``config.json``, downloaded into the Hub cache if needed."""
    try:
        from huggingface_hub import errors, hf_hub_download
    except ImportError:
        raise InputError(
            "model",
            "a Hub id needs the 'hub' extra (pip install 'vrammath[hub]')",
            got=repo_id,
        ) from None
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    # its retry warnings would break the one-line promise (set after the lazy import configures it)
    hub_log.setLevel(logging.ERROR)
    try:
        path = hf_hub_download(repo_id, "config.json")
    except errors.GatedRepoError:
        raise InputError(
            "model", "is a gated repository: set HF_TOKEN to a token with access", got=repo_id
        ) from None
    except errors.RepositoryNotFoundError:
        raise InputError(
            "model", "is not a repository on the Hub (private? set HF_TOKEN)", got=repo_id
        ) from None
    # before EntryNotFoundError: recent releases derive the local miss from it
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        raise InputError(
            "model",
            "config.json is not in the Hub cache and the Hub cannot be reached "
            "(no network, or HF_HUB_OFFLINE=1)",
            got=repo_id,
        ) from None
    except errors.EntryNotFoundError:
        raise InputError("model", "has no config.json on the Hub", got=repo_id) from None
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise InputError(
            "model", f"the Hub refused the download (HTTP {status})", got=repo_id
        ) from None
    except Exception as exc:  # an I/O edge: whatever the HTTP stack raises becomes one line
        raise InputError(
            "model", f"cannot fetch config.json from the Hub ({type(exc).__name__})", got=repo_id
        ) from None
    finally:
        hub_log.setLevel(level)
    return Path(str(path))


__all__ = ["fetch_config", "is_hub_id"]
