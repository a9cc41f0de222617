"""OpenVINO: ScaledDotProductAttention takes no fewer key/value heads than query heads (its
shape inference fails 'key_input_correctness'), so exactattn's wrapper repeats K and V over
each group of query heads (head h reads key/value head h // group)."""

import openvino as ov

q = ov.opset13.parameter([1, 4, 5, 8], ov.Type.f32)  # 4 query heads
k, v = (ov.opset13.parameter([1, 2, 7, 8], ov.Type.f32) for _ in range(2))  # 2 key/value heads
try:
    ov.opset13.scaled_dot_product_attention(q, k, v)
except RuntimeError as error:
    print("refused:", "key_input_correctness" in str(error))  # refused: True
