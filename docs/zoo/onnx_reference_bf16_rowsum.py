"""onnx.reference's bfloat16 Attention sums each softmax row in bfloat16, one term at a time
(op_attention.py:31 np.sum on ml_dtypes' bfloat16): past 256 equal keys the sum stops growing."""

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

io = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, None) for n in "QKVY"]
node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"])
graph = helper.make_graph([node], "g", io[:3], io[3:])
model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 23)])
n_k = 1024  # q = 0: every score 0, every weight 1/n_k, so y = mean(v) = 1
q, k = np.zeros((1, 1, 1, 4), ml_dtypes.bfloat16), np.zeros((1, 1, n_k, 4), ml_dtypes.bfloat16)
v = np.ones((1, 1, n_k, 4), ml_dtypes.bfloat16)
y = ReferenceEvaluator(model).run(None, {"Q": q, "K": k, "V": v})[0].astype(np.float64)
print(f"exact y = 1; onnx.reference bfloat16 y = {y.ravel()} (the row sum stalls at 256)")
assert np.all(y == 4.0), "the reference now sums rows more accurately: revisit its bf16 claim"
