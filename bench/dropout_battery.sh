#!/usr/bin/env bash
# The dropout mask's random bytes through dieharder's tests (docs/dropout.md, "Versions"): for each
# round count and call order given, memeff_keep_stream's bytes go to every test below; one line
# per result on stdout (rounds, order, test, ntup, p-value, assessment), progress on stderr.
# dieharder calls a p-value WEAK outside [0.005, 0.995] (about 1 result in 100 of a perfect
# generator) and FAILED below 1e-6 or above 1 - 1e-6; a WEAK test is run again with more samples.
#
#   bench/dropout_battery.sh [BUILD_DIR] [ROUNDS,...] [ORDERS,...]
#   defaults: build 7,10 row,head,col
# ROUNDS may name `aes`: dieharder's own AES_OFB generator through the same tests (once, whatever
# the orders), the control that shows how often a good generator gets WEAK from them.
set -uo pipefail
build=${1:-build}; rounds=${2:-7,10}; orders=${3:-row,head,col}
stream=$build/bench/memeff_keep_stream
[ -x "$stream" ] || { echo "dropout_battery.sh: $stream not built (ninja -C $build memeff_keep_stream)" >&2; exit 2; }
if ! command -v dieharder > /dev/null; then
  echo "dropout_battery.sh: installing dieharder" >&2
  ${SUDO:-$( [ "$(id -u)" = 0 ] || echo sudo )} apt-get install -y -q dieharder >&2
fi
# dieharder's tests rated "Good" by its own list (-l), except the slowest ones (11, 12, 201,
# 204: minimum distance and KS tests, hours on a small machine).
# One output line: rounds, order, test, ntup, p-value, assessment (and " retest" on retests).
format='/PASSED|WEAK|FAILED/ { gsub(/ /, "", $1); gsub(/ /, "", $5); gsub(/ /, "", $6)
  print r, o, $1, $2 + 0, $5, $6 tag }'
tests="0 1 2 3 4 8 9 10 13 15 16 17 100 101 102 202 203 205 206 207 208 209"
for r in ${rounds//,/ }; do
  [ "$r" = aes ] && order_list=control || order_list=${orders//,/ }
  for o in $order_list; do
    for d in $tests; do
      echo "rounds $r, order $o, test $d" >&2
      # The stream ends when dieharder has read enough (SIGPIPE).
      run() {
        if [ "$r" = aes ]; then dieharder -g 205 "$@" 2> /dev/null
        else { "$stream" --rounds "$r" --order "$o" || true; } | dieharder -g 200 "$@" 2> /dev/null; fi
      }
      result=$(run -d "$d" | awk -F'|' -v r="$r" -v o="$o" -v tag="" "$format")
      echo "$result"
      # A WEAK result is retested with more samples (-Y 1) until dieharder calls it either way;
      # every line of that retest is printed, tagged.
      if grep -q WEAK <<< "$result"; then
        run -Y 1 -d "$d" | awk -F'|' -v r="$r" -v o="$o" -v tag=" retest" "$format"
      fi
    done
  done
done
