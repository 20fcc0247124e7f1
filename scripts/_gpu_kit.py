"""The backend-specific half of `gpu_layer_check.py`: autodiff of a Keras
layer, synchronisation, timing, the native fused attention peer, and device
memory, for Keras's JAX and torch backends. Imported by the worker process
after `KERAS_BACKEND` is set; it needs no TensorFlow."""

import time

import numpy as np


class BackendKit:
    """The backend-specific pieces: autodiff, synchronisation, the native
    fused attention, device memory."""

    def __init__(self, backend):
        self.backend = backend
        if backend == "torch":
            import torch
            self.torch = torch
            self.on_gpu = torch.cuda.is_available()
            self.device = "cuda" if self.on_gpu else "cpu"
        else:
            import jax
            self.jax = jax
            self.on_gpu = jax.default_backend() == "gpu"

    def device_name(self):
        if self.backend == "torch":
            return (self.torch.cuda.get_device_name() if self.on_gpu
                    else "cpu")
        return str(self.jax.devices()[0].device_kind)

    def _sync(self, value):
        if self.backend == "torch":
            if self.on_gpu:
                self.torch.cuda.synchronize()
        else:
            self.jax.block_until_ready(value)
        return value

    def _timed(self, step, repeats):
        self._sync(step())  # compile / warm up
        self._sync(step())
        started = time.perf_counter()
        for _ in range(repeats):
            value = step()
        self._sync(value)
        return (time.perf_counter() - started) / repeats

    def matmul_peak(self, size):
        """Measured bf16 matmul TFLOP/s: the peak the fractions refer to."""
        if self.backend == "torch":
            a = self.torch.randn(size, size, device=self.device,
                                 dtype=self.torch.bfloat16)
            seconds = self._timed(lambda: a @ a, 10)
        else:
            import jax.numpy as jnp
            a = jnp.ones((size, size), jnp.bfloat16)
            product = self.jax.jit(lambda m: m @ m)
            seconds = self._timed(lambda: product(a), 10)
        return 2 * size**3 / seconds / 1e12

    def forward_backward(self, layer, x, mask, cotangent):
        """Output, input gradient and weight gradients of
        `sum(layer(x) * cotangent)`, as float32 numpy arrays."""
        if self.backend == "torch":
            torch = self.torch
            inputs = torch.tensor(x, device=self.device, requires_grad=True)
            weights = [v.value for v in layer.trainable_variables]
            kwargs = {k: torch.tensor(v, device=self.device)
                      if isinstance(v, np.ndarray) else v
                      for k, v in mask.items()}
            out = layer(inputs, **kwargs)
            grads = torch.autograd.grad(
                (out.float() * torch.tensor(cotangent, device=self.device))
                .sum(), [inputs, *weights])
            arrays = [out, *grads]
            return [a.detach().float().cpu().numpy() for a in arrays]
        import jax.numpy as jnp
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def loss(weights, inputs):
            out, _ = layer.stateless_call(weights, fixed, inputs, **mask)
            return jnp.sum(out.astype("float32") * cotangent), out

        (_, out), (dweights, dx) = self.jax.value_and_grad(
            loss, argnums=(0, 1), has_aux=True)(trainable, jnp.asarray(x))
        return [np.asarray(a, "float32") for a in (out, dx, *dweights)]

    def time_layer(self, layer, is_ours, x, repeats):
        """Seconds per forward + backward of self-attention `layer` on `x`,
        and the peak device bytes (None where the backend does not say)."""

        def arguments(inputs):  # MultiHeadAttention takes query and value.
            return (inputs,) if is_ours else (inputs, inputs)

        if self.backend == "torch":
            torch = self.torch
            inputs = torch.tensor(x, device=self.device, requires_grad=True)
            layer(*arguments(inputs))  # builds the weights
            weights = [v.value for v in layer.trainable_variables]

            def step():
                out = layer(*arguments(inputs))
                return torch.autograd.grad(out.float().sum(),
                                           [inputs, *weights])[0]
            return self._measure_torch(step, repeats)
        import jax.numpy as jnp
        inputs = jnp.asarray(x)
        layer(*arguments(inputs))
        fixed = [v.value for v in layer.non_trainable_variables]
        trainable = [v.value for v in layer.trainable_variables]

        def loss(weights, inputs):
            out, _ = layer.stateless_call(weights, fixed, *arguments(inputs))
            return jnp.sum(out.astype("float32"))

        grad = self.jax.jit(self.jax.grad(loss, argnums=(0, 1)))
        seconds = self._timed(lambda: grad(trainable, inputs), repeats)
        return seconds, self._jax_peak()

    def time_native(self, x, heads, key_dim, repeats):
        """The same projections around the backend's own fused attention."""
        width = heads * key_dim
        rng = np.random.default_rng(1)
        kernels = [rng.standard_normal((width, width)).astype("float32")
                   / np.sqrt(width) for _ in range(4)]
        batch, length, _ = x.shape
        if self.backend == "torch":
            torch = self.torch
            functional = torch.nn.functional
            inputs = torch.tensor(x, device=self.device, dtype=torch.bfloat16,
                                  requires_grad=True)
            w = [torch.tensor(k, device=self.device, dtype=torch.bfloat16,
                              requires_grad=True) for k in kernels]

            def heads_first(t):
                return t.view(batch, length, heads, key_dim).transpose(1, 2)

            def step():
                q, k, v = (heads_first(inputs @ kernel) for kernel in w[:3])
                out = functional.scaled_dot_product_attention(q, k, v)
                out = out.transpose(1, 2).reshape(batch, length, width) @ w[3]
                return torch.autograd.grad(out.float().sum(), [inputs, *w])[0]
            return self._measure_torch(step, repeats)
        import jax.numpy as jnp
        inputs = jnp.asarray(x, jnp.bfloat16)
        w = [jnp.asarray(k, jnp.bfloat16) for k in kernels]
        implementation = "cudnn" if self.on_gpu else None

        def loss(w, inputs):
            q, k, v = (jnp.reshape(inputs @ kernel,
                                   (batch, length, heads, key_dim))
                       for kernel in w[:3])
            out = self.jax.nn.dot_product_attention(
                q, k, v, implementation=implementation)
            out = jnp.reshape(out, (batch, length, width)) @ w[3]
            return jnp.sum(out.astype("float32"))

        grad = self.jax.jit(self.jax.grad(loss, argnums=(0, 1)))
        return self._timed(lambda: grad(w, inputs), repeats), self._jax_peak()

    def _measure_torch(self, step, repeats):
        if self.on_gpu:
            self.torch.cuda.reset_peak_memory_stats()
        seconds = self._timed(step, repeats)
        peak = (self.torch.cuda.max_memory_allocated() if self.on_gpu
                else None)
        return seconds, peak

    def _jax_peak(self):
        stats = self.jax.devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")
