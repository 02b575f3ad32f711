"""examples/submit_gang.py runs to completion against the dev cluster."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import PACKAGE_ROOT, DevCluster


def test_submit_gang_example_runs_to_the_end(dev: DevCluster) -> None:
    env = dict(os.environ, MUSTER_SCHEDULER=",".join(dev.addresses), MUSTER_TLS_DIR=dev.tls_dir)
    env.pop("MUSTER_IDENTITY", None)
    proc = subprocess.run(
        [sys.executable, str(PACKAGE_ROOT / "examples" / "submit_gang.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("allocation ") and lines[0].endswith(" submitted")
    body = "\n".join(lines[1:])
    for kind in ("submitted", "gang_reserved", "task_started", "allocation_done"):
        assert kind in body, proc.stdout
    assert "allocation_done" in lines[-1]
