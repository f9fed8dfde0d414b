"""Language models first-class: the token datamodule, the GPT model, token metrics in the event files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lit_compute import FlopsLogger, StepTimeMonitor, TokenSpec, count_flops
from lit_compute.data import TokenDataModule
from lit_compute.data.tokens import EOS, PAD, decode
from lit_compute.models import GPT

from ..conftest import DrivenClock, clocked_trainer, read_events, scalar_values

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"seq_len": 128, "max_tokens": 60_000, "batch_size": 4}


@pytest.fixture(scope="module")
def corpus():
    dm = TokenDataModule(**SMALL)
    dm.prepare_data()
    dm.setup()
    return dm


def test_the_corpus_is_real_python_source_and_deterministic(corpus):
    text = decode([t for d in corpus.splits["train"][:20] for t in d.tolist()])
    assert "def " in text or "import " in text  # the standard library's own code
    assert all(d[-1] == EOS and len(d) <= SMALL["seq_len"] for d in corpus.splits["train"])
    again = TokenDataModule(**SMALL)
    again.setup()
    assert all(np.array_equal(a, b) for a, b in zip(corpus.splits["train"], again.splits["train"]))
    other = TokenDataModule(**{**SMALL, "seed": 1})
    other.setup()
    assert not all(np.array_equal(a, b) for a, b in zip(corpus.splits["train"], other.splits["train"]))


def test_padded_batches_vary_in_length_and_mask_exactly_the_padding(corpus):
    lengths, masked, positions = set(), 0, 0
    for batch in corpus.train_dataloader():
        ids, mask = batch["input_ids"], batch["attention_mask"]
        assert ids.shape == mask.shape
        assert bool(((ids == PAD) == (mask == 0)).all())
        lengths.add(ids.shape[1])
        masked += int((mask == 0).sum())
        positions += ids.numel()
    assert len(lengths) > 3  # each batch padded to its own longest document
    assert 0.05 < masked / positions < 0.8


def test_packed_rows_hold_every_token_of_the_split_exactly_once(corpus):
    packed = TokenDataModule(**{**SMALL, "mode": "packed"})
    packed.setup()
    seen = []
    for batch in packed.train_dataloader():
        ids = batch["input_ids"]
        assert ids.shape[1] == SMALL["seq_len"]
        seen.append(ids[ids != PAD] if "attention_mask" in batch else ids.flatten())
    tokens = torch.cat(seen)
    assert tokens.numel() == corpus.token_count("train")
    expected = np.concatenate(corpus.splits["train"])
    assert sorted(tokens.tolist()) == sorted(expected.tolist())  # shuffled rows, the same multiset of tokens


def test_gpt_flops_follow_the_analytic_formula():
    model = GPT(vocab_size=258, block_size=64, n_layer=2, n_head=2, n_embd=32)
    ids = torch.randint(0, 258, (2, 16))
    count = count_flops(model, ids, count_on="real")
    t, d, n, v, length = 2 * 16, 32, 2, 258, 16
    forward = n * (24 * t * d * d + 4 * 2 * length * length * d) + 2 * t * d * v
    assert count.forward == forward
    assert count.total == 3 * forward


def _fit_tokens(tmp_path, corpus, callback):
    clock = DrivenClock()

    class Timed(GPT):
        def training_step(self, batch, batch_idx):
            clock.advance(0.05)
            return super().training_step(batch, batch_idx)

    model = Timed(vocab_size=258, block_size=128, n_layer=1, n_head=2, n_embd=16)
    trainer = clocked_trainer(
        tmp_path, clock, max_steps=6, limit_train_batches=6, limit_val_batches=0, callbacks=[callback]
    )
    # the training split in order (the batches listed here are the ones trained on): the validation split can hold
    # fewer than six batches (a Debian python3's standard library has few files, and which are validation is seeded)
    loader = corpus._loader("train", shuffle=False)
    batches = [b for _, b in zip(range(6), loader)]
    trainer.fit(model, train_dataloaders=loader)
    return read_events(trainer.logger.log_dir), batches


def test_tokens_per_second_counts_real_tokens(tmp_path, corpus):
    acc, batches = _fit_tokens(tmp_path, corpus, StepTimeMonitor(log_every_n_steps=2))
    tokens = dict(scalar_values(acc, "time/tokens_per_sec"))
    real = [int(b["attention_mask"].sum()) for b in batches]
    assert tokens == {
        1: pytest.approx(real[1] / 0.05, rel=1e-6),  # step 0 holds the start: left out
        3: pytest.approx((real[2] + real[3]) / 0.1, rel=1e-6),
        5: pytest.approx((real[4] + real[5]) / 0.1, rel=1e-6),
    }


def test_padding_fraction_is_the_masked_share(tmp_path, corpus):
    acc, batches = _fit_tokens(tmp_path, corpus, FlopsLogger(peak_flops=1e12, log_every_n_steps=2))
    padding = dict(scalar_values(acc, "compute/padding_fraction"))
    assert sorted(padding) == [1, 3, 5]
    for step in (1, 3, 5):
        pair = batches[step - 1 : step + 1]
        real = sum(int(b["attention_mask"].sum()) for b in pair)
        total = sum(b["input_ids"].numel() for b in pair)
        assert padding[step] == pytest.approx(1 - real / total, rel=1e-6)
    assert {"compute/flops_per_step", "compute/hardware_flops_per_step"} <= set(acc.Tags()["scalars"])


def test_a_token_spec_points_at_other_keys(tmp_path):
    class Renamed(GPT):
        def training_step(self, batch, batch_idx):
            return super().training_step({"input_ids": batch["tokens"], "attention_mask": batch["keep"]}, batch_idx)

    ids = torch.randint(0, 250, (16, 24))
    keep = torch.ones(16, 24, dtype=torch.long)
    keep[:, 18:] = 0
    data = [{"tokens": ids[i : i + 4], "keep": keep[i : i + 4]} for i in range(0, 16, 4)]
    trainer = clocked_trainer(
        tmp_path,
        DrivenClock(),
        max_steps=4,
        limit_val_batches=0,
        callbacks=[FlopsLogger(peak="none", log_every_n_steps=1, tokens=TokenSpec(key="tokens", mask_key="keep"))],
    )
    trainer.fit(
        Renamed(block_size=32, n_layer=1, n_head=2, n_embd=16),
        train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None),
    )
    padding = [v for _, v in scalar_values(read_events(trainer.logger.log_dir), "compute/padding_fraction")]
    assert padding
    assert all(v == pytest.approx(6 / 24) for v in padding)


def test_bad_token_arguments_are_named():
    with pytest.raises(ValueError, match=r"TokenDataModule\(mode='bucketed'\) must be one of 'padded', 'packed'"):
        TokenDataModule(mode="bucketed")
    with pytest.raises(ValueError, match=r"TokenDataModule\(seq_len=4\) must be an integer >= 16"):
        TokenDataModule(seq_len=4)
    with pytest.raises(ValueError, match=r"GPT\(n_head=3\) must divide n_embd=128"):
        GPT(n_head=3)
    with pytest.raises(ValueError, match=r"TokenSpec\(pad_id='0'\) must be an integer or None"):
        TokenSpec(pad_id="0")


# -- damaged or tiny corpora ----------------------------------------------------------------------------------------
def _sources(monkeypatch, tmp_path, files: dict[str, bytes]) -> None:
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path / "cache"))  # never the shared cache: other files, same key
    paths = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    monkeypatch.setattr("lit_compute.data.tokens.stdlib_sources", lambda: sorted(paths))


@pytest.mark.parametrize(
    "files",
    [{"blob.py": bytes(range(256)) * 40}, {"three.py": b"a = 1\nb = 2\nc = 3\n"}],
    ids=["one-binary-file", "one-three-line-file"],
)
def test_a_corpus_too_small_to_split_says_so(monkeypatch, tmp_path, files):
    _sources(monkeypatch, tmp_path, files)
    dm = TokenDataModule(seq_len=64, max_tokens=20_000)
    with pytest.raises(
        ValueError,
        match=r"TokenDataModule: the corpus is too small: \d+ tokens in \d document\(s\) "
        r"from 1 file\(s\)",
    ):
        dm.prepare_data()


def test_max_tokens_holds_inside_one_huge_file(monkeypatch, tmp_path):
    _sources(monkeypatch, tmp_path, {"huge.py": b"x" * 2_000_000, "small.py": b"def f():\n    return 1\n\n" * 50})
    dm = TokenDataModule(seq_len=64, max_tokens=20_000)
    dm.prepare_data()
    dm.setup()
    assert 20_000 <= dm.token_count("train") + dm.token_count("val") <= 20_000 + 64


def test_a_cut_token_cache_is_named_and_rebuilt(monkeypatch, tmp_path):
    _sources(monkeypatch, tmp_path, {f"m{i}.py": b"def f():\n    return 1\n\n" * 40 for i in range(8)})
    dm = TokenDataModule(seq_len=64, max_tokens=5_000)
    dm.setup()
    before = [d.tolist() for d in dm.splits["train"]]
    path = dm.cache_path()
    path.write_bytes(path.read_bytes()[:10])
    with pytest.warns(UserWarning, match=f"the token cache {path} is damaged .*BadZipFile.*rebuilding it"):
        dm.setup()
    assert [d.tolist() for d in dm.splits["train"]] == before
    assert path.stat().st_size > 10
