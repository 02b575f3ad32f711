#!/usr/bin/env bash
# Validates everything under deploy/, offline:
#   - the Kubernetes manifests against the Kubernetes schemas
#     (kubernetes-validate, strict: unknown fields are errors);
#   - the systemd units with systemd-analyze verify (when systemd-analyze is
#     installed), any warning counting as an error;
#   - every flag the units and manifests pass to `muster server` and
#     `muster agent` exists in that command's --help;
#   - the Grafana dashboard and Prometheus rules (deploy/check_monitoring.py).
# Each check first proves it can fail, on a deliberately broken input.
#
#   deploy/check.sh [path/to/muster]      (default: target/debug/muster)
set -euo pipefail
cd "$(dirname "$0")/.."
muster=${1:-target/debug/muster}
muster=$(realpath "$muster")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deploy check: $*" >&2; exit 1; }

# --- Kubernetes manifests --------------------------------------------------
command -v kubernetes-validate >/dev/null || fail "kubernetes-validate is not installed (pip install kubernetes-validate)"
sed 's/defaultMode: 256.*/defaultMode: "0400"/' deploy/kubernetes/scheduler.yaml > "$tmp/broken.yaml"
if kubernetes-validate --strict --quiet "$tmp/broken.yaml" >/dev/null 2>&1; then
  fail "kubernetes-validate accepted a manifest with a string defaultMode"
fi
kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml || fail "the Kubernetes manifests do not validate"
manifests=$(ls deploy/kubernetes/*.yaml | wc -l)

# --- systemd units ---------------------------------------------------------
units=0
if command -v systemd-analyze >/dev/null; then
  verify() {
    # The units name /usr/local/bin/muster; verify checks that it exists.
    rm -f "$tmp"/*.service
    for u in "$@"; do sed "s|/usr/local/bin/muster|$muster|" "$u" > "$tmp/$(basename "$u")"; done
    systemd-analyze verify "$tmp"/*.service 2>&1
  }
  mkdir "$tmp/broken"
  printf '[Service]\nBogusKey=1\n' | cat deploy/systemd/muster-agent.service - > "$tmp/broken/muster-agent.service"
  out=$(verify "$tmp/broken/muster-agent.service" || true)
  [[ "$out" == *BogusKey* ]] || fail "systemd-analyze verify did not flag an unknown key: $out"
  out=$(verify deploy/systemd/*.service) || fail "systemd-analyze verify failed: $out"
  [ -z "$out" ] || fail "systemd-analyze verify warned: $out"
  grep -q '^KillMode=process$' deploy/systemd/muster-agent.service || fail "the agent unit must keep tasks alive (KillMode=process)"
  units=$(ls deploy/systemd/*.service | wc -l)
else
  echo "deploy check: systemd-analyze not installed; units not verified" >&2
fi

# --- flags -----------------------------------------------------------------
# The flags a file passes to `muster CMD`, one a line.
flags_of() { grep -oE -- '--[a-z][a-z0-9-]+' "$2" | sort -u; }
check_flags() {
  local cmd=$1 file=$2 help
  help=$("$muster" "$cmd" --help)
  while read -r flag; do
    grep -qE -- "(^|[ ,])$flag([ =,]|$)" <<<"$help" || fail "$file passes $flag, which 'muster $cmd' does not take"
  done < <(flags_of "$cmd" "$file")
}
printf 'ExecStart=muster server --no-such-flag\n' > "$tmp/bad-flags"
if (check_flags server "$tmp/bad-flags") 2>/dev/null; then fail "the flag check accepted --no-such-flag"; fi
# A unit's ExecStart= line and its continuations.
exec_start() { awk '/^ExecStart=/ {on=1} on {print} on && !/\\$/ {on=0}' "$1"; }
check_flags server <(exec_start deploy/systemd/muster-server.service)
check_flags agent <(exec_start deploy/systemd/muster-agent.service)
check_flags server <(sed -n '/kind: StatefulSet/,/^---/p' deploy/kubernetes/scheduler.yaml | grep -- '--')
check_flags agent <(sed -n '/command:.*agent/,/env:/p' deploy/kubernetes/agents.yaml)

# --- dashboards and rules --------------------------------------------------
python3 deploy/check_monitoring.py --self-test
python3 deploy/check_monitoring.py

echo "deploy check: $manifests manifests valid (strict), $units systemd units verified, flags known: ok"
