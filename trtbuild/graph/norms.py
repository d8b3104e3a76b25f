"""Normalization units: fused norm ops and the decomposed forms exporters write.

Why units: FP16 breaks inside a normalization (the variance `Pow` that reaches
1e7), so a policy pins the whole unit, and the LayerNorm fusion pass replaces
the whole unit by one node. Both need the same recognition, with the unit's
parts (input, axes, epsilon, scale, bias) named, so it lives here once.

Forms recognised (each seen in real exports):
- fused ops (LayerNormalization, GroupNormalization, InstanceNormalization, ...);
- LayerNorm as PyTorch < opset 17 and Paddle write it: ReduceMean, Sub,
  Pow(d, 2) or Mul(d, d), ReduceMean, Add(eps), Sqrt, then Div, or the inverse
  (Reciprocal, or Div(1, ·): the legacy torch.onnx exporter's `torch.rsqrt`) and
  Mul, then an optional Mul(weight) and Add(bias), on any axes (NAFNet's
  LayerNorm2d normalises axis 1);
- the same with the variance computed from x centred a second time (PyTorch's
  `x.var(dim, unbiased=False)` beside `x - x.mean(dim)`: two means of x, as
  Restormer's LayerNorm exports; torch.onnx's dynamo exporter takes that variance
  without keepdims and reshapes and expands it back), and Restormer's bias-free
  LayerNorm, which divides x itself, not x - mean, by that deviation; and x centred
  twice by one mean (NAFNet's and KBNet's `LayerNormFunction`, traced by TorchScript);
- LayerNorm as tf2onnx writes Keras' (batch-norm style): the same statistics,
  then x * (gamma * rsqrt) + (beta - mean * gamma * rsqrt);
- any of these with its means (`moments/mean`, `moments/variance`) written as
  tf2onnx's global-pool optimizer writes them: `GlobalAveragePool`, alone or
  between a `Transpose` and its inverse;
- RMSNorm: the LayerNorm tail without centring; Hugging Face's (T5LayerNorm,
  LlamaRMSNorm and its copies) as torch.onnx exports it, in the rsqrt form, with
  the Cast back before the weight in the unit, and the Casts of x to float before
  the square (a second one before the scaling in an FP16 export) where only the
  unit reads them;
- GroupNorm as PyTorch exports it: Reshape, InstanceNormalization, Reshape,
  Mul, Add.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import helper

from trtbuild.graph.view import GraphView, constant

FUSED_NORMS = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
    }
)


@dataclass(frozen=True)
class NormUnit:
    """One normalization unit; `nodes` are graph indices, the first is the unit's name."""

    # an op type for fused norms; "layernorm", "biasfree-layernorm", "rmsnorm", "groupnorm"
    kind: str
    nodes: tuple[int, ...]
    reason: str
    x: str | None = None
    output: str | None = None
    axes: tuple[tuple[int, ...] | None, ...] = ()  # of the mean and variance ReduceMeans
    keepdims: bool = True
    epsilon: str | None = None
    scale: str | None = None
    bias: str | None = None


# -- small matchers -------------------------------------------------------------


def _consumers(view: GraphView, tensor: str, op: str | tuple[str, ...]) -> list[int]:
    ops = (op,) if isinstance(op, str) else op
    return [c for c in view.consumers.get(tensor, []) if view.nodes[c].op_type in ops]


def _is_scalar_const(view: GraphView, tensor: str, value: float | None = None) -> bool:
    """A one-element weight or `Constant` (a scalar or shape [1], as exporters write them)."""
    arr = constant(view, tensor)
    if arr is None or arr.size != 1:
        return False
    return value is None or float(arr.ravel()[0]) == value


def _other(node, tensor: str) -> str | None:
    """The other input of a binary node that has `tensor` as one input."""
    ins = list(node.input)
    if len(ins) != 2 or tensor not in ins:
        return None
    return ins[1] if ins[0] == tensor else ins[0]


