"""MiniLM's forward pass written out as tensor operations, for a query or two.

A Recall query is one short text. Through the model's modules (``SentenceTransformer``'s
``encode`` and Hugging Face's BERT), the six small layers of all-MiniLM-L6-v2 cost more
in dispatch than in arithmetic. The same pass written as a dozen torch operations a layer
(the model's own weights, not copied, and the same float32 arithmetic) takes about
half the time of ``encode`` on two cores and three quarters of the same pass in NumPy
(whose matrix products and ``erf`` are slower on a dozen tokens), which is most of what a
Recall at scale waits for. The vectors agree with sentence-transformers' to about 1e-7
(``tests/test_recall_minilm.py`` checks it).

:func:`query_encoder` builds one from a loaded SentenceTransformer when the model is the
shape it knows (a BERT encoder with absolute positions and exact GELU, mean pooling,
normalisation), and returns None otherwise: the caller then runs the model's modules.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any

import numpy as np

__all__ = ["QueryEncoder", "query_encoder"]


def _layer_norm(x: Any, gain: Any, bias: Any, eps: float) -> Any:
    """Normalise each column (a token's features)."""
    import torch

    mean = x.mean(0, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(0, keepdim=True)
    return centred * torch.rsqrt(var + eps) * gain + bias


class QueryEncoder:
    """A BERT encoder with mean pooling and normalisation, one text at a time."""

    def __init__(
        self, weights: dict[str, Any], *, layers: int, heads: int, eps: float, tokenizer: Any, max_length: int
    ):
        self.heads, self.eps = heads, eps
        self.tokenizer, self.max_length = tokenizer, max_length
        self._lock = threading.Lock()
        """A fast tokenizer must not be called from two threads at once."""
        w = weights

        def column(name: str) -> Any:  # a bias or gain, as a column that broadcasts over tokens
            return w[name][:, None]

        self._words = w["embeddings.word_embeddings.weight"]
        self._positions = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._norm = (column("embeddings.LayerNorm.weight"), column("embeddings.LayerNorm.bias"))
        self._layers = []
        import torch

        for i in range(layers):
            p = f"encoder.layer.{i}."
            attention = p + "attention."
            self._layers.append(
                (  # weights as torch keeps them, (out, in): see encode_one
                    torch.cat([w[f"{attention}self.{n}.weight"] for n in ("query", "key", "value")]),
                    torch.cat([w[f"{attention}self.{n}.bias"] for n in ("query", "key", "value")])[:, None],
                    w[f"{attention}output.dense.weight"],
                    column(f"{attention}output.dense.bias"),
                    column(f"{attention}output.LayerNorm.weight"),
                    column(f"{attention}output.LayerNorm.bias"),
                    w[f"{p}intermediate.dense.weight"],
                    column(f"{p}intermediate.dense.bias"),
                    w[f"{p}output.dense.weight"],
                    column(f"{p}output.dense.bias"),
                    column(f"{p}output.LayerNorm.weight"),
                    column(f"{p}output.LayerNorm.bias"),
                )
            )

    def encode_one(self, text: str) -> np.ndarray:
        """The normalised, mean-pooled vector of ``text`` (float32)."""
        import torch

        with self._lock:
            ids = torch.as_tensor(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])
        n, eps, heads = len(ids), self.eps, self.heads
        with torch.inference_mode():
            # the activations are kept a column per token, (features, tokens): a weight
            # (out, in) times them is the product BLAS does fastest for a few tokens
            x = _layer_norm((self._words[ids] + self._positions[:n] + self._type0).T, *self._norm, eps)
            d = x.shape[0]
            size = d // heads
            scale = 1.0 / math.sqrt(size)
            for qkv_w, qkv_b, out_w, out_b, g1, b1, up_w, up_b, down_w, down_b, g2, b2 in self._layers:
                qkv = torch.addmm(qkv_b, qkv_w, x).reshape(3, heads, size, n)
                q, k, v = qkv[0], qkv[1], qkv[2]  # (heads, size, tokens)
                attention = torch.softmax(torch.bmm(q.transpose(1, 2), k) * scale, -1)  # (heads, tokens, tokens)
                attended = torch.bmm(v, attention.transpose(1, 2)).reshape(d, n)
                x = _layer_norm(torch.addmm(out_b, out_w, attended) + x, g1, b1, eps)
                h = torch.addmm(up_b, up_w, x)
                h = 0.5 * h * (1.0 + torch.special.erf(h * (1.0 / math.sqrt(2.0))))  # exact GELU
                x = _layer_norm(torch.addmm(down_b, down_w, h) + x, g2, b2, eps)
            vector: np.ndarray = torch.nn.functional.normalize(x.mean(1), dim=0).numpy().astype(np.float32)
        return vector

    def encode(self, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts`` (shape ``(len(texts), dim)``), one forward pass each."""
        if not texts:
            return np.zeros((0, self._words.shape[1]), np.float32)
        return np.stack([self.encode_one(t) for t in texts])


def query_encoder(model: Any) -> QueryEncoder | None:
    """A :class:`QueryEncoder` for a loaded SentenceTransformer of the shape it knows, else None."""
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
        if (
            config.model_type != "bert"
            or config.hidden_act != "gelu"
            or getattr(config, "position_embedding_type", "absolute") != "absolute"
        ):
            return None
        weights = {k.removeprefix("bert."): v.detach().float() for k, v in bert.state_dict().items()}
        return QueryEncoder(
            weights,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            eps=float(config.layer_norm_eps),
            tokenizer=copy.deepcopy(model.tokenizer),
            max_length=int(model.max_seq_length),
        )
    except Exception:  # noqa: BLE001 - any surprise in the model's shape: run its modules
        return None
