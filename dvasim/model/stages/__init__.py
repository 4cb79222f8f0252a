"""Running a model's stages as serving stacks run them: real buffers (:mod:`~dvasim.model.stages.buffers`),
TorchScript and eager modules (:mod:`~dvasim.model.stages.compiled`), CUDA graphs
(:mod:`~dvasim.model.stages.graphs`) and the one object every ``torch.cuda`` call goes through
(:mod:`~dvasim.model.stages.cuda`). The profiler and the replay both run stages through here.

May import: torch, the foundation and the rest of :mod:`dvasim.model`.
"""