def _square_of(view: GraphView, x: str) -> int | None:
    """Pow(x, 2) or Mul(x, x) consuming x."""
    for c in view.consumers.get(x, []):
        n = view.nodes[c]
        if n.op_type == "Pow" and n.input[0] == x and _is_scalar_const(view, n.input[1], 2.0):
            return c
        if n.op_type == "Mul" and n.input[0] == x and n.input[1] == x:
            return c
    return None


def reduce_axes(view: GraphView, index: int) -> tuple[int, ...] | None:
    """Axes of a Reduce* node, from the attribute (opset < 18) or the input (18+)."""
    node = view.nodes[index]
    for a in node.attribute:
        if a.name == "axes":
            return tuple(helper.get_attribute_value(a))
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] in view.initializers:
            return tuple(int(v) for v in view.initializer_array(node.input[1]).ravel())
        return None  # computed axes: unknown
    return None  # all axes


def _keepdims(node) -> bool:
    return all(helper.get_attribute_value(a) != 0 for a in node.attribute if a.name == "keepdims")


@dataclass(frozen=True)
class _Mean:
    """A mean over some axes, however an exporter wrote it (see `_mean_at`)."""

    nodes: tuple[int, ...]
    x: str
    out: str
    axes: tuple[int, ...] | None  # in x's layout; None for all axes
    keepdims: bool


def _rank(view: GraphView, tensor: str) -> int | None:
    t = view.shape.get(tensor)
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


def _perm(view: GraphView, i: int) -> tuple[int, ...] | None:
    return next(
        (tuple(helper.get_attribute_value(a)) for a in view.nodes[i].attribute if a.name == "perm"),
        None,
    )


def _mean_at(view: GraphView, i: int) -> _Mean | None:
    """ReduceMean; GlobalAveragePool (the mean over axes 2..); or GlobalAveragePool between a
    Transpose and its inverse, as tf2onnx's optimizers leave Keras' `moments`."""
    n = view.nodes[i]
    if n.op_type == "ReduceMean":
        return _Mean((i,), n.input[0], n.output[0], reduce_axes(view, i), _keepdims(n))
    if n.op_type != "GlobalAveragePool":
        return None
    rank = _rank(view, n.input[0])
    if rank is None or rank < 3:
        return None
    pooled = tuple(range(2, rank))
    before = view.producer.get(n.input[0])
    after = _single(view, n.output[0], "Transpose")
    if before is None or view.nodes[before].op_type != "Transpose" or after is None:
        return _Mean((i,), n.input[0], n.output[0], pooled, True)
    p, q = _perm(view, before), _perm(view, after)
    if p is None or q is None or len(p) != rank or [p[j] for j in q] != list(range(rank)):
        return _Mean((i,), n.input[0], n.output[0], pooled, True)
    x_axes = tuple(sorted(p[j] for j in pooled))
    return _Mean((before, i, after), view.nodes[before].input[0], _out(view, after), x_axes, True)


def _means_of(view: GraphView, tensor: str) -> list[_Mean]:
    """The means computed from `tensor` (directly, or through a transposed pool)."""
    found = []
    for c in view.consumers.get(tensor, []):
        entry = c
        if view.nodes[c].op_type == "Transpose":
            nxt = _single(view, _out(view, c), "GlobalAveragePool")
            entry = nxt if nxt is not None else c
        mean = _mean_at(view, entry)
        if mean is not None and mean.x == tensor:
            found.append(mean)
    return found


@dataclass(frozen=True)
class _Stats:
    """mean(x²) + eps → sqrt, shared by LayerNorm and RMSNorm."""

    nodes: tuple[int, ...]  # square, the mean's nodes, Add, Sqrt
    std: str
    epsilon: str
    variance: _Mean


