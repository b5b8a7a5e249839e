"""microgpt's loss written plainly, position by position, in float64, and its
step's tokens: the tests' reference, independent of engine.model.gpt and
engine.data.split (no batching, no backward pass, no token arrays)."""
from __future__ import annotations

import numpy as np


def microgpt_step_tokens(corpus, step: int, block_size: int):
    """microgpt's step from its definition: document step % len(docs) as bos +
    its characters + bos, inputs its first n = min(block_size, len(tokens) - 1)
    tokens, targets the same one later; (T,) int32 each."""
    doc = corpus.docs[step % len(corpus.docs)]
    tokens = np.array([corpus.bos, *corpus.encode(doc), corpus.bos], dtype=np.int32)
    n = min(block_size, len(tokens) - 1)
    return tokens[:n], tokens[1 : n + 1]


def plain_loss_sum(flat, specs, model, inputs, targets) -> float:
    """The summed cross-entropy of one document's positions (inputs[i] -> targets[i])."""
    p = {s.name: np.asarray(flat[s.offset : s.end], dtype=np.float64).reshape(s.shape) for s in specs}
    c, nh = model.n_embd, model.n_head
    hd = c // nh
    norm = lambda v: v / np.sqrt(np.mean(v * v) + 1e-5)  # noqa: E731
    keys = [[] for _ in range(model.n_layer)]
    vals = [[] for _ in range(model.n_layer)]
    total = 0.0
    for pos, (tok, tgt) in enumerate(zip(inputs, targets)):
        x = norm(p["wte"][tok] + p["wpe"][pos])
        for i in range(model.n_layer):
            pre = f"layer{i}."
            xn = norm(x)
            q, k, v = (p[pre + n] @ xn for n in ("attn_wq", "attn_wk", "attn_wv"))
            keys[i].append(k)
            vals[i].append(v)
            heads = []
            for h in range(nh):
                sl = slice(h * hd, (h + 1) * hd)
                logits = np.array([q[sl] @ kk[sl] for kk in keys[i]]) / np.sqrt(hd)
                w = np.exp(logits - logits.max())
                w /= w.sum()
                heads.append(sum(wt * vv[sl] for wt, vv in zip(w, vals[i])))
            x = x + p[pre + "attn_wo"] @ np.concatenate(heads)
            x = x + p[pre + "mlp_fc2"] @ np.maximum(p[pre + "mlp_fc1"] @ norm(x), 0)
        logits = p["lm_head"] @ x
        logits = logits - logits.max()
        total += np.log(np.exp(logits).sum()) - logits[tgt]
    return total
