"""microgpt in PyTorch, written the usual way: a comparison point for `bench`.

nn.Module with nn.Linear/nn.Embedding parameters, autograd, torch.optim.Adam
and a LambdaLR linear decay: the same architecture, loss and update as
engine.model.gpt, so for equal initial parameters it gives the same losses.
PyTorch is optional: nothing else in microgpt-gui imports this module.
"""
from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig, TrainConfig
from ..backends.base import HeldoutEvaluation
from ..data.split import DataSplit
from ..data.corpus import Corpus
from ..model.gpt import RMS_EPS
from ..params import init_params, param_specs


def rmsnorm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)


class Block(nn.Module):
    def __init__(self, c: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.attn_wq = nn.Linear(c, c, bias=False)
        self.attn_wk = nn.Linear(c, c, bias=False)
        self.attn_wv = nn.Linear(c, c, bias=False)
        self.attn_wo = nn.Linear(c, c, bias=False)
        self.mlp_fc1 = nn.Linear(c, 4 * c, bias=False)
        self.mlp_fc2 = nn.Linear(4 * c, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, t, c = x.shape  # (T, C), or (B, T, C) for a batch
        heads = lambda z: z.view(*lead, t, self.n_head, c // self.n_head).transpose(-2, -3)  # noqa: E731
        xn = rmsnorm(x)
        q, k, v = heads(self.attn_wq(xn)), heads(self.attn_wk(xn)), heads(self.attn_wv(xn))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(head_dim)
        x = x + self.attn_wo(y.transpose(-2, -3).reshape(*lead, t, c))
        return x + self.mlp_fc2(F.relu(self.mlp_fc1(rmsnorm(x))))


class MicroGPT(nn.Module):
    def __init__(self, model: ModelConfig, vocab_size: int):
        super().__init__()
        c = model.n_embd
        self.wte = nn.Embedding(vocab_size, c)
        self.wpe = nn.Embedding(model.block_size, c)
        self.lm_head = nn.Linear(c, vocab_size, bias=False)
        self.layers = nn.ModuleList(Block(c, model.n_head) for _ in range(model.n_layer))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[-1])
        x = rmsnorm(self.wte(tokens) + self.wpe(pos))
        for block in self.layers:
            x = block(x)
        return self.lm_head(x)  # no final norm

    def load_flat(self, flat: np.ndarray, model: ModelConfig, vocab_size: int) -> None:
        """Copy engine.params' flat layout (microgpt's names) into the modules."""
        own = dict(self.named_parameters())
        with torch.no_grad():
            for spec in param_specs(model, vocab_size):
                name = re.sub(r"^layer(\d+)\.", r"layers.\1.", spec.name)  # layer0.x -> layers.0.x
                own[f"{name}.weight"].copy_(torch.from_numpy(flat[spec.offset : spec.end].reshape(spec.shape)))


def masked_losses(net: MicroGPT, tokens: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """Each position's cross-entropy for padded documents (B, T+1) (engine.data.split.Batch's
    arrays), 0 at the padding: (B, T). Summed: the batch's loss (with the count, its mean)."""
    tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    logits = net(tokens[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, T)
    mask = torch.arange(nll.shape[1])[None, :] < torch.from_numpy(np.asarray(lengths, dtype=np.int64))[:, None]
    return nll * mask


class TorchReference(HeldoutEvaluation):
    """Trains MicroGPT on the corpus as the backends do: the same documents per
    step (engine.data.split.DataSplit), padded and masked at B > 1, and the same
    held-out loss (HeldoutEvaluation, Backend's)."""

    name = "torch"

    def __init__(self, model: ModelConfig, train: TrainConfig, corpus: Corpus,
                 params: np.ndarray | None = None):
        self.model, self.train_config, self.corpus = model, train, corpus
        self.split = DataSplit(corpus, train.holdout, model.block_size, train.batch_size)
        self._heldout = []  # HeldoutEvaluation's record
        if params is None:
            params = init_params(model, corpus.vocab_size, train.seed, train.init_std)
        self.net = MicroGPT(model, corpus.vocab_size)
        self.net.load_flat(params, model, corpus.vocab_size)
        self.num_params = sum(p.numel() for p in self.net.parameters())
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=train.learning_rate,
                                          betas=(train.beta1, train.beta2), eps=train.eps)
        # the schedule's one definition (warm-up, then microgpt's linear decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, train.lr_factor)
        self.step = 0

    @property
    def finished(self) -> bool:
        return self.step >= self.train_config.num_steps

    def _step_loss(self) -> torch.Tensor:
        if self.split.batch_size == 1:  # one document, unpadded: microgpt's step
            inputs, targets = self.split.step_tokens(self.step)
            logits = self.net(torch.from_numpy(inputs.astype(np.int64)))
            return F.cross_entropy(logits, torch.from_numpy(targets.astype(np.int64)))
        batch = self.split.batch(self.step)
        return masked_losses(self.net, batch.tokens, batch.lengths).sum() / batch.positions

    def _doc_losses(self, batch) -> np.ndarray:
        """Each held-out document's summed loss (HeldoutEvaluation.heldout_loss's forward pass)."""
        with torch.no_grad():
            return masked_losses(self.net, batch.tokens, batch.lengths).sum(dim=1).numpy()

    def train(self, k: int) -> np.ndarray:
        k = max(0, min(k, self.train_config.num_steps - self.step))
        losses = np.empty(k, dtype=np.float32)
        for i in range(k):
            loss = self._step_loss()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            losses[i] = loss.item()
            self.step += 1
        return losses

    def close(self) -> None:
        pass

