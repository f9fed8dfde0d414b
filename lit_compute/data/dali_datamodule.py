"""DALIImageDataModule: NVIDIA DALI image pipelines (GPU or CPU), sharded for DDP, with correct epochs."""

from __future__ import annotations

import gc
import math
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import torch

from lit_compute._compat import available_cpu_cores
from lit_compute._validate import Check, validated
from lit_compute.data.folders import first_undecodable
from lit_compute.data.torchvision_datamodule import IMAGENET_MEAN, IMAGENET_STD, TorchvisionImageDataModule


def _import_dali() -> Any:
    try:
        import nvidia.dali as dali  # noqa: F401 - the package's absence is what this import finds out
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as err:
        raise ModuleNotFoundError(
            "DALIImageDataModule needs NVIDIA DALI: pip install 'lit-compute[dali]' "
            f"(nvidia-dali-cuda120); importing it failed with: {err}"
        ) from err
    return fn, pipeline_def, types, DALIGenericIterator, LastBatchPolicy


# -- pipelines and fork ------------------------------------------------------------------------------------
# A DALI pipeline owns executor threads. A child forked from this process (a DataLoader worker of another
# datamodule, later in the same script or notebook) inherits the pipeline object but not its threads: if the
# child's garbage collector runs the pipeline's destructor, DALI waits on threads that do not exist there and the
# worker hangs for good. So: pipelines are released in the parent (at each training pass's end and at teardown,
# collected at once), the parent collects DALI garbage before forking, and a child never frees what it inherited.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # DALI iterators built in this process
_INHERITED: list[Any] = []  # in a forked child: strong references that keep inherited pipelines from being freed
_fork_handlers = False


def _before_fork() -> None:  # registered once this process built a pipeline
    gc.collect()  # unreferenced pipelines die here, where their threads exist


def _in_forked_child() -> None:
    _INHERITED.extend(_LIVE)  # never dropped to refcount zero in the child
    gc.freeze()  # and the child's collector never examines (nor finalises) anything it inherited


def _track(iterator: Any) -> Any:
    global _fork_handlers
    if not _fork_handlers and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_in_forked_child)
        _fork_handlers = True
    _LIVE.add(iterator)
    return iterator


def dali_available() -> bool:
    """True when NVIDIA DALI is installed (found without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no "nvidia" namespace at all
        return False


class DALILoader:
    """An iterable of ``(images, labels)`` batches from a DALI pipeline, with exact epochs.

    Every ``iter()`` starts at the beginning of a fresh pass over the shard. A training loader builds each
    pass's pipeline over a new seeded permutation of the files (the same on every rank, so shards stay
    disjoint). A validation loader resets its DALI iterator when the previous pass was consumed to the end
    (cheap); when Lightning stopped early (the sanity check, ``limit_*_batches``, ``fast_dev_run``,
    ``val_check_interval``), DALI would refuse to reset and resume mid-epoch, so the pipeline is rebuilt
    instead. ``len()`` is exact and the same on every rank.
    """

    def __init__(
        self,
        build: Callable[[int], Any],
        length: int,
        to_torch: Callable[[dict], tuple],
        reshuffle: bool = False,
        files: list[str] | None = None,
    ) -> None:
        self._build = build
        self._files = files or []
        self._reshuffle = reshuffle
        self._length = length
        self._to_torch = to_torch
        self._iterator: Any = None
        self._exhausted = False
        self.passes = 0  # passes started
        self._last: tuple | None = None

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[tuple]:
        # A generator: nothing is built until the first batch is asked for (Lightning calls iter() once
        # just to check that a loader is iterable).
        if self._iterator is not None and self._exhausted and not self._reshuffle:
            self._iterator.reset()
        else:
            self._iterator = None  # free the old pipeline before building the next
            self._iterator = self._build(self.passes)
        self._exhausted = False
        self.passes += 1
        iterator = self._iterator
        for _ in range(self._length):
            try:
                data = next(iterator)
            except StopIteration:
                break
            except RuntimeError as err:
                culprits = first_undecodable(self._files)  # DALI's message names no file: find it with a full decode
                named = f"; a full decode of this split fails on {', '.join(culprits)}" if culprits else ""
                raise RuntimeError(
                    f"DALIImageDataModule: DALI failed while reading or decoding images: {err}{named}"
                ) from err
            batch = self._to_torch(data[0])
            if batch[1].shape[0] == 0 and self._last is not None:  # see DALIImageDataModule: sharding
                batch = tuple(t[:1] for t in self._last)
            self._last = batch
            yield batch
        try:  # consume DALI's end-of-epoch marker so the next pass can reset cheaply
            next(iterator)
        except StopIteration:
            self._exhausted = True
        except RuntimeError:
            self._exhausted = False
        if self._reshuffle:  # a training pass builds a new pipeline next time: free this one now
            del iterator
            self.release()

    def release(self) -> None:
        """Free this loader's DALI pipeline now, in this process (the next pass builds a new one)."""
        if self._iterator is None:
            return
        self._iterator = None
        self._exhausted = False
        gc.collect()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_iterator"] = None  # DALI pipelines are never pickled (ddp_spawn)
        state["_exhausted"] = False
        return state


