"""Step 1 of examples/torch_pipeline: make the dataset the training gang reads.

Writes ``data.pt`` (inputs ``x`` and targets ``y``) into the workflow's
shared directory, ``$TMPDIR/muster-workflow-$MUSTER_WORKFLOW_ID`` (or
``--work``), under a temporary name first, so a later step never reads a
torn file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch


def work_dir(arg: str | None) -> str:
    d = arg or os.path.join(tempfile.gettempdir(), f"muster-workflow-{os.environ['MUSTER_WORKFLOW_ID']}")
    os.makedirs(d, exist_ok=True)
    return d


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--work", default=None, help="the directory the steps share")
    args = p.parse_args()
    g = torch.Generator().manual_seed(42)
    x = torch.randn(args.samples, 16, generator=g)
    # A smooth target the small network learns in a few dozen steps.
    y = (x.sum(dim=1, keepdim=True) / 4).sin()
    d = work_dir(args.work)
    path = os.path.join(d, "data.pt")
    torch.save({"x": x, "y": y}, path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"preprocess: {args.samples} samples written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
