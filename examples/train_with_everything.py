"""Train the demo model with every lit_compute callback on, in plain Python (no YAML).

python examples/train_with_everything.py
tensorboard --logdir lightning_logs
"""

import lightning.pytorch as pl

from lit_compute import (
    DeviceMonitor,
    FlopsLogger,
    FP32BatchNormPrecision,
    ImageClassifier,
    LossScaleMonitor,
    ProfilerWindow,
    StepTimeMonitor,
    TorchvisionImageDataModule,
)

if __name__ == "__main__":
    trainer = pl.Trainer(
        max_epochs=1,
        log_every_n_steps=5,
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        callbacks=[
            FlopsLogger(peak="measure"),  # "table" on a GPU the peak table knows
            StepTimeMonitor(),
            DeviceMonitor(),
            LossScaleMonitor(),
            ProfilerWindow(start_step=10, warmup=2, active=3),
        ],
    )
    trainer.fit(ImageClassifier("resnet18"), datamodule=TorchvisionImageDataModule(batch_size=32, image_size=64))
