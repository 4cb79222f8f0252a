"""The ``triton`` engine: a dvasim config served on the real Triton server (tritonserver 2.51.0, r24.10, from the
``nvidia-pytriton`` wheel) on this machine's CPU, its model a Python-backend model that runs the config's latency
table on an emulated device, and the simulator scored against it.

>>> from dvasim.engines.triton import serve
>>> result = serve("configs/triton/linear.toml", work_dir="results/triton_run")   # doctest: +SKIP

Modules: :mod:`~dvasim.engines.triton.server` (the managed server and its environment),
:mod:`~dvasim.engines.triton.repository` (the model repository and ``config.pbtxt``),
:mod:`~dvasim.engines.triton.device` (the emulated device), :mod:`~dvasim.engines.triton.client` (the load),
:mod:`~dvasim.engines.triton.engine` (one run and its records). ``device.py``, ``client.py`` and
``model_template.py`` run in the Triton environment's Python, outside dvasim.

May import: the layers below the engines (no simpy, no torch); its three scripts import no dvasim module.
"""

from dvasim.engines.triton.engine import ServerDied, check_triton_config, serve, write_extras
from dvasim.engines.triton.server import TritonUnavailable, find_env

__all__ = ["ServerDied", "TritonUnavailable", "check_triton_config", "find_env", "serve", "write_extras"]
