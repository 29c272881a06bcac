"""One process a rank: the launcher's environment read as torchrun and Slurm set it (each bad
value one line naming the variable), and the ranks' meeting at MASTER_ADDR:MASTER_PORT."""

from __future__ import annotations

import socket
import threading

import pytest

from kern.world.processes import World, WorldError, all_gather

OK = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_a_torchrun_environment():
    assert World.from_env(OK) == World(1, 2, 1, "127.0.0.1", 29500)
    assert World.from_env({**OK, "LOCAL_RANK": "0"}).local_rank == 0  # rank 1 on another host's GPU 0
    assert World.from_env({}) is None and World.from_env({"WORLD_SIZE": "1"}) is None  # one process drives all


@pytest.mark.parametrize("change, says", [
    ({"RANK": None}, "WORLD_SIZE is 2, but RANK is not set"),
    ({"RANK": "2"}, "RANK=2: must be below WORLD_SIZE=2"),
    ({"RANK": "-1"}, "RANK='-1': expected a whole number >= 0"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two': expected a whole number >= 2"),
    ({"MASTER_ADDR": None}, "WORLD_SIZE is 2, but MASTER_ADDR is not set"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: not a TCP port"),
    ({"MASTER_PORT": "x"}, "MASTER_PORT='x': expected a whole number >= 1"),
])
def test_a_bad_environment_is_one_line(change, says):
    env = {k: v for k, v in {**OK, **change}.items() if v is not None}
    with pytest.raises(WorldError) as e:
        World.from_env(env)
    assert str(e.value) == says


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_ranks_meet_and_each_gets_every_blob_in_rank_order():
    port, n = _free_port(), 3
    got: dict[int, list] = {}

    def rank(r: int) -> None:
        got[r] = all_gather(World(r, n, r, "127.0.0.1", port), {"rank": r, "ipc": f"handle-{r}"}, timeout=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    threads[0].start()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    want = [{"rank": r, "ipc": f"handle-{r}"} for r in range(n)]
    assert got == {r: want for r in range(n)}


def test_a_rank_that_finds_no_meeting_says_where(monkeypatch):
    with pytest.raises(WorldError, match=r"rank 1: cannot meet rank 0 at 127.0.0.1:\d+"):
        all_gather(World(1, 2, 1, "127.0.0.1", _free_port()), {}, timeout=2)
