"""``tpsim profile``: measure kernel times with torch and store them as a profile file.

Torch is imported only by :mod:`tpsim.profiler.kernels`, :mod:`tpsim.profiler.timing` and
:mod:`tpsim.profiler.run` (inside functions); the grid (:mod:`.grid`), the file writer (:mod:`.store`) and the
leave-one-out check (:mod:`.check`) are torch-free. Reading and using a profile is
:mod:`tpsim.compute.profile`. Runs from a source tree without PyYAML or tqdm (``python -m tpsim.profiler``).
"""
