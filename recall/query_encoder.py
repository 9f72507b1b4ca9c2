"""MiniLM's forward pass in NumPy, for a query or two.

A Recall query is one short text. Through torch, the six small layers of all-MiniLM-L6-v2
cost more in dispatch than in arithmetic; the same pass written as NumPy matrix products
(the model's own weights, the same float32 arithmetic) takes about two thirds of the time
on two cores, which is most of what a Recall at scale waits for. The vectors agree with
sentence-transformers' to about 1e-7 (``tests/test_recall_embedders.py`` checks it).

:func:`numpy_encoder` builds one from a loaded SentenceTransformer when the model is the
shape it knows (a BERT encoder with absolute positions and exact GELU, mean pooling,
normalisation), and returns None otherwise: the caller then stays on torch.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any

import numpy as np

__all__ = ["NumpyEncoder", "numpy_encoder"]


def _layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Normalise each column (a token's features)."""
    mean = x.mean(0, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(0, keepdims=True)
    out: np.ndarray = centred / np.sqrt(var + eps) * gain + bias
    return out


class NumpyEncoder:
    """A BERT encoder with mean pooling and normalisation, one text at a time, in NumPy."""

    def __init__(self, weights: dict[str, np.ndarray], *, layers: int, heads: int, eps: float,
                 tokenizer: Any, max_length: int):
        from scipy.special import erf

        self._erf = erf
        self.heads, self.eps = heads, eps
        self.tokenizer, self.max_length = tokenizer, max_length
        self._lock = threading.Lock()
        """A fast tokenizer must not be called from two threads at once."""
        w = weights
        self._words = w["embeddings.word_embeddings.weight"]
        self._positions = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = []
        for i in range(layers):
            p = f"encoder.layer.{i}."
            attention = p + "attention."
            self._layers.append((  # weights as torch keeps them, (out, in): see encode_one
                np.concatenate([w[f"{attention}self.{n}.weight"] for n in ("query", "key", "value")]),
                np.concatenate([w[f"{attention}self.{n}.bias"] for n in ("query", "key", "value")])[:, None],
                w[f"{attention}output.dense.weight"], w[f"{attention}output.dense.bias"][:, None],
                w[f"{attention}output.LayerNorm.weight"][:, None], w[f"{attention}output.LayerNorm.bias"][:, None],
                w[f"{p}intermediate.dense.weight"], w[f"{p}intermediate.dense.bias"][:, None],
                w[f"{p}output.dense.weight"], w[f"{p}output.dense.bias"][:, None],
                w[f"{p}output.LayerNorm.weight"][:, None], w[f"{p}output.LayerNorm.bias"][:, None],
            ))

    def encode_one(self, text: str) -> np.ndarray:
        """The normalised, mean-pooled vector of ``text`` (float32)."""
        with self._lock:
            ids = np.asarray(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])
        n, eps = len(ids), self.eps
        x = self._words[ids] + self._positions[:n] + self._type0
        # the activations are kept a column per token, (features, tokens): a weight (out, in)
        # times them is the product OpenBLAS does fastest for a few tokens (about half the
        # time of tokens times weights (in, out), which packs the whole weight matrix)
        x = _layer_norm(x.T, self._norm[0][:, None], self._norm[1][:, None], eps)
        d = x.shape[0]
        size = d // self.heads
        scale = 1.0 / math.sqrt(size)
        for qkv_w, qkv_b, out_w, out_b, g1, b1, up_w, up_b, down_w, down_b, g2, b2 in self._layers:
            qkv = (qkv_w @ x + qkv_b).reshape(3, self.heads, size, n)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (heads, size, tokens)
            s = (q.transpose(0, 2, 1) @ k) * scale  # (heads, tokens, tokens)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            attended = (v @ s.transpose(0, 2, 1)).reshape(d, n)
            x = _layer_norm(out_w @ attended + out_b + x, g1, b1, eps)
            h = up_w @ x + up_b
            h = 0.5 * h * (1.0 + self._erf(h * (1.0 / math.sqrt(2.0))))  # exact GELU
            x = _layer_norm(down_w @ h + down_b + x, g2, b2, eps)
        pooled = x.mean(1)
        norm = float(np.linalg.norm(pooled))
        vector: np.ndarray = (pooled / norm if norm > 0 else pooled).astype(np.float32)
        return vector

    def encode(self, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts`` (shape ``(len(texts), dim)``), one forward pass each."""
        return np.stack([self.encode_one(t) for t in texts]) if texts else np.zeros((0, self._words.shape[1]), np.float32)


def numpy_encoder(model: Any) -> NumpyEncoder | None:
    """A :class:`NumpyEncoder` for a loaded SentenceTransformer of the shape it knows, else None."""
    try:
        names = [type(m).__name__ for m in model]
        if names[:3] != ["Transformer", "Pooling", "Normalize"] or len(names) != 3:
            return None
        pooling = model[1]
        mode = getattr(pooling, "pooling_mode", None) or (
            "mean" if getattr(pooling, "pooling_mode_mean_tokens", False) else None
        )
        if mode != "mean":
            return None
        bert: Any = getattr(model[0], "auto_model", None) or model[0].model
        config = bert.config
        if (config.model_type != "bert" or config.hidden_act != "gelu"
                or getattr(config, "position_embedding_type", "absolute") != "absolute"):
            return None
        weights = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in bert.state_dict().items()}
        weights = {k.removeprefix("bert."): v for k, v in weights.items()}
        return NumpyEncoder(weights, layers=config.num_hidden_layers, heads=config.num_attention_heads,
                            eps=float(config.layer_norm_eps), tokenizer=copy.deepcopy(model.tokenizer),
                            max_length=int(model.max_seq_length))
    except Exception:  # noqa: BLE001 - any surprise in the model's shape: stay on torch
        return None
