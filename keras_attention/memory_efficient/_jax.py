"""The JAX loops: `jax.lax` loops with `jax.custom_vjp`, running the blocks.

JAX is imported inside the function: it is an optional dependency.
"""

from keras import ops

from keras_attention.memory_efficient._blocks import Problem
from keras_attention.memory_efficient._blocks import backward_block
from keras_attention.memory_efficient._blocks import finish_rows
from keras_attention.memory_efficient._blocks import initial_state
from keras_attention.memory_efficient._blocks import merge_heads_chunks
from keras_attention.memory_efficient._blocks import online_softmax_step


def attention(query, key, value, scale, masks, query_chunk_size,
              key_chunk_size, soft_cap=None):
    """`memory_efficient_attention` on JAX arrays (checked already)."""
    import jax
    import jax.numpy as jnp

    input_dtype = query.dtype
    query, key, value = (x.astype(jnp.float32) for x in (query, key, value))
    scale = jnp.asarray(scale, jnp.float32)
    length, num_keys = query.shape[1], key.shape[1]
    if length == 0 or num_keys == 0:
        # No keys behaves like fully masked rows; lax loops cannot index
        # empty chunk arrays.
        return jnp.zeros(query.shape[:3] + value.shape[3:], input_dtype)
    causal = masks[3]

    def make_problem(mask_arrays):
        return Problem(
            length,
            num_keys,
            tuple(mask_arrays) + (causal,),
            query_chunk_size,
            key_chunk_size,
            soft_cap,
        )

    def forward(query, key, value, scale, mask_arrays):
        problem = make_problem(mask_arrays)
        query_chunks, key_chunks, value_chunks = problem.split_inputs(
            query, key, value, scale
        )

        def one_query_chunk(i):
            query_chunk = query_chunks[i]

            def body(j, state):
                return online_softmax_step(
                    query_chunk,
                    key_chunks[j],
                    value_chunks[j],
                    problem.masks(i, j),
                    state,
                    problem.soft_cap,
                )

            state = jax.lax.fori_loop(
                0,
                problem.visible_key_chunks(i),
                body,
                initial_state(query_chunk, ops.shape(value_chunks)[-1]),
            )
            return finish_rows(state)

        output_chunks, logsumexp = jax.lax.map(
            one_query_chunk, jnp.arange(problem.num_query_chunks)
        )
        return merge_heads_chunks(output_chunks, length), (
            output_chunks,
            logsumexp,
        )

    # The masks travel as an argument (not a closure) so that custom_vjp
    # never closes over traced values; they get no cotangent.
    @jax.custom_vjp
    def attend(query, key, value, scale, mask_arrays):
        return forward(query, key, value, scale, mask_arrays)[0]

    def attend_forward(query, key, value, scale, mask_arrays):
        output, saved = forward(query, key, value, scale, mask_arrays)
        return output, (query, key, value, scale, mask_arrays) + saved

    def attend_backward(residuals, d_output):
        (query, key, value, scale, mask_arrays, output_chunks,
         logsumexp) = residuals
        problem = make_problem(mask_arrays)
        query_chunks, key_chunks, value_chunks = problem.split_inputs(
            query, key, value, scale
        )
        d_output_chunks = problem.split_queries(d_output)

        def outer(sums, i):
            query_chunk = query_chunks[i]
            d_output = d_output_chunks[i]
            delta = jnp.sum(d_output * output_chunks[i], axis=-1)
            num_visible = problem.visible_key_chunks(i)

            def inner(d_query, j):
                def block(d_query):
                    d_q, d_k, d_v = backward_block(
                        query_chunk,
                        key_chunks[j],
                        value_chunks[j],
                        d_output,
                        logsumexp[i],
                        delta,
                        problem.masks(i, j),
                        problem.soft_cap,
                    )
                    return d_query + d_q, (d_k, d_v)

                def skip(d_query):
                    zeros_key = jnp.zeros_like(key_chunks[j])
                    zeros_value = jnp.zeros_like(value_chunks[j])
                    return d_query, (zeros_key, zeros_value)

                # Blocks above the causal diagonal contribute nothing.
                return jax.lax.cond(j < num_visible, block, skip, d_query)

            d_query, (d_keys, d_values) = jax.lax.scan(
                inner,
                jnp.zeros_like(query_chunk),
                jnp.arange(problem.num_key_chunks),
            )
            return (sums[0] + d_keys, sums[1] + d_values), d_query

        (d_key_chunks, d_value_chunks), d_query_chunks = jax.lax.scan(
            outer,
            (jnp.zeros_like(key_chunks), jnp.zeros_like(value_chunks)),
            jnp.arange(problem.num_query_chunks),
        )
        gradients = problem.gradients(
            d_query_chunks, d_key_chunks, d_value_chunks, query, scale
        )
        return gradients + (None,)

    attend.defvjp(attend_forward, attend_backward)
    output = attend(query, key, value, scale, masks[:3])
    return output.astype(input_dtype)


def to_tensor(x):
    """`x` (an array, list or tensor) as a JAX array."""
    import jax.numpy as jnp

    return jnp.asarray(x)
