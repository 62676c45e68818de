#!/usr/bin/env bash
# Extracts the public CUDA programs that tests/gpu/real_programs.sh runs, from local git mirrors,
# into a git-ignored source directory. Nothing fetched here is ever committed: the sources are
# NVIDIA's and Rodinia's, under their own licenses (LICENSE files are extracted alongside).
#
#   hack/fetch_real_programs.sh [--samples MIRROR] [--rodinia MIRROR] [--dest DIR]
#
#   --samples MIRROR  a git directory (bare clone or .git) of https://github.com/NVIDIA/cuda-samples
#                     (default $CUDA_SAMPLES_MIRROR, else /work/.mirror/NVIDIA+cuda-samples/repo)
#   --rodinia MIRROR  a git directory of https://github.com/yuhc/gpu-rodinia (Rodinia 3.1, GPU
#                     part; optional: skipped when absent). Default $RODINIA_MIRROR, else
#                     /work/.mirror/yuhc+gpu-rodinia/repo
#   --dest DIR        where the sources go (default .realprogs-src in the repository root,
#                     git-ignored by .gitignore)
#
# Without a mirror: `git clone --bare https://github.com/NVIDIA/cuda-samples cs.git` (and the
# same for yuhc/gpu-rodinia), then pass those directories.
#
# What is taken, pinned by commit (override with CUDA_SAMPLES_REV / RODINIA_REV):
#   cuda-samples c94ff366aed18c797b8a85dfaac7817b0228b420 (master, 2025-09-05; 9 commits after
#     tag v13.0): LICENSE, Common/, Samples/ -> DEST/cuda-samples/
#   gpu-rodinia  9c10d3ea16ddba2ba057cc3951a9efc4c2cc18a4 (master, 2023-04-13): LICENSE,
#     common/, cuda/ -> DEST/rodinia/ (Rodinia's data sets are not in git; only programs that
#     generate their input are built)
#
# Files are extracted with `git archive REV -- FILE... | tar -x`. A mirror may lack some blobs
# (a partial snapshot): those files are skipped, listed in DEST/<name>.absent, and reported;
# git archive's complaints about them go to DEST/<name>.archive.log. Known absent in the
# snapshot used to prepare this: three .doc files, randomFog/data/ref_randomFog.bin and
# dwtHaar1D/data/{regression_2_18.gold.dat,signal_2_18.dat} (so dwtHaar1D is not built).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SAMPLES_MIRROR=${CUDA_SAMPLES_MIRROR:-/work/.mirror/NVIDIA+cuda-samples/repo}
RODINIA_MIRROR=${RODINIA_MIRROR:-/work/.mirror/yuhc+gpu-rodinia/repo}
CUDA_SAMPLES_REV=${CUDA_SAMPLES_REV:-c94ff366aed18c797b8a85dfaac7817b0228b420}
RODINIA_REV=${RODINIA_REV:-9c10d3ea16ddba2ba057cc3951a9efc4c2cc18a4}
DEST=$REPO/.realprogs-src

while [ $# -gt 0 ]; do
    case $1 in
        --samples) SAMPLES_MIRROR=$2; shift 2 ;;
        --rodinia) RODINIA_MIRROR=$2; shift 2 ;;
        --dest) DEST=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

say() { printf '[fetch] %s\n' "$*" >&2; }

# extract NAME MIRROR REV PATH...: the files under PATH... at REV that the mirror has, into
# DEST/NAME (replaced). Prints how many files came out.
extract() {
    local name=$1 mirror=$2 rev=$3
    shift 3
    local out=$DEST/$name list absent
    git --git-dir="$mirror" rev-parse --verify -q "$rev^{commit}" >/dev/null \
        || { say "$mirror has no commit $rev"; return 1; }
    rm -rf "$out"
    mkdir -p "$out"
    list=$(mktemp)
    absent=$DEST/$name.absent
    # "<mode> blob <sha>\t<path>" for every file; cat-file says "<sha> missing" for absent blobs.
    git --git-dir="$mirror" ls-tree -r "$rev" -- "$@" | awk -F'\t' '$1 ~ / blob / { print }' >"$list.all"
    cut -f1 "$list.all" | awk '{ print $3 }' \
        | git --git-dir="$mirror" cat-file --batch-check='%(objectname) %(objecttype)' \
        | paste - "$list.all" \
        | awk -F'\t' '{ split($1, a, " "); if (a[2] == "missing") print $3 > "/dev/stderr"; else print $3 }' \
            >"$list" 2>"$absent"
    # git archive writes one archive per xargs batch; tar -i reads them all.
    (cd "$out" && xargs -d '\n' -a "$list" git --git-dir="$mirror" archive --format=tar "$rev" -- \
        2>"$DEST/$name.archive.log" | tar -x -i -f -)
    local want got
    want=$(wc -l <"$list")
    got=$(cd "$out" && find . -type f | wc -l)
    if [ "$got" != "$want" ]; then
        say "$name: extracted $got files, expected $want (see $DEST/$name.archive.log)"
        rm -f "$list" "$list.all"
        return 1
    fi
    printf '%s\t%s\t%s\n' "$name" "$rev" "$(git --git-dir="$mirror" log -1 --format=%ci "$rev")" >>"$DEST/SOURCES.tsv"
    say "$name @ ${rev:0:12}: $got files into $out$([ -s "$absent" ] && echo "; $(wc -l <"$absent") absent from the mirror (listed in $absent)")"
    rm -f "$list" "$list.all"
}

mkdir -p "$DEST"
printf 'name\tcommit\tdate\n' >"$DEST/SOURCES.tsv"
[ -d "$SAMPLES_MIRROR" ] || { say "no cuda-samples mirror at $SAMPLES_MIRROR (see --help)"; exit 1; }
extract cuda-samples "$SAMPLES_MIRROR" "$CUDA_SAMPLES_REV" LICENSE Common Samples
if [ -d "$RODINIA_MIRROR" ]; then
    extract rodinia "$RODINIA_MIRROR" "$RODINIA_REV" LICENSE common cuda
else
    say "no Rodinia mirror at $RODINIA_MIRROR: Rodinia programs will not be built"
fi
du -sh "$DEST" >&2
