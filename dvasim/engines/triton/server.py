"""The real Triton server as a managed component: found, checked, started on free ports, ready-checked, logged,
and stopped on exit, on error and on Ctrl-C, with no process left behind.

Where it comes from: the ``nvidia-pytriton`` wheel (pinned: :data:`PYTRITON`) bundles ``tritonserver`` 2.51.0
(Triton r24.10), ``libtritonserver.so``, the Python backend and its stubs. It lives in its own virtual environment,
``.venv/triton`` beside dvasim's ``.venv`` (``make triton-env``, which ``make test`` runs): the wheel and the
tritonclient of that release need numpy < 2 and protobuf < 5, which dvasim's own environment does not keep, and
the Python backend's 3.11 stub links the system ``libpython3.11.so.1.0``, so that environment is made from the
system's ``/usr/bin/python3.11`` (a pyenv 3.11's standard library fails inside the stub: ``'_thread.RLock' object
has no attribute '_recursion_count'``). ``DVASIM_TRITON_ENV`` names another such environment.

What refuses, in one line naming the cause and the fix (:class:`TritonUnavailable`, a
:class:`~dvasim.errors.DvasimError`, so exit status 2): glibc older than 2.35 (the wheel is manylinux_2_35), no
environment, no server in it, a stub whose libraries do not resolve (no system libpython3.11), a port in use, a
server that does not become ready (its log's last error line), a server that died during a run.

The server runs as ``tritonserver --model-repository R --backend-directory B`` with the backend directory ``B``
made of links to the wheel's Python backend and its 3.11 stub (a link keeps the stub's ``$ORIGIN`` library path),
HTTP, gRPC and metrics on loopback ports, and Triton's trace API on (``level=TIMESTAMPS``, every request, written
when the server stops). It is started in its own process group; :meth:`TritonServer.stop` sends SIGINT (Triton
then finishes in-flight requests, unloads the models and writes its trace), waits, and kills the group if it
lingers. An ``atexit`` hook and the caller's ``with`` block make sure of it on every way out.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dvasim.errors import DvasimError

PYTRITON = "nvidia-pytriton==0.7.0"  # tritonserver 2.51.0, Triton r24.10
CLIENT = "tritonclient[grpc]==2.51.0"
SERVER_VERSION = "2.51.0"
RELEASE = "24.10"
MIN_GLIBC = (2, 35)
STUB_PYTHON = "3.11"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class TritonUnavailable(DvasimError):
    """The real Triton server cannot run here, or stopped: one line, the cause and the fix (exit 2)."""


@dataclass(frozen=True)
class TritonEnv:
    """A Triton environment: its Python (for the client), its site-packages (for the stub), the server binary,
    the Python backend and the stub of :data:`STUB_PYTHON`."""

    root: Path
    python: Path
    site: Path
    server: Path
    backend: Path  # the wheel's backends/python
    stub: Path


def glibc_version() -> tuple[int, int] | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    parts = text.split()[-1].split(".") if text.startswith("glibc") else []
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


def default_env_root() -> Path:
    """``DVASIM_TRITON_ENV``, else ``triton`` inside the running Python's environment (``.venv/triton``)."""
    given = os.environ.get("DVASIM_TRITON_ENV")
    return Path(given) if given else Path(sys.prefix) / "triton"


FIX = "make triton-env (or: /usr/bin/python3.11 -m venv .venv/triton && .venv/triton/bin/pip install " \
      f"'{PYTRITON}' '{CLIENT}')"


def find_env(root: Path | None = None) -> TritonEnv:
    """The Triton environment at ``root`` (default :func:`default_env_root`), checked; else
    :class:`TritonUnavailable` with the fix."""
    glibc = glibc_version()
    if glibc is not None and glibc < MIN_GLIBC:
        raise TritonUnavailable("triton", f"glibc {glibc[0]}.{glibc[1]} is older than 2.35, which the "
                                          f"{PYTRITON} wheel needs (manylinux_2_35); run the triton engine on a "
                                          "newer Linux (Debian 12, Ubuntu 22.04 or later)")
    root = (root or default_env_root()).resolve()
    python = root / "bin" / "python"
    if not python.exists():
        raise TritonUnavailable("triton", f"no Triton environment at {root}; {FIX}")
    sites = sorted(root.glob(f"lib/python{STUB_PYTHON}/site-packages"))
    if not sites:
        raise TritonUnavailable("triton", f"{root} is not a Python {STUB_PYTHON} environment (the Python "
                                          f"backend's stub links libpython{STUB_PYTHON}); {FIX}")
    site = sites[0]
    base = site / "pytriton" / "tritonserver"
    server = base / "bin" / "tritonserver"
    stub = base / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub"
    if not server.exists() or not stub.exists():
        raise TritonUnavailable("triton", f"{root} has no tritonserver ({PYTRITON} is not installed); {FIX}")
    return TritonEnv(root, python, site, server, base / "backends" / "python", stub)


