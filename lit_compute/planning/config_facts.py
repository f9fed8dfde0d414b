"""A config's facts before any run, for ``lit-compute whatif --config C``: what would this cost on an H100, with no
CPU run first.

The config is built as ``lit-compute estimate`` builds it (the LightningModule on fake tensors, one real batch),
and one whole training step - ``training_step``, backward, every optimizer's step, under the config's precision
plugin - runs on fake tensors under FlopsLogger's counter (``SafeFlopCounterMode``: the op classes' FLOPs, bytes
and kernels a real run's ``compute/op_classes`` would hold) and the memory tracker (the step's peak and its parts).
The training loader is timed apart in this process (:mod:`lit_compute.planning.loader_cost`). What no run has
measured is said in the facts' notes: the efficiencies are the defaults, and Lightning's own work per step is not
in the host's time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lit_compute import _compat
from lit_compute.formatting import first_line
from lit_compute.planning.whatif import ChannelsFirst, OpCost, RunFacts, WhatifError

__all__ = ["config_facts", "with_counts_at"]


def config_facts(config: str | Path, overrides: list[str] | None = None, time_the_loader: bool = True) -> RunFacts:
    """The facts :func:`~lit_compute.planning.whatif.predict` needs, from ``config`` alone (see the module
    docstring). Raises :class:`WhatifError` for a config that cannot be built or traced (the message says why).
    ``time_the_loader=False``: the op classes and memory only."""
    from lit_compute.flops.counting import SafeFlopCounterMode
    from lit_compute.planning.estimate import EstimateError, build_pieces, resized, trace_step, untraceable_module
    from lit_compute.planning.estimate.trace import prepare
    from lit_compute.planning.loader_cost import time_loader

    try:
        pieces = build_pieces(config, list(overrides or []))
    except EstimateError as err:
        raise WhatifError(f"--config {config}: {err}") from None
    if _compat.model_parallel_sizes(pieces.trainer.strategy) is not None:
        raise WhatifError(
            f"--config {config}: ModelParallelStrategy is not traced by whatif --config; train a few "
            "steps with FlopsLogger and StepTimeMonitor and price that run (lit-compute whatif RUN)"
        )
    optimizers = prepare(pieces)
    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=pieces.model, hookless=True)

    def optimizer_begins(*_: Any) -> None:
        counter.in_optimizer_step = True

    hooks = [opt.register_step_pre_hook(optimizer_begins) for opt in optimizers]
    batch = resized(pieces.batch, pieces.batch_size, pieces.batch_size, pieces.fake_mode)
    try:
        with pieces.fake_mode, counter:
            memory = trace_step(pieces.model, batch, optimizers, pieces.trainer.precision_plugin)
    except EstimateError as err:
        raise WhatifError(f"--config {config}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's step on fake tensors: where it failed, in one line
        raise WhatifError(
            f"--config {config}: the step cannot be counted on fake tensors "
            f"({untraceable_module(err, pieces.model)}: {type(err).__name__}); train a few steps with "
            "FlopsLogger and price that run (lit-compute whatif RUN)"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
    count = counter.result()
    params = list(pieces.model.parameters())
    trainer = pieces.trainer
    notes = [f"{Path(config).name}: counted on fake tensors before any run; priced at the default efficiencies"]
    facts = RunFacts(
        path=Path(config),
        by_class={k: OpCost.of(v) for k, v in count.by_class.items()},
        samples=pieces.batch_size,
        model_flops=float(count.total),
        accumulate=int(trainer.accumulate_grad_batches),
        channels_first=ChannelsFirst(*(float(v) for v in count.channels_first)),
        conv_weights=float(count.conv_weights),
        kernels=count.kernels,
        parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in params if p.requires_grad),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        precision=str(trainer.precision),
        device="traced",
        world_size=int(trainer.world_size),
        data_parallel=int(trainer.world_size),
        strategy=type(trainer.strategy).__name__,
        loader_workers=pieces.loader_workers,
        tokens_per_sample=_tokens_per_sample(pieces.batch),
        memory={p: float(v) for p, v in memory.parts.items()},
        notes=notes,
    )
    if not time_the_loader:
        return facts
    try:
        facts.loader = time_loader(pieces.loader, pieces.batch_size)
        notes.append(
            "the host's time is the loader's own, timed here at two batch sizes; Lightning's work per step "
            "is not in it (no run measured it)"
        )
    except Exception as err:  # noqa: BLE001 - the user's data code: priced without input, and said
        notes.append(f"the loader could not be timed here ({first_line(err)}): no input time is priced")
    return facts


def _tokens_per_sample(batch: Any) -> float | None:
    ids = batch.get("input_ids") if isinstance(batch, dict) else getattr(batch, "input_ids", None)
    return float(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None


def with_counts_at(run: RunFacts, precision: str) -> RunFacts:
    """``run`` with its step counted again at ``precision`` (:attr:`RunFacts.recounted`): its own config
    (``config.yaml`` in the run folder, written by ``lit-compute fit``) with the trainer's precision (and any precision
    plugin) replaced, traced on fake CPU tensors, so the casts autocast adds around each matmul and convolution are
    counted ops with their bytes instead of an assumption. Used for a CPU target (the trace is CPU autocast's). Where
    that cannot be done (no config, a config that does not trace here) a note says so and the run is priced from its
    own counts."""
    import tempfile
    import warnings

    import yaml

    if precision == run.precision or precision in run.recounted:
        return run
    config = Path(run.path) / "config.yaml"
    if not config.is_file():
        run.notes.append(
            f"{precision} is priced from the run's {run.precision} counts ({run.path} has no config.yaml "
            "to count the step again at that precision)"
        )
        return run
    from lit_compute.planning.loader_cost import run_config

    kept = run_config(config)
    trainer = dict(kept.get("trainer") or {})
    plugins = trainer.get("plugins")
    plugins = plugins if isinstance(plugins, list) else [plugins] if plugins else []
    # the precision plugin is the run's precision: the target's is Lightning's own for that precision string
    kept_plugins = [p for p in plugins if "Precision" not in str(p.get("class_path", p) if isinstance(p, dict) else p)]
    trainer.pop("plugins", None)
    if kept_plugins:
        trainer["plugins"] = kept_plugins
    trainer.update(precision=precision, logger=False, callbacks=None, enable_checkpointing=False)
    kept["trainer"] = trainer
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp, "config.yaml")
        path.write_text(yaml.safe_dump(kept))
        try:
            counted = config_facts(path, time_the_loader=False)
        except WhatifError as err:
            run.notes.append(
                f"{precision} is priced from the run's {run.precision} counts (its step could not be "
                f"counted again at {precision}: {first_line(err).replace(str(path), 'its config')})"
            )
            return run
    scale = run.samples / max(1, counted.samples)  # per batch of the run's micro-batch (the optimizer's step kept)
    run.recounted[precision] = {
        k: (v if k == "optimizer" else OpCost(v.flops * scale, v.bytes * scale, v.kernels))
        for k, v in counted.by_class.items()
    }
    return run