def _stats(view: GraphView, sq: int) -> _Stats | None:
    means = _means_of(view, view.nodes[sq].output[0])
    if not means:
        return None
    # a variance kept without its reduced axes is put back in shape (dynamo's x.var); one kept
    # with them is read as it is: a reshape of it could move a row's variance to another row
    shaped, var = ((), means[0].out) if means[0].keepdims else _reshaped(view, means[0].out)
    for add in _consumers(view, var, "Add"):
        eps = _other(view.nodes[add], var)
        if eps is None or not _is_scalar_const(view, eps):
            continue
        sqrt = _consumers(view, view.nodes[add].output[0], "Sqrt")
        if sqrt:
            std = view.nodes[sqrt[0]].output[0]
            return _Stats((sq, *means[0].nodes, *shaped, add, sqrt[0]), std, eps, means[0])
    return None


# ops that give a value another shape and no other value
_RESHAPES = ("Reshape", "Expand", "Unsqueeze", "Squeeze")


def _reshaped(view: GraphView, tensor: str) -> tuple[tuple[int, ...], str]:
    """The reshapes `tensor` passes through alone (a `Shape` of it aside), and their result.

    Why: torch.onnx's dynamo exporter takes `x.var(dim)` without keepdim, then `Reshape`s
    the variance back and `Expand`s it to x's shape before adding epsilon.
    """
    chain: list[int] = []
    while tensor not in view.outputs:
        users = [c for c in view.consumers.get(tensor, []) if view.nodes[c].op_type != "Shape"]
        if len(users) != 1 or view.nodes[users[0]].op_type not in _RESHAPES:
            break
        chain.append(users[0])
        tensor = _out(view, users[0])
    return tuple(chain), tensor


def _divide(view: GraphView, x: str, std: str) -> list[int] | None:
    """Div(x, std), or 1 / std (`_inverses`) then Mul(x, ·) in either operand order."""
    div = [c for c in _consumers(view, std, "Div") if view.nodes[c].input[0] == x]
    if div:
        return [div[0]]
    for r in _inverses(view, std):
        mul = [c for c in _consumers(view, _out(view, r), "Mul") if x in view.nodes[c].input]
        if mul:
            return [r, mul[0]]
    return None


def _inverses(view: GraphView, std: str) -> list[int]:
    """The nodes computing 1 / std: Reciprocal(std), or Div(1, std).

    Why the Div: the legacy torch.onnx exporter writes `torch.rsqrt(v)` as Sqrt, then a Div
    whose numerator is a constant 1 (a scalar or shape [1]); Hugging Face's RMSNorms
    (T5LayerNorm, LlamaRMSNorm and those copied from it) and its rsqrt LayerNorms use it.
    """
    found = []
    for c in view.consumers.get(std, []):
        n = view.nodes[c]
        if n.op_type == "Reciprocal" or (
            n.op_type == "Div" and n.input[1] == std and _is_scalar_const(view, n.input[0], 1.0)
        ):
            found.append(c)
    return found


def _affine(view: GraphView, last: int) -> tuple[list[int], str | None, str | None]:
    """The optional Mul(weight) then Add(bias) by initializers after a normalization."""
    added, scale, bias = [], None, None
    out = view.nodes[last].output[0]
    for op in ("Mul", "Add"):
        nxt = view.consumers.get(out, [])
        if len(nxt) != 1 or view.nodes[nxt[0]].op_type != op or out in view.outputs:
            continue
        other = _other(view.nodes[nxt[0]], out)
        if other is None or other not in view.initializers:
            continue
        added.append(nxt[0])
        if op == "Mul":
            scale = other
        else:
            bias = other
        out = view.nodes[nxt[0]].output[0]
    return added, scale, bias


def _out(view: GraphView, index: int) -> str:
    return view.nodes[index].output[0]


# -- the forms ----------------------------------------------------------------


