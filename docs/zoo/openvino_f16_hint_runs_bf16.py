"""OpenVINO CPU: the f16 hint runs bf16 where the CPU has no native f16 (config.cpp keeps the
default, bf16 with AVX512-BF16). One key (p = 1) returns V as the format holds it: 1 + 2^-9
comes back exactly in f16 and f32, as 1.0 in bf16; 1 + 2^-12 exactly in f32 only."""

import numpy as np
import openvino as ov

one = np.ones((1, 1, 1, 1), np.float32)
v = np.array([1 + 2.0**-9, 1 + 2.0**-12], np.float32).reshape(1, 1, 1, 2)
p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (one, one, v)]
model = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
for hint in ("f32", "f16", "bf16"):
    compiled = ov.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
    y = compiled([one, one, v])[0].ravel()
    print(hint, compiled.get_property("INFERENCE_PRECISION_HINT"), (y - 1) * 2**12)  # [8 1] f32
