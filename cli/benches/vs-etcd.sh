#!/usr/bin/env bash
# Muster's commit path against etcd, measured in the same run on the same
# machine: installs etcd 3.4 from Debian when missing, then alternates
# etcd's put benchmark (../shared/peers/etcd/run.sh) with `cargo bench -p
# muster --bench cluster`, ROUNDS times, and prints each round's ratios at
# 1, 16 and 256 clients. Only these same-run ratios count; a figure from
# another machine or another session is not a comparison.
#
#   cli/benches/vs-etcd.sh                 # 3 rounds, --insecure
#   ROUNDS=5 cli/benches/vs-etcd.sh --tls  # extra arguments go to Muster's bench
#   cli/benches/vs-etcd.sh --tls-ab        # each round: etcd, then Muster
#                                          # insecure and with mutual TLS (their
#                                          # order swapped every round), and the
#                                          # TLS cost as a same-run ratio too
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
peer="${ETCD_RUN:-$root/../shared/peers/etcd/run.sh}"
rounds="${ROUNDS:-3}"
ab=0
if [ "${1:-}" = "--tls-ab" ]; then
  ab=1
  shift
fi
if [ ! -x "$peer" ] && [ ! -f "$peer" ]; then
  echo "vs-etcd: no etcd peer script at $peer (set ETCD_RUN)" >&2
  exit 2
fi
if ! command -v etcd >/dev/null || ! command -v go >/dev/null; then
  echo "vs-etcd: installing etcd and Go from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server golang-go golang-etcd-server-dev >/dev/null
fi
cd "$root"
cargo bench -p muster --bench cluster --no-run >/dev/null 2>&1
out="$(mktemp -d)"
# A failed run names itself and shows the end of its stderr.
run() {
  local name="$1"; shift
  if ! "$@" >"$out/$name.txt" 2>"$out/$name.err"; then
    echo "vs-etcd: $name failed; the end of $out/$name.err:" >&2
    tail -n 15 "$out/$name.err" >&2
    exit 1
  fi
}
for r in $(seq 1 "$rounds"); do
  run "etcd-$r" bash "$peer"
  if [ "$ab" = 0 ]; then
    run "muster-$r" cargo bench -q -p muster --bench cluster -- --kills 0 "$@"
  elif [ $((r % 2)) = 1 ]; then
    run "muster-$r" cargo bench -q -p muster --bench cluster -- --kills 0 "$@"
    run "tls-$r" cargo bench -q -p muster --bench cluster -- --kills 0 --tls "$@"
  else
    run "tls-$r" cargo bench -q -p muster --bench cluster -- --kills 0 --tls "$@"
    run "muster-$r" cargo bench -q -p muster --bench cluster -- --kills 0 "$@"
  fi
done
python3 "$root/cli/benches/vs-etcd-report.py" "$out" "$rounds" "$ab"
