"""The ranks a user's launcher started this process among: torchrun's environment, or
SLURM's under ``srun``; and the environment each rank's run process gets.

Read without torch, so that the command line finds out at once whether it runs as one rank
of several (:func:`launched`). Nothing here connects anywhere: :mod:`._hosts` does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping

#: Where ``srun`` gives no ``MASTER_PORT``: this plus the job id's last three digits, so that
#: two jobs sharing a first host take two ports (as Lightning's SLURM environment does).
SLURM_BASE_PORT = 15000


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the ranks its launcher started.

    ``node`` is the host's rank among the hosts (torchrun's ``--node-rank``, SLURM's node
    id): two torchrun "nodes" on one machine are two nodes with one hostname.
    """

    launcher: str  # "torchrun" or "srun"
    rank: int
    size: int
    local_rank: int
    local_size: int
    node: int
    master_addr: str
    master_port: int
    #: torchrun's agent on node 0 holds the store at ``master_addr:master_port`` (its
    #: ``TORCHELASTIC_USE_AGENT_STORE``): every rank connects to it; else rank 0 holds it.
    agent_store: bool = False

    @property
    def host(self) -> str:
        return socket.gethostname()

    def run_env(self, port: int) -> dict[str, str]:
        """The environment of this rank's process for one run: torchrun's variables for the
        run's own group, which rank 0's run process holds at ``master_addr:port`` (a port
        of its own per run, so that a run never meets the rendezvous of the one before)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.node),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(port),
            # the run's rank 0 holds its group's store, not torchrun's agent
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }


def launched(environ: Mapping[str, str] | None = None) -> World | None:
    """The world a launcher started this process in, or ``None`` when it runs alone:
    torchrun's ``RANK``/``WORLD_SIZE`` (what any launcher that mimics it sets), else an
    ``srun`` step of more than one task.

    Raises:
        ValueError: The launcher's variables are not numbers, or name no rendezvous host.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and int(env.get("WORLD_SIZE") or 1) > 1:
        size = int(env["WORLD_SIZE"])
        local_size = int(env.get("LOCAL_WORLD_SIZE") or size)
        rank = int(env["RANK"])
        return World(
            launcher="torchrun",
            rank=rank,
            size=size,
            local_rank=int(env.get("LOCAL_RANK") or 0),
            local_size=local_size,
            node=int(env.get("GROUP_RANK") or rank // local_size),
            master_addr=_required(env, "MASTER_ADDR"),
            master_port=int(_required(env, "MASTER_PORT")),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )
    if int(env.get("SLURM_STEP_NUM_TASKS") or 1) > 1 and "SLURM_PROCID" in env:
        size = int(env["SLURM_STEP_NUM_TASKS"])
        nodes = int(env.get("SLURM_STEP_NUM_NODES") or 1)
        return World(
            launcher="srun",
            rank=int(env["SLURM_PROCID"]),
            size=size,
            local_rank=int(env.get("SLURM_LOCALID") or 0),
            local_size=size // max(1, nodes),
            node=int(env.get("SLURM_NODEID") or 0),
            master_addr=env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST", "")),
            master_port=int(
                env.get("MASTER_PORT")
                or SLURM_BASE_PORT + int(re.sub(r"\D", "", env.get("SLURM_JOB_ID", "")) or 0) % 1000
            ),
        )
    return None


def _required(env: Mapping[str, str], name: str) -> str:
    if not env.get(name):
        raise ValueError(f"{name} is not set")
    return env[name]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-05,09],cpu1`` gives ``gpu03``.

    Raises:
        ValueError: The list is empty.
    """
    first = re.match(r"([^,\[]*)(?:\[([^\],-]*)[^\]]*\])?", nodelist.strip())
    name = (first.group(1) + (first.group(2) or "")) if first else ""
    if not name:
        raise ValueError("SLURM_STEP_NODELIST names no host, and MASTER_ADDR is not set")
    return name
