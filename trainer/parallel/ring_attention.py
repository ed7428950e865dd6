"""Global self-attention over tokens split in space, computed across the devices that hold them (ring attention).

Attention is exact on any order of its keys: each query's output is
Σ_s softmax(q·k_s)·v_s over all keys s, and the sum can be taken block by block.
So each device keeps its own queries, and the keys and values travel once around
the ring of the devices that split the tokens (a `collective-permute` a step,
`jax.lax.ppermute` inside a `jax.shard_map` over the split mesh axes). Each
block's scores update an online softmax (Milakov & Gimelshein, 2018; Liu et
al., 2023): the running maximum m, the running sum l and the unnormalized output
o, rescaled by exp(m_old − m_new) whenever the maximum grows, in float32 (float64
for float64 inputs). After p steps o / l is the attention output, exactly (to
rounding). JAX differentiates the ring: the backward pass is the reverse ring,
the split kept. Each step's scores are recomputed in the backward pass
(`jax.checkpoint`), so a device holds one block of scores,
batch × heads × (T/p) × (S/p), where the unsplit layer holds batch × heads × T × S.

Where the tokens are: `dot_product_attention`'s (B, T, heads, dim) with T split
over the split mesh axes in the mesh's order (depth, then height, then width),
as a reshape (B, D', H', W', C) → (B, D'·H'·W', C) lays each device's tokens
out when only the first split axis is split, or when each device holds whole
rows of the later ones (else XLA re-blocks them by all-to-alls first).
`MultiHeadAttention(attention_axes=...)` on a grid of tokens (B, D', H', W', C)
keeps every axis's own split: its queries, keys and values enter the ring as
they lie, the ring over the attended axes' devices (all three, as UNETR's; time
alone, as TimeSformer's divided attention). Causal masks (positions from each
device's block), masks and biases of shape (…, T or 1, S or 1) are supported;
dropout on the scores, returned scores, and key or value token counts that do
not divide by the split are Keras's own (XLA then gathers; `fullres train`
refuses by layer name).
"""

from __future__ import annotations

import functools
import math

REPLICA_AXIS = "replica"  # partitioning.REPLICA_AXIS (that module imports this one's caller)


def _ring_axes(mesh) -> tuple[str, ...]:
    """The mesh axes that split space, in the mesh's order."""
    return tuple(name for name in mesh.axis_names if name != REPLICA_AXIS and mesh.shape[name] > 1)


def _batch_axis(mesh, batch: int):
    replicas = mesh.shape.get(REPLICA_AXIS, 1)
    return REPLICA_AXIS if replicas > 1 and batch % replicas == 0 else None


def _block_update(q, k, v, bias, mask, state, *, scale, causal, query_start, key_start, stats_dtype):
    """One ring step: the scores of the local queries against one block of keys, folded into (o, m, l)."""
    import jax.numpy as jnp

    o, m, total = state
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.promote_types(q.dtype, jnp.float32))
    logits = logits * jnp.asarray(scale, logits.dtype)
    if bias is not None:
        logits = (logits + bias).astype(logits.dtype)
    logits = logits.astype(stats_dtype)
    keep = None if mask is None else mask.astype(bool)
    if causal:
        rows = query_start + jnp.arange(q.shape[1])[:, None]
        cols = key_start + jnp.arange(k.shape[1])[None, :]
        keep = (rows >= cols) if keep is None else jnp.logical_and(keep, rows >= cols)
    if keep is not None:
        logits = jnp.where(keep, logits, jnp.asarray(-0.7 * jnp.finfo(stats_dtype).max, stats_dtype))
    new_m = jnp.maximum(m, logits.max(axis=-1))
    correction = jnp.exp(m - new_m)
    weights = jnp.exp(logits - new_m[..., None])
    total = total * correction + weights.sum(axis=-1)
    o = o * correction[..., None] + jnp.einsum("BNTS,BSNH->BNTH", weights.astype(v.dtype), v,
                                               preferred_element_type=stats_dtype)
    return o, new_m, total


def _ring(q, k, v, bias, mask, *, axes, parts, scale, causal):
    """The per-device body: local queries (b, t, n, h); keys and values travel the ring `axes` (`parts` devices).
    A bias or mask holds the local queries' rows and every key's column (or broadcasts)."""
    import jax
    import jax.numpy as jnp

    stats_dtype = jnp.promote_types(q.dtype, jnp.float32)
    index = jax.lax.axis_index(axes)
    b, t, n, _ = q.shape
    block = k.shape[1]
    state = (jnp.zeros((b, n, t, v.shape[-1]), stats_dtype), jnp.full((b, n, t), -jnp.inf, stats_dtype),
             jnp.zeros((b, n, t), stats_dtype))
    update = jax.checkpoint(functools.partial(_block_update, scale=scale, causal=causal, stats_dtype=stats_dtype))
    forward = [(i, (i + 1) % parts) for i in range(parts)]
    for step in range(parts):
        source = (index - step) % parts  # whose keys this device holds now

        bias_block, mask_block = (_columns(array, source * block, block) for array in (bias, mask))
        state = update(q, k, v, bias_block, mask_block, state, query_start=index * t, key_start=source * block)
        if step < parts - 1:
            k, v = jax.lax.ppermute((k, v), axes, forward)
    o, _, total = state
    return jnp.swapaxes(o / total[..., None], 1, 2).astype(v.dtype)


