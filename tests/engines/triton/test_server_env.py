"""Where the real Triton server cannot run, the engine refuses in one line naming the cause and the fix; and the
managed server leaves nothing behind."""

import subprocess

import pytest

import dvasim.engines.triton.server as srv
from dvasim.engines.triton.server import TritonServer, TritonUnavailable, find_env


def test_old_glibc_is_refused(monkeypatch):
    monkeypatch.setattr(srv, "glibc_version", lambda: (2, 31))
    with pytest.raises(TritonUnavailable, match=r"glibc 2\.31 is older than 2\.35") as e:
        find_env()
    assert "\n" not in str(e.value)


def test_missing_environment_names_the_fix(tmp_path):
    with pytest.raises(TritonUnavailable, match="make triton-env"):
        find_env(tmp_path / "nowhere")


@pytest.mark.parametrize("python, why", [("3.12", "not a Python 3.11 environment"),
                                         ("3.11", "nvidia-pytriton==0.7.0 is not installed")])
def test_an_environment_that_cannot_serve_is_refused(tmp_path, python, why):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / "lib" / f"python{python}" / "site-packages").mkdir(parents=True)
    with pytest.raises(TritonUnavailable, match=why):
        find_env(tmp_path)


def test_a_stub_that_cannot_load_libpython_is_refused(monkeypatch, triton_env):
    out = "\tlibpython3.11.so.1.0 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6\n"
    monkeypatch.setattr(srv.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out, stderr=""))
    with pytest.raises(TritonUnavailable, match="cannot load libpython3.11.so.1.0"):
        srv.check_stub(triton_env)


def test_a_repository_the_server_cannot_load_is_one_line_and_stops_it(tmp_path, triton_env):
    """A model whose config the server refuses: the start fails with the server's own error line, and the
    process is gone."""
    repo = tmp_path / "repo" / "m" / "1"
    repo.mkdir(parents=True)
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 4\n')
    (repo / "model.py").write_text("raise RuntimeError('this model cannot load')\n")
    s = TritonServer(triton_env, tmp_path / "repo", tmp_path / "work")
    with pytest.raises(TritonUnavailable, match="did not become ready") as e:
        s.start()
    assert "\n" not in str(e.value) and s.proc is not None and s.proc.poll() is not None
