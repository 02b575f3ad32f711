"""Step 3 of examples/torch_pipeline: evaluate the model the gang trained.

Loads ``model.pt`` and ``data.pt`` from the workflow's shared directory,
prints the mean squared error on the last eighth of the data (the gang
trained on all of it, so this is a smoke check, not a held-out score), and
fails when it is above ``--max-loss`` or a file is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch import nn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default=None, help="the directory the steps share")
    p.add_argument("--max-loss", type=float, default=0.2)
    args = p.parse_args()
    d = args.work or os.path.join(tempfile.gettempdir(), f"muster-workflow-{os.environ['MUSTER_WORKFLOW_ID']}")
    data = torch.load(os.path.join(d, "data.pt"))
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    net.load_state_dict(torch.load(os.path.join(d, "model.pt")))
    n = data["x"].shape[0]
    x, y = data["x"][n - n // 8 :], data["y"][n - n // 8 :]
    with torch.no_grad():
        loss = nn.functional.mse_loss(net(x), y).item()
    print(
        f"evaluate: mse {loss:.4f} on {x.shape[0]} samples (at most {args.max_loss}; the targets' variance is "
        f"{y.var().item():.4f})",
        flush=True,
    )
    return 0 if loss <= args.max_loss else 1


if __name__ == "__main__":
    sys.exit(main())
