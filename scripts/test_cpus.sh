#!/usr/bin/env bash
# Run the notebooks' stored-output comparison (make test-notebooks) as other machines
# would, one setting after another, and say which passed. Stored outputs must hold on
# any CPU, thread count and load; these settings let one machine stand in for others:
#
#   as-is     this machine as it is
#   avx2      ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: a CPU without AVX-512
#             (on a machine that has it; elsewhere the same as as-is)
#   default   ATEN_CPU_CAPABILITY=default: PyTorch's kernels without SIMD, as on a
#             CPU of another architecture
#   omp1      OMP_NUM_THREADS=1: one thread per process, another thread count
#
#   make test-cpus                          # or: bash scripts/test_cpus.sh
#   make test-cpus CPU_SETTINGS="default omp1"
#   make test-cpus PYTEST_ARGS="-k 01_"     # passed on to each run
#   CPU_BUSY=1 make test-cpus               # each run beside a busy loop per core
#
# Each run's log is test-artifacts/cpus/<setting>.log. It ends with one line per
# setting (passed, failed, seconds); the exit status is 0 only when all passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SETTINGS="${CPU_SETTINGS:-as-is avx2 default omp1}"
LOGS="$ROOT/test-artifacts/cpus"
mkdir -p "$LOGS"

settings_for() {
    case "$1" in
        as-is) echo "" ;;
        avx2) echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
        default) echo "ATEN_CPU_CAPABILITY=default" ;;
        omp1) echo "OMP_NUM_THREADS=1" ;;
        *) echo "test-cpus: unknown setting '$1'; the settings are: as-is avx2 default" \
               "omp1" >&2
           return 1 ;;
    esac
}

# A busy machine: one spinning process per core, for the length of a run.
HOGS=()
start_hogs() {
    [[ "${CPU_BUSY:-}" == 1 ]] || return 0
    local n
    for ((n = 0; n < $(nproc); n++)); do
        bash -c 'while :; do :; done' &
        HOGS+=($!)
    done
}
stop_hogs() {
    if [[ ${#HOGS[@]} -gt 0 ]]; then
        kill "${HOGS[@]}" 2>/dev/null || true
        wait "${HOGS[@]}" 2>/dev/null || true
    fi
    HOGS=()
}
trap stop_hogs EXIT

for setting in $SETTINGS; do settings_for "$setting" >/dev/null; done  # fail early

SUMMARY=()
status=0
for setting in $SETTINGS; do
    read -r -a assignments <<<"$(settings_for "$setting")"
    echo "[test-cpus] $setting: ${assignments[*]:-(nothing set)}${CPU_BUSY:+, busy}"
    start_hogs
    started=$(date +%s)
    rc=0
    # Each setting gets an empty inductor cache of its own, as another machine has:
    # torch.compile's cache key leaves ATEN_CPU_CAPABILITY out, so C++ written for
    # this CPU's vector units was reused under "default" and failed to build there.
    cache="$LOGS/inductor-$setting"
    rm -rf "$cache"
    assignments+=("TORCHINDUCTOR_CACHE_DIR=$cache")
    env ${assignments[@]+"${assignments[@]}"} make --no-print-directory test-notebooks \
        PYTEST_ARGS="${PYTEST_ARGS:-}" >"$LOGS/$setting.log" 2>&1 || rc=$?
    stop_hogs
    seconds=$(($(date +%s) - started))
    # pytest's last line: "== 5 failed, 148 passed in 512.00s (0:08:32) =="
    counts=$(tail -n 1 "$LOGS/$setting.log" | sed -E 's/=+//g; s/ in [0-9.]+s.*//; s/^ +//')
    if [[ $rc -eq 0 ]]; then word=passed; else word=FAILED; status=1; fi
    SUMMARY+=("$(printf '%-8s %-6s %s, %s s' "$setting" "$word" "$counts" "$seconds")")
    echo "[test-cpus] ${SUMMARY[-1]}"
done

echo "[test-cpus] summary (logs in test-artifacts/cpus/):"
printf '  %s\n' "${SUMMARY[@]}"
exit "$status"