def _columns(array, start, size: int):
    """The key block's columns of a bias or mask (last axis), or itself where it broadcasts over them."""
    import jax

    if array is None or array.shape[-1] == 1:
        return array
    return jax.lax.dynamic_slice_in_dim(array, start, size, axis=array.ndim - 1)


def _side_spec(array, batch: int, tokens: int, batch_axis, axes):
    """A bias's or mask's layout: (batch?, heads, T rows split, S columns whole)."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(batch_axis if array.shape[0] == batch else None, None,
                         axes if array.shape[2] == tokens else None, None)


def supported(mesh, query, key, value, bias=None, mask=None) -> bool:
    """True where `dot_product_attention` of these splits as a ring: 4-D inputs, as many key as query heads, the
    token counts divisible by the split, masks and biases 4-D (or none)."""
    if mesh is None or not _ring_axes(mesh):
        return False
    parts = math.prod(mesh.shape[name] for name in _ring_axes(mesh))
    shapes_ok = all(len(x.shape) == 4 for x in (query, key, value)) and query.shape[2] == key.shape[2]
    sides_ok = all(x is None or len(x.shape) == 4 for x in (bias, mask))
    return shapes_ok and sides_ok and query.shape[1] % parts == 0 and key.shape[1] % parts == 0


def dot_product_attention(mesh, query, key, value, bias=None, mask=None, scale=None, is_causal=False):
    """Keras's `dot_product_attention` (B, T, heads, dim) with T split over `mesh`'s spatial axes, as a ring
    (`supported` first)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    axes = _ring_axes(mesh)
    parts = math.prod(mesh.shape[name] for name in axes)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    batch = _batch_axis(mesh, query.shape[0])
    tokens = PartitionSpec(batch, axes, None, None)
    sides = [x for x in (bias, mask) if x is not None]
    specs = [_side_spec(x, query.shape[0], query.shape[1], batch, axes) for x in sides]

    def body(q, k, v, *rest):
        rest = list(rest)
        local_bias = rest.pop(0) if bias is not None else None
        local_mask = rest.pop(0) if mask is not None else None
        return _ring(q, k, v, local_bias, local_mask, axes=axes, parts=parts, scale=scale, causal=is_causal)

    ring = jax.shard_map(body, mesh=mesh, in_specs=(tokens, tokens, tokens, *specs), out_specs=tokens,
                         check_vma=False)
    if mask is not None:
        sides = [x if x is not mask else jnp.asarray(x).astype(bool) for x in sides]
    return ring(query, key, value, *sides)


def grid_supported(mesh, query, key, value, token_axes, spatial_dims: int) -> bool:
    """True where a `MultiHeadAttention` over a grid of tokens (B, *grid, heads, dim), attending over some of the
    grid's axes (`token_axes`: all of them, as UNETR's, or time alone, as a divided space-time video transformer's),
    splits as a ring: the grid is the split volume's (one axis per spatial axis), each axis divisible by its split,
    and at least one attended axis split (else XLA splits it as it lies)."""
    if mesh is None or not _ring_axes(mesh) or len(query.shape) != spatial_dims + 3:
        return False
    if not token_axes or not set(token_axes) <= set(range(1, spatial_dims + 1)) or query.shape[-2] != key.shape[-2]:
        return False
    if query.shape[:-2] != key.shape[:-2] or key.shape[:-1] != value.shape[:-1]:
        return False
    axes = _grid_parts(mesh, spatial_dims, query.shape)
    return axes is not None and any(axes[axis - 1] is not None for axis in token_axes)


_SPATIAL_NAMES = {2: ("height", "width"), 3: ("depth", "height", "width")}  # partitioning.DIMENSION_NAMES's


def _grid_parts(mesh, spatial_dims: int, shape):
    names = _SPATIAL_NAMES.get(spatial_dims)
    if names is None:
        return None
    axes = [name if name in mesh.axis_names and mesh.shape[name] > 1 else None for name in names]
    if any(axis is not None and size % mesh.shape[axis] for axis, size in zip(axes, shape[1:-2])):
        return None
    return axes


def grid_attention(mesh, query, key, value, scale: float, spatial_dims: int, token_axes):
    """`MultiHeadAttention`'s attention over a grid of tokens (B, *grid, heads, dim) along `token_axes`, every grid
    axis split as the volume's: each device lays its own block out as (B · the other axes, its tokens, heads, dim),
    and the blocks travel the ring of the attended axes' devices (`grid_supported` first)."""
    import jax
    from jax.sharding import PartitionSpec

    grid_axes = _grid_parts(mesh, spatial_dims, query.shape)
    axes = tuple(name for name in mesh.axis_names if name in {grid_axes[a - 1] for a in token_axes})
    parts = math.prod(mesh.shape[name] for name in axes)
    spec = PartitionSpec(_batch_axis(mesh, query.shape[0]), *grid_axes, None, None)
    others = [a for a in range(1, spatial_dims + 1) if a not in token_axes]
    order = [0, *others, *sorted(token_axes), spatial_dims + 1, spatial_dims + 2]

    def body(q, k, v):
        def tokens(x):
            x = x.transpose(order)
            return x.reshape(-1, math.prod(x.shape[1 + len(others):-2]), *x.shape[-2:])

        out = _ring(tokens(q), tokens(k), tokens(v), None, None, axes=axes, parts=parts, scale=scale, causal=False)
        laid = q.transpose(order).shape[:-1] + (v.shape[-1],)
        return out.reshape(laid).transpose([order.index(i) for i in range(len(order))])

    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(
        query, key, value)
