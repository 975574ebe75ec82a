"""Expected values of the router tests, computed with NumPy independently of the Rust code.

Run once (python3 gen_router.py in this folder); the test reads the files it writes:
  logits.npy  float32 [2, 8, 16]   random logits (ranks 2, tokens 8, experts 16)
  bias.npy    float32 [16]         selection bias
  CASE_ids.npy int32 [2, 8, K], CASE_weights.npy float32 [2, 8, K] for every case below
  drop_ids.npy, drop_weights.npy   the hand-made routing of the dropping test
"""
import numpy as np

rng = np.random.default_rng(20261202)
logits = rng.standard_normal((2, 8, 16)).astype(np.float32)
bias = (0.2 * rng.standard_normal(16)).astype(np.float32)
np.save("logits.npy", logits)
np.save("bias.npy", bias)

z = logits.astype(np.float64)


def route(score, topk, normalize, scale=1.0, n_group=1, topk_group=1, use_bias=False):
    if score == "softmax":
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    else:
        p = 1.0 / (1.0 + np.exp(-z))
    q = p + (bias.astype(np.float64) if use_bias else 0.0)
    if n_group > 1:
        g = q.reshape(2, 8, n_group, 16 // n_group)
        gscore = np.sort(g, axis=-1)[..., -2:].sum(axis=-1)  # sum of the two best per group
        best = np.argsort(-gscore, axis=-1, kind="stable")[..., :topk_group]
        mask = np.zeros((2, 8, n_group), dtype=bool)
        np.put_along_axis(mask, best, True, axis=-1)
        q = np.where(np.repeat(mask, 16 // n_group, axis=-1), q, -np.inf)
    ids = np.argsort(-q, axis=-1, kind="stable")[..., :topk]
    w = np.take_along_axis(p, ids, axis=-1)
    if normalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return ids.astype(np.int32), (w * scale).astype(np.float32)


cases = {
    "softmax_top4": route("softmax", 4, True),
    "softmax_top2_raw": route("softmax", 2, False),
    "sigmoid_grouped": route("sigmoid", 4, True, scale=2.5, n_group=4, topk_group=2, use_bias=True),
}
for name, (ids, w) in cases.items():
    np.save(f"{name}_ids.npy", ids)
    np.save(f"{name}_weights.npy", w)

# The dropping test's routing (ranks 2, tokens 3, top-2 over 4 experts), as in the test.
drop_ids = np.array([[[0, 1], [0, 2], [1, 0]], [[0, 3], [2, 1], [3, 2]]], dtype=np.int32)
drop_w = np.array(
    [[[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]], [[0.9, 0.1], [0.8, 0.2], [0.55, 0.45]]], dtype=np.float32
)
np.save("drop_ids.npy", drop_ids)
np.save("drop_weights.npy", drop_w)
