"""DeviceMonitor as a user sees it: CPU metrics on a CPU run, NVML failures that never stop training."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lit_compute import DeviceMonitor

from ..conftest import RandomImages, make_trainer, read_events, scalar_values, tiny_model


def test_device_monitor_logs_cpu_quietly_on_a_cpu_run(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[DeviceMonitor(log_every_n_steps=1)], limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(tiny_model(), train_dataloaders=DataLoader(RandomImages(), batch_size=4))
    assert not [w for w in caught if "DeviceMonitor" in str(w.message)]  # CPU-only is expected, not a warning
    acc = read_events(trainer.logger.log_dir)
    tags = set(acc.Tags()["scalars"])
    assert {"device/cpu_percent", "device/rss_gb", "device/system_cpu_percent", "device/load_avg_1m"} <= tags
    assert all(v > 0.05 for _, v in scalar_values(acc, "device/rss_gb"))  # a real process, not zeros
    assert not [t for t in tags if t.startswith("device/gpu")]


def test_device_monitor_nvml_read_error_warns_once_and_training_goes_on(tmp_path):
    class Broken:
        def read(self):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

        def close(self):
            pass

    monitor = DeviceMonitor(log_every_n_steps=1, gpu=False)
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[monitor], limit_val_batches=0)

    class Inject(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            monitor._gpu_reader = Broken()

    trainer.callbacks.append(Inject())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(tiny_model(), train_dataloaders=DataLoader(RandomImages(), batch_size=4))
    assert len([w for w in caught if "GPU_IS_LOST" in str(w.message)]) == 1
    assert trainer.global_step == 4
    assert scalar_values(read_events(trainer.logger.log_dir), "device/cpu_percent")
