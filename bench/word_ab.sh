#!/usr/bin/env bash
# Completion words (issue 25; daemon/native/fast_words.c) A/B on the GPU, in one go: bench.py's
# launch and round-trip rows beside native with the words on (the default) and off
# (PILOT_WORD_US=0), then the many-tenants rows under MPS and under pilot with the words on and
# off (bench/spin_ab.sh's table).
#
#   OUT=/tmp/rs bash tests/gpu/run_all.sh smoke && OUT=/tmp/out bash bench/word_ab.sh  # (installs first)
#
# Environment: PARTS ("bench tenants"), and bench/spin_ab.sh's NS, WORKLOADS, ROUNDS, WARM, MPS.
# Writes $OUT/word_bench_{on,off}.md, and spin_ab.sh's $OUT/spin_ab.md and $OUT/spin-*/.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" word_ab
cd "$REPO" || exit 1
PARTS=${PARTS:-bench tenants}
mkdir -p "$OUT"
case " $PARTS " in *" bench "*)
    for mode in on off; do
        words=()
        [ "$mode" = off ] && words=(env PILOT_WORD_US=0)
        say "bench.py launch, roundtrip, words $mode"
        timeout -k 10 150 "${words[@]}" "$PYTHON" bench/bench.py --start-daemon --only launch \
            --only roundtrip --out "$OUT/word_bench_$mode.md" \
            --daemon-log "$OUT/pilotd-word-$mode.log" 2>&1 | tail -25
    done ;;
esac
case " $PARTS " in *" tenants "*)
    SPINNERS="0 0:PILOT_WORD_US=0" SPIN_BENCH=0 bash bench/spin_ab.sh ;;
esac
