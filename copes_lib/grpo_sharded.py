"""GRPO updates sharded over the processes of one node with PyTorch FSDP2 (``fully_shard``).

The notebook stays the driver: :func:`launch` writes a job (model directory, GRPO configuration,
rollouts and advantages) to a folder and runs ``torchrun --standalone --nproc_per_node N -m
copes_lib.grpo_sharded JOB_DIR`` as a subprocess; every process runs :func:`worker`, which

1. builds the model in fp32 (the master weights) and, for LoRA, attaches the adapters with
   ``grpo.attach_lora`` (same seed on every process, so every process starts from the same weights);
2. turns on activation checkpointing in every decoder layer (transformers' own, which checkpoints
   the layer's ``forward`` inside FSDP's hooks);
3. shards every decoder layer and then the whole model with ``fully_shard`` under
   ``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``: each process stores 1/N of the fp32
   parameters, AdamW's fp32 moments are created on those shards, and a layer's parameters are
   gathered in ``param_dtype`` (bf16 on GPU) only while it runs;
4. keeps the reference policy without a second full copy: for LoRA the policy itself with its
   adapters disabled (``grpo.Reference``); for full fine-tuning a frozen copy, also sharded, stored in
   ``param_dtype``;
5. runs ``grpo.grpo_update`` (the same loss, ``grpo.grpo_loss``, and the same mini/micro-batching)
   with the process group: each process takes its share of every mini-batch's rows, the counts
   that divide the loss are summed over processes and FSDP sums (does not average) the gradients,
   so the update equals the single-process one (tested on CPU with 2 gloo processes, fp32; LoRA and
   full fine-tuning, and LoRA under bf16);
6. writes the full trainable state (gathered) and per-update statistics and times from process 0,
   and on request the full AdamW state, from which the next job continues.

:class:`ShardedUpdater` is ``grpo.train_grpo``'s ``update_fn`` built on this: one job per training
step, weights and AdamW state carried from job to job, the new weights copied back into the
driver's policy (the model it rolls out with) after every update.

How it departs from VeRL's FSDP workers: rollouts are not generated here (the driver passes them;
VeRL colocates a vLLM/SGLang engine), no CPU offload of parameters or optimizer state (FSDP2's
``CPUOffloadPolicy`` is not wired), no sequence parallelism (Ulysses), no sequence packing. With
``param_dtype = bfloat16`` gradients are computed in bf16 and reduced in fp32, so a sharded bf16 run
matches a single-process bf16-autocast run only to bf16 precision, not bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from copes_lib import grpo, runs
from copes_lib.config import Config, ConfigError, param

BACKENDS = ("auto", "gloo", "nccl")


@dataclasses.dataclass(frozen=True)
class ShardingConfig(Config):
    """How :func:`launch` shards a GRPO update over the processes (GPUs) of one node."""

    processes: int = param(2, "processes (one per GPU on CUDA) that share the model's parameters", ge=1)
    backend: str = param("auto", "torch.distributed backend: nccl on GPUs, gloo on CPU; auto picks by the "
                                 "device", choices=BACKENDS)
    param_dtype: str = param("bfloat16", "dtype of the gathered parameters that forward/backward compute with; "
                                         "master weights and AdamW states stay fp32 (VeRL's FSDP mixed "
                                         "precision)", choices=("bfloat16", "float32"))
    activation_checkpointing: bool = param(True, "recompute each decoder layer's activations in backward")
    reshard_after_forward: bool = param(True, "free gathered parameters after each layer's forward "
                                              "(ZeRO-3); False keeps them until backward (ZeRO-2, faster)")
    timeout_s: int = param(3600, "seconds before the driver stops the torchrun job", ge=1)


# --------------------------------------------------------------------------- the engine, per process
def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of a transformers causal LM (peft-wrapped or not)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: its decoder has no .layers; cannot shard it layer by layer")
    return list(layers)


def shard(model: torch.nn.Module, sharding: ShardingConfig, mesh: Any = None,
          trainable: bool = True) -> grpo.LogProbsModule:
    """Apply activation checkpointing and FSDP2 to ``model`` (fp32) in place; returns the FSDP root,
    ``grpo.LogProbsModule(model)``, which ``grpo.grpo_update`` and ``grpo.Reference`` accept as the
    policy (its forward computes the log-probs, so the root's parameters are gathered throughout)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, sharding.param_dtype), reduce_dtype=torch.float32)
    layers = decoder_layers(model)
    if trainable and sharding.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # transformers checkpoints a layer only when that layer is in training mode. Set the layer's own
        # flag, not its children's, so attention dropout (if any) stays off: pi_theta must equal pi_old.
        for layer in layers:
            layer.training = True
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=sharding.reshard_after_forward)
    root = grpo.LogProbsModule(model)
    fully_shard(root, mesh=mesh, mp_policy=policy, reshard_after_forward=sharding.reshard_after_forward)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            # grpo_update divides by the global token count itself: the gradients must be summed over
            # processes, not averaged; gloo has no AVG/PREMUL_SUM, so force plain SUM collectives.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    if trainable:
        # FSDP2 fixes each group's gradient dtypes (cast bf16 gradients back to the fp32 parameters) at
        # the root's first forward, from the parameters that require gradients *then*. peft's
        # disable_adapter switches the adapters' requires_grad off, so when that first forward is the
        # LoRA reference's, every group records no trainable parameter and hands bf16 gradients to the
        # fp32 adapters (a grad_dtype error). One tiny forward now, with the training flags in place.
        with torch.no_grad():
            root(grpo.pack([[0]], [[0]], [[1]], pad_id=0, device=next(model.parameters()).device))
    return root


