"""ORT's float64 Attention (the function body, onnx/defs/nn/old.cc): a row with no allowed key
is NaN (Softmax of all -inf); its float32 kernel gives 0 (onnx 1.23.2, onnxruntime 1.31.1)."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def run(dtype, T):
    io = [helper.make_tensor_value_info(n, T, None) for n in "QKVMY"]
    node = helper.make_node("Attention", ["Q", "K", "V", "M"], ["Y"])
    graph = helper.make_graph([node], "g", io[:4], io[4:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q, k, m = np.ones((1, 1, 1, 2), dtype), np.ones((1, 1, 3, 2), dtype), np.full((1, 3), -np.inf)
    return sess.run(None, {"Q": q, "K": k, "V": k, "M": m.astype(dtype)})[0]


y32, y64 = run(np.float32, TensorProto.FLOAT), run(np.float64, TensorProto.DOUBLE)
print(f"float32 {y32.ravel()}, float64 {y64.ravel()}")
assert (y32 == 0).all() and np.isnan(y64).all(), "fixed upstream: drop the KNOWN-UPSTREAM entry"
