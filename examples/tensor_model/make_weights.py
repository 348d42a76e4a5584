"""Write a small MLP (16 -> 32 -> 4) as a torch.export program or a TorchScript file.

    python make_weights.py mlp.pt2          # torch.export, batch dimension dynamic
    python make_weights.py mlp.pt           # TorchScript
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

#: The largest batch the exported program accepts (a bin's max_batch must not exceed it).
MAX_BATCH = 1024


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).eval()


def main(path: Path) -> None:
    model = mlp()
    example = torch.randn(2, 16)
    if path.suffix == ".pt2":
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, path)
    else:
        torch.jit.save(torch.jit.trace(model, example), str(path))
    print(path)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
