"""examples/sequence_parallel.py on 2 CPU processes (torchrun, gloo): the loss over the ranks
follows the single-process run's, and it goes down."""

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sequence_parallel.py"


def test_sequence_parallel_example_matches_one_process():
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29531", str(EXAMPLE),
         "--device", "cpu", "--steps", "21", "--length", "96", "--dim", "8"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [tuple(map(float, m)) for m in re.findall(r"loss over 2 ranks ([\d.]+)\s+in one process ([\d.]+)", out.stdout)]
    assert len(rows) == 3, out.stdout
    for sharded, whole in rows:
        assert abs(sharded - whole) <= 1e-4 * whole
    assert rows[-1][0] < 0.5 * rows[0][0]
