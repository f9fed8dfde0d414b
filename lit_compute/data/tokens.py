"""TokenDataModule: real text on every machine (the Python standard library's own source), byte-level tokens,
padded or packed batches for causal language models."""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from lit_compute._validate import Check, validated
from lit_compute.data.synthetic import default_cache_dir

EOS, PAD = 256, 257
VOCAB_SIZE = 258
_FORMAT_VERSION = 1


def stdlib_sources() -> list[Path]:
    """The ``.py`` files of this interpreter's standard library (tests and site-packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}
    return sorted(p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & skip))


def encode(text: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes (0-255)."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def _documents(text: str, max_tokens: int) -> list[list[int]]:
    """A file cut into documents at blank lines (a function, a class, a paragraph of text: blocks shorter than a
    quarter of ``max_tokens`` are joined to the next), each at most ``max_tokens`` tokens with its end-of-document
    token: naturally variable lengths."""
    docs: list[list[int]] = []
    current: list[int] = []
    for block in text.split("\n\n"):
        tokens = encode(block + "\n\n")
        if len(tokens) > max_tokens - 1:  # a block longer than a document: cut it into equal pieces
            if current:
                docs.append(current + [EOS])
                current = []
            pieces = -(-len(tokens) // (max_tokens - 1))
            size = -(-len(tokens) // pieces)
            docs += [tokens[i : i + size] + [EOS] for i in range(0, len(tokens) - size, size)]
            tokens = tokens[(pieces - 1) * size :]
        if current and len(current) + len(tokens) > max_tokens - 1:
            docs.append(current + [EOS])
            current = []
        current += tokens
        if len(current) >= max_tokens // 4:
            docs.append(current + [EOS])
            current = []
    if current:
        docs.append(current + [EOS])
    return [d for d in docs if len(d) > 8]


class _Documents(Dataset):
    def __init__(self, docs: list[np.ndarray]) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.docs[i]


def pad_batch(docs: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Pad a batch of documents to its longest: ``input_ids`` (padding = ``PAD``) and ``attention_mask``."""
    longest = max(len(d) for d in docs)
    ids = torch.full((len(docs), longest), PAD, dtype=torch.long)
    mask = torch.zeros(len(docs), longest, dtype=torch.long)
    for i, d in enumerate(docs):
        ids[i, : len(d)] = torch.from_numpy(np.asarray(d, dtype=np.int64))
        mask[i, : len(d)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def stack_rows(rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Packed rows (all ``seq_len`` long); a mask only when a row has padding (the corpus' last)."""
    ids = torch.from_numpy(np.stack(rows).astype(np.int64))
    batch = {"input_ids": ids}
    if bool((ids == PAD).any()):
        batch["attention_mask"] = (ids != PAD).long()
    return batch


class TokenDataModule(LightningDataModule):
    """Real text that is on every machine without a download - the running interpreter's standard-library source
    files - as byte-level tokens for causal language models (:class:`~lit_compute.models.GPT`).

    The corpus: the standard library's ``.py`` files (tests left out) in a seeded order, up to ``max_tokens``
    tokens, each file cut at blank lines into documents of at most ``seq_len`` tokens ending with an
    end-of-document token; a seeded ``val_fraction`` of the files is the validation split. Tokens are UTF-8 bytes
    (0-255) plus ``EOS`` (256) and ``PAD`` (257): ``vocab_size`` is 258. Tokenised once and cached under
    ``$LIT_COMPUTE_CACHE/tokens/`` (keyed by the Python version and the arguments); deterministic given ``seed``.

    Batching modes:

    - ``"padded"``: one document per row, each batch padded to its longest document (``PAD`` ids, and an
      ``attention_mask`` that is 0 on padding): the variable-length batches most language-model code starts with,
      and their padding waste.
    - ``"packed"``: every split's documents concatenated (with their ``EOS``) and cut into rows of exactly
      ``seq_len`` tokens: no padding except the corpus' last row (which then has an ``attention_mask``); every
      token of the split appears exactly once per epoch. Rows cross document boundaries (no document masking).

    Batches are ``{"input_ids": (B, T), "attention_mask": (B, T)}`` (the mask omitted where nothing is padding):
    lit_compute's timeline reads tokens, real tokens and padding from them (``time/tokens_per_sec``,
    ``compute/padding_fraction``).

    Args:
        mode: ``"padded"`` or ``"packed"``.
        batch_size: Rows per batch (per process under DDP).
        seq_len: The longest document / the packed row length, in tokens.
        max_tokens: Corpus size in tokens (both splits).
        val_fraction: Share of the files in the validation split.
        num_workers: DataLoader workers (collation is cheap; 0 is usually right).
        seed: Order of files and documents, and the split.

    Example:
        >>> dm = TokenDataModule(mode="packed", seq_len=64, max_tokens=20_000)
    """

    vocab_size = VOCAB_SIZE
    pad_token_id = PAD
    eos_token_id = EOS

    @validated
    def __init__(
        self,
        mode: Literal["padded", "packed"] = "padded",
        batch_size: Annotated[int, Check(ge=1)] = 16,
        seq_len: Annotated[int, Check(ge=16)] = 256,
        max_tokens: Annotated[int, Check(ge=1000)] = 1_000_000,
        val_fraction: Annotated[float, Check(gt=0.0, lt=1.0)] = 0.05,
        num_workers: Annotated[int, Check(ge=0)] = 0,
        seed: Annotated[int, Check(ge=0)] = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.mode = mode
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.max_tokens = max_tokens
        self.val_fraction = val_fraction
        self.num_workers = num_workers
        self.seed = seed
        self.splits: dict[str, list[np.ndarray]] = {}

    # -- the corpus ------------------------------------------------------------------------------------
    def cache_path(self) -> Path:
        import sys

        key = json.dumps(
            {
                "v": _FORMAT_VERSION,
                "python": sys.version.split()[0],
                "seq_len": self.seq_len,
                "max_tokens": self.max_tokens,
                "val": self.val_fraction,
                "seed": self.seed,
            },
            sort_keys=True,
        )
        return default_cache_dir() / "tokens" / f"stdlib-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"

    def prepare_data(self) -> None:
        self._corpus()

    def _corpus(self) -> dict[str, list[np.ndarray]]:
        path = self.cache_path()
        if path.is_file():
            try:
                with np.load(path) as data:
                    return {
                        split: np.split(data[f"{split}_tokens"], data[f"{split}_ends"][:-1])
                        for split in ("train", "val")
                    }
            except Exception as err:  # noqa: BLE001 - a cut or damaged cache file is rebuilt, not fatal
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(
                    f"TokenDataModule: the token cache {path} is damaged ({type(err).__name__}: {err}); rebuilding it.",
                    category=UserWarning,
                )
                path.unlink(missing_ok=True)
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(
            f"TokenDataModule: tokenising this Python's standard library ({self.max_tokens:,} tokens; once, "
            f"cached in {path.parent})"
        )
        files = stdlib_sources()
        if not files:
            raise ValueError(
                "TokenDataModule: found no standard-library .py files under "
                f"{sysconfig.get_paths()['stdlib']!r} (an interpreter without its sources?)"
            )
        rng = random.Random(self.seed)
        rng.shuffle(files)
        splits: dict[str, list[list[int]]] = {"train": [], "val": []}
        total = 0
        for f in files:
            if total >= self.max_tokens:
                break
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            name = hashlib.sha1(f"{self.seed}:{f.name}".encode()).digest()
            split = "val" if name[0] / 256 < self.val_fraction else "train"
            for doc in _documents(text, self.seq_len):
                if total >= self.max_tokens:  # the limit holds inside a file too (one huge file is not all read)
                    break
                splits[split].append(doc)
                total += len(doc)
        if not splits["val"]:  # a tiny corpus: give validation one file's documents
            keep = max(1, min(4, len(splits["train"]) // 2))
            splits["val"], splits["train"] = splits["train"][-keep:], splits["train"][:-keep]
        if not splits["train"] or not splits["val"]:
            docs = splits["train"] + splits["val"]
            raise ValueError(
                f"TokenDataModule: the corpus is too small: {sum(len(d) for d in docs)} tokens in {len(docs)} "
                f"document(s) from {len(files)} file(s) under {sysconfig.get_paths()['stdlib']!r} "
                "(files that are not UTF-8 text are skipped, documents of 8 tokens or fewer dropped); training and "
                "validation need at least one document each: an interpreter with its standard-library sources "
                "installed gives millions of tokens."
            )
        arrays = {}
        for split, docs in splits.items():
            flat = np.concatenate([np.asarray(d, dtype=np.uint16) for d in docs])
            arrays[f"{split}_tokens"] = flat
            arrays[f"{split}_ends"] = np.cumsum([len(d) for d in docs])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        os.close(fd)
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        return {split: np.split(arrays[f"{split}_tokens"], arrays[f"{split}_ends"][:-1]) for split in ("train", "val")}

    def setup(self, stage: str | None = None) -> None:
        self.splits = self._corpus()

    def token_count(self, split: str) -> int:
        return int(sum(len(d) for d in self.splits[split]))

    # -- loaders ---------------------------------------------------------------------------------------
    def _rows(self, split: str) -> list[np.ndarray]:
        stream = np.concatenate(self.splits[split])
        rows = [stream[i : i + self.seq_len] for i in range(0, len(stream), self.seq_len)]
        if len(rows[-1]) < self.seq_len:
            rows[-1] = np.concatenate([rows[-1], np.full(self.seq_len - len(rows[-1]), PAD, dtype=stream.dtype)])
        return rows

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if not self.splits:
            raise RuntimeError("TokenDataModule.setup() must run before asking for a dataloader")
        collate: Callable[[list[np.ndarray]], dict[str, torch.Tensor]]
        if self.mode == "packed":
            data, collate = _Documents(self._rows(split)), stack_rows
        else:
            data, collate = _Documents(self.splits[split]), pad_batch
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            data,
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
            generator=generator,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "seed": self.seed}
