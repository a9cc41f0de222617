"""ORT's Attention skips is_causal for one query with a past (attention.cc, ComputeAttentionProbs:
`causal = is_causal && !(q_sequence_length == 1 && past_sequence_length > 0)`): with L = 3 new
keys the query sees all P + L = 5 keys; the schema (onnx/defs/nn/old.cc) allows j <= i + P."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "QKVABYCD"]
node = helper.make_node("Attention", ["Q", "K", "V", "", "A", "B"], ["Y", "C", "D"], is_causal=1)
graph = helper.make_graph([node], "g", io[:5], io[5:])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
k = np.zeros((1, 1, 5, 2), np.float32)  # equal scores: y is the mean of the values it sees
v = np.repeat(np.arange(5, dtype=np.float32).reshape(1, 1, 5, 1), 2, axis=-1)
feeds = {"Q": k[:, :, :1], "K": k[:, :, 2:], "V": v[:, :, 2:], "A": k[:, :, :2], "B": v[:, :, :2]}
y = sess.run(None, feeds)[0].ravel()[0]
print(f"P = 2, L = 3: y = {y} (all 5 keys: 2; the schema's keys 0..2: 1)")
assert y == 2.0, "fixed upstream: one query with a past now keeps j <= i + P"
