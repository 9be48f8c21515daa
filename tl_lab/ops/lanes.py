"""Sixteen float32 lanes for the compiled kernels, with the order of every sum written out.
Chapter L10.1, section 2.4 (batch invariance).

A dot product sum_k x[k] w[k] of K terms can be added up in many orders, and each order rounds
differently. The kernels fix one, here, in code:

    lane l (l = 0 .. 15) adds x[k] w[k] for k = l, l + 16, l + 32, ... in that order, each step one
    fused multiply-add (`vfma`: one rounding); then the 16 lanes are folded in halves (`vsum`):
    lane l + 8 onto lane l, then l + 4 onto l, then l + 2, then lane 1 onto lane 0.

Every product kernel builds its sums from these pieces and nothing else. So a kernel may block
its work however it likes (one row by four features, three rows by eight features, any batch, any
thread) and y[m, n] still comes out with the same bits: the blocking decides which sums run side
by side, never the order inside one. That lets the engine pick the fastest kernel for each batch
size without giving up batch invariance (`kernels.product_f32`).

Why not let the compiler vectorize a plain loop (numba's ``fastmath`` with ``reassoc``)? It would
also split the sum into lanes, but it picks how many partial sums to keep from the loop around it
(more for one feature, fewer for sixteen), so two kernels would add the same dot product in two
orders; and numba optimizes a parallel kernel loaded from its cache differently from one it has
just compiled (numba issue #10617). Here nothing is left to choose: none of these operations
carries a fast-math flag, so LLVM may not reassociate them.

The pieces are numba intrinsics emitting LLVM's vector instructions (`F32x16` is LLVM's
<16 x float>: one AVX-512 register, or two AVX2 ones):

- ``vzero()`` -> 16 zeros;
- ``vload(a, i, k)`` -> a[i, k : k + 16] of a C-contiguous 2-D float32 array, unchecked: the rows
  must hold whole steps of 16 (`kernels.lanes_ready` pads a K that is not a multiple of 16 with
  zero columns, which add nothing to any lane; a bounds check on every load cost the one-row
  kernel 20% of its speed, measured);
- ``vfma(a, b, c)`` -> a * b + c lane by lane, rounded once;
- ``vsum(v)`` -> the lanes folded in the fixed tree above, a float32;
- ``vsum4(a0, a1, a2, a3)`` -> the four `vsum`s in lanes 0 .. 3 (the same folds, shared shuffles);
  ``vstore_sums82(y, n, a, b)`` stores the sixteen `vsum`s of a block of 8 rows x 2 features so;
  ``vmul(a, b)``;
- ``vmax(a, b)``, ``vtop(v)`` -> the larger lane by lane, the largest lane (a maximum is exact: any
  order gives it);
- ``prefetch(a, i, k)`` -> ask the memory system for the cache line of a[i, k] (a hint; it never
  faults). A kernel that does arithmetic on the weight as it streams in keeps the next weight rows
  on their way this way; measured on SmolLM2 at batch 8, it turns 34 ms of layer products into 22;
  ``prefetch_l2(a, i, k)`` the same into the L2 cache only, for rows asked for far ahead, which
  would crowd the rows in use out of L1;
- ``vsplat(x)``, ``vstore(a, i, k, v)``; for attention, whose head dimension may end inside a
  step, ``vload_part``, ``vstore_part`` (masked: lanes past the row's end read as 0 and are never
  written) and ``vload_f16`` / ``vload_f16_part`` (the pool's f16 bits widened to float32, exact);
- ``vhat(P, i, b, shift, s)`` -> sixteen stored int4 nibbles n as W_hat = (n - 8) s, for the int4 kernels;
  ``vq8(Q, i, k, s)`` -> sixteen stored int8 values q as W_hat = q s, for the int8 LM head.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

__all__ = ["LANES", "HALF", "F32x16", "F32x8", "vzero8", "vload8", "vfma8", "vjoin", "vsplat8", "vq8h", "wide_registers", "vzero", "vload", "vfma", "vsum", "prefetch", "prefetch_l2", "vload_part", "vload_f16", "vload_f16_part",
           "vstore", "vstore_part", "vsplat", "vtranspose16", "vhat", "vq8", "vexp", "vmax", "vtop", "vsum4", "vstore_sums82", "vmul"]

LANES = 16
_VEC = ir.VectorType(ir.FloatType(), LANES)
_I32 = ir.IntType(32)
_F16_BITS = ir.VectorType(ir.IntType(16), LANES)  # sixteen f16 values' bits


class F32x16(types.Type):
    """numba's name for LLVM's <16 x float>, so kernels can hold a vector in a variable."""

    def __init__(self):
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _item_pointer(context, builder, aryty, ary, i, k):
    """The address of ary[i, k] (2-D, no bounds check: the kernels' loops stay in bounds)."""
    a = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, a, [i, k], wraparound=False), a


