"""Training data: a local text, JSON-lines or parquet file tokenized and packed into fixed-length
blocks (the study packed WikiText-2 into 4096-token blocks). Without a tokenizer directory
the text is tokenized as UTF-8 bytes (ids 0-255, 256 ends a document), which needs no
download; the study measured systems behaviour, not model quality."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from iotune.errors import UsageError

BYTE_EOS = 256
FORMATS = (".txt", ".jsonl", ".parquet")


def check_inputs(data: str | None, tokenizer: str | None) -> None:
    """--data names a file of a known format; --tokenizer a saved Hugging Face tokenizer."""
    if data:
        if not Path(data).is_file():
            raise UsageError(
                f"--data {data}: no such file", hint="name a .txt, .jsonl or .parquet file"
            )
        if Path(data).suffix.lower() not in FORMATS:
            raise UsageError(
                f"--data {data}: unknown format {Path(data).suffix or '(none)'}",
                hint="use a .txt, .jsonl or .parquet file with the text",
            )
    if tokenizer and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise UsageError(
            f"--tokenizer {tokenizer} is not a Hugging Face tokenizer directory (no tokenizer_config.json)",
            hint="save one with AutoTokenizer.from_pretrained(...).save_pretrained(DIR), or leave it out for byte tokens",
        )


def read_texts(path: Path) -> Iterator[str]:
    """Documents of the file: paragraphs of a text file, the "text" field of JSON lines or of
    a parquet table."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise UsageError(
            f"--data {path}: no such file", hint="name a .txt, .jsonl or .parquet file"
        )
    if suffix == ".txt":
        doc: list[str] = []
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    doc.append(line)
                elif doc:
                    yield "".join(doc)
                    doc = []
        if doc:
            yield "".join(doc)
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(
                        f"--data {path}:{n}: not JSON: {exc.msg}", hint="one JSON object per line"
                    ) from exc
                if isinstance(rec, dict) and isinstance(rec.get("text"), str):
                    yield rec["text"]
    elif suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path, columns=["text"])
        except ImportError as exc:
            raise UsageError(
                f"--data {path}: reading parquet needs pyarrow", hint="pip install pyarrow"
            ) from exc
        except (KeyError, ValueError) as exc:
            raise UsageError(
                f"--data {path}: no 'text' column ({exc})", hint="WikiText's parquet files have one"
            ) from exc
        yield from (t for t in frame["text"] if isinstance(t, str))
    else:
        raise UsageError(
            f"--data {path}: unknown format {suffix or '(none)'}",
            hint="use a .txt, .jsonl or .parquet file with the text",
        )


def byte_tokens(texts: Iterable[str]) -> Iterator[int]:
    for t in texts:
        yield from t.encode("utf-8")
        yield BYTE_EOS


def pack(tokens: Iterable[int], seq_len: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Concatenate and cut into [blocks, seq_len]; the incomplete tail is dropped."""
    ids = np.fromiter(tokens, dtype=np.int32)
    n = len(ids) // seq_len
    if n == 0:
        raise UsageError(
            f"the data holds {len(ids)} tokens, fewer than one {seq_len}-token block",
            hint="use a larger file, or a shorter --set seq_len",
        )
    return ids[: n * seq_len].reshape(n, seq_len)


def prepare(
    path: Path, seq_len: int, vocab: int, out: Path, tokenizer: Path | None = None
) -> dict[str, Any]:
    """Tokenize and pack *path* into out (a .npy file the worker memory-maps)."""
    texts = read_texts(path)
    if tokenizer is None:
        if vocab <= BYTE_EOS:
            raise UsageError(
                f"a vocabulary of {vocab} cannot hold byte tokens", hint="--tokenizer DIR"
            )
        blocks = pack(byte_tokens(texts), seq_len)
        kind = "utf-8 bytes"
    else:
        from transformers import AutoTokenizer  # only when a tokenizer is asked for

        try:
            tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--tokenizer {tokenizer}: {str(exc).splitlines()[0]}",
                hint="a directory written by save_pretrained(), with its tokenizer files",
            ) from exc
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0

        def ids() -> Iterator[int]:
            for t in texts:
                yield from tok(t, add_special_tokens=False)["input_ids"]
                yield eos

        blocks = pack(ids(), seq_len)
        if int(blocks.max()) >= vocab:
            raise UsageError(
                f"the tokenizer produces ids up to {int(blocks.max())}, the model's vocabulary is {vocab}",
                hint="--set model.vocab_size=N to match the tokenizer",
            )
        kind = f"tokenizer {tokenizer}"
    np.save(out, blocks)
    return {
        "source": str(path),
        "tokenizer": kind,
        "blocks": str(out),
        "n_blocks": int(blocks.shape[0]),
        "seq_len": seq_len,
    }
