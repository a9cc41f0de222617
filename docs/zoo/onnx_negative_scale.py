"""ONNX Attention: a negative scale is NaN, the spec takes sqrt(scale) (onnx 1.23.2, ORT 1.31)."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

io = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in "QKVY"]
node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], scale=-1.0)
graph = helper.make_graph([node], "g", io[:3], io[3:])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
feeds = {x: np.array(a).reshape(1, 1, -1, 1) for x, a in zip("QKV", ([0.5], [1, -1.0], [1, 2.0]))}
e = np.exp(-0.5 * np.array([1.0, -1.0]))  # the exact weights e^{c·q·k}, c = -1
ref = ReferenceEvaluator(model).run(None, feeds)[0]
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
y = sess.run(None, feeds)[0]
print(
    f"exact {e @ [1.0, 2.0] / e.sum():.6f}; onnx.reference {ref.ravel()}; onnxruntime {y.ravel()}"
)
assert np.isnan(ref).all() and np.isnan(y).all(), "fixed upstream: drop the KNOWN-UPSTREAM entry"