def _check_2d(arr, dtype=types.float32, what="lanes work on"):
    """A kernel's array: C-contiguous, 2-D, of `dtype` (any dtype for None); else a TypeError."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C" and dtype in (None, arr.dtype)):
        kind = "" if dtype is None else f"{dtype} "
        raise TypeError(f"{what} C-contiguous 2-D {kind}arrays, got {arr}")


def _broadcast(builder, value, vectype):
    """`value` (a scalar) in every lane of `vectype`."""
    v = builder.insert_element(ir.Constant(vectype, None), value, _I32(0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


@intrinsic
def vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC, None)

    return f32x16(), codegen


@intrinsic
def vload(typingctx, arr, i, k):
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        return builder.load(builder.bitcast(ptr, _VEC.as_pointer()), align=4)

    return f32x16(arr, i, k), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v16f32")
        return builder.call(fn, args)

    return f32x16(f32x16, f32x16, f32x16), codegen


def _fold(builder, x, combine):
    """Fold 16 lanes into lane 0, the upper half onto the lower one: 16 -> 8 -> 4 -> 2 -> 1."""
    n = LANES
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        x = combine(lo, hi)
    return builder.extract_element(x, _I32(0))


@intrinsic
def vsum(typingctx, v):
    def codegen(context, builder, sig, args):
        return _fold(builder, args[0], builder.fadd)

    return types.float32(f32x16), codegen


def _folds_side_by_side(builder, vectors):
    """`vsum` of each of `vectors` (a power of two of them, at most 16), the j-th in lane j: the
    very same folds as `_fold` (lane l + 8 onto l, then + 4, + 2, + 1), each step adding the halves
    of two vectors side by side, one vector addition for both, where `_fold` adds one vector's
    halves at a time. Lanes past len(vectors): undefined."""
    width = LANES  # lanes that hold one vector's partial sums
    while width > 1:
        width //= 2
        if len(vectors) == 1:
            vectors = vectors * 2
        groups = range(LANES // width)  # of 2 width lanes in x ++ y: one vector's sums each
        lo = ir.Constant(ir.VectorType(_I32, LANES), [2 * width * g + l for g in groups for l in range(width)])
        hi = ir.Constant(ir.VectorType(_I32, LANES), [2 * width * g + width + l for g in groups for l in range(width)])
        vectors = [builder.fadd(builder.shuffle_vector(x, y, lo), builder.shuffle_vector(x, y, hi))
                   for x, y in zip(vectors[::2], vectors[1::2], strict=True)]
    return vectors[0]


@intrinsic
def vsum4(typingctx, a0, a1, a2, a3):
    """Lanes 0 .. 3: vsum(a0) .. vsum(a3), the very same folds (so the same bits), done four vectors
    at a time (`_folds_side_by_side`): 15 additions for four sums instead of 4 x 4 plus four
    extractions. Lanes 4 .. 15: undefined."""
    def codegen(context, builder, sig, args):
        return _folds_side_by_side(builder, list(args))

    return f32x16(f32x16, f32x16, f32x16, f32x16), codegen


@intrinsic
def vstore_sums82(typingctx, y, n, a, b):
    """y[m, n] = vsum(a[m]) and y[m, n + 1] = vsum(b[m]) for m = 0 .. 7 (a, b: tuples of eight
    vectors, the sums of a block of 8 rows x 2 features): the sixteen folds side by side
    (`_folds_side_by_side`), so the bits of sixteen `vsum`s in 15 vector additions, then each row's
    two sums stored together. Unchecked, like `vstore`: y needs 8 rows and columns n, n + 1."""
    _check_2d(y)
    for t in (a, b):
        if not (isinstance(t, types.UniTuple) and t.count == 8 and t.dtype == f32x16):
            raise TypeError(f"vstore_sums82 folds two tuples of eight f32x16, got {t}")

    def codegen(context, builder, sig, args):
        sums = _folds_side_by_side(builder, [builder.extract_value(t, m) for m in range(8) for t in args[2:]])
        pair = ir.VectorType(ir.FloatType(), 2)
        col = context.cast(builder, args[1], sig.args[1], types.intp)
        for m in range(8):
            ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], context.get_constant(types.intp, m), col)
            two = builder.shuffle_vector(sums, sums, ir.Constant(ir.VectorType(_I32, 2), [2 * m, 2 * m + 1]))
            builder.store(two, builder.bitcast(ptr, pair.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(y, n, a, b), codegen


@intrinsic
def vmul(typingctx, a, b):
    """a * b lane by lane."""
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])

    return f32x16(f32x16, f32x16), codegen


def _max(builder, a, b):
    """Lane by lane the larger of a and b (a where they compare equal or unordered)."""
    return builder.select(builder.fcmp_ordered("<", a, b), b, a)


@intrinsic
def vmax(typingctx, a, b):
    """Lane by lane the larger of a and b. A maximum is exact, so no order of taking it can change
    its value: unlike a sum, it may be folded any way."""
    def codegen(context, builder, sig, args):
        return _max(builder, args[0], args[1])

    return f32x16(f32x16, f32x16), codegen


@intrinsic
def vtop(typingctx, v):
    """The largest of the 16 lanes, a float32."""
    def codegen(context, builder, sig, args):
        return _fold(builder, args[0], lambda lo, hi: _max(builder, lo, hi))

    return types.float32(f32x16), codegen


def _prefetch(locality: int):
    """An intrinsic asking for the cache line of arr[i, k] with LLVM's locality hint: 3 keeps it in
    every level (L1 on x86), 2 in the outer ones (prefetcht1: the L2 cache)."""
    @intrinsic
    def ask(typingctx, arr, i, k):
        _check_2d(arr, None, "prefetch takes")

        def codegen(context, builder, sig, args):
            ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
            i8p = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [builder.bitcast(ptr, i8p), _I32(0), _I32(locality), _I32(1)])  # read, data
            return context.get_dummy_value()

        return types.void(arr, i, k), codegen

    return ask


prefetch = _prefetch(3)
prefetch_l2 = _prefetch(2)


@intrinsic
def vtranspose16(typingctx, src, i, k, dst, r, c):
    """dst[r + a, c + b] = src[i + b, k + a] for a, b = 0 .. 15: a 16 x 16 block of float32 moved
    transposed (both C-contiguous 2-D, unchecked like `vload`; src float32, or uint16 f16 bits widened
    as they are loaded, as `vload_f16` does: attention's keys straight from the pool). Sixteen loads,
    four rounds of sixteen two-vector shuffles (each round swaps the off-diagonal blocks of size 8,
    4, 2, 1), and sixteen stores: a quarter of an instruction per value, where one value at a time
    took two."""
    _check_2d(src, None)
    if src.dtype not in (types.float32, types.uint16):
        raise TypeError(f"vtranspose16 reads float32 or f16 bits (uint16), got {src}")
    _check_2d(dst)
    bits = src.dtype == types.uint16

    def codegen(context, builder, sig, args):
        rows = []
        for b in range(LANES):
            ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], builder.add(args[1], ir.Constant(args[1].type, b)), args[2])
            if bits:
                rows.append(_widen_f16(builder, builder.load(builder.bitcast(ptr, _F16_BITS.as_pointer()), align=2)))
            else:
                rows.append(builder.load(builder.bitcast(ptr, _VEC.as_pointer()), align=4))
        size = LANES // 2
        while size >= 1:  # rows x = rows[a], y = rows[a + size] with a's bit `size` clear
            for a in range(LANES):
                if a & size:
                    continue
                x, y = rows[a], rows[a + size]
                lo = [col if not col & size else LANES + col - size for col in range(LANES)]
                hi = [col + size if not col & size else LANES + col for col in range(LANES)]
                rows[a] = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(_I32, LANES), lo))
                rows[a + size] = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(_I32, LANES), hi))
            size //= 2
        for a in range(LANES):
            ptr, _ = _item_pointer(context, builder, sig.args[3], args[3], builder.add(args[4], ir.Constant(args[4].type, a)), args[5])
            builder.store(rows[a], builder.bitcast(ptr, _VEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(src, i, k, dst, r, c), codegen


# ---------------------------------------------------------------------------------------------
# Rows shorter than a whole step (attention's head dimension may be any size): masked loads and
# stores, lanes n .. 15 read as 0 and never touched. A kernel uses them only where its rows may
# end inside a step (`kernels.attend_paged` compiles a second loop for that case): the mask costs
# instructions on every load, and attention ran at half speed with it on every step.
# ---------------------------------------------------------------------------------------------


def _mask(builder, n):
    """<16 x i1>: lane l < n."""
    lane = ir.Constant(ir.VectorType(n.type, LANES), list(range(LANES)))
    ends = _broadcast(builder, n, ir.VectorType(n.type, LANES))
    return builder.icmp_signed("<", lane, ends)


def _masked_load(context, builder, sig, args, elem):
    """The first n lanes of a[i, k:k + 16] (element type `elem`), the rest 0."""
    vec = ir.VectorType(elem, LANES)
    ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
    n = context.cast(builder, args[3], sig.args[3], types.intp)
    name = "llvm.masked.load.v16f32.p0" if elem == ir.FloatType() else "llvm.masked.load.v16i16.p0"
    fnty = ir.FunctionType(vec, [vec.as_pointer(), _I32, ir.VectorType(ir.IntType(1), LANES), vec])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, [builder.bitcast(ptr, vec.as_pointer()), _I32(2), _mask(builder, n), ir.Constant(vec, None)])


@intrinsic
def vload_part(typingctx, arr, i, k, n):
    """a[i, k : k + n] in lanes 0 .. n - 1 (float32), 0 in the others; n <= 16."""
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        return _masked_load(context, builder, sig, args, ir.FloatType())

    return f32x16(arr, i, k, n), codegen


def _widen_f16(builder, bits):
    """<16 x i16> f16 bits -> <16 x float>, exact (every f16 is a float32; one instruction, F16C)."""
    return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), _VEC)


@intrinsic
def vload_f16(typingctx, arr, i, k):
    """The f16 values a[i, k : k + 16] of a C-contiguous 2-D uint16 array (the KV pool's bits),
    widened to float32; unchecked, like `vload`."""
    _check_2d(arr, types.uint16, "the f16 loads read")

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        bits = builder.load(builder.bitcast(ptr, _F16_BITS.as_pointer()), align=2)
        return _widen_f16(builder, bits)

    return f32x16(arr, i, k), codegen


@intrinsic
def vload_f16_part(typingctx, arr, i, k, n):
    """`vload_f16` of a[i, k : k + n] in lanes 0 .. n - 1, 0 in the others."""
    _check_2d(arr, types.uint16, "the f16 loads read")

    def codegen(context, builder, sig, args):
        return _widen_f16(builder, _masked_load(context, builder, sig, args, ir.IntType(16)))

    return f32x16(arr, i, k, n), codegen


@intrinsic
def vstore(typingctx, arr, i, k, v):
    """a[i, k : k + 16] = v; unchecked, like `vload`."""
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        builder.store(args[3], builder.bitcast(ptr, _VEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(arr, i, k, f32x16), codegen


@intrinsic
def vstore_part(typingctx, arr, i, k, n, v):
    """a[i, k : k + n] = lanes 0 .. n - 1 of v; the others are not written."""
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        n = context.cast(builder, args[3], sig.args[3], types.intp)
        fnty = ir.FunctionType(ir.VoidType(), [_VEC, _VEC.as_pointer(), _I32, ir.VectorType(ir.IntType(1), LANES)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.store.v16f32.p0")
        builder.call(fn, [args[4], builder.bitcast(ptr, _VEC.as_pointer()), _I32(4), _mask(builder, n)])
        return context.get_dummy_value()

    return types.void(arr, i, k, n, f32x16), codegen


@intrinsic
def vstore_few(typingctx, arr, i, k, n, v):
    """a[i, k : k + n] = lanes 0 .. n - 1 of v for n <= 4, a scalar store each: without mask
    registers (AVX2) a masked store costs more than the few it replaces."""
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        n = context.cast(builder, args[3], sig.args[3], types.intp)
        for lane in range(4):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(n.type, lane), n)):
                builder.store(builder.extract_element(args[4], _I32(lane)), cgutils.gep_inbounds(builder, ptr, lane))
        return context.get_dummy_value()

    return types.void(arr, i, k, n, f32x16), codegen


@intrinsic
def vsplat(typingctx, x):
    """x (float32) in all 16 lanes."""
    def codegen(context, builder, sig, args):
        return _broadcast(builder, context.cast(builder, args[0], sig.args[0], types.float32), _VEC)

    return f32x16(types.float32), codegen


# ---------------------------------------------------------------------------------------------
# Halves: lanes 0 .. 7 and lanes 8 .. 15 of a sum are chains that never meet before the fold (its
# first step adds lane l + 8 onto lane l), so a kernel may add one half over every k and then the
# other: each lane still adds its terms in the same order, so the sum has the same bits. It lets a
# machine whose vector registers hold eight floats (AVX2's sixteen; NEON's thirty-two hold four)
# keep a block of sums in registers: three rows by four features are 12 sums, 24 such registers
# as whole 16-lane vectors and 12 as halves.
# ---------------------------------------------------------------------------------------------

HALF = LANES // 2
_HALF_VEC = ir.VectorType(ir.FloatType(), HALF)


class F32x8(types.Type):
    """numba's name for LLVM's <8 x float>: lanes 0 .. 7 or 8 .. 15 of a 16-lane vector."""

    def __init__(self):
        super().__init__(name="f32x8")


f32x8 = F32x8()


@register_model(F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _HALF_VEC)


@intrinsic
def vzero8(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_HALF_VEC, None)

    return f32x8(), codegen


@intrinsic
def vload8(typingctx, arr, i, k):
    """a[i, k : k + 8] (float32, unchecked like `vload`): with k = 16 j the low half of the step
    `vload(a, i, 16 j)`, with k = 16 j + 8 its high half."""
    _check_2d(arr)

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        return builder.load(builder.bitcast(ptr, _HALF_VEC.as_pointer()), align=4)

    return f32x8(arr, i, k), codegen


@intrinsic
def vfma8(typingctx, a, b, c):
    """a * b + c in eight lanes, rounded once: `vfma` on one half."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_HALF_VEC, [_HALF_VEC] * 3)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v8f32"), args)

    return f32x8(f32x8, f32x8, f32x8), codegen


