"""The parts of a predicted step, one physical effect each, every one a pure ``price(run, scenario, calibration)``:
:mod:`.compute` (the op classes' roofline on the target chip), :mod:`.host` (the host's input work and eager
dispatch), :mod:`.comm` (the collectives over the slowest link, less their overlap) and :mod:`.memory` (the peak
against the chip's capacity). A new effect is a new part with its own tests, composed in
:mod:`lit_compute.planning.whatif.predict`."""
