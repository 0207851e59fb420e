"""The frozen "widened" substrate of paper B: tokenizer, token streams, a small Qwen3 decoder, pre-training.

Paper B's substrate is a from-scratch decoder, "widened-1536": d_model 1536, vocab 32,000, ~150M
parameters, probably 3-4 layers with tied embeddings; trained on its mixed corpus, then frozen.
Here the architecture is ``transformers``' Qwen3 (RMSNorm, RoPE, GQA, SwiGLU, tied embeddings) built
from a ``Qwen3Config``, so the same model loads in ``peft`` for the adapter-export test. The gpu
profile uses the paper's shape (4 layers x 1536, vocab 32,000: 150M parameters); the cpu profile
keeps the shape "wide model dimension relative to the vocabulary, few layers" at ~2.6M parameters
(2 x 256, vocab 4,096); smoke is tiny. The tokenizer is a byte-level BPE trained with
``tokenizers`` on the training split only. Departures: the paper's training recipe (steps, batch,
schedule) is unknown; ours is AdamW with warm-up + cosine decay, balanced batches (equal sequences
per domain), stated in the notebook.

Data layout: each domain/split is one 1-D token stream (documents joined by ``<|endoftext|>``).
Training windows are drawn at seeded random offsets; evaluation windows are fixed, non-overlapping.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from copes_lib.config import Config, ConfigError, param
from copes_lib.molora import corpus

EOS = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class SubstrateConfig(Config):
    """Corpus, tokenizer, architecture and pre-training of the frozen substrate (defaults: cpu profile)."""

    corpus_source: str = param("debian", "'debian' (fetch + clean real text) or 'sample' (committed)",
                               choices=("debian", "sample"))
    max_chars_per_domain: int = param(2_000_000, "character budget per domain (0 = everything)", ge=0)
    vocab_size: int = param(4096, "byte-level BPE vocabulary (paper: 32,000)", ge=300)
    d_model: int = param(256, "hidden size (paper: 1536)", ge=8)
    n_layers: int = param(2, "decoder layers (paper: likely 3-4)", ge=1)
    n_heads: int = param(4, "attention heads", ge=1)
    n_kv_heads: int = param(2, "key/value heads (GQA)", ge=1)
    intermediate: int = param(768, "MLP width", ge=8)
    seq_len: int = param(128, "tokens per training / evaluation window", ge=8)
    batch_per_domain: int = param(4, "sequences per domain in each batch (balanced batches)", ge=1)
    steps: int = param(800, "pre-training steps", ge=1)
    lr: float = param(2e-3, "AdamW peak learning rate", gt=0)
    warmup: int = param(50, "linear warm-up steps", ge=0)
    eval_windows: int = param(64, "fixed evaluation windows per domain and split", ge=1)
    seed: int = param(0, "seed of the corpus subset, splits, initialisation and batches", ge=0)

    def check(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model = {self.d_model} must be divisible by n_heads = {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads = {self.n_heads} must be divisible by n_kv_heads = {self.n_kv_heads}")


# --------------------------------------------------------------------------- tokenizer + streams
def train_corpus_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` (deterministic for the same input)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_streams(tokenizer, docs: dict, splits: dict) -> dict[str, dict[str, torch.Tensor]]:
    """{domain: {split: 1-D LongTensor}}: the split's documents in id order, joined by EOS."""
    eos = tokenizer.token_to_id(EOS)
    by_id = {d.id: d.text for items in docs.values() for d in items}
    streams = {}
    for domain, parts in splits.items():
        streams[domain] = {}
        for split, ids in parts.items():
            encoded = tokenizer.encode_batch([by_id[i] for i in ids])
            flat = [t for enc in encoded for t in [*enc.ids, eos]]
            streams[domain][split] = torch.tensor(flat, dtype=torch.long)
    return streams