@intrinsic
def vjoin(typingctx, lo, hi):
    """The 16 lanes whose lanes 0 .. 7 are lo's and 8 .. 15 hi's, ready for `vsum` / `vsum4`."""
    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES))))

    return f32x16(f32x8, f32x8), codegen


@intrinsic
def vsplat8(typingctx, x):
    """x (float32) in all eight lanes of a half."""
    def codegen(context, builder, sig, args):
        v = builder.insert_element(ir.Constant(_HALF_VEC, None), context.cast(builder, args[0], sig.args[0], types.float32), _I32(0))
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, HALF), [0] * HALF))

    return f32x8(types.float32), codegen


@intrinsic
def vq8h(typingctx, arr, i, k, s):
    """`vq8` on eight stored int8 values a[i, k : k + 8]: lanes q s, s a half's splat (`vsplat8`)."""
    _check_2d(arr, types.int8, "vq8h reads")

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        raw = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), HALF).as_pointer()), align=1)
        return builder.fmul(builder.sitofp(raw, _HALF_VEC), args[3])

    return f32x8(arr, i, k, f32x8), codegen


def wide_registers() -> bool:
    """Whether the code numba compiles in this process may use AVX-512, whose 32 registers hold 16
    floats each: the kernels' widest blocks (24 sums of 16 lanes) fit there; elsewhere they add in
    halves. Read from the target numba compiles for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, else the host)."""
    from numba.core.registry import cpu_target

    return _has_avx512(cpu_target.target_context)


