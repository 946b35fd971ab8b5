"""Shared test configuration."""

import torch

# The suite's tensors are tiny: with several threads, each small LAPACK call pays thread
# start-up costs that dominate (measured ~3 ms against 0.004 ms per call on 2 loaded cores).
torch.set_num_threads(1)
