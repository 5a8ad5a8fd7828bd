"""Ranks from every launcher: make torchrun, the deepspeed launcher, ``srun``, ``mpirun`` and plain python look the
same to DeepSpeed (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

torchrun and the deepspeed launcher set ``RANK`` themselves and nothing is changed then. Without ``RANK``:

============================  =====================================================================================
launcher (how recognised)     what is set
============================  =====================================================================================
mpirun (Open MPI:             RANK = OMPI_COMM_WORLD_RANK, WORLD_SIZE = OMPI_COMM_WORLD_SIZE, LOCAL_RANK / LOCAL_WORLD_
``OMPI_COMM_WORLD_RANK``)     SIZE = OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE; on one node MASTER_ADDR 127.0.0.1 and
                              MASTER_PORT 29500 unless set; across nodes both must be exported (``mpirun -x``)
srun (``SLURM_PROCID``)       RANK = SLURM_PROCID, WORLD_SIZE = SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), LOCAL_RANK =
                              SLURM_LOCALID, LOCAL_WORLD_SIZE = this node's entry of SLURM_STEP_TASKS_PER_NODE
                              (``2(x3),1`` = 2, 2, 2, 1), MASTER_ADDR = the first host of SLURM_STEP_NODELIST (else
                              SLURM_JOB_NODELIST), MASTER_PORT = 15000 + SLURM_JOB_ID mod 5000 (as Lightning), each
                              unless set
plain python                  RANK 0, WORLD_SIZE 1, LOCAL_RANK 0, MASTER_ADDR 127.0.0.1, a free MASTER_PORT
============================  =====================================================================================

Open MPI is looked at before SLURM: an ``mpirun`` inside a SLURM job passes every rank the batch shell's
``SLURM_PROCID=0``. Anything that cannot give every process a distinct rank is refused with one line
(:class:`TrainError`): ``WORLD_SIZE > 1`` with no ``RANK`` and no launcher above, a SLURM batch shell of a
several-task job running the trainer itself instead of through ``srun``, variables that contradict each other, a
multi-node ``mpirun`` without ``MASTER_ADDR``.

Example (the second of two tasks of ``srun -N1 -n2 python launch/pretrain.py …`` in job 77)::

    SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0
    SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_NODELIST=gpu[07-08] SLURM_JOB_ID=77
    → RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=gpu07 MASTER_PORT=15077
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import MutableMapping

import torch

from regulargpt.errors import TrainError

__all__ = ["prepare_process_env", "launcher_ranks", "first_host", "tasks_on_node"]

MPI_DEFAULT_PORT = 29500  # torch's own default rendezvous port


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: ``gpu[07-08,11],cpu1`` → ``gpu07``; ``a[1-2]b[3-4]`` → ``a1b3``;
    ``node5`` → ``node5`` (what ``scontrol show hostnames`` prints first)."""
    item = re.split(r",(?![^\[]*\])", nodelist.strip())[0]  # top-level comma: not inside brackets
    return re.sub(r"\[([^\],\-]+)[^\]]*\]", r"\1", item)


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """This node's entry of SLURM's ``SLURM_STEP_TASKS_PER_NODE``: ``2(x3),1`` lists 2, 2, 2, 1, so node 3 → 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise TrainError(f"SLURM_STEP_TASKS_PER_NODE={tasks_per_node!r}: cannot read {part!r}; expected e.g. "
                             f"'2(x3),1'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise TrainError(f"SLURM_NODEID={node_id} is not a node of SLURM_STEP_TASKS_PER_NODE={tasks_per_node!r}")
    return counts[node_id]


def _integer(env: MutableMapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise TrainError(f"{key}={env[key]!r}: expected an integer") from None


def _from_open_mpi(env: MutableMapping[str, str]) -> dict[str, str]:
    keys = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    missing = [k for k in keys if k not in env]
    if missing:
        raise TrainError(f"OMPI_COMM_WORLD_RANK is set but {', '.join(missing)} is not; start the ranks with Open "
                         f"MPI's mpirun, or with torchrun")
    rank, world, local_rank, local = (_integer(env, k) for k in keys)
    out = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local)}
    if local == world:  # one node: every rank can find rank 0 here
        out["MASTER_ADDR"], out["MASTER_PORT"] = "127.0.0.1", str(MPI_DEFAULT_PORT)
    elif not ("MASTER_ADDR" in env and "MASTER_PORT" in env):
        raise TrainError(f"mpirun started {world} ranks over several nodes ({local} on this one) but MASTER_ADDR and "
                         f"MASTER_PORT are not both set; export them to every rank, e.g. mpirun -x MASTER_ADDR=<first "
                         f"node> -x MASTER_PORT=29500 …")
    return out


def _from_slurm(env: MutableMapping[str, str]) -> dict[str, str]:
    rank = _integer(env, "SLURM_PROCID")
    world_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    world = _integer(env, world_key) if world_key in env else 1
    if world > 1 and world_key == "SLURM_NTASKS":
        raise TrainError(f"SLURM_NTASKS={world} but this process is not a task of an srun step (no "
                         f"SLURM_STEP_NUM_TASKS): a batch script must start the ranks with `srun python "
                         f"launch/pretrain.py …` (or use launch/slurm/pretrain.sbatch, which runs torchrun)")
    if world == 1:
        return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    missing = [k for k in ("SLURM_LOCALID", "SLURM_JOB_ID") if k not in env]
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if missing or not nodelist:
        raise TrainError(f"SLURM_PROCID={rank} and {world_key}={world} are set but "
                         f"{', '.join(missing + ([] if nodelist else ['SLURM_STEP_NODELIST']))} is not; start the "
                         f"ranks with srun, or with torchrun")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    local = tasks_on_node(per_node, int(env.get("SLURM_NODEID", "0"))) if per_node else 1
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(_integer(env, "SLURM_LOCALID")),
            "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": first_host(nodelist),
            "MASTER_PORT": str(15000 + _integer(env, "SLURM_JOB_ID") % 5000)}


def launcher_ranks(env: MutableMapping[str, str]) -> tuple[str, dict[str, str]]:
    """(launcher name, the variables to set when absent) for a process without ``RANK``; TrainError when the
    environment cannot give this process a rank of its own (see the module docstring)."""
    if "OMPI_COMM_WORLD_RANK" in env:
        name, found = "mpirun", _from_open_mpi(env)
    elif "SLURM_PROCID" in env:
        name, found = "srun", _from_slurm(env)
    else:
        if env.get("WORLD_SIZE", "1") != "1":
            raise TrainError(f"WORLD_SIZE={env['WORLD_SIZE']} but RANK is unset (and no SLURM_PROCID or "
                             f"OMPI_COMM_WORLD_RANK); start several processes with torchrun, the deepspeed launcher, "
                             f"srun or mpirun")
        return "python", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                          "MASTER_ADDR": "127.0.0.1"}
    if "WORLD_SIZE" in env and env["WORLD_SIZE"] != found["WORLD_SIZE"]:
        raise TrainError(f"WORLD_SIZE={env['WORLD_SIZE']} contradicts {name}'s {found['WORLD_SIZE']} processes; "
                         f"unset WORLD_SIZE (the launcher's variables are used when RANK is unset)")
    return name, found


def prepare_process_env() -> dict[str, int]:
    """Set this process's rank variables (module docstring); call before ``import deepspeed``. Returns rank info
    ``{"rank", "world_size", "local_rank", "local_world_size"}``.

    Also ``DS_ACCELERATOR=cpu`` when torch sees no CUDA device (explicit, no detection warning), and threads: when
    OMP_NUM_THREADS is unset (the ``deepspeed`` launcher and srun do not set it) a CPU process gets
    SLURM_CPUS_PER_TASK threads under srun, else cpu_count // local processes, so N ranks do not oversubscribe.
    """
    env = os.environ
    if "DS_ACCELERATOR" not in env and not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
    launcher = "torchrun"
    if "RANK" not in env:
        launcher, found = launcher_ranks(env)
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env[key] = found[key]
        for key in ("LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if key in found:
                env.setdefault(key, found[key])
    env.setdefault("WORLD_SIZE", "1")
    env.setdefault("LOCAL_RANK", "0")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(_free_port()))
    local = int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or 1)
    if "OMP_NUM_THREADS" not in env and env.get("DS_ACCELERATOR") == "cpu":
        per_task = env.get("SLURM_CPUS_PER_TASK") if launcher == "srun" else None
        torch.set_num_threads(int(per_task) if per_task and per_task.isdigit() else
                              max(1, (os.cpu_count() or 1) // local))
    return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]), "local_rank": int(env["LOCAL_RANK"]),
            "local_world_size": local}