# ---------------------------------------------------------------------------------------------
# int4 weights (section 2.5): sixteen nibbles of the kernel layout (`quant.to_planar`) as W_hat
# = (n - 8) s, exactly, so that an int4 product adds the very terms the float32 product on W_hat
# adds, in the same order.
# ---------------------------------------------------------------------------------------------


def _has_avx512(context) -> bool:
    """Whether the code being compiled may use AVX-512 (numba's target features, which
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES set, else the host's)."""
    features = getattr(context.codegen(), "_tm_features", None)
    if features is None:
        from llvmlite import binding

        features = binding.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


@intrinsic
def vhat(typingctx, arr, i, b, shift, s):
    """W_hat of sixteen stored nibbles: bytes a[i, b : b + 16] of a C-contiguous 2-D uint8 array,
    lane l = (n - 8) s with n = (byte >> shift) & 15 (shift 0: the low nibbles, 4: the high ones)
    and s the group's scale in every lane (`vsplat`). Exact: n - 8 is an integer of -8 .. 7 and s an
    f16, so (n - 8) s is a float32 whatever computes it, and the two ways below give the same bits.

    With AVX-512 the sixteen possible values (n - 8) s are one register, made once per group (the
    compiler shares it between the calls with the same s), and each nibble picks its lane of it
    (`vpermps`, which reads the low 4 bits of each index, so no mask is needed): three instructions
    a step instead of five, and the int4 one-row kernel, bound by these instructions, ran 1.6x
    faster on processor B. Without it: mask, convert, and n s - 8 s in one fused multiply-add (n s
    and 8 s are exact, so is their difference, rounded once: the same bits as (n - 8) s), the - 8 s
    made once per group like the table."""
    _check_2d(arr, types.uint8, "vhat reads")

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        i32x16 = ir.VectorType(_I32, LANES)
        raw = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
        sh = builder.trunc(context.cast(builder, args[3], sig.args[3], types.intp), _I32)
        idx = builder.lshr(builder.zext(raw, i32x16), _broadcast(builder, sh, i32x16))
        if _has_avx512(context):
            table = builder.fmul(ir.Constant(_VEC, [float(n - 8) for n in range(LANES)]), args[4])
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC, i32x16]),
                                                "llvm.x86.avx512.permvar.sf.512")
            return builder.call(fn, [table, idx])
        n = builder.sitofp(builder.and_(idx, ir.Constant(i32x16, [15] * LANES)), _VEC)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v16f32")
        return builder.call(fma, [n, args[4], builder.fmul(args[4], _splat(-8.0))])  # n s - 8 s, rounded once: exact

    return f32x16(arr, i, b, shift, f32x16), codegen


