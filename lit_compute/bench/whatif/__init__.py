"""``lit-compute bench whatif``: ``lit-compute whatif``'s predictions beside measurements, a module a part.

- :mod:`.training`: training a config in a fresh process (the run folders every measured part reads);
- :mod:`.zoo`: the published results' models and their optimizers, and their steps counted on fake tensors;
- :mod:`.gpu`: published GPU throughputs (``published_gpu.csv``) against the predictions, with the set summaries;
- :mod:`.fit`: the default efficiencies fitted on the fit set;
- :mod:`.cpu`, :mod:`.comm`, :mod:`.input_bound`, :mod:`.run`, :mod:`.scaling`, :mod:`.conv_setup`: the parts
  measured on this machine, one each;
- :mod:`.on_gpu`: the checks ``lit-compute bench gpu`` runs on a GPU (predicted against a Lightning run there);
- :mod:`.cli`: the command.
"""

from __future__ import annotations