class DALIImageDataModule(TorchvisionImageDataModule):
    """ImageNet-style folders decoded and augmented by NVIDIA DALI, on the GPU or the CPU.

    Same batches as :class:`TorchvisionImageDataModule` (``(images, labels)``: ``(B, 3, image_size,
    image_size)`` normalised with ImageNet statistics, ``int64`` labels in the same class order), so the
    same LightningModule trains on either. Grayscale and PNG inputs give 3-channel RGB outputs.

    Train: file reader (a new seeded permutation of all files each epoch, ``shard_id`` = global rank,
    ``num_shards`` = world size), fused decode + random crop (``device="mixed"`` on GPU, ``"cpu"`` otherwise,
    area in ``[min_crop_scale, 1]``, aspect ratio in ``[3/4, 4/3]``), resize to ``image_size``, random
    mirror, normalise, CHW layout (or channels-last strides with ``channels_last=True``).
    Val: decode, resize the shorter side to ``val_resize``, center crop, normalise.

    ``device="auto"``: a GPU pipeline when the trainer runs on CUDA (``device_id`` = the rank's device,
    outputs already on it, so Lightning's transfer is a no-op), else a CPU-only pipeline (``device_id=None``).
    Pipelines are built in ``setup()`` on each rank (never pickled, so ``ddp_spawn`` works) and rebuilt when
    Lightning stops an epoch early, so every epoch starts a fresh pass (see :class:`DALILoader`).

    Sharding: ranks read disjoint shards whose union is the dataset, and all run the same number of batches.
    When shard sizes differ by one and the smaller shard fills whole batches, its last batch would be empty;
    it then repeats one sample of its previous batch instead (so no rank waits on the others).

    Args:
        data_dir: ImageNet-style folder; ``None`` uses the embedded synthetic dataset (as the torchvision one).
        batch_size: Samples per batch (per process).
        image_size: Side of the square crops.
        val_resize: Shorter side before the validation center crop (default ``round(image_size / 0.875)``).
        num_threads: DALI CPU threads per process (default: the cores available, divided between local ranks).
        device: ``"auto"``, ``"gpu"`` or ``"cpu"``.
        output_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"`` images.
        channels_last: Images in channels-last memory format.
        seed: Seed of the shuffles and augmentations (and of the synthetic dataset).
        min_crop_scale: Lower bound of the random crop's area.
        synthetic_num_classes: Classes of the synthetic dataset (``data_dir=None`` only).
        synthetic_images_per_class: Training images per class of the synthetic dataset.
        prefetch_queue_depth: Batches DALI prepares ahead.
        on_bad_image: ``"error"`` or ``"skip"``, as for :class:`TorchvisionImageDataModule` (the same check runs
            before training; a decode failure during training names the file).

    Raises:
        ModuleNotFoundError: DALI is not installed (``pip install 'lit-compute[dali]'``), at ``setup()``.
        ValueError: at ``setup()``: what :class:`TorchvisionImageDataModule` refuses (a missing or empty folder,
            differing classes, undecodable images, named), ``device="gpu"`` without CUDA.

    Example:
        >>> dm = DALIImageDataModule(batch_size=8, image_size=32, synthetic_images_per_class=4)
    """

    @validated
    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: Annotated[int, Check(ge=1)] = 64,
        image_size: Annotated[int, Check(ge=8)] = 224,
        val_resize: Annotated[int | None, Check(ge=8)] = None,
        num_threads: Annotated[int | None, Check(ge=1, hint="None: the available cores")] = None,
        device: Literal["auto", "gpu", "cpu"] = "auto",
        output_dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        channels_last: bool = False,
        seed: Annotated[int, Check(ge=0)] = 0,
        min_crop_scale: Annotated[float, Check(gt=0.0, le=1.0)] = 0.08,
        synthetic_num_classes: Annotated[int, Check(ge=2)] = 10,
        synthetic_images_per_class: Annotated[int, Check(ge=1)] = 100,
        prefetch_queue_depth: Annotated[int, Check(ge=1)] = 2,
        on_bad_image: Literal["error", "skip"] = "error",
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            batch_size=batch_size,
            image_size=image_size,
            val_resize=val_resize,
            num_workers=0,
            min_crop_scale=min_crop_scale,
            synthetic_num_classes=synthetic_num_classes,
            synthetic_images_per_class=synthetic_images_per_class,
            seed=seed,
            on_bad_image=on_bad_image,
        )
        self.num_threads = num_threads
        self.device = device
        self.output_dtype = output_dtype
        self.channels_last = channels_last
        self.prefetch_queue_depth = prefetch_queue_depth
        self.with_source_info = False  # yield (images, labels, paths): for auditing which files were read
        self._loaders: dict[str, DALILoader] = {}

    # -- set-up ---------------------------------------------------------------------------------------
    def _placement(self) -> tuple[str, int | None, int, int, int]:
        """(device kind, device_id, shard_id, num_shards, local world size) for this process."""
        trainer = self._trainer_or_none()
        on_cuda = trainer is not None and trainer.strategy.root_device.type == "cuda"
        name = type(self).__name__
        if self.device == "gpu" and not torch.cuda.is_available():
            raise ValueError(
                f"{name}(device='gpu') needs CUDA, which is not available here; use device='cpu' or 'auto'"
            )
        kind = "gpu" if self.device == "gpu" or (self.device == "auto" and on_cuda) else "cpu"
        device_id = None
        if kind == "gpu":
            device_id = trainer.strategy.root_device.index if on_cuda else torch.cuda.current_device()
        shard, shards = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        local = max(1, trainer.num_devices) if trainer is not None else 1
        return kind, device_id, shard, shards, local

    def _trainer_or_none(self) -> Any:
        try:
            return self.trainer
        except RuntimeError:
            return None

    def setup(self, stage: str | None = None) -> None:
        dali = _import_dali()
        scan = self.check_data()
        kind, device_id, shard, shards, local = self._placement()
        threads = self.num_threads or max(1, available_cpu_cores() // local)
        self._loaders = {
            split: self._make_loader(
                dali, scan.samples[split], split == "train", kind, device_id, shard, shards, threads
            )
            for split in ("train", "val")
        }

    def _make_loader(
        self,
        dali: Any,
        files: list[tuple[str, int]],
        train: bool,
        kind: str,
        device_id: int | None,
        shard: int,
        shards: int,
        threads: int,
    ) -> DALILoader:
        fn, pipeline_def, types, iterator_cls, policy = dali
        mean = [m * 255 for m in IMAGENET_MEAN]
        std = [s * 255 for s in IMAGENET_STD]
        size, resize, scale = self.image_size, self.val_resize, self.min_crop_scale
        decoder_device = "mixed" if kind == "gpu" else "cpu"
        dtype = types.FLOAT16 if self.output_dtype == "float16" else types.FLOAT
        layout = "HWC" if self.channels_last else "CHW"
        with_info = self.with_source_info
        n_files = len(files)

        @pipeline_def(enable_conditionals=False)
        def pipeline(order: list[int]) -> Any:
            # every rank reads the same ordered list; the reader gives each its contiguous, disjoint shard
            jpegs, labels = fn.readers.file(
                files=[files[i][0] for i in order],
                labels=[files[i][1] for i in order],
                shard_id=shard,
                num_shards=shards,
                pad_last_batch=True,
                name="Reader",
                random_shuffle=False,
            )
            if train:
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device=decoder_device,
                    output_type=types.RGB,
                    random_area=[scale, 1.0],
                    random_aspect_ratio=[3 / 4, 4 / 3],
                    num_attempts=10,
                )
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=resize)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images,
                dtype=dtype,
                output_layout=layout,
                crop=(size, size),
                mean=mean,
                std=std,
                mirror=mirror,
            )
            outputs = [images, labels.gpu() if kind == "gpu" else labels]
            if with_info:
                outputs.append(fn.pad(fn.get_property(jpegs, key="source_info"), fill_value=0, shape=[4096]))
            return tuple(outputs)

        names = ["images", "labels"] + (["paths"] if with_info else [])

        def build(pass_index: int) -> Any:
            order = list(range(n_files))
            if train:  # a fresh permutation per pass, the same on every rank
                order = torch.randperm(
                    n_files, generator=torch.Generator().manual_seed(self.seed * 1000 + pass_index)
                ).tolist()
            pipe = pipeline(
                order=order,
                batch_size=self.batch_size,
                num_threads=threads,
                device_id=device_id,
                seed=self.seed * 1000 + pass_index,
                prefetch_queue_depth=self.prefetch_queue_depth,
            )
            pipe.build()
            return _track(
                iterator_cls(pipe, names, reader_name="Reader", last_batch_policy=policy.PARTIAL, auto_reset=False)
            )

        channels_last, bf16 = self.channels_last, self.output_dtype == "bfloat16"

        def to_torch(data: dict) -> tuple:
            images = data["images"]
            if channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels-last strides
            if bf16:
                images = images.to(torch.bfloat16)
            labels = data["labels"].reshape(-1).long()
            if not with_info:
                return images, labels
            paths = ["".join(chr(c) for c in row if c) for row in data["paths"].cpu().tolist()]
            return images, labels, paths

        per_shard = math.ceil(n_files / shards)
        return DALILoader(
            build, math.ceil(per_shard / self.batch_size), to_torch, reshuffle=train, files=[path for path, _ in files]
        )

    # -- loaders ---------------------------------------------------------------------------------------
    def _loader(self, split: str) -> DALILoader:  # type: ignore[override]
        if split not in self._loaders:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a dataloader")
        return self._loaders[split]

    def train_dataloader(self) -> DALILoader:  # type: ignore[override]
        return self._loader("train")

    def val_dataloader(self) -> DALILoader:  # type: ignore[override]
        return self._loader("val")

    def test_dataloader(self) -> DALILoader:  # type: ignore[override]
        return self._loader("val")

    def teardown(self, stage: str | None = None) -> None:
        """Free every DALI pipeline of this datamodule in this process (a later forked DataLoader worker inherits
        none); ``setup()`` builds them again."""
        for loader in self._loaders.values():
            loader.release()
        super().teardown(stage or "fit")  # Lightning's own teardown takes a stage and does nothing with it

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_loaders"] = {}  # pipelines are built in setup() on each rank, never pickled
        return state
