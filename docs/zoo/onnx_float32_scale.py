"""ONNX Attention's scale is a float32: float64 runs err by ~1e-8 (onnx 1.23, ORT 1.31)."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

io = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in "QKVY"]
q, k, v = np.ones((1, 1, 1, 3)), np.eye(2, 3)[None, None] * [[1], [0]], np.eye(2, 1)[None, None]
for c, attrs in ((1 / np.sqrt(3), {}), (1 / 3, {"scale": 1 / 3})):  # default, explicit
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs)
    graph = helper.make_graph([node], "g", io[:3], io[3:])
    m = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 23)])
    feeds = {"Q": q, "K": k, "V": v}  # scores c and 0: y = p_0 = 1 / (1 + e^-c)
    y_ort = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0].item()
    y_ref = ReferenceEvaluator(m).run(None, feeds)[0].item()
    errors = [abs(y * (1 + np.exp(-c)) - 1) for y in (y_ort, y_ref)]
    print(f"c = {c:.17g} {attrs or '(default)'}: relative errors ORT, reference: {errors}")
    assert errors[0] > 1e-10 and (errors[1] > 1e-10) == bool(attrs)  # float32 c; float64 ops
