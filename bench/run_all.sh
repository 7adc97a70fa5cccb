#!/usr/bin/env bash
# The whole benchmark suite, one benchmark at a time (CPU is the scarce resource), in <= 15 minutes on a
# 2-core box. Writes bench/results/*.json, *.md and latest.md (machine description + every table).
#
#   bench/run_all.sh                 # default schedule
#   REPEAT=5 REPEAT_PER=torchrun=2 bench/run_all.sh
#
# Schedule (measured on a 2-core VM with background load 2-5): an elasticd lifetime takes ~35-45 s,
# torchrun-tuned ~100-120 s, torchrun with c10d defaults ~3-3.5 min, so the defaults run once. The suite
# took 597 s with torchrun=1,torchrun-tuned=2,elasticd-shim=2,elasticd-nozygote=1 (load ~2-3) and 882 s
# with torchrun=1,elasticd-nozygote=2 (load 3-5); the default below stays well inside 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
REPEAT=${REPEAT:-3}
# torchrun with c10d defaults takes ~4 min a lifetime here, so fewer lifetimes fit in 15 minutes.
REPEAT_PER=${REPEAT_PER:-torchrun=1,torchrun-tuned=2,elasticd-nozygote=1}
SYSTEMS=${SYSTEMS:-elasticd,elasticd-shim,elasticd-nozygote,torchrun-tuned,torchrun}
OUT=bench/results
mkdir -p "$OUT/logs"
start=$(date +%s)

"$PY" bench/recovery.py --repeat "$REPEAT" --repeat-per "$REPEAT_PER" \
    --systems "$SYSTEMS" --out "$OUT/recovery.json" | tee "$OUT/recovery.log" || echo "recovery.py failed ($?)"
"$PY" bench/resize.py --out "$OUT/resize.json" | tee "$OUT/resize.log" \
    || echo "resize.py failed ($?)"  # ~3.5 min: in place, restart, torchrun-tuned, one lifetime each
"$PY" bench/daemon_overhead.py --out "$OUT/daemon_overhead.json" | tee "$OUT/daemon_overhead.log" \
    || echo "daemon_overhead.py failed ($?)"
"$PY" bench/worker_output.py --out "$OUT/worker_output.json" | tee "$OUT/worker_output.log" \
    || echo "worker_output.py failed ($?)"  # ~80 s: torchrun --tee beside elasticd, with followers
if [ -f bench/shim_overhead.py ]; then
    "$PY" bench/shim_overhead.py 2>&1 | tee "$OUT/shim_overhead.txt" || echo "shim_overhead.py failed"
fi
if [ -f bench/console_scale.py ]; then
    "$PY" bench/console_scale.py --seconds 5 2>&1 | tee "$OUT/console_scale.txt" || echo "console_scale.py failed"
fi

{
    echo "# elasticd benchmarks — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores," \
         "$(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr)"
    echo "- elasticd at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- elasticd trainer_shim 2>/dev/null || echo ' + uncommitted changes in elasticd/ or trainer_shim/')"
    echo "- python $("$PY" -c 'import sys; print(sys.version.split()[0])'), torch $("$PY" -c 'import torch; print(torch.__version__)')"
    echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other work may share this machine;"
    echo "  every run records os.getloadavg() at its start and end in the JSON)"
    echo "- suite wall time: $(( $(date +%s) - start )) s; command: \`bench/run_all.sh\`" \
         "(REPEAT=$REPEAT REPEAT_PER=$REPEAT_PER)"
    echo
    cat "$OUT/recovery.md" 2>/dev/null || echo "(recovery.py produced no table: see recovery.log)"
    echo
    cat "$OUT/resize.md" 2>/dev/null || echo "(resize.py produced no table: see resize.log)"
    echo
    cat "$OUT/daemon_overhead.md" 2>/dev/null || echo "(daemon_overhead.py produced no table)"
    echo
    cat "$OUT/worker_output.md" 2>/dev/null || echo "(worker_output.py produced no table)"
    if [ -f "$OUT/shim_overhead.txt" ]; then
        echo; echo "### trainer_shim overhead (bench/shim_overhead.py)"; echo; echo '```'
        cat "$OUT/shim_overhead.txt"; echo '```'
    fi
    if [ -f "$OUT/console_scale.txt" ]; then
        echo; echo "### Console scale (bench/console_scale.py)"; echo; echo '```'
        cat "$OUT/console_scale.txt"; echo '```'
    fi
} > "$OUT/latest.md"
echo "wrote $OUT/latest.md in $(( $(date +%s) - start )) s"
