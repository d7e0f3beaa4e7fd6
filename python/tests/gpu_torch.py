"""The Python package with PyTorch CUDA tensors (run by scripts/gpu-check.sh,
"suites"; needs a GPU, PyTorch and a CUDA build of the library):

    UNIKV_LIBRARY=<prefix>/lib/libunikv.so PYTHONPATH=python python3 python/tests/gpu_torch.py

Sparse decode on a CUDA context, every tensor a torch CUDA tensor (the pool's
layer buffer too: the pool adopts a torch allocation), launched on a
non-default torch stream that the bindings pick up from
torch.cuda.current_stream(); outputs poisoned first and compared with a float64
PyTorch reference written here. Also checks that a launch error raises
unikv.Error. Prints one PASS line; exit code 0 passes.
"""

import sys

import torch

import unikv

HEAD_DIM = 512


def reference(q, keys, indptr, indices, sink, scale):
    """float64 attention with the sink as a virtual key of value zero (K = V)."""
    tokens, heads, _ = q.shape
    out = torch.zeros(tokens, heads, HEAD_DIM, dtype=torch.float64, device=q.device)
    lse = torch.empty(tokens, heads, dtype=torch.float64, device=q.device)
    for t in range(tokens):
        k = keys[indices[indptr[t] : indptr[t + 1]].long()].double()
        if k.shape[0] == 0:
            lse[t] = sink.double()
            continue
        logits = scale * (q[t].double() @ k.T)  # [H, n]
        both = torch.cat([sink.double()[:, None], logits], dim=1)
        lse[t] = torch.logsumexp(both, dim=1)
        out[t] = torch.softmax(both, dim=1)[:, 1:] @ k
    return out, lse


def main():
    if not torch.cuda.is_available():
        print("gpu_torch: FAIL: no CUDA device visible to PyTorch")
        return 1
    torch.manual_seed(2027)
    dev = torch.device("cuda")
    heads, tokens, window, requests = 16, 8, 128, 8
    scale = HEAD_DIM**-0.5
    ctx = unikv.Context("cuda")
    assert ctx.backend == "cuda", ctx.backend

    # The pool adopts a torch allocation of the row count unikv.h gives:
    # (max_requests + 1) * (window + spec_extra) for a dense layer.
    rows = (requests + 1) * window
    layer_buffer = (torch.rand(rows, HEAD_DIM, device=dev) * 2 - 1).to(torch.bfloat16)
    pool = ctx.create_pool([0], max_requests=requests, window=window, layer_buffers=[layer_buffer])
    layer = pool.layer(0)
    assert layer.data == layer_buffer.data_ptr() and layer.rows == rows

    q = ((torch.rand(tokens, heads, HEAD_DIM, device=dev) * 2 - 1) * 3).to(torch.bfloat16)
    sink = torch.rand(heads, device=dev) * 4 - 2
    counts = torch.randint(1, 200, (tokens,))
    counts[3] = 0  # an empty slice
    indices = torch.cat([torch.randperm(rows)[: int(n)] for n in counts]).to(torch.int32).to(dev)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).to(dev)
    out = torch.full((tokens, heads, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=dev)
    lse = torch.full((tokens, heads), float("nan"), device=dev)

    plan = ctx.create_decode_plan(max_tokens=tokens, num_heads=heads)
    workspace = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the bindings launch on this stream
        plan.sparse_decode(pool, workspace=workspace, q=q, indices=indices, indptr=indptr, sink=sink, out=out,
                           lse=lse, layer=0, softmax_scale=scale)
    side.synchronize()

    want, want_lse = reference(q, layer_buffer, indptr.cpu(), indices, sink, scale)
    got = out.double()
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30))
    err[3] = 0
    worst = float(err.max())
    ok = worst < 1e-2 and bool(torch.all(got[3] == 0))
    lse_err = float((lse.double() - want_lse).abs().max())
    ok = ok and lse_err < 1e-3

    # Errors come back as exceptions with the library's message.
    try:
        plan.sparse_decode(pool, workspace=workspace, q=q[:, :4], indices=indices, indptr=indptr, out=out[:, :4],
                           softmax_scale=scale)
        ok = False
        print("gpu_torch: a 4-head q on a 16-head plan did not raise")
    except unikv.Error as e:
        ok = ok and e.status_name == "UNIKV_BAD_SHAPE" and bool(e.message)

    print("gpu_torch: %s: decode of %d tokens x %d heads on a torch stream, max relative L2 error %.3e, "
          "max |lse error| %.2e" % ("PASS" if ok else "FAIL", tokens, heads, worst, lse_err))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
