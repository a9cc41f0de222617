"""OpenVINO CPU, bf16 hint: subnormal operands and products are flushed to zero (AVX512-BF16).
One key (p = 1): V = 2^-130, a bf16 subnormal, comes back 0. 40 equal keys: every p·v =
2^-121/40 is below 2^-126, so Y = 0 where the exact value is 2^-121 = 3.8e-37, a normal number.
Under the f32 hint both come back as themselves."""

import numpy as np
import openvino as ov

for n_q, n_k, value in ((1, 1, 2.0**-130), (64, 40, 2.0**-121)):
    q, k = np.zeros((1, 1, n_q, 8), np.float32), np.zeros((1, 1, n_k, 8), np.float32)
    v = np.full((1, 1, n_k, 8), value, np.float32)
    p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (q, k, v)]
    model = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
    for hint in ("f32", "bf16"):
        y = ov.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})([q, k, v])[0]
        print(n_k, hint, y.max())  # 1 f32 7.3e-40, 1 bf16 0, 40 f32 3.8e-37, 40 bf16 0
