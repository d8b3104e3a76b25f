#!/usr/bin/env bash
# Nightly accuracy job for cron, e.g.:
#   0 2 * * *  /path/to/trtbuild/scripts/nightly.sh >> /var/log/trtbuild-nightly.log 2>&1
# Builds and reports every policy in $POLICIES, appends the night to $HISTORY and
# writes $OUT/summary.md, summary.html and junit.xml. Exits non-zero (1) when a
# policy fails, errors or regressed against its last passing night.
set -euo pipefail
cd "$(dirname "$0")/.."
POLICIES=${POLICIES:-policies}
OUT=${OUT:-build/nightly}
HISTORY=${HISTORY:-history/nightly.sqlite}
JOBS=${JOBS:-1}
make --no-print-directory install models >/dev/null
exec .venv/bin/trtbuild nightly --policies "$POLICIES" --out "$OUT" --history "$HISTORY" --jobs "$JOBS" "$@"
