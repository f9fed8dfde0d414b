"""GPT: a small causal language model (the one a language-model user recognises), trained from scratch."""

from __future__ import annotations

import math
from typing import Annotated, Any, cast

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn import functional as F

from lit_compute import _compat
from lit_compute._validate import Check, validated


class GPTBlock(nn.Module):
    """Pre-norm transformer block: LayerNorm -> causal self-attention -> residual; LayerNorm -> MLP -> residual."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.dropout = dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        # head-major (head, q/k/v, dim): a column-wise shard of qkv holds whole heads, so tensor parallelism
        # splits the heads between devices (-1: the heads this device holds)
        qkv = self.qkv(self.ln_1(x)).view(b, t, -1, 3, c // self.n_head)
        q, k, v = (z.transpose(1, 2) for z in qkv.unbind(dim=3))
        p = self.dropout if self.training else 0.0
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(LightningModule):
    """A GPT-style causal language model: token and position embeddings, pre-norm blocks with causal
    ``scaled_dot_product_attention``, a final LayerNorm and an output head tied to the token embedding.

    Batches are mappings with ``input_ids`` ``(B, T)`` and optionally ``attention_mask`` (1 = real token,
    0 = padding: padded positions are neither attended to nor predicted) and ``labels`` (default: the inputs;
    the model predicts token t+1 from tokens up to t; label -100 is ignored), as Hugging Face models take
    them and :class:`~lit_compute.data.TokenDataModule` makes them.

    Model FLOPs per token (forward, one multiply-add = 2 FLOPs): ``2 x 12 x n_layer x n_embd^2`` for the
    blocks' matmuls, ``2 x 2 x n_layer x T x n_embd`` for attention at sequence length T (full score matrix,
    the convention of PaLM's MFU), and ``2 x n_embd x vocab_size`` for the head; training is 3 x forward.

    Logged metrics:
        - ``train/loss``: next-token cross-entropy, every step.
        - ``val/loss``, ``val/perplexity``: per validation epoch.

    Args:
        vocab_size: Token ids are in ``[0, vocab_size)`` (258: TokenDataModule's bytes, end-of-document and padding).
        block_size: Longest sequence (position embeddings).
        n_layer: Transformer blocks.
        n_head: Attention heads (must divide ``n_embd``).
        n_embd: Model width.
        dropout: Dropout on attention and residual branches.
        lr: Peak learning rate (AdamW).
        weight_decay: Decoupled weight decay of the matrices (not of norms, biases, embeddings).
        warmup_steps: Linear warm-up steps, then cosine decay to 10% over the run's optimizer steps.
        compile: ``torch.compile`` the blocks in ``configure_model``.

    Sharded: under Lightning's ``ModelParallelStrategy`` (``configs/gpt_model_parallel.yaml``), ``configure_model``
    splits each block's heads and MLP between the ``tensor_parallel`` devices and shards the blocks with FSDP2
    over ``data_parallel`` (see ``_shard``).

    Raises:
        ValueError: bad sizes (the message names the argument).

    Example:
        >>> model = GPT(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=32)
        >>> model(torch.zeros(2, 16, dtype=torch.long)).shape
        torch.Size([2, 16, 256])
    """

    @property
    def hp(self) -> Any:
        """``self.hparams`` (Lightning types it as a mapping; its keys read as attributes)."""
        return self.hparams

    @validated
    def __init__(
        self,
        vocab_size: Annotated[int, Check(ge=2)] = 258,
        block_size: Annotated[int, Check(ge=2)] = 256,
        n_layer: Annotated[int, Check(ge=1)] = 4,
        n_head: Annotated[int, Check(ge=1)] = 4,
        n_embd: Annotated[int, Check(ge=1)] = 128,
        dropout: Annotated[float, Check(ge=0.0, lt=1.0)] = 0.0,
        lr: Annotated[float, Check(gt=0)] = 1e-3,
        weight_decay: Annotated[float, Check(ge=0)] = 0.1,
        warmup_steps: Annotated[int, Check(ge=0)] = 20,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"GPT(n_head={n_head}) must divide n_embd={n_embd}")
        self.save_hyperparameters()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def setup(self, stage: str) -> None:
        # An example batch of one sequence, so Lightning's model summary reports this model's real FLOPs
        length = getattr(getattr(self._trainer, "datamodule", None), "seq_len", None) if self._trainer else None
        if self.example_input_array is None and isinstance(length, int):
            self.example_input_array = torch.zeros(1, min(length, self.hp.block_size), dtype=torch.long)

    def configure_model(self) -> None:
        mesh = getattr(self, "_device_mesh", None)  # set by Lightning's ModelParallelStrategy
        if mesh is not None and not getattr(self, "_sharded", False):
            self._sharded = True
            self._shard(mesh)
        if self.hp.compile and not all(_compat.compiled_original(b) is not None for b in self.blocks):
            self.blocks = nn.ModuleList(cast(nn.Module, torch.compile(b)) for b in self.blocks)

    def _shard(self, mesh: Any) -> None:
        """Under ``ModelParallelStrategy``: tensor parallelism inside each block over the ``tensor_parallel`` mesh
        dimension (attention heads and the MLP's hidden units split column-wise into ``qkv`` and ``mlp.0``, joined
        row-wise by ``proj`` and ``mlp.2``: one all-reduce after attention and one after the MLP, as Megatron-LM
        does), then FSDP2 (``fully_shard``) over ``data_parallel``: each block, then the rest. Embeddings, norms and
        the tied head stay whole on every tensor-parallel device (they run on each: counted on each)."""
        tp = mesh["tensor_parallel"]
        if tp.size() > 1:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            if self.hp.n_head % tp.size():
                raise ValueError(
                    f"GPT(n_head={self.hp.n_head}) must be divisible by tensor_parallel_size="
                    f"{tp.size()}: each device holds whole attention heads"
                )
            plan = {
                "qkv": ColwiseParallel(),
                "proj": RowwiseParallel(),
                "mlp.0": ColwiseParallel(),
                "mlp.2": RowwiseParallel(),
            }
            for block in self.blocks:
                parallelize_module(block, tp, plan)
        dp = mesh["data_parallel"]
        if dp.size() > 1:
            from torch.distributed.fsdp import fully_shard

            for block in self.blocks:
                fully_shard(block, mesh=dp)
            fully_shard(self, mesh=dp)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t = input_ids.shape
        if t > self.hp.block_size:
            raise ValueError(f"GPT: a sequence of {t} tokens is longer than block_size={self.hp.block_size}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        mask = None
        if attention_mask is not None:
            causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
            keys = attention_mask.bool()[:, None, None, :]
            mask = causal[None, None] & keys
            mask = mask | torch.eye(t, dtype=torch.bool, device=input_ids.device)  # a padded query sees itself: no NaN
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        labels = batch.get("labels", ids)
        if mask is not None:
            labels = labels.masked_fill(mask == 0, -100)
        logits = self(ids, mask)
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
        )

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/perplexity", torch.exp(loss.detach().float()), sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hp
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and "emb" not in n]
        rest = [p for n, p in self.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=(0.9, 0.95),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1000
        warmup = min(hp.warmup_steps, max(1, total // 10))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
