"""SageAttention 1.0.6, non-causal: the padded keys of the last 64-key tile are not masked
(attn_qk_int8_per_block.py, _attn_fwd_inner: the tail tile's scores get no key bound), so
each one (K loaded as 0: score 0) adds e^(0 - m) to the row sum l while its V adds 0.
With V = 1 the exact Y is 1 for every n_k; n_k = 64 gives 1, n_k = 3 about 3/64.
On a GPU; on the CPU run it with TRITON_INTERPRET=1 (its asserts want CUDA tensors)."""

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":
    torch.Tensor.is_cuda = property(lambda self: True)
from sageattention import sageattn  # noqa: E402

g = torch.Generator().manual_seed(0)
for n_k in (64, 3):
    q, k = (torch.randn(1, 1, s, 64, generator=g).half().to(device) for s in (8, n_k))
    v = torch.ones(1, 1, n_k, 64, dtype=torch.float16, device=device)
    y = sageattn(q, k, v, tensor_layout="HND", is_causal=False)
    print(n_k, f"{float(y.float().mean()):.3f}")  # 64 1.000; 3 0.0xx (exact: 1)