@intrinsic
def vq8(typingctx, arr, i, k, s):
    """W_hat of sixteen stored int8 values: a[i, k : k + 16] of a C-contiguous 2-D int8 array, lane
    l = q s with s the group's scale in every lane (`vsplat`). Exact: q is an integer of -127 .. 127
    (8 bits) and s an f16 (11 significant bits), so q s fits a float32's 24 (the int8 LM head of
    `kernels.matvec_q8`). Sign-extend, convert, multiply: three instructions a step."""
    _check_2d(arr, types.int8, "vq8 reads")

    def codegen(context, builder, sig, args):
        ptr, _ = _item_pointer(context, builder, sig.args[0], args[0], args[1], args[2])
        raw = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
        return builder.fmul(builder.sitofp(raw, _VEC), args[3])

    return f32x16(arr, i, k, f32x16), codegen


# ---------------------------------------------------------------------------------------------
# exp, sixteen at a time (attention's softmax): libm's expf is one call per value, and a decode
# step of a batch of 8 makes about 300,000 of them, a 512-token prefill 35 million.
# ---------------------------------------------------------------------------------------------

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # ln 2 split in two (Cody and Waite): n * _LN2_HI is exact for |n| < 2^15
_LN2_LO = -2.1219444005469057e-4
_EXP_LO, _EXP_HI = -87.33654, 88.37626  # below: 0 (exp < 2^-126, a subnormal at best); above: inf
_TAYLOR = [1.0 / f for f in (1, 1, 2, 6, 24, 120, 720, 5040)]  # e^r = sum r^i / i!, |r| <= ln2 / 2


