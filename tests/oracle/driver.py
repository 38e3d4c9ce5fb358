"""A driver that feeds the same random prompts, queries and new K/V to any engine and keeps the truth.

It owns every token's K/V (the engine's copy is not trusted) and the query it
gave for each layer: the real one, and the predicted one (the real one plus
noise) where the engine asks for a prediction.
"""

from __future__ import annotations

import torch

from scout_sglang import reference


class Driver:
    def __init__(self, shape, lengths, steps, *, seed=0, predict_noise=0.3, device="cpu"):
        gen = torch.Generator().manual_seed(seed)  # drawn on the CPU (the same numbers everywhere), then moved
        layers, heads, dim = shape.num_layers, shape.num_kv_heads, shape.head_dim
        self.shape, self.lengths, self.steps = shape, list(lengths), steps
        batch = len(lengths)
        self.prompts = {(b, l): (torch.randn(n, heads, dim, generator=gen), torch.randn(n, heads, dim, generator=gen))
                        for b, n in enumerate(lengths) for l in range(layers)}
        self.queries = torch.randn(steps, layers, batch, shape.num_qo_heads, dim, generator=gen)
        noise = torch.randn(steps, layers, batch, shape.num_qo_heads, dim, generator=gen)
        self.predicted = self.queries + predict_noise * noise  # what a layer-ahead prediction hands the engine
        self.new_k = torch.randn(steps, layers, batch, heads, dim, generator=gen)
        self.new_v = torch.randn(steps, layers, batch, heads, dim, generator=gen)
        self.was_predicted = torch.zeros(steps, layers, dtype=torch.bool)
        if device != "cpu":
            self.prompts = {key: (k.to(device), v.to(device)) for key, (k, v) in self.prompts.items()}
            for name in ("queries", "predicted", "new_k", "new_v"):
                setattr(self, name, getattr(self, name).to(device))

    def run(self, engine, *, close=True):
        """Outputs [steps, layers, B, Hq, D] of the engine, request b admitted as rid b.
        What end_step returned for each step (the engine's telemetry) is kept in self.telemetry."""
        batch = len(self.lengths)
        for b in range(batch):
            engine.add_request(b)
            for l in range(self.shape.num_layers):
                engine.prefill(b, l, *self.prompts[(b, l)])
        outputs = self.decode(engine, list(range(batch)))
        if close:
            engine.close()
        return outputs

    def decode(self, engine, rids, before_step=None):
        """The decode steps of requests `rids` (already admitted; rid b takes row b of the step's tensors) ->
        outputs [steps, layers, B, Hq, D]; `before_step()` runs before each step's plan (a caller that assigns
        pages, as SGLang's allocator does) and may return begin_step's keyword arguments (its token slots). What
        end_step returned is kept in self.telemetry."""
        outputs, self.telemetry = [], []
        for s in range(self.steps):
            step_args = (before_step() if before_step is not None else None) or {}
            engine.begin_step(rids, **step_args)
            per_layer = []
            for l in range(self.shape.num_layers):
                if l + 1 < self.shape.num_layers and engine.wants_prediction(l + 1):
                    self.was_predicted[s, l + 1] = True
                    engine.predict(l + 1, self.predicted[s, l + 1])
                per_layer.append(engine.attend(l, self.queries[s, l], self.new_k[s, l], self.new_v[s, l]).float())
            self.telemetry.append(engine.end_step())
            outputs.append(torch.stack(per_layer))
        return torch.stack(outputs)

    def kv(self, b, layer, step):
        """K, V [N, Hkv, D] of request b in a layer once step `step`'s token is in."""
        k, v = self.prompts[(b, layer)]
        return (torch.cat([k, self.new_k[: step + 1, layer, b]]), torch.cat([v, self.new_v[: step + 1, layer, b]]))

    def dense(self):
        """Dense attention over every token: what any mode gives when its budget covers the context."""
        out = torch.zeros_like(self.queries)
        for s in range(self.steps):
            for l in range(self.shape.num_layers):
                for b in range(len(self.lengths)):
                    k, v = self.kv(b, l, s)
                    out[s, l, b] = reference.dense_decode(self.queries[s, l, b], k, v, scale=self.shape.softmax_scale)[0]
        return out
