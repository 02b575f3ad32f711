#!/usr/bin/env python3
"""The report of cli/benches/vs-etcd.sh: reads each round's raw outputs in
OUT (etcd-R.txt, muster-R.txt and, with --tls-ab, tls-R.txt) and prints
Muster's ratios against etcd round by round, and with --tls-ab also
TLS's cost pair by pair.

    vs-etcd-report.py OUT ROUNDS AB    # AB: 1 for a --tls-ab run, else 0
"""
import re, sys
out, rounds, ab = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
# clients -> (per second, p50 ms, p99 ms), from each bench's own lines
ETCD = r"clients=(\d+) .*rps=([\d.]+) p50=([\d.]+)ms p99=([\d.]+)ms"
MUSTER = r"^\s*(\d+) clients:\s+([\d.]+) committed submits/s\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms"
def rows(path, pattern):
    found = (re.search(pattern, line) for line in open(path))
    return {int(m[1]): tuple(float(x) for x in m.groups()[1:]) for m in found if m}
def versus_etcd(title, prefix, label):
    """Each round's etcd run against the Muster run in PREFIX-R.txt."""
    print(title)
    print(f"{'round':>5} {'clients':>7} | {'etcd/s':>8} {label + '/s':>9} {'x':>5} | {'etcd p50':>8} {label + ' p50':>10} | {'etcd p99':>8} {label + ' p99':>10}")
    for r in range(1, rounds + 1):
        e, m = rows(f"{out}/etcd-{r}.txt", ETCD), rows(f"{out}/{prefix}-{r}.txt", MUSTER)
        for c in sorted(set(e) & set(m)):
            (er, e50, e99), (mr, m50, m99) = e[c], m[c]
            print(f"{r:>5} {c:>7} | {er:>8.0f} {mr:>9.0f} {mr / er:>5.2f} | {e50:>6.2f}ms {m50:>8.2f}ms | {e99:>6.1f}ms {m99:>8.1f}ms")
versus_etcd("Muster vs etcd, same run, same machine (ratios > 1: Muster better)", "muster", "muster")
if ab:
    print()
    versus_etcd("Muster with mutual TLS vs etcd (plain), same rounds", "tls", "tls")
    print()
    print("The cost of mutual TLS, same rounds (throughput and p50 with TLS against without; 0 % = none)")
    print(f"{'round':>5} {'clients':>7} | {'plain/s':>8} {'tls/s':>9} {'cost':>6} | {'plain p50':>9} {'tls p50':>8} {'cost':>6}")
    costs = {}
    for r in range(1, rounds + 1):
        m, t = rows(f"{out}/muster-{r}.txt", MUSTER), rows(f"{out}/tls-{r}.txt", MUSTER)
        for c in sorted(set(m) & set(t)):
            (mr, m50, _), (tr, t50, _) = m[c], t[c]
            cost, slower = 1 - tr / mr, t50 / m50 - 1
            costs.setdefault(c, []).append((cost, slower))
            print(f"{r:>5} {c:>7} | {mr:>8.0f} {tr:>9.0f} {100 * cost:>5.1f}% | {m50:>7.2f}ms {t50:>6.2f}ms {100 * slower:>5.1f}%")
    for c, pairs in sorted(costs.items()):
        n = len(pairs)
        print(f"{'mean':>5} {c:>7} | {'':>8} {'':>9} {100 * sum(x for x, _ in pairs) / n:>5.1f}% | {'':>7}   {'':>6}   {100 * sum(y for _, y in pairs) / n:>5.1f}%   ({n} rounds)")
    # One gRPC call's share: health checks of the leader and of a bare
    # tonic server (no Muster layers), each run's p50.
    def call_p50(path, pattern):
        found = [re.search(pattern + r".*p50 ([\d.]+) ms", line) for line in open(path)]
        return next((float(m[1]) for m in found if m), float("nan"))
    LEADER, BARE, BARE_TLS = r"health check of the leader", r"bare tonic server \(plain", r"bare tonic server with mutual TLS"
    print()
    print("One gRPC health check, p50 in ms: the leader without and with TLS, a bare tonic server without and with TLS")
    print(f"{'round':>5} | {'leader':>7} {'leader tls':>10} | {'bare':>6} {'bare tls':>8}")
    for r in range(1, rounds + 1):
        m, t = f"{out}/muster-{r}.txt", f"{out}/tls-{r}.txt"
        print(f"{r:>5} | {call_p50(m, LEADER):>7.3f} {call_p50(t, LEADER):>10.3f} | {call_p50(t, BARE):>6.3f} {call_p50(t, BARE_TLS):>8.3f}")
print(f"(raw outputs in {out})")
