"""The TensorFlow loops: `tf.while_loop` with `tf.custom_gradient`.

Works eagerly, inside `tf.function` and with `jit_compile=True`. TensorFlow
is imported inside the functions: it is needed only on its backend.
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
    """`memory_efficient_attention` on TensorFlow tensors (checked already)."""
    import tensorflow as tf

    input_dtype = query.dtype
    query, key, value = (tf.cast(x, tf.float32) for x in (query, key, value))
    # Reading a variable here turns it into a tensor the tape can follow.
    scale = tf.cast(tf.convert_to_tensor(scale), tf.float32)
    problem = Problem(
        ops.shape(query)[1],
        ops.shape(key)[1],
        masks,
        query_chunk_size,
        key_chunk_size,
        soft_cap,
    )

    @tf.custom_gradient
    def attend(query, key, value, scale):
        chunks = problem.split_inputs(query, key, value, scale)
        output_chunks, logsumexp = _forward(problem, *chunks)
        output = merge_heads_chunks(output_chunks, problem.length)

        def grad(d_output):
            d_chunks = _backward(
                problem,
                *chunks,
                output_chunks,
                logsumexp,
                problem.split_queries(d_output),
            )
            return problem.gradients(*d_chunks, query, scale)

        return output, grad

    return tf.cast(attend(query, key, value, scale), input_dtype)


def _forward(problem, query_chunks, key_chunks, value_chunks):
    import tensorflow as tf

    def one_query_chunk(i):
        query_chunk = query_chunks[i]

        def body(j, *state):
            state = online_softmax_step(
                query_chunk,
                key_chunks[j],
                value_chunks[j],
                problem.masks(i, j),
                state,
                problem.soft_cap,
            )
            return (j + 1,) + tuple(state)

        num_visible = problem.visible_key_chunks(i)
        initial = initial_state(query_chunk, ops.shape(value_chunks)[-1])
        # parallel_iterations=1: blocks run one after another, so only one
        # block of scores is alive at a time.
        _, *state = tf.while_loop(
            lambda j, *_: j < num_visible,
            body,
            (tf.constant(0),) + initial,
            parallel_iterations=1,
        )
        return finish_rows(state)

    def outer(i, output_array, logsumexp_array):
        output, logsumexp = one_query_chunk(i)
        return (i + 1, output_array.write(i, output),
                logsumexp_array.write(i, logsumexp))

    _, output_array, logsumexp_array = tf.while_loop(
        lambda i, *_: i < problem.num_query_chunks,
        outer,
        (
            tf.constant(0),
            _chunk_array(query_chunks, value_chunks.shape[-1:]),
            _chunk_array(query_chunks, ()),
        ),
        parallel_iterations=1,
    )
    return output_array.stack(), logsumexp_array.stack()


def _backward(
    problem,
    query_chunks,
    key_chunks,
    value_chunks,
    output_chunks,
    logsumexp,
    d_output_chunks,
):
    import tensorflow as tf

    num_key_chunks = problem.num_key_chunks

    # Outer loop over query chunks: a chunk's d_query is complete after its
    # inner loop over key chunks; d_key / d_value are summed once per query
    # chunk, so no full-size tensor is updated per block.
    def outer(i, d_key_sum, d_value_sum, d_query_array):
        query_chunk = query_chunks[i]
        d_output = d_output_chunks[i]
        row_logsumexp = logsumexp[i]
        delta = tf.reduce_sum(d_output * output_chunks[i], axis=-1)
        num_visible = problem.visible_key_chunks(i)

        def inner(j, d_query, d_key_array, d_value_array):
            def block():
                d_q, d_k, d_v = backward_block(
                    query_chunk,
                    key_chunks[j],
                    value_chunks[j],
                    d_output,
                    row_logsumexp,
                    delta,
                    problem.masks(i, j),
                    problem.soft_cap,
                )
                return d_query + d_q, d_k, d_v

            def skip():
                zeros_key = tf.zeros_like(key_chunks[j])
                return d_query, zeros_key, tf.zeros_like(value_chunks[j])

            if problem.causal:
                # Blocks above the diagonal contribute nothing.
                d_query, d_k, d_v = tf.cond(j < num_visible, block, skip)
            else:
                d_query, d_k, d_v = block()
            return (
                j + 1,
                d_query,
                d_key_array.write(j, d_k),
                d_value_array.write(j, d_v),
            )

        _, d_query, d_key_array, d_value_array = tf.while_loop(
            lambda j, *_: j < num_key_chunks,
            inner,
            (
                tf.constant(0),
                tf.zeros_like(query_chunk),
                _chunk_array(key_chunks),
                _chunk_array(value_chunks),
            ),
            parallel_iterations=1,
        )
        return (
            i + 1,
            d_key_sum + d_key_array.stack(),
            d_value_sum + d_value_array.stack(),
            d_query_array.write(i, d_query),
        )

    _, d_key_chunks, d_value_chunks, d_query_array = tf.while_loop(
        lambda i, *_: i < problem.num_query_chunks,
        outer,
        (
            tf.constant(0),
            tf.zeros_like(key_chunks),
            tf.zeros_like(value_chunks),
            _chunk_array(query_chunks),
        ),
        parallel_iterations=1,
    )
    return d_query_array.stack(), d_key_chunks, d_value_chunks


def _chunk_array(chunks, last_dims=None):
    """An empty TensorArray with one slot per chunk of `chunks`.

    Elements have the shape of one chunk, with its last dim replaced by
    `last_dims` when given.
    """
    import tensorflow as tf

    element_shape = chunks.shape[1:]
    if last_dims is not None:
        element_shape = element_shape[:-1].concatenate(last_dims)
    # A static size keeps the stacked result's shape static, as the loop
    # carries that it is added to require.
    size = chunks.shape[0]
    if size is None:
        size = tf.shape(chunks)[0]
    return tf.TensorArray(tf.float32, size=size, element_shape=element_shape)




def to_tensor(x):
    """`x` (an array, list or tensor) as a TensorFlow tensor."""
    import tensorflow as tf

    return tf.convert_to_tensor(x)
