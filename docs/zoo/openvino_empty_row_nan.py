"""OpenVINO CPU: a query row whose boolean mask allows no key is NaN (the mask becomes -inf,
as the op's specification says, and the softmax of a row of -inf is 0/0), so exactattn does
not give it such rows."""

import numpy as np
import openvino as ov

x = np.ones((1, 1, 2, 4), np.float32)
allowed = np.array([[True, False], [False, False]]).reshape(1, 1, 2, 2)  # row 1: no key
p = [ov.opset13.parameter(a.shape, ov.Type.f32) for a in (x, x, x)]
p.append(ov.opset13.parameter(allowed.shape, ov.Type.boolean))
model = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
f32 = {"INFERENCE_PRECISION_HINT": "f32"}  # in every precision: the softmax of -inf is 0/0
print(ov.compile_model(model, "CPU", f32)([x, x, x, allowed])[0][0, 0])  # [[1 1 1 1] [nan ..]]
