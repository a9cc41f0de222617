"""OpenVINO CPU, bf16 hint: subnormal values are flushed to zero (AVX512-BF16 takes subnormal
operands as 0). One key (p = 1) returns V: 2^-130, a bf16 subnormal, comes back 0 under bf16
and as itself under f32."""

import numpy as np
import openvino as ov

one = np.ones((1, 1, 1, 1), np.float32)
v = np.full((1, 1, 1, 1), 2.0**-130, np.float32)
p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (one, one, v)]
model = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
for hint in ("f32", "bf16"):
    compiled = ov.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
    print(hint, compiled([one, one, v])[0].ravel())  # f32 [7.34684e-40], bf16 [0.]