def check_stub(env: TritonEnv) -> None:
    """The stub's shared libraries resolve (``ldd``): the system's ``libpython3.11.so.1.0`` above all."""
    try:
        out = subprocess.run(["ldd", str(env.stub)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return  # no ldd: the server's own start-up will say
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    if missing:
        raise TritonUnavailable("triton", f"the Python backend's stub cannot load {', '.join(missing)}; install "
                                          f"the system Python {STUB_PYTHON} with its shared library (Debian: apt-get "
                                          f"install python{STUB_PYTHON} libpython{STUB_PYTHON}) and rebuild the "
                                          f"environment from /usr/bin/python{STUB_PYTHON}")


def backend_dir(env: TritonEnv, where: Path) -> Path:
    """A backend directory for ``--backend-directory``: ``python/`` with links to the wheel's backend library,
    its utilities and the stub (links keep the stub's ``$ORIGIN`` run path to the wheel's libraries)."""
    py = where / "python"
    py.mkdir(parents=True, exist_ok=True)
    for src in (env.backend / "libtriton_python.so", env.backend / "triton_python_backend_utils.py", env.stub):
        dst = py / src.name
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        dst.symlink_to(src)
    return where


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass
class TritonServer:
    """One ``tritonserver`` process serving ``repository`` (see the module docstring)."""

    env: TritonEnv
    repository: Path
    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    trace_path: Path | None = None
    server_cores: str | None = None  # taskset's list: the cores the server and its stubs run on (None: any)

    def start(self, ports: dict[str, int] | None = None, trace: bool = True) -> TritonServer:
        given = ports or {}
        for name, port in given.items():
            if port_in_use(port):
                raise TritonUnavailable(f"triton.{name}_port", f"port {port} is in use on 127.0.0.1; give another "
                                                               "port or leave it out (a free one is taken)")
        self.ports = {name: given.get(name) or free_port() for name in ("http", "grpc", "metrics")}
        self.workdir.mkdir(parents=True, exist_ok=True)
        backends = backend_dir(self.env, self.workdir / "backends")
        self.log_path = self.workdir / "server.log"
        cmd = [str(self.env.server), f"--model-repository={self.repository}", f"--backend-directory={backends}",
               f"--http-port={self.ports['http']}", f"--grpc-port={self.ports['grpc']}",
               f"--metrics-port={self.ports['metrics']}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               "--allow-metrics=false", "--log-verbose=0", "--exit-timeout-secs=10"]
        if trace:
            self.trace_path = self.workdir / "trace.json"
            cmd += [f"--trace-config=triton,file={self.trace_path}", "--trace-config=rate=1",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=log_frequency=0"]
        if self.server_cores is not None:
            cmd = ["taskset", "-c", self.server_cores, *cmd]
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        atexit.register(self.stop)
        self._wait_ready()
        return self

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _get(self, path: str, timeout: float = 2.0):
        with urllib.request.urlopen(self.http + path, timeout=timeout) as r:  # noqa: S310  (loopback only)
            return r.status, r.read()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                break
            with contextlib.suppress(OSError, urllib.error.URLError, ConnectionError):
                if self._get("/v2/health/ready")[0] == 200:
                    return
            time.sleep(0.1)
        why = self.last_error() or "no error logged"
        self.stop()
        raise TritonUnavailable("triton", f"the server did not become ready ({why}); its log: {self.log_path}")

    def last_error(self) -> str:
        """The last error line of the server's log (what went wrong at start-up), shortened."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines()
                 if ln.startswith("E") or ln.startswith("error:")]
        keep = [ln for ln in lines if "CudaDriverHelper" not in ln]  # harmless on a machine without a GPU
        return " ".join(keep[-1].split())[:300] if keep else ""

    def version(self) -> str:
        return json.loads(self._get("/v2")[1])["version"]

    def statistics(self, model: str) -> dict:
        return json.loads(self._get(f"/v2/models/{model}/stats", timeout=10.0)[1])

    def stop(self) -> int | None:
        """SIGINT (Triton finishes, unloads and writes its trace), then SIGKILL to the group if it lingers.
        Returns the exit status (None: it was never started)."""
        atexit.unregister(self.stop)
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # the stubs too, if any outlived it
        p.wait()
        return p.returncode

    def __enter__(self) -> TritonServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
