"""OpenVINO bf16 hint: the scale is folded into K, c·K formed in fp32 and rounded to bf16."""

import numpy as np
import openvino as ov


def bf16(x):  # to the nearest bf16 (ties to even), held in float32
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).view(np.float32)


q, k, v = np.random.default_rng(0).standard_normal((3, 1, 2, 64, 8)).astype(np.float32)
c = np.float32(7.3)  # logits of tens: a bf16 rounding after the scale moves them visibly
p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (q, k, v)]
m = ov.Model([ov.opset13.scaled_dot_product_attention(*p, np.float32(0), c)], p)
y = ov.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})([q, k, v])[0]
for name, a, b in (("bf16(c*k)", q, c * k), ("c*bf16(k)", q, k), ("bf16(c*q)", c * q, k)):
    s = bf16(a) @ np.swapaxes(bf16(b), -1, -2) * (c if name == "c*bf16(k)" else 1)
    e = np.exp(s - s.max(-1, keepdims=True))  # prints ~1e-7 for bf16(c*k) only
    print(name, f"{abs(y - bf16(e / e.sum(-1, keepdims=True)) @ bf16(v)).max():.1e}")
