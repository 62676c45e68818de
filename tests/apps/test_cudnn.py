"""cuDNN under pilot (issue 13): tests/apps/cudnn_conv.cu, linked against libcudnn.so.9, runs with
libpilot.so and the stand-ins preloaded against the sim daemon, which emulates cuDNN's backend API
and batch normalization with numpy (daemon/backends/sim_dnn.py). The program checks every result
against the CPU itself, so EXPECTED is what every check passing prints; tests/gpu/cudnn_compare.sh
runs it natively and under pilot on a GPU (NVIDIA's libcudnn.so.9 in pilotd) and diffs the two.
That GPU comparison has not run yet (2026-11-27: no device time was left); until it has, the
sim's agreement with cuDNN rests on the CPU references and the header's semantics."""

from __future__ import annotations

import subprocess
import time

import pytest
from pilotd_metrics import run_scraped, total

from pilot.shim import LIBRARY_STANDINS, standin_path

EXPECTED = """\
cudnn 9: 1
conv forward: ok
conv backward data: ok
conv backward filter: ok
batchnorm forward training: ok
batchnorm saved and running statistics: ok
batchnorm backward: ok
batchnorm inference: ok
done
"""


@pytest.fixture
def dnn_env(shim_path: str) -> dict[str, str]:
    return {"LD_PRELOAD": ":".join([shim_path, *(str(standin_path(s)) for s in LIBRARY_STANDINS)])}


def test_convolutions_and_batch_normalization_through_pilot(run_under_pilot, dnn_env,
                                                            daemon_log) -> None:
    proc = run_under_pilot("cudnn_conv", env=dnn_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout == EXPECTED, f"{proc.stderr}\n{daemon_log()}"


def test_an_execution_past_its_buffer_is_refused(run_under_pilot, dnn_env, daemon_log) -> None:
    """The variant pack's output tensor starts 1 KiB before the end of its allocation: pilotd
    checks it against the extent of the plan's tensor with that unique id and refuses the
    execution (it never reaches cuDNN); the next synchronize reports it, the program goes on."""
    proc = run_under_pilot("cudnn_conv", "isolation", env=dnn_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout.splitlines()[1:] == [
        "synchronize after the execution: cudaErrorInvalidValue",
        "variant pack past the end of its buffer: refused at the next synchronize",
        "the program goes on: cudaSuccess",
        "done"], proc.stdout
    # pilotd's log reaches the test through a reader thread: give it a moment
    deadline = time.monotonic() + 5.0
    while not ("dnn_execute refused" in daemon_log() and "is not memory of this session" in
               daemon_log()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "dnn_execute refused" in daemon_log() and "is not memory of this session" in \
        daemon_log(), daemon_log()


def test_without_pilotd_cudnn_fails_cleanly(app_binaries, dnn_env, tmp_path) -> None:
    """No daemon: cudnnGetVersion says 0 (frameworks then refuse cuDNN), cudnnCreate fails with
    a status; no hang, no crash."""
    env = {**dnn_env, "PILOT_SOCKET": str(tmp_path / "nobody.sock")}
    proc = subprocess.run([str(app_binaries["cudnn_conv"])], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "cudnn 9: 0" and "cudnnCreate(&g_handle): CUDNN_STATUS_" in lines[1], lines


def test_a_killed_client_loses_its_descriptors_and_handles(app_binaries, dnn_env,
                                                           pilot_client_env, pilot_sessions,
                                                           kill_and_await_release,
                                                           started_client) -> None:
    """The program is killed while it holds plans: its session goes with them, pilotd lives and
    the next program's cuDNN works."""
    env = {**pilot_client_env, **dnn_env}
    with started_client([str(app_binaries["cudnn_conv"]), "hold"], env, "holding\n") as (proc, _):
        mine = [s for s in pilot_sessions() if s["pid"] == proc.pid]
        assert len(mine) == 1 and mine[0]["library_handles"] == 1, mine
        assert mine[0]["dnn_descriptors"] >= 6, mine
        kill_and_await_release(proc)
        after = subprocess.run([str(app_binaries["cudnn_conv"])], env=env, capture_output=True,
                               text=True, timeout=60)
        assert after.returncode == 0 and after.stdout == EXPECTED, after.stdout + after.stderr


def test_executions_run_in_c_with_the_same_results(start_pilotd, app_binaries, dnn_env) -> None:
    """A plan's executions after its first, and batch normalizations of a shape after its
    first, run in C (daemon/native/fast_library.c: the variant pack's
    tensors checked against the plan's, each range the session's); with `fast_launch = false`
    Python runs them all. Both print what the H100 prints, and each execution counts once."""
    argv = [str(app_binaries["cudnn_conv"])]
    fast_out, fast = run_scraped(start_pilotd, argv, dnn_env["LD_PRELOAD"], None)
    slow_out, slow = run_scraped(start_pilotd, argv, dnn_env["LD_PRELOAD"],
                                 "[daemon]\nfast_launch = false\n")
    assert fast_out == slow_out == EXPECTED
    assert total(fast, "pilot_fast_library_calls_total") >= 1, fast
    assert total(slow, "pilot_fast_library_calls_total") == 0
    executions = 'pilot_library_calls_total{function="cudnnBackendExecute",'
    assert sum(v for k, v in fast.items() if k.startswith(executions)) == \
        sum(v for k, v in slow.items() if k.startswith(executions)) == 4
    # the memset, the forward plan's second execution and the second round of batch
    # normalization (on the program's own stream, which only library calls use)
    assert total(fast, "pilot_fast_library_calls_total") == 4, fast