def full_trainable_state(root: grpo.LogProbsModule, grads: bool = False) -> dict[str, torch.Tensor]:
    """``grpo.trainable_state`` of the wrapped model (names as there) with every shard gathered, or
    with ``grads`` the trainable parameters' gradients. A collective: call it on every process."""
    out = {}
    for name, p in root.model.named_parameters():
        value = p.grad if grads else p
        if p.requires_grad and value is not None:
            value = value.detach()
            out[name] = (value.full_tensor() if hasattr(value, "full_tensor") else value).cpu().clone()
    return out


def _state_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def _get_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Trainable weights and AdamW state, gathered to full CPU tensors on process 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    trainable = {n for n, p in root.named_parameters() if p.requires_grad}
    weights = get_model_state_dict(root, options=_state_options(cpu_offload=True))
    return {"model": {k: v for k, v in weights.items() if k in trainable},
            "optimizer": get_optimizer_state_dict(root, optimizer, options=_state_options(cpu_offload=True))}


def _load_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Inverse of :func:`_get_state`: every process reads the full state and keeps its shards."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(root, state["model"], options=_state_options(strict=False))
    set_optimizer_state_dict(root, optimizer, state["optimizer"], options=_state_options())


def worker(job_dir: str | Path) -> None:
    """One process of a torchrun job written by :func:`launch`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    job_dir = Path(job_dir)
    job = json.loads((job_dir / "job.json").read_text())
    config = grpo.GRPOConfig(**job["grpo"])
    sharding = ShardingConfig(**job["sharding"])
    cuda = sharding.backend == "nccl"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(sharding.backend)
    try:
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        group = mesh.get_group()
        # Loaded on the CPU: fully_shard moves each layer to the device as it shards it, so no process
        # ever holds the whole fp32 model on its GPU.
        model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32).eval()
        frozen = None
        if config.use_lora:
            model = grpo.attach_lora(model, config)
        elif config.kl_coef > 0:
            import copy

            frozen = copy.deepcopy(model).to(getattr(torch, sharding.param_dtype)).eval().requires_grad_(False)
            frozen = shard(frozen, sharding, mesh, trainable=False)
        policy = shard(model, sharding, mesh)
        reference = grpo.Reference(policy, config.use_lora, needed=config.kl_coef > 0, frozen=frozen)
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.lr,
                                      weight_decay=config.weight_decay)
        if job.get("init_state"):
            _load_state(policy, optimizer, torch.load(job["init_state"], map_location="cpu", weights_only=False)["state"])
        updates = torch.load(job_dir / "rollouts.pt", weights_only=False)
        rows = []
        for update in updates:
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            dist.barrier(group)
            t0 = time.perf_counter()
            stats = grpo.grpo_update(policy, optimizer, SimpleNamespace(**update["batch"]), update["advantages"],
                                     config, reference, update["pad_id"], process_group=group)
            if cuda:
                torch.cuda.synchronize(device)
            stats["update_s"] = time.perf_counter() - t0
            stats["peak_gib"] = runs.peak_memory_gib(device)
            rows.append(stats)
        grads = full_trainable_state(policy, grads=True) if job.get("return_grads") else None
        state = full_trainable_state(policy)
        carried = _get_state(policy, optimizer) if job.get("save_state") else None
        if dist.get_rank() == 0:
            runs.save_checkpoint(job_dir / "result.pt", {"trainable": state, "grads": grads, "stats": rows,
                                                         "processes": dist.get_world_size(), "state": carried})
        # Every process waits for process 0's write before any tears down: without it a process that
        # left first could take the process group down under the others (seen with gloo as "terminate
        # called without an active exception" after result.pt was written).
        dist.barrier(group)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the driver
def launch(model_dir: str | Path, updates: list[dict[str, Any]], config: grpo.GRPOConfig,
           sharding: ShardingConfig, job_dir: str | Path, *, return_grads: bool = False,
           env: dict[str, str] | None = None, capacity_gib: float | None = None,
           init_state: str | Path | None = None, save_state: bool = False) -> dict[str, Any]:
    """Run ``grpo_update`` on each of ``updates`` (dicts with ``batch`` = a rollout batch with
    ``prompt_ids``/``completion_ids``/``model_mask``, ``advantages``, ``pad_id``) in a torchrun job of
    ``sharding.processes`` processes, from the model saved in ``model_dir`` (``save_pretrained``).

    Returns process 0's result: ``trainable`` (the trained parameters, gathered), ``stats`` (one
    dict per update: ``grpo_update``'s statistics, ``update_s``, ``peak_gib``) and, with
    ``return_grads``, the last optimizer step's gradients. ``job_dir`` must not hold an earlier result.
    ``save_state`` adds ``state`` (trainable weights and AdamW state, full tensors); a later job started
    with ``init_state`` = the path of that ``result.pt`` continues from it (:class:`ShardedUpdater`).

    Before anything loads, ``grpo_memory.check_fits`` predicts the memory per device from the model's
    config.json and the longest trajectory, against ``capacity_gib`` (default: the GPU's memory on
    CUDA, no check on CPU), and raises a ConfigError with the prediction and what to change.
    """
    job_dir = Path(job_dir)
    if (job_dir / "result.pt").exists():
        raise FileExistsError(f"{job_dir / 'result.pt'} exists; pass a new job_dir (results are never overwritten)")
    backend = sharding.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < sharding.processes:
        raise ConfigError(f"ShardingConfig.processes = {sharding.processes} but {torch.cuda.device_count()} GPUs "
                          "are visible; lower processes or use backend = 'gloo' on CPU")
    for update in updates:
        missing = {"batch", "advantages", "pad_id"} - set(update)
        if missing:
            raise ValueError(f"an update lacks {sorted(missing)}; each needs batch, advantages and pad_id")
    if capacity_gib is None and backend == "nccl":
        capacity_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if capacity_gib is not None and updates:
        from transformers import AutoConfig

        from copes_lib.grpo_memory import check_fits, describe_hf_config

        context = max(len(p) + len(c) for u in updates
                      for p, c in zip(u["batch"].prompt_ids, u["batch"].completion_ids))
        check_fits(describe_hf_config(AutoConfig.from_pretrained(model_dir), Path(model_dir).name), config,
                   context, sharding.processes, capacity_gib, sharded=True, param_dtype=sharding.param_dtype,
                   activation_checkpointing=sharding.activation_checkpointing)
    job_dir.mkdir(parents=True, exist_ok=True)
    runs.atomic_torch_save([
        {"batch": _plain_batch(u["batch"]), "advantages": torch.as_tensor(u["advantages"], dtype=torch.float32),
         "pad_id": int(u["pad_id"])} for u in updates], job_dir / "rollouts.pt")
    job = {"model_dir": str(model_dir), "grpo": config.to_dict(),
           "sharding": dataclasses.replace(sharding, backend=backend).to_dict(), "return_grads": return_grads,
           "save_state": save_state, "init_state": str(init_state) if init_state else None}
    runs.atomic_write_text(job_dir / "job.json", json.dumps(job, indent=1))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={sharding.processes}", "-m", "copes_lib.grpo_sharded", str(job_dir)]
    proc_env = dict(os.environ if env is None else env)
    proc_env.setdefault("OMP_NUM_THREADS", "1")
    try:
        done = subprocess.run(command, env=proc_env, capture_output=True, text=True, timeout=sharding.timeout_s)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(f"sharded GRPO job {job_dir} ran past ShardingConfig.timeout_s = "
                           f"{sharding.timeout_s}") from err
    (job_dir / "torchrun.log").write_text(done.stdout + done.stderr)
    return _job_result(job_dir, done.returncode, done.stdout + done.stderr)


def _job_result(job_dir: Path, returncode: int, log: str) -> dict[str, Any]:
    """Process 0's result of a finished job. A job whose result.pt exists completed: process 0 writes
    it atomically after the last collective (the gathers of the trained state), so every process
    had finished its work; a non-zero exit then comes from teardown only and is logged, not raised."""
    path = job_dir / "result.pt"
    if not path.exists():
        raise RuntimeError(f"sharded GRPO job failed (exit {returncode}); log: {job_dir / 'torchrun.log'}\n"
                           + log[-3000:])
    result = runs.load_checkpoint(path, required=True, rebuild="rerun the job in a new job_dir")
    if returncode != 0:
        import warnings

        note = (f"sharded GRPO job {job_dir}: exit {returncode} after process 0 wrote result.pt (a process "
                "failed at teardown); the result is complete and used")
        with open(job_dir / "torchrun.log", "a") as log_file:
            log_file.write("\n" + note + "\n")
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    return result


class ShardedUpdater:
    """``grpo.train_grpo``'s ``update_fn`` backed by sharded torchrun jobs, one per training step.

    Each call runs one GRPO update of the step's rollouts in a fresh job of ``sharding.processes``
    processes that starts from the previous job's weights and AdamW state (carried in its
    ``result.pt``), then copies the trained weights back into the driver's ``policy``: the model the
    driver rolls out with gets the new weights after every update. A job per step reloads the model,
    which costs start-up time per step (a persistent process pool would not); in exchange the
    notebook stays the driver and no process outlives a step.
    """

    def __init__(self, model_dir: str | Path, config: grpo.GRPOConfig, sharding: ShardingConfig,
                 work_dir: str | Path, env: dict[str, str] | None = None):
        self.model_dir, self.config, self.sharding = Path(model_dir), config, sharding
        self.work_dir, self.env = Path(work_dir), env
        self.calls = 0
        self.last_result: Path | None = None

    def __call__(self, policy: torch.nn.Module, batch: Any, advantages: torch.Tensor, pad_id: int) -> dict:
        self.calls += 1
        job_dir = self.work_dir / f"step_{self.calls:05d}"
        result = launch(self.model_dir, [{"batch": batch, "advantages": advantages, "pad_id": pad_id}], self.config,
                        self.sharding, job_dir, env=self.env, init_state=self.last_result, save_state=True)
        self.last_result = job_dir / "result.pt"
        grpo.load_trainable_state(policy, result["trainable"])
        return result["stats"][0]


def _plain_batch(batch: Any) -> dict[str, list[list[int]]]:
    """The three fields ``grpo_update`` reads, as plain lists: the job file holds no library classes."""
    return {name: [list(row) for row in getattr(batch, name)]
            for name in ("prompt_ids", "completion_ids", "model_mask")}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: torchrun --nproc_per_node N -m copes_lib.grpo_sharded JOB_DIR")
    worker(sys.argv[1])