def _layernorm_at(view: GraphView, i: int) -> NormUnit | None:
    """A centred LayerNorm whose mean is computed at node `i` (PyTorch/Paddle or tf2onnx form)."""
    n = view.nodes[i]
    mean = _mean_at(view, i)
    if mean is None:
        return None
    x, m = mean.x, mean.out
    subs = _centrings(view, x, m)
    # the centring the variance squares first: where x is centred twice, either may come
    # first in the graph's order (a re-sorted export)
    direct = ((k, _stats_of(view, _out(view, sub))) for k, sub in enumerate(subs))
    k, variance = next((((k, ((), s)) for k, s in direct if s is not None)), (0, None))
    if variance is None and subs:
        variance = _variance_of(view, mean, _out(view, subs[0]))
    if variance is None:
        return None
    subs = [subs[k], *subs[:k], *subs[k + 1 :]]
    again, stats = variance
    common = dict(
        x=x,
        axes=(mean.axes, stats.variance.axes),
        keepdims=mean.keepdims and stats.variance.keepdims,
        epsilon=stats.epsilon,
    )
    div, twice = _divide_centred(view, subs, stats.std)
    kind, form = "layernorm", ""
    if div is None:
        keras = None if again else _tf_layernorm(view, mean, subs[0], stats, common)
        if keras is not None:
            return keras
        # x itself over the deviation: Restormer's bias-free form, a Div (the Keras form without
        # gamma multiplies x by `Reciprocal(std)`, and is that form's)
        div = [c for c in _consumers(view, stats.std, "Div") if view.nodes[c].input[0] == x][:1]
        kind, form = "biasfree-layernorm", " bias-free"
    if not div:
        return None
    affine, scale, bias = _affine(view, div[-1])
    nodes = (*mean.nodes, subs[0], *again, *stats.nodes, *twice, *div, *affine)
    return NormUnit(
        kind,
        nodes,
        f"decomposed{form} LayerNorm unit from {n.name}",
        output=_out(view, nodes[-1]),
        scale=scale,
        bias=bias,
        **common,
    )


def _divide_centred(
    view: GraphView, subs: list[int], std: str
) -> tuple[list[int] | None, tuple[int, ...]]:
    """The division of x centred by the mean (`_divide`), and the second centring it divides
    where x is centred twice by that mean: `(x - mu).pow(2)` and `(x - mu) / std` written as
    two `Sub(x, mu)` (NAFNet's and KBNet's LayerNorm2d, a `torch.autograd.Function` the
    TorchScript exporter traces without merging them: no unit was found in either, so
    `layernorm` and `layernorm_after_attention` matched nothing)."""
    for k, sub in enumerate(subs):
        div = _divide(view, _out(view, sub), std)
        if div is not None:
            return div, (sub,) if k else ()
    return None, ()


def _variance_of(view: GraphView, mean: _Mean, d: str) -> tuple[tuple[int, ...], _Stats] | None:
    """The statistics of `d = x - mean`, or of x centred a second time by its own mean over the
    same axes, with the nodes of that second centring.

    Why the second: `x.var(dim, unbiased=False)` beside `x - x.mean(dim)` exports two means
    of x (Restormer's LayerNorm, the restoration networks built on it): one unit all the same.
    """
    stats = _stats_of(view, d)
    if stats is not None:
        return (), stats
    for other in _means_of(view, mean.x):
        if other.nodes == mean.nodes or other.keepdims != mean.keepdims:
            continue
        if not _same_axes(view, mean.x, other.axes, mean.axes):
            continue
        subs = _centrings(view, mean.x, other.out)
        stats = _stats_of(view, _out(view, subs[0])) if subs else None
        if stats is not None:
            return (*other.nodes, subs[0]), stats
    return None


def _stats_of(view: GraphView, d: str) -> _Stats | None:
    """The statistics of the square of `d`, where `d`'s square is taken."""
    sq = _square_of(view, d)
    return _stats(view, sq) if sq is not None else None


def _same_axes(view: GraphView, x: str, a: tuple[int, ...] | None, b: tuple[int, ...] | None):
    """Do axes `a` and `b` of `x` name the same axes (-1 and 2 of a rank-3 x do)?"""
    if a == b:
        return True
    rank = _rank(view, x)
    if a is None or b is None or rank is None:
        return False
    return {k % rank for k in a} == {k % rank for k in b}