def _splat(value: float) -> ir.Constant:
    return ir.Constant(_VEC, [value] * LANES)


@intrinsic
def vexp(typingctx, v):
    """exp of each lane: e^x = 2^n e^r with n = rint(x log2 e) and r = x - n ln 2 (two fused
    steps), e^r by its Taylor series to r^7 (the next term is below 6e-9 for |r| <= ln 2 / 2), and
    2^n written into the exponent bits. Within 0.86 ulp of the exact value over [-87.3, 88.4]
    (measured on 200,001 points, tests/test_lanes.py), 0 below (where float32 holds only
    subnormals), inf above, NaN for NaN; no fast-math flag, so the bits are fixed by this code."""
    def codegen(context, builder, sig, args):
        x = args[0]
        fn = lambda name, n: cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * n), name)  # noqa: E731
        i32x16 = ir.VectorType(_I32, LANES)
        low = builder.fcmp_ordered("<", x, _splat(_EXP_LO))
        high = builder.fcmp_ordered(">", x, _splat(_EXP_HI))
        xc = builder.select(low, _splat(_EXP_LO), builder.select(high, _splat(_EXP_HI), x))
        n = builder.call(fn("llvm.rint.v16f32", 1), [builder.fmul(xc, _splat(_LOG2E))])
        neg_n = builder.fneg(n)
        r = builder.call(fn("llvm.fma.v16f32", 3), [neg_n, _splat(_LN2_HI), xc])
        r = builder.call(fn("llvm.fma.v16f32", 3), [neg_n, _splat(_LN2_LO), r])
        p = _splat(_TAYLOR[-1])
        for c in reversed(_TAYLOR[:-1]):  # Horner: ((c7 r + c6) r + ...) r + 1
            p = builder.call(fn("llvm.fma.v16f32", 3), [p, r, _splat(c)])
        # n is a whole number of -126 .. 128 (x was clamped first), or NaN, taken as 0: so the plain
        # conversion is exact and gives what the saturating one (llvm.fptosi.sat) gave, which this
        # machine's LLVM turned into sixteen scalar conversions (half of a 512-token prefill's attention)
        n_int = builder.fptosi(builder.select(builder.fcmp_unordered("uno", n, n), _splat(0.0), n), i32x16)
        bits = builder.shl(builder.add(n_int, ir.Constant(i32x16, [127] * LANES)), ir.Constant(i32x16, [23] * LANES))
        y = builder.fmul(p, builder.bitcast(bits, _VEC))
        y = builder.select(low, _splat(0.0), y)
        return builder.select(high, _splat(float("inf")), y)

    return f32x16(f32x16), codegen
