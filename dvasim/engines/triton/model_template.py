"""The Triton Python-backend model of the ``triton`` engine (written into the model repository as ``model.py``).

Each execution (one batch Triton's scheduler gave this instance) reads its requests' input lengths, takes the
batch's standalone time ``T(b, L)`` and demand from the config's latency table (``emulation.json``, written by
:mod:`dvasim.engines.triton.repository`; ``L`` the batch's longest input, as a padded batch runs), runs that long
on the emulated device (:mod:`dvasim.engines.triton.device`), answers every request, and logs the execution:
its instance, its requests, when ``execute`` began, when the device started and ended it, and when ``execute``
returned. Runs inside Triton's Python stub: standard library, numpy and Triton's ``triton_python_backend_utils``.
"""

import json
import os
import socket
import sys
import time

sys.path.insert(0, os.environ.get("DVASIM_TRITON_SITE", "@SITE@"))  # the stub's Python does not see the venv

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "emulation.json"), encoding="utf-8") as f:
            self.emu = json.load(f)
        self.lengths = [int(x) for x in self.emu["lengths"]]  # the table's length buckets ([1]: no lengths)
        self.instance = args["model_instance_name"]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.emu["device_socket"])
        self.reader = self.sock.makefile("rb")
        log = os.path.join(self.emu["log_dir"], f"executions_{self.instance.replace('/', '_')}.csv")
        self.log = open(log, "w", encoding="utf-8", buffering=1)  # noqa: SIM115  (line by line; closed in finalize)
        self.log.write("instance,batch_size,length,requests,exec_start_ns,device_start_ns,device_end_ns,"
                       "exec_end_ns,work_ms\n")

    def _bucket(self, length):
        for b in self.lengths:
            if b >= length:
                return b
        return self.lengths[-1]

    def execute(self, requests):
        t0 = time.monotonic_ns()
        ids, longest = [], 1
        for r in requests:
            ids.append(r.request_id())
            longest = max(longest, int(pb_utils.get_input_tensor_by_name(r, "LEN").as_numpy().max()))
        b = len(requests)
        key = str(self._bucket(longest))
        work = self.emu["latency_ms"][key][b - 1]
        demand = self.emu["demand"][key][b - 1]
        self.sock.sendall(f"start {ids[0] or '-'} {work!r} {demand!r}\n".encode())
        start, end = self.reader.readline().split()
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "LEN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.asarray(x, dtype=np.int32))]))
        t1 = time.monotonic_ns()
        self.log.write(f"{self.instance},{b},{longest},{';'.join(ids)},{t0},{int(start)},{int(end)},{t1},{work!r}\n")
        return out

    def finalize(self):
        self.log.close()
        self.sock.close()
