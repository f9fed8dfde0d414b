"""Profile one inference of a model outside any trainer (CPU or GPU).

python examples/profile_one_inference.py
"""

import torchvision

from lit_compute.profiling import profile_model

if __name__ == "__main__":
    result = profile_model(torchvision.models.resnet50(), input_size=(1, 3, 224, 224), row_limit=10)
    print(f"profiled call: {result.total_ms:.1f} ms")
