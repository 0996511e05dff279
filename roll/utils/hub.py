"""Is a Hugging Face Hub id (a model's or a dataset's) readable here, asked in about a second
instead of after the Hub client's retries (five, ~25 s on a machine with no network, before
the same "couldn't connect" error)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                   "all_proxy")


def _offline(repo_type: str) -> bool:
    names = ("HF_HUB_OFFLINE",) + (("HF_DATASETS_OFFLINE",) if repo_type == "dataset" else ())
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in names)


def _behind_proxy() -> bool:
    """A proxy may reach the Hub where a direct connection cannot: then nothing is probed."""
    return any(os.environ.get(name) for name in PROXY_VARIABLES)


def cached_config(repo_id: str) -> bool:
    """The model's config.json is in the local Hub cache (HF_HOME / HF_HUB_CACHE)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id: let the loader say so
        return True
    return isinstance(found, str)


def cached_dataset(repo_id: str) -> bool:
    """Some of the dataset is here: its files in the Hub cache, or a table ``datasets`` built
    from it (HF_DATASETS_CACHE), which ``datasets`` falls back to when the Hub is away."""
    from huggingface_hub import constants

    folder = "--".join(["datasets", *repo_id.split("/")])
    tables = os.environ.get("HF_DATASETS_CACHE") or os.path.join(constants.HF_HOME, "datasets")
    return (os.path.isdir(os.path.join(constants.HF_HUB_CACHE, folder))
            or os.path.isdir(os.path.join(tables, repo_id.replace("/", "___"))))


def endpoint_unreachable(endpoint: str | None = None) -> str | None:
    """Why the Hub endpoint (``HF_ENDPOINT``, else huggingface.co) cannot be reached, or None
    when a TCP connection to it opens within PROBE_TIMEOUT_S."""
    url = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return f"HF_ENDPOINT={url!r} names no host"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as error:
        return f"{host}:{port} cannot be reached ({error})"


def check_hub_id(repo_id: str, repo_type: str = "model") -> None:
    """Raise FileNotFoundError with the reason when ``repo_id`` (a ``repo_type`` 'model' or
    'dataset') is neither in the local cache nor downloadable because the Hub cannot be
    reached. Offline (HF_HUB_OFFLINE, or HF_DATASETS_OFFLINE for a dataset) the Hub client
    fails at once by itself, and behind a proxy a direct probe says nothing: neither is
    probed."""
    cached = cached_dataset if repo_type == "dataset" else cached_config
    if _offline(repo_type) or _behind_proxy() or cached(repo_id):
        return
    reason = endpoint_unreachable()
    if reason is not None:
        raise FileNotFoundError(
            f"is not a local {'file or folder' if repo_type == 'dataset' else 'folder'}, "
            f"the Hugging Face cache does not hold it, and the Hub {reason}: check the id, "
            "or download it where there is a network (or give a local "
            f"{'file' if repo_type == 'dataset' else 'folder, or a built-in name'})")
