"""Where a checkpoint comes from: a local folder, or a Hugging Face hub repo id.

    resolve_checkpoint("weights/my-model")                        -> that folder, as it is
    resolve_checkpoint("HuggingFaceTB/SmolLM2-135M-Instruct")     -> its snapshot in the hub cache
    resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct@main")         -> the same at a revision
    resolve_checkpoint("Qwen/Qwen2.5-0.5B-Instruct", revision="v1.0")

    resolve_checkpoint("qwen2.5-coder-1.5b-instruct")             -> a known name (minispec.checkpoints.known):
                                                                  fetched and converted on first use

A local folder always wins: a spec that names an existing folder is never looked up anywhere. A
known name (`python -m minispec.weights --list`) is converted by minispec.checkpoints.fetch into its folder
(weights/<name> in a source checkout, else MINISPEC_HOME or the user cache). Anything else of the
form `owner/name[@revision]` is fetched with `huggingface_hub` (a dependency of `tokenizers`, so always installed) into its usual cache, with its usual environment:
HF_HOME / HF_HUB_CACHE pick the cache folder, HF_HUB_OFFLINE=1 reads only what is cached, HF_TOKEN
authenticates. Only what minispec reads is fetched: the JSON files (config, tokenizer, generation
config, the shard index) and the safetensors weights; never pickles, never code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from minispec.errors import CheckpointError
from minispec.checkpoints.known import is_known

# what a checkpoint folder needs: config.json, tokenizer*.json, chat_template.jinja, model*.safetensors(.index.json)
ALLOW_PATTERNS = ["*.json", "*.safetensors", "chat_template.jinja"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the hub spells repo ids


def resolve_checkpoint(spec: str | Path, revision: str | None = None, *, what: str = "checkpoint") -> Path:
    """A local checkpoint folder for `spec`: the folder itself, or the hub repo's cached snapshot.

    `spec` may end in `@revision` (a branch, tag or commit); `revision=` says the same. `what`
    names the flag or argument in error messages.
    """
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():  # Path("") would be the current folder
        raise CheckpointError(f"{what} = {spec!r}; expected a checkpoint folder, a known name or a hub repo id "
                              "'owner/name'")
    path = Path(spec)
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(f"{what} {spec}: a revision ({revision!r}) was given for a local folder; "
                                  "expected a hub repo id for a revision")
        return path
    if path.exists():
        raise CheckpointError(f"{what} {spec}: a file, not a folder; expected a checkpoint folder with config.json")
    text = str(spec)
    if is_known(text):
        if revision is not None:
            raise CheckpointError(f"{what} {spec}: a revision ({revision!r}) was given for a known checkpoint; "
                                  "expected a hub repo id for a revision")
        from minispec.checkpoints.fetch import ensure_checkpoint

        try:
            return ensure_checkpoint(text)
        except OSError as error:  # a full disk, an unwritable folder: the user's to fix, in one line
            raise CheckpointError(f"{what} {spec}: fetching and converting it failed ({error.strerror or error}); "
                                  "expected room and write access for it (python -m minispec.weights --list gives "
                                  "its size; MINISPEC_HOME picks the folder)") from None
    repo_id, at, at_revision = text.partition("@")
    if at and not at_revision.strip():
        raise CheckpointError(f"{what} {spec}: nothing after '@'; expected owner/name@REVISION (a branch, tag or "
                              "commit) or no '@'")
    if at_revision and revision is not None and at_revision != revision:
        raise CheckpointError(f"{what} {spec}: two revisions ({at_revision!r} and {revision!r}); expected one")
    if not is_repo_id(repo_id):
        raise CheckpointError(f"{what} {spec}: no such folder; expected a checkpoint folder with config.json, "
                              "a known name (python -m minispec.weights --list) or a hub repo id 'owner/name[@revision]'")
    return _snapshot(repo_id, at_revision or revision, text, what)


def is_repo_id(text: str) -> bool:
    """'owner/name' as the hub spells it (not a path that starts with '.', '/' or '~')."""
    return bool(_REPO_ID.match(text)) and ".." not in text


def _snapshot(repo_id: str, revision: str | None, spec: str, what: str) -> Path:
    """Download (or find, offline) the repo's checkpoint files; the snapshot folder."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS)
    except LocalEntryNotFoundError:
        offline = "offline mode is on (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise CheckpointError(f"{what} {spec}: not a local folder, not in the hub cache ({constants.HF_HUB_CACHE}) "
                              f"and {offline}; expected a checkpoint folder or a cached or reachable repo id") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{what} {spec}: the hub repo has no revision {revision!r}") from None
    except GatedRepoError:
        raise CheckpointError(f"{what} {spec}: a gated repo; accept its licence on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{what} {spec}: no such hub repo (or a private one: set HF_TOKEN); "
                              "expected a checkpoint folder or a hub repo id") from None
    except (HfHubHTTPError, OSError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointError(f"{what} {spec}: fetching from the hub failed ({first_line})") from None
    return Path(folder)
