#!/usr/bin/env bash
# Regenerate the docs' figures under docs/ from the shipped defaults:
#   docs/simulate-ettr.png  `pitstop simulate` (default scenario) swept over fleet sizes
#   docs/report.png         `pitstop report` on the incidents the local pipeline made in
#                           `pitstop demo` (the Slurm scenarios), screenshot in headless Chromium
# Usage: scripts/make-docs-figures.sh [simulate|report|all]   (default all; run from anywhere)
# Env: PITSTOP (default .venv/bin/pitstop), CHROMIUM (default chromium),
#      STACK_WORKDIR: a stack `pitstop demo --keep` left running; reused (and left up) instead
#      of running the demo in a fresh temporary workdir (which is torn down afterwards).
set -euo pipefail

cd "$(dirname "$0")/.."
PITSTOP=${PITSTOP:-.venv/bin/pitstop}
PYTHON=$(dirname "$PITSTOP")/python
CHROMIUM=${CHROMIUM:-chromium}
MAX_BYTES=400000
what=${1:-all}
mkdir -p docs

simulate_figure() {
    # ETTR vs fleet size for each strategy, and GPU-hours lost by cause at the default 2,048 nodes.
    "$PITSTOP" simulate --sweep nodes=128,256,512,1024,2048,4096 --plot docs/simulate-ettr.png
}

stack_down() {
    # `local down` stops the stack's daemons; the slurmstepd of a job still running (and its
    # script) can outlive slurmd: end those too, chosen by their SLURM_CONF inside this workdir.
    local workdir=$1 pid child
    "$PITSTOP" local down --workdir "$workdir" || true
    for pid in $(pgrep -x slurmstepd || true); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$workdir/slurm/slurm.conf"; then
            for child in $(pgrep -P "$pid" || true); do  # a job's batch script leads its own group
                kill -KILL -- "-$child" 2>/dev/null || kill -KILL "$child" 2>/dev/null || true
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}

report_figure() {
    local workdir tmp own=0
    tmp=$(mktemp -d -t pitstop-docs-XXXXXX)
    if [[ -n "${STACK_WORKDIR:-}" ]]; then
        workdir=$STACK_WORKDIR
    else
        workdir=$tmp/stack
        own=1
        # shellcheck disable=SC2064  # expand now: the workdir is fixed
        trap "stack_down '$workdir' >/dev/null 2>&1" EXIT
        # The Slurm scenarios on one stack (the GKE ones run on a second stack with its own store).
        # Fails, and writes no figure, unless every scenario passes.
        "$PITSTOP" demo --keep --workdir "$workdir" \
            --only xid79 xid13 preemption maintenance duplicates lemon blast_radius poison
    fi
    local firestore project
    firestore=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoints"]["firestore"])' "$workdir/stack.json")
    project=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["project"])' "$workdir/stack.json")
    FIRESTORE_EMULATOR_HOST=$firestore GOOGLE_CLOUD_PROJECT=$project \
        "$PITSTOP" report --out "$tmp/report.html" --since 1d
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --disable-quic --hide-scrollbars \
        --window-size=1280,2400 --screenshot="$tmp/report-full.png" "file://$tmp/report.html" 2>/dev/null
    # Keep the PNG small: palette-quantize it (text and flat charts survive), halve it if still big.
    "$PYTHON" - "$tmp/report-full.png" docs/report.png "$MAX_BYTES" <<'EOF'
import sys
from PIL import Image

src, dst, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
img = Image.open(src).convert("RGB")
while True:
    img.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
    size = __import__("os").path.getsize(dst)
    if size <= limit or img.width <= 640:
        break
    img = img.resize((img.width * 3 // 4, img.height * 3 // 4), Image.Resampling.LANCZOS)
print(f"wrote {dst}: {img.width}x{img.height}, {size} bytes")
EOF
    if ((own)); then
        stack_down "$workdir"
        trap - EXIT
    fi
    rm -rf "$tmp"
}

case $what in
simulate) simulate_figure ;;
report) report_figure ;;
all) simulate_figure && report_figure ;;
*) echo "usage: $0 [simulate|report|all]" >&2 && exit 2 ;;
esac