def sample_batch(streams: dict, split: str, batch_per_domain: int, seq_len: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Balanced random windows: ids (B, seq_len + 1) and the domain index of each row (B,)."""
    rows, labels = [], []
    for d, domain in enumerate(streams):
        stream = streams[domain][split]
        if len(stream) <= seq_len + 1:
            raise ValueError(f"{domain}/{split} has {len(stream)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_per_domain,), generator=generator)
        rows += [stream[s: s + seq_len + 1] for s in starts.tolist()]
        labels += [d] * batch_per_domain
    return torch.stack(rows), torch.tensor(labels)


def eval_windows(streams: dict, split: str, n_windows: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Fixed, non-overlapping windows (n <= n_windows, seq_len + 1 tokens) per domain."""
    out = {}
    for domain in streams:
        stream = streams[domain][split]
        n = min(n_windows, (len(stream) - 1) // seq_len)
        if n < 1:
            raise ValueError(f"{domain}/{split} has too few tokens ({len(stream)}) for one window")
        out[domain] = torch.stack([stream[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    return out


# --------------------------------------------------------------------------- model
def build_corpus_lm(cfg: SubstrateConfig, vocab_size: int | None = None, device="cpu", dtype=torch.float32):
    """A randomly initialised Qwen3ForCausalLM of the configured (widened) shape, seeded."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size or cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_model // cfg.n_heads, max_position_embeddings=max(cfg.seq_len, 512),
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        use_cache=False, attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean next-token NLL (nats), shape (B,)."""
    targets = targets.to(logits.device)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return nll.view(targets.shape).mean(dim=1)


@torch.no_grad()
def domain_nll(forward, windows: dict[str, torch.Tensor], batch_size: int = 16) -> dict[str, float]:
    """Mean next-token NLL per domain; ``forward(ids) -> logits`` (moves ``ids`` to its device itself)."""
    out = {}
    for domain, rows in windows.items():
        total = 0.0
        for start in range(0, len(rows), batch_size):
            chunk = rows[start: start + batch_size]
            total += lm_loss(forward(chunk[:, :-1]), chunk[:, 1:]).sum().item()
        out[domain] = total / len(rows)
    return out


def window_nll(forward, windows: dict[str, torch.Tensor], batch_size: int = 16) -> dict[str, list[float]]:
    """Mean next-token NLL of every window, per domain in the windows' order; ``forward`` as in
    :func:`domain_nll` (whose per-domain value is the mean of these)."""
    out = {}
    for domain, rows in windows.items():
        out[domain] = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start: start + batch_size]
            out[domain] += [float(v) for v in lm_loss(forward(chunk[:, :-1]), chunk[:, 1:]).tolist()]
    return out


def lr_at(step: int, cfg_steps: int, warmup: int, peak: float) -> float:
    """Linear warm-up then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg_steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclasses.dataclass
class Substrate:
    """A pre-trained, frozen substrate with its tokenizer, token streams and split ids."""

    model: torch.nn.Module
    tokenizer: object
    streams: dict
    splits: dict
    config: SubstrateConfig
    history: list
    test_nll: dict
    stats: list

    @property
    def domains(self) -> list[str]:
        return list(self.streams)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def pretrain(cfg: SubstrateConfig, device="cpu", dtype=torch.float32, log_every: int = 50,
             on_log=None) -> Substrate:
    """Load the corpus, train the tokenizer and the model, evaluate per domain, freeze."""
    docs = corpus.load_documents(cfg.corpus_source, cfg.max_chars_per_domain, cfg.seed)
    splits = corpus.split_ids(docs, seed=cfg.seed)
    by_id = {d.id: d.text for items in docs.values() for d in items}
    train_texts = [by_id[i] for domain in splits for i in splits[domain]["train"]]
    tokenizer = train_corpus_tokenizer(train_texts, cfg.vocab_size)
    streams = token_streams(tokenizer, docs, splits)
    model = build_corpus_lm(cfg, tokenizer.get_vocab_size(), device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(cfg.seed)
    val = eval_windows(streams, "val", min(cfg.eval_windows, 16), cfg.seq_len)
    history, t0 = [], time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.warmup, cfg.lr)
        ids, _ = sample_batch(streams, "train", cfg.batch_per_domain, cfg.seq_len, generator)
        ids = ids.to(device)
        loss = lm_loss(model(input_ids=ids[:, :-1]).logits, ids[:, 1:]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            model.eval()
            nll = domain_nll(lambda x: model(input_ids=x.to(device)).logits, val)
            model.train()
            row = {"step": step + 1, "train/loss": loss.item(), "time/elapsed_s": time.perf_counter() - t0,
                   **{f"eval/val_nll_{d}": v for d, v in nll.items()},
                   "eval/val_balanced_log_ppl": sum(nll.values()) / len(nll)}
            history.append(row)
            if on_log:
                on_log(row)
    model.eval().requires_grad_(False)
    test = eval_windows(streams, "test", cfg.eval_windows, cfg.seq_len)
    test_nll = domain_nll(lambda x: model(input_ids=x.to(device)).logits, test)
    return Substrate(model, tokenizer, streams, splits, cfg, history, test_nll, corpus.corpus_stats(docs, splits))


# --------------------------------------------------------------------------- cache
def save_substrate(sub: Substrate, folder: Path) -> None:
    from copes_lib import runs

    folder.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_text(folder / "tokenizer.json", sub.tokenizer.to_str())
    runs.atomic_torch_save({"state_dict": sub.model.state_dict(), "streams": sub.streams}, folder / "substrate.pt")
    runs.atomic_write_json(folder / "splits.json", sub.splits)
    # meta.json last: its presence marks a complete cache entry.
    runs.atomic_write_json(folder / "meta.json", {"config": sub.config.to_dict(), "history": sub.history,
                                                  "test_nll": sub.test_nll, "stats": sub.stats})


def load_substrate(folder: Path, device="cpu", dtype=torch.float32) -> Substrate:
    from tokenizers import Tokenizer

    from copes_lib import runs

    meta = runs.read_json(folder / "meta.json")
    cfg = SubstrateConfig(**meta["config"])
    tokenizer = Tokenizer.from_str((folder / "tokenizer.json").read_text())
    blob = torch.load(folder / "substrate.pt", map_location="cpu", weights_only=True)
    model = build_corpus_lm(cfg, tokenizer.get_vocab_size(), device, dtype)
    model.load_state_dict(blob["state_dict"])
    model.eval().requires_grad_(False)
    splits = runs.read_json(folder / "splits.json")
    corpus.check_splits(splits)
    return Substrate(model, tokenizer, blob["streams"], splits, cfg, meta["history"], meta["test_nll"],
                     meta["stats"])


def substrate_cache_folder(profile: str, cfg: SubstrateConfig) -> Path:
    from copes_lib import runs

    return runs.cache_dir(profile, "molora_substrate", runs.cache_key(cfg))


def get_substrate(profile: str, cfg: SubstrateConfig, force: bool = False, device="cpu",
                  dtype=torch.float32, on_log=None) -> tuple[Substrate, bool]:
    """The cached substrate for ``cfg`` (trained and cached if missing); returns (substrate, was_cached)."""
    folder = substrate_cache_folder(profile, cfg)
    if (folder / "meta.json").exists() and not force:
        from copes_lib import runs

        sub = runs.load_cache_entry(folder, lambda: load_substrate(folder, device, dtype),
                                    rebuild=runs.rebuild_command(profile, "10_molora_substrate"))
        if sub is not None:
            return sub, True
    sub = pretrain(cfg, device, dtype, on_log=on_log)
    save_substrate(sub, folder)
    return sub, False
