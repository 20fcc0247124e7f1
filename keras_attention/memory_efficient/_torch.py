"""The PyTorch loops: Python loops over the blocks in a
`torch.autograd.Function`.

The forward pass keeps only the output and the per-row log-sum-exp (no
score block outlives its iteration: autograd is off inside `forward`); the
backward pass recomputes each block's probabilities from them, as the other
backends do. torch is imported inside the functions: it is needed only on
its backend.
"""

from keras import ops

from keras_attention.memory_efficient._blocks import Problem
from keras_attention.memory_efficient._blocks import backward_block
from keras_attention.memory_efficient._blocks import finish_rows
from keras_attention.memory_efficient._blocks import initial_state
from keras_attention.memory_efficient._blocks import merge_heads_chunks
from keras_attention.memory_efficient._blocks import online_softmax_step

_FUNCTION = None


def attention(query, key, value, scale, masks, query_chunk_size,
              key_chunk_size, soft_cap=None):
    """`memory_efficient_attention` on torch tensors (checked already)."""
    import torch

    input_dtype = query.dtype
    query, key, value = (x.to(torch.float32) for x in (query, key, value))
    # A learned scale (a Keras variable: its torch Parameter) stays in the
    # graph and gets a gradient.
    scale = ops.convert_to_tensor(scale).to(torch.float32)
    length, num_keys = query.shape[1], key.shape[1]
    if length == 0 or num_keys == 0:
        # No keys behaves like fully masked rows.
        zeros = query.new_zeros(query.shape[:3] + value.shape[3:])
        return zeros.to(input_dtype)
    problem = Problem(length, num_keys, masks, query_chunk_size,
                      key_chunk_size, soft_cap)
    output = _function().apply(query, key, value, scale, problem)
    return output.to(input_dtype)


def _function():
    """The `torch.autograd.Function`, defined once torch is imported."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    class ChunkedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, scale, problem):
            chunks = problem.split_inputs(query, key, value, scale)
            output_chunks, logsumexp = _forward(problem, *chunks)
            ctx.problem = problem
            ctx.save_for_backward(query, key, value, scale, output_chunks,
                                  logsumexp)
            return merge_heads_chunks(output_chunks, problem.length)

        @staticmethod
        def backward(ctx, d_output):
            query, key, value, scale, output_chunks, logsumexp = (
                ctx.saved_tensors
            )
            problem = ctx.problem
            chunks = problem.split_inputs(query, key, value, scale)
            d_chunks = _backward(
                problem, *chunks, output_chunks, logsumexp,
                problem.split_queries(d_output),
            )
            d_query, d_key, d_value, d_scale = problem.gradients(
                *d_chunks, query, scale
            )
            return d_query, d_key, d_value, d_scale, None

    _FUNCTION = ChunkedAttention
    return _FUNCTION


def _forward(problem, query_chunks, key_chunks, value_chunks):
    import torch

    outputs, logsumexps = [], []
    for i in range(problem.num_query_chunks):
        query_chunk = query_chunks[i]
        state = initial_state(query_chunk, value_chunks.shape[-1])
        for j in range(int(problem.visible_key_chunks(i))):
            state = online_softmax_step(
                query_chunk, key_chunks[j], value_chunks[j],
                problem.masks(i, j), state, problem.soft_cap,
            )
        output, logsumexp = finish_rows(state)
        outputs.append(output)
        logsumexps.append(logsumexp)
    return torch.stack(outputs), torch.stack(logsumexps)


def _backward(problem, query_chunks, key_chunks, value_chunks, output_chunks,
              logsumexp, d_output_chunks):
    import torch

    d_keys = torch.zeros_like(key_chunks)
    d_values = torch.zeros_like(value_chunks)
    d_queries = []
    for i in range(problem.num_query_chunks):
        query_chunk = query_chunks[i]
        d_output = d_output_chunks[i]
        delta = ops.sum(d_output * output_chunks[i], axis=-1)
        d_query = torch.zeros_like(query_chunk)
        # Blocks above the causal diagonal contribute nothing: skipped.
        for j in range(int(problem.visible_key_chunks(i))):
            d_q, d_k, d_v = backward_block(
                query_chunk, key_chunks[j], value_chunks[j], d_output,
                logsumexp[i], delta, problem.masks(i, j), problem.soft_cap,
            )
            d_query = d_query + d_q
            d_keys[j] += d_k
            d_values[j] += d_v
        d_queries.append(d_query)
    return torch.stack(d_queries), d_keys, d_values


def to_tensor(x):
    """`x` (an array, list or tensor) as a torch tensor on Keras's device."""
    return ops.convert_to_tensor(x)