def _centrings(view: GraphView, x: str, m: str) -> list[int]:
    """The `Sub(x, m)` nodes."""
    return [c for c in _consumers(view, m, "Sub") if list(view.nodes[c].input) == [x, m]]


def _tf_layernorm(
    view: GraphView, mean: _Mean, sub: int, stats: _Stats, common: dict
) -> NormUnit | None:
    """tf2onnx's Keras LayerNorm: x * k + (beta - mean * k), k = gamma * rsqrt(var + eps)."""
    x, m = mean.x, mean.out
    recip = _inverses(view, stats.std)
    if not recip:
        return None
    nodes, k, scale = [recip[0]], _out(view, recip[0]), None
    gamma = [
        c
        for c in _consumers(view, k, "Mul")
        if (_other(view.nodes[c], k) or "") in view.initializers
    ]
    if gamma:
        scale = _other(view.nodes[gamma[0]], k)
        nodes.append(gamma[0])
        k = _out(view, gamma[0])
    xk = [c for c in _consumers(view, k, "Mul") if _other(view.nodes[c], k) == x]
    mk = [c for c in _consumers(view, k, "Mul") if _other(view.nodes[c], k) == m]
    if not xk or not mk:
        return None
    nodes += [xk[0], mk[0]]
    a, b = _out(view, xk[0]), _out(view, mk[0])
    bias = None
    centre = [c for c in _consumers(view, b, "Sub") if view.nodes[c].input[1] == b]
    if centre and view.nodes[centre[0]].input[0] == a:  # no beta: x*k - mean*k
        nodes.append(centre[0])
    elif centre and view.nodes[centre[0]].input[0] in view.initializers:
        bias = view.nodes[centre[0]].input[0]
        c = _out(view, centre[0])
        add = [j for j in _consumers(view, c, "Add") if _other(view.nodes[j], c) == a]
        if not add:
            return None
        nodes += [centre[0], add[0]]
    else:
        return None
    ordered = tuple(sorted((*mean.nodes, sub, *stats.nodes, *nodes)))
    return NormUnit(
        "layernorm",
        ordered,
        f"decomposed LayerNorm unit (tf2onnx form) from {view.nodes[mean.nodes[0]].name}",
        output=_out(view, nodes[-1]),
        scale=scale,
        bias=bias,
        **common,
    )


def _rmsnorm_at(view: GraphView, i: int) -> NormUnit | None:
    """RMSNorm from its square at node `i`: x / sqrt(mean(x²) + eps), then the affine.

    Hugging Face's (T5LayerNorm, LlamaRMSNorm) casts x to FP32 for the square, scales x or
    another Cast of it by the inverse, and casts back before the weight: those Casts are
    the unit's where it alone reads them, so it is pinned whole from the value before them.
    """
    n = view.nodes[i]
    x = n.input[0]
    if _square_of(view, x) != i:
        return None
    stats = _stats(view, i)
    scaling = _scaling(view, x, stats.std) if stats else None
    if stats is None or scaling is None:
        return None
    casts, div = scaling
    back = _single(view, _out(view, div[-1]), "Cast")
    tail = [*div, back] if back is not None else div
    affine, scale, bias = _affine(view, tail[-1])
    body = (*stats.nodes, *tail, *affine)
    if casts and _read_inside(view, casts, body):
        x = view.nodes[casts[0]].input[0]
    else:
        casts = []
    nodes = (*casts, *body)
    return NormUnit(
        "rmsnorm",
        nodes,
        f"decomposed RMSNorm unit from {n.name}",
        x=x,
        output=_out(view, nodes[-1]),
        axes=(stats.variance.axes,),
        epsilon=stats.epsilon,
        scale=scale,
        bias=bias,
    )


