"""The names a tenant may not set in their work's environment, and why: one rule for the portal, which
refuses them at submission (a 400 naming ``env``), and the node agent, which drops the ones that reach the
toolkit or MPS from work stored before the rule (``hook_safe``, ``agent.launcher.container_spec``).

- ``LD_PRELOAD``, ``LD_AUDIT``: the dynamic loader's ways to run a library inside every program started
  with them. The NVIDIA Container Toolkit's createContainer hook ran with the container's environment, as
  root on the host, so an ``LD_PRELOAD`` there was a container escape (CVE-2025-23266, "NVIDIAScape";
  NVIDIA security bulletin 5659; fixed in toolkit 1.17.8, whose hooks get an environment of their own,
  upstream commit d6f61079). A tenant who wants a preloaded allocator sets it in their command
  (``LD_PRELOAD=... python train.py``): that reaches their processes, never a hook.
  ``LD_LIBRARY_PATH`` stays allowed: conda environments and CUDA installs need it, it runs nothing by
  itself, and no hook of a toolkit >= 1.17.8 sees the container's environment (checked where the agent
  starts: ``agent.toolkit``). An ``LD_PRELOAD`` baked into an image's ENV never passes here: that, the
  vector the CVE was shown with, only the toolkit's version stops.
- ``NVIDIA_*``: the toolkit's own controls (visible devices, driver capabilities, CUDA requirements, MIG,
  debug); the platform says which cards and driver parts a container gets.
- ``CUDA_MPS_*``: where a fraction's MPS client connects and what it may use (``agent.mps``).
- The platform's own: ``GPUCLOUD_*``, the launchers' contract (``MASTER_ADDR`` ... ``AUTO_TMPDIR``, a
  gang's ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``) and an array task's ``SLURM_ARRAY_*``. Refused,
  not quietly overridden: a job that sets ``NODE_RANK`` would otherwise run with another value than the
  one it asked for, and nothing would say so.
- What a launcher sets for each process it starts (``LAUNCHED``: ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
  ``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RUN_ID`` ...): in a job's environment they say its processes were
  started already — Lightning then starts none (``LOCAL_RANK``: LightningEnvironment) or takes torchrun's
  values (``TORCHELASTIC_RUN_ID``: TorchElasticEnvironment.detect, torch's is_torchelastic_launched) —
  so one process per node would run where one per card was meant. The launcher drops them from work
  stored before the rule (``launched_dropped``).

``CUDA_VISIBLE_DEVICES`` is the tenant's: a container sees only its own cards, so narrowing them is harmless.
"""

LOADER = frozenset({"LD_PRELOAD", "LD_AUDIT"})
# What agent.launcher.rendezvous_env sets for every job and instance (tests/agent/test_gpu_request.py
# checks that every name the launcher sets is reserved here).
CONTRACT = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "AUTO_TMPDIR",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    }
)
# What torchrun (torch.distributed.elastic's agent) sets for each worker it starts, which Lightning and
# torch read as "launched already".
LAUNCHED = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
    }
)
PREFIXES = {
    "NVIDIA_": "the NVIDIA Container Toolkit reads it; the platform sets which cards and driver parts you get",
    "CUDA_MPS_": "it steers the MPS client of a fraction of a card, which the platform sets up",
    "GPUCLOUD_": "the platform sets it",
    "SLURM_ARRAY_": "the platform sets it for the tasks of a job array",
}


def why_reserved(name: str) -> str | None:
    """Why a tenant may not set ``name`` (a sentence), or None when they may."""
    if name in LOADER:
        return (
            "it would load a library into the programs that set up your container; "
            f"set it in your command instead (e.g. {name}=... python train.py)"
        )
    if name in CONTRACT:
        return "the platform sets it (the torchrun contract of every job and instance)"
    if name in LAUNCHED:
        return (
            "torchrun sets it for each process it starts; in the job's environment it makes Lightning and "
            "torch believe their processes were started already"
        )
    for prefix, why in PREFIXES.items():
        if name.startswith(prefix):
            return why
    return None


HOOKS = ("NVIDIA_", "CUDA_MPS_")


def hook_safe(env: dict) -> dict[str, str]:
    """A stored ``env`` (as strings) without what reaches the toolkit's hooks or a fraction's MPS client:
    the loader's names, ``NVIDIA_*``, ``CUDA_MPS_*``. The platform's own names stay: an array task's
    ``GPUCLOUD_ARRAY_*`` and ``SLURM_ARRAY_*`` are stored by the platform itself, and the launcher sets
    the rest after the stored ones, so its values win."""
    return {str(k): str(v) for k, v in env.items() if str(k) not in LOADER and not str(k).startswith(HOOKS)}


def launched_dropped(env: dict[str, str]) -> dict[str, str]:
    """``env`` without ``LAUNCHED`` (work stored before they were refused)."""
    return {k: v for k, v in env.items() if k not in LAUNCHED}
