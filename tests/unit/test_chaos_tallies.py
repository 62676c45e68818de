"""tests/gpu/chaos_tallies.py, which the GPU runs under `[priority] preempt_chaos` read pilotd's
logs with: per program (its executable's base name and arguments) the sessions' tallies, the
programs short of a number of preemptions, and one program's count (run_compare.sh and
real_programs.sh repeat a program until it reaches CHAOS_NEED)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "chaos_tallies.py"

LOG = """\
x INFO session 1: pid 10 uid 0 (/opt/bin/vector_add) on vGPU 0
x INFO session 2: pid 11 uid 0 (/opt/bin/pathfinder 200 10) on vGPU 0
x INFO session 1 (root): 40 preemptible launches, 70 preemptions, 900 blocks deferred, 75 retreats, \
0 blocks abandoned
x INFO session 2 (root): 3 preemptible launches, 2 preempted, 10 blocks deferred, 2 retreats, \
0 blocks abandoned
x INFO session 1: pid 12 uid 0 (/opt/bin/vector_add) on vGPU 0
x INFO session 1 (root): 30 preemptible launches, 40 preemptions, 500 blocks deferred, 41 retreats, \
0 blocks abandoned
"""


def _run(tmp_path: Path, *args: str) -> str:
    log = tmp_path / "pilotd.log"
    log.write_text(LOG)
    out = subprocess.run([sys.executable, str(SCRIPT), *args, str(log)], capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_a_programs_preemptions_add_up_over_its_runs(tmp_path: Path) -> None:
    # a session number names the command line last logged for it; the older log wording counts
    assert _run(tmp_path, "--count", "vector_add").strip() == "110"
    assert _run(tmp_path, "--count", "pathfinder 200 10").strip() == "2"
    assert _run(tmp_path, "--count", "never_ran").strip() == "0"


def test_the_table_names_the_programs_short_of_what_is_needed(tmp_path: Path) -> None:
    out = _run(tmp_path, "--chaos", "300us", "--need", "100")
    assert "| vector_add | 2 | 70 | 116 | 110 | 1400 |" in out
    assert "| pathfinder 200 10 | 1 | 3 | 2 | 2 | 10 |" in out
    assert out.rstrip().endswith("1 of 2 programs with at least 100 preemptions; fewer: pathfinder 200 10")
