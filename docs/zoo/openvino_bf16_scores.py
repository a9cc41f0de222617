"""OpenVINO bf16 hint: scores rounded to bf16 without an MHA subgraph (small), fp32 with one."""

import numpy as np
import openvino as ov


def bf16(x):  # to the nearest bf16 (ties to even), held in float32
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).view(np.float32)


for h, n in ((1, 3), (2, 64)):  # unfused (2 threads), fused: prints [0, ~1e-3], [~1e-3, ~1e-7]
    q, k, v = np.random.default_rng(n).standard_normal((3, 1, h, n, 8)).astype(np.float32)
    p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (q, k, v)]
    m = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
    y = ov.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})([q, k, v])[0]
    s = bf16(q) @ np.swapaxes(bf16(np.float32(8**-0.5) * k), -1, -2)  # K·scale rounded
    e = [np.exp(t - t.max(-1, keepdims=True)) for t in (bf16(s), s)]  # bf16 scores, fp32
    print(h, n, [f"{abs(y - bf16(x / x.sum(-1, keepdims=True)) @ bf16(v)).max():.1e}" for x in e])