def _scaling(view: GraphView, x: str, std: str) -> tuple[list[int], list[int]] | None:
    """The division by `std` of x or of a copy of it (`_copies`), with the Casts that made
    x and that copy: (casts, division nodes)."""
    copies = _copies(view, x)
    for copy, made_by in copies:
        div = _divide(view, copy, std)
        if div is not None:
            return [k for k in dict.fromkeys((copies[0][1], made_by)) if k is not None], div
    return None


def _copies(view: GraphView, x: str) -> list[tuple[str, int | None]]:
    """The tensors that hold x's value, each with the Cast that made it from x's source.

    x first; where a Cast made x, every other Cast of the same source to the same type,
    then the source itself. Why: T5LayerNorm squares `x.to(float32)` but scales x itself,
    which an FP16 export casts a second time (the exporter's type promotion).
    """
    p = view.producer.get(x)
    if p is None or view.nodes[p].op_type != "Cast":
        return [(x, None)]
    source, to = view.nodes[p].input[0], _cast_to(view.nodes[p])
    others = [c for c in _consumers(view, source, "Cast") if c != p]
    same = [(_out(view, c), c) for c in others if _cast_to(view.nodes[c]) == to]
    return [(x, p), *same, (source, None)]


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _read_inside(view: GraphView, casts: list[int], body: tuple[int, ...]) -> bool:
    """Do the unit's nodes alone read these Casts' outputs (none a graph output)?"""
    inside = {*casts, *body}
    for c in casts:
        out = _out(view, c)
        if out in view.outputs or any(r not in inside for r in view.consumers.get(out, [])):
            return False
    return True


def _single(view: GraphView, tensor: str, op: str) -> int | None:
    c = view.consumers.get(tensor, [])
    if len(c) == 1 and view.nodes[c[0]].op_type == op and tensor not in view.outputs:
        return c[0]
    return None


def _fused_at(view: GraphView, i: int) -> NormUnit:
    """A fused norm op; InstanceNormalization between Reshapes is PyTorch's GroupNorm."""
    n = view.nodes[i]
    alone = NormUnit(n.op_type, (i,), f"{n.op_type} {n.name}", x=n.input[0], output=_out(view, i))
    if n.op_type != "InstanceNormalization":
        return alone
    before = view.producer.get(n.input[0])
    nodes = [i]
    reshaped = before is not None and view.nodes[before].op_type == "Reshape"
    if reshaped and _single(view, _out(view, before), "InstanceNormalization") == i:
        nodes.insert(0, before)
    after = _single(view, _out(view, i), "Reshape")
    if after is None or len(nodes) == 1:
        return alone
    nodes.append(after)
    affine, scale, bias = _affine(view, after)
    nodes += affine
    return NormUnit(
        "groupnorm",
        tuple(nodes),
        f"GroupNorm unit (Reshape, InstanceNormalization, Reshape) at {n.name}",
        x=view.nodes[nodes[0]].input[0],
        output=_out(view, nodes[-1]),
        scale=scale,
        bias=bias,
    )


def norm_units(view: GraphView) -> tuple[NormUnit, ...]:
    """Every normalization unit in the graph, fused ones first; units never overlap."""
    return tuple(_find_norm_units(view))


def _find_norm_units(view: GraphView) -> list[NormUnit]:
    units: list[NormUnit] = []
    taken: set[int] = set()

    def add(unit: NormUnit | None) -> None:
        if unit is not None and taken.isdisjoint(unit.nodes):
            units.append(unit)
            taken.update(unit.nodes)

    for i, n in enumerate(view.nodes):
        if n.op_type in FUSED_NORMS:
            add(_fused_at(view, i))
    for i, n in enumerate(view.nodes):
        if n.op_type in ("ReduceMean", "GlobalAveragePool") and i not in taken:
            add(_layernorm_at(view, i))
    for i, n in enumerate(view.nodes):
        if n.op_type in ("Pow", "Mul") and i not in taken:
            add(_rmsnorm_at(view, i))
    return units
