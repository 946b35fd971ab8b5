"""quotientsharp.engine.distributed: batches and models spread over ranks give single-process
results.

The multi-process test launches ``torchrun`` with 2 CPU processes on gloo (127.0.0.1, a free
port) running the worker below; rank 0 writes every value as ``float.hex``, and the test
compares them bit for bit with the same computations in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.engine import distributed as qd
from quotientsharp.models import find_symmetries

WORKER = textwrap.dedent('''
    """Worker of tests/test_distributed.py (launched by torchrun, also imported by the test)."""
    import json
    import math
    import sys

    import torch
    from torch import nn

    import quotientsharp.engine.distributed as qd

    RHO = 0.05


    class TinyAttention(nn.Module):
        def __init__(self, width, heads):
            super().__init__()
            self.num_heads = heads
            self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
            self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)

        def forward(self, x):
            b, t, w = x.shape
            h = self.num_heads
            split = lambda y: y.reshape(b, t, h, w // h).transpose(1, 2)
            q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w // h), dim=-1)
            return self.o_proj((a @ v).transpose(1, 2).reshape(b, t, w))


    class Classifier(nn.Module):
        def __init__(self, width=8, heads=2, classes=3):
            super().__init__()
            self.attention = TinyAttention(width, heads)
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            return self.head(self.attention(x).mean(dim=1))


    def build(seed=0):
        torch.manual_seed(seed)
        model = Classifier().double()
        generator = torch.Generator().manual_seed(100)
        batches = [(torch.randn(4, 5, 8, generator=generator, dtype=torch.float64),
                    torch.randint(0, 3, (4,), generator=generator)) for _ in range(5)]
        return model, batches


    CASES = {
        "geodesic": dict(measure="geodesic", metric="mix", n_iter=4),
        "random_init": dict(measure="adaptive", n_iter=3, random_init=True, seed=7),
        "average": dict(measure="average", samples=2, seed=3),
    }


    def hexes(result):
        return {"value": result.value.hex(), "per_batch": [v.hex() for v in result.per_batch],
                "clean": [v.hex() for v in result.clean_losses],
                "n_batches": result.settings["n_batches"],
                "world_size": result.settings["world_size"],
                "seeding": result.settings["seeding"]}


    def main(out):
        torch.set_num_threads(1)
        rank, world = qd.init_distributed("gloo")
        model, batches = build()
        report = {"world": world}
        for name, options in CASES.items():
            report[name] = hexes(qd.distributed_sharpness(model, batches, rho=RHO,
                                                          progress=False, **options))
        models = [build(seed)[0] for seed in range(3)]
        report["models"] = [r.value.hex() for r in qd.models_sharpness(
            models, batches[:2], measure="adaptive", rho=RHO, n_iter=3, progress=False)]
        report["map"] = qd.distributed_map(lambda i: i * i + rank * 0, list(range(7)))
        if rank == 1:
            with torch.no_grad():
                next(model.parameters()).add_(1.0)
        try:
            qd.distributed_sharpness(model, batches, rho=RHO, progress=False, n_iter=1)
            report["mismatch_raised"] = False
        except ValueError as err:
            report["mismatch_raised"] = "differs between ranks" in str(err)
        if rank == 0:
            with open(out, "w") as stream:
                json.dump(report, stream)
        torch.distributed.destroy_process_group()


    if __name__ == "__main__":
        main(sys.argv[1])
''')


def _load_worker(tmp_path: Path):
    path = tmp_path / "distributed_worker.py"
    path.write_text(WORKER)
    spec = importlib.util.spec_from_file_location("distributed_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hexes(result):
    return [v.hex() for v in result.per_batch], result.value.hex()


# ---------------------------------------------------------------------------- in one process
def test_shard_deals_round_robin_and_covers_everything():
    items = list("abcdefg")
    shares = [qd.shard(items, rank, 3) for rank in range(3)]
    assert shares[0] == [(0, "a"), (3, "d"), (6, "g")]
    assert shares[2] == [(2, "c"), (5, "f")]
    assert sorted(i for share in shares for i, _ in share) == list(range(7))
    # a plain iterable is dealt the same way as a sequence
    assert qd.shard(iter(items), 1, 3) == qd.shard(items, 1, 3)
    assert qd.split_models(items, 1, 2) == [(1, "b"), (3, "d"), (5, "f")]
    assert qd.shard(items) == list(enumerate(items))       # no process group: everything


@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0)])
def test_shard_rejects_bad_ranks(rank, world):
    with pytest.raises(ValueError, match="rank"):
        qd.shard([1, 2], rank, world)


def test_shard_rejects_half_given_ranks_and_non_iterables():
    with pytest.raises(ValueError, match="both rank and world_size"):
        qd.shard([1, 2], rank=0)
    with pytest.raises(TypeError, match="iterable"):
        qd.shard(torch.zeros(3), 0, 1)


def test_gather_indexed_orders_and_checks_indices():
    assert qd.gather_indexed([(2, "c"), (0, "a"), (1, "b")]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="exactly once"):
        qd.gather_indexed([(0, "a"), (2, "c")])


def test_batch_seed_depends_on_seed_and_index_only():
    seeds = {qd.batch_seed(s, i) for s in range(5) for i in range(50)}
    assert len(seeds) == 250
    assert qd.batch_seed(3, 4) == qd.batch_seed(3, 4)
    assert all(0 <= s < 2 ** 63 for s in seeds)
    with pytest.raises(ValueError, match="index"):
        qd.batch_seed(0, -1)


def test_is_randomised():
    assert qd.is_randomised("average", {})
    assert not qd.is_randomised("geodesic", {})
    assert qd.is_randomised("geodesic", {"random_init": True})
    assert qd.is_randomised("worst-case", {"restarts": 2})
    assert not qd.is_randomised("relative_flatness", {})


def test_single_process_matches_sharpness(tmp_path):
    _, worker = _load_worker(tmp_path)
    model, batches = worker.build()
    ours = qd.distributed_sharpness(model, batches, rho=worker.RHO, progress=False,
                                    **worker.CASES["geodesic"])
    plain = qs.sharpness(model, batches, rho=worker.RHO, progress=False,
                         **worker.CASES["geodesic"])
    assert _hexes(ours) == _hexes(plain)
    assert ours.settings["seeding"] == "per-call" and ours.settings["world_size"] == 1
    assert ours.clean_losses == plain.clean_losses
    assert ours.perturbation_norms == plain.perturbation_norms


def test_randomised_measures_seed_each_batch_by_index(tmp_path):
    _, worker = _load_worker(tmp_path)
    model, batches = worker.build()
    options = dict(worker.CASES["average"])
    seed = options.pop("seed")
    ours = qd.distributed_sharpness(model, batches, rho=worker.RHO, progress=False, seed=seed,
                                    **options)
    for index, value in enumerate(ours.per_batch):
        alone = qs.sharpness(model, [batches[index]], rho=worker.RHO, progress=False,
                             seed=qd.batch_seed(seed, index), **options)
        assert value.hex() == alone.per_batch[0].hex()
    assert ours.settings["seeding"] == "per-batch"
    assert len(set(ours.per_batch)) == len(batches)        # really random, batch by batch


def test_distributed_sharpness_rejects_bad_input(tmp_path):
    _, worker = _load_worker(tmp_path)
    model, batches = worker.build()
    with pytest.raises(TypeError, match="model"):
        qd.distributed_sharpness("model", batches, rho=0.1)
    with pytest.raises(TypeError, match="batches"):
        qd.distributed_sharpness(model, torch.zeros(3), rho=0.1)
    with pytest.raises(ValueError, match="seed"):
        qd.distributed_sharpness(model, batches, rho=0.1, seed=-1)
    with pytest.raises(ValueError, match="empty"):
        qd.distributed_sharpness(model, [], rho=0.1, measure="adaptive")
    with pytest.raises(TypeError, match="sequence"):
        qd.models_sharpness([model], iter(batches), rho=0.1)


def test_init_distributed_without_torchrun_says_how(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="torchrun"):
        qd.init_distributed()


# ---------------------------------------------------------------------------- two processes
def test_two_gloo_ranks_match_one_process(tmp_path):
    path, worker = _load_worker(tmp_path)
    out = tmp_path / "report.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
               str(_free_port()), str(path), str(out)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["world"] == 2

    model, batches = worker.build()
    for name, options in worker.CASES.items():
        single = worker.hexes(qd.distributed_sharpness(model, batches, rho=worker.RHO,
                                                       progress=False, **options))
        got = report[name]
        assert got["per_batch"] == single["per_batch"], name
        assert got["value"] == single["value"], name
        assert got["clean"] == single["clean"], name
        assert got["n_batches"] == len(batches) and got["world_size"] == 2
    # deterministic measures agree with one plain sharpness call as well
    plain = qs.sharpness(model, batches, rho=worker.RHO, progress=False,
                         **worker.CASES["geodesic"])
    assert report["geodesic"]["per_batch"] == [v.hex() for v in plain.per_batch]

    models = [worker.build(seed)[0] for seed in range(3)]
    expected = [qs.sharpness(m, batches[:2], measure="adaptive", rho=worker.RHO, n_iter=3,
                             progress=False).value.hex() for m in models]
    assert report["models"] == expected
    assert report["map"] == [i * i for i in range(7)]
    assert report["mismatch_raised"] is True


def test_worker_model_has_attention_pairs(tmp_path):
    """The geodesic case really exercises GL pairs (not only the adaptive block)."""
    _, worker = _load_worker(tmp_path)
    model, _ = worker.build()
    report = find_symmetries(model)
    assert len(report.pairs) == 4
    assert isinstance(model, nn.Module)
