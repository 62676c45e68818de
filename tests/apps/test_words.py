"""Completion words (issue 25; shim/transport/pilot_ring.h, daemon/native/fast_words.c): pilotd
answers a synchronization or a small copy to the host as soon as it has queued a write of the
connection's word behind the work, and the shim polls the word. tests/apps/words.cu computes the
same with the words on (most of its calls answered by them), off (PILOT_WORD_US=0: none), and
when a wait outlasts the shim's polling budget (it then asks pilotd the usual way). A program
killed while its word is still to be written leaves pilotd serving, and its ring is unmapped
once the write has happened."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pilotd_metrics import run_scraped, scrape, start_scraped, total

WORDS_OUTPUT = "sizes ok\nrounds ok\nstreams ok\nslow ok\nthreads ok\n"
ANSWERS = "pilot_fast_word_answers_total"


def _two_at_once(start_pilotd, binary: Path, shim_path: str, env: dict[str, str]
                 ) -> tuple[list[str], dict[str, float]]:
    """Two words.cu processes at once on a new pilotd (beside another session, kernels' printf
    output goes to nobody, so calls after launches may be answered by the word too); their
    stdouts and pilotd's metrics afterwards."""
    daemon, port = start_scraped(start_pilotd)
    full = {**daemon.env(), **env, "LD_PRELOAD": shim_path}
    procs = [subprocess.Popen([str(binary)], env=full, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err + daemon.log_tail()
        outs.append(out)
    return outs, scrape(port)


@pytest.mark.parametrize("budget_us", ["50000", "5000000"])
def test_calls_answered_by_the_word_compute_the_same(start_pilotd, app_binaries: dict[str, Path],
                                                     shim_path: str, budget_us: str) -> None:
    """50 ms: the 300 ms wait behind a host function outlasts the poll (the usual way answers
    it); 5 s: the word answers it too."""
    outs, values = _two_at_once(start_pilotd, app_binaries["words"], shim_path,
                                {"PILOT_WORD_US": budget_us})
    assert outs == [WORDS_OUTPUT] * 2
    # each: 300 rounds (a copy each), 50 on a stream (a synchronization and a copy), 800 of
    # the threads', the sizes that fit the GPU page; a few go the usual way when both
    # processes' first calls after a Python one come together
    assert total(values, ANSWERS) >= 2 * 1000, values


def test_without_words_the_same(start_pilotd, app_binaries: dict[str, Path],
                                shim_path: str) -> None:
    outs, values = _two_at_once(start_pilotd, app_binaries["words"], shim_path,
                                {"PILOT_WORD_US": "0"})
    assert outs == [WORDS_OUTPUT] * 2
    assert total(values, ANSWERS) == 0


def test_alone_a_program_that_cannot_print_is_answered_by_the_word(
        start_pilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    """Alone on pilotd, a program whose modules cannot print (no vprintf, no __assertfail:
    words.cu) has no kernel output to wait for, so its synchronizations after launches are
    answered by the word too. (One that may print is answered in the driver, which prints its
    output there: test_apps.py's kernel printf tests.)"""
    out, values = run_scraped(start_pilotd, [str(app_binaries["words"])], shim_path, None)
    assert out == WORDS_OUTPUT
    assert total(values, ANSWERS) >= 1000, values


def _rings_mapped(pid: int) -> int:
    return sum("pilot-ring" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def test_a_program_killed_while_its_word_is_due(start_pilotd, app_binaries: dict[str, Path],
                                                shim_path: str) -> None:
    """Killed while its synchronization waits behind a 1.5 s host function: pilotd keeps the
    ring's page (the write is still queued) and unmaps it once the stream has moved on; a
    program after it computes as before."""
    daemon = start_pilotd()
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    proc = subprocess.Popen([str(app_binaries["words"]), "orphan"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    time.sleep(0.3)
    assert _rings_mapped(daemon.proc.pid) >= 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    after = subprocess.run([str(app_binaries["words"])], env=env, capture_output=True, text=True,
                           timeout=120)
    assert after.returncode == 0, after.stdout + after.stderr + daemon.log_tail()
    assert after.stdout == WORDS_OUTPUT
    deadline = time.monotonic() + 10
    while _rings_mapped(daemon.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rings_mapped(daemon.proc.pid) == 0, daemon.log_tail()
    assert daemon.alive()
