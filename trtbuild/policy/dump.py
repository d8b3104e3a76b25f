"""A `Policy` back to the document it came from: the mapping `from_dict` reads, and its YAML.

Why: a policy built or changed in Python (an export script, `tune`'s result) must be
written as a file the CLI, the nightly and a reviewer read. Every value is written
explicitly (defaults too) and every path absolute, so the document means the same
wherever it is saved: `Policy.from_dict(policy.to_dict())` equals the policy.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from trtbuild.policy.specs import METRIC_KEYS, SIMPLE_KEYS

if TYPE_CHECKING:
    from trtbuild.policy.specs import AccuracySpec, DataSpec, InputSpec, Rule, Tolerance

# `model.Policy` reads this module to write itself; typing its argument as a Policy would
# make the two import each other, so it is read by its fields (path, model, inputs, ...).
PolicyLike = Any


def policy_dict(policy: PolicyLike) -> dict[str, Any]:
    """The policy as the mapping its file holds (version 1)."""
    p, b = policy.passes, policy.build
    return {
        "version": 1,
        "model": str(policy.model),
        "inputs": {s.name: _input(s) for s in policy.inputs},
        "passes": {
            **({"opset": p.opset} if p.opset is not None else {}),
            "fuse_layernorm": p.fuse_layernorm,
            "fold_constants": p.fold_constants,
            "fold_batchnorm": p.fold_batchnorm,
            "override_input_shapes": {n: list(d) for n, d in p.override_input_shapes},
            "freeze_inputs": {n: _plain(v) for n, v in p.freeze_inputs},
        },
        "precision": {
            "default": policy.precision.default,
            "guards": list(policy.precision.guards),
            "rules": [_rule(r) for r in policy.precision.rules],
        },
        "build": {
            "backend": b.backend,
            "compute_capabilities": list(b.compute_capabilities),
            "workspace": b.workspace,
            **({"timing_cache": str(b.timing_cache)} if b.timing_cache else {}),
            "variants": b.variants,
        },
        "accuracy": _accuracy(policy.accuracy),
    }


def policy_yaml(policy: PolicyLike) -> str:
    """`policy_dict` as YAML, in the policy's own key order."""
    import yaml

    return yaml.safe_dump(policy_dict(policy), sort_keys=False, default_flow_style=None, width=100)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _input(spec: InputSpec) -> dict[str, Any]:
    shapes = {"shape": spec.shape} if spec.shape is not None else {}
    if spec.opt is not None:
        shapes = {"min": spec.min, "opt": spec.opt, "max": spec.max}
    return {k: list(v) for k, v in shapes.items()} | {"data": _data(spec.data)}


def _data(data: DataSpec) -> dict[str, Any]:
    if data.images is not None:
        img = data.images
        return {
            "images": str(img.folder),
            **({"resize": list(img.resize)} if img.resize is not None else {}),
            "fit": img.fit,
            **({"layout": img.layout} if img.layout else {}),
            "channels": img.channels,
            "scale": img.scale,
            "mean": list(img.mean),
            "std": list(img.std),
        }
    if data.file is not None:
        return {"file": str(data.file), "derive": data.derive}
    keep = ("low", "high", "mean", "std")
    return {"distribution": data.distribution, **{k: getattr(data, k) for k in keep}}


def _rule(rule: Rule) -> dict[str, Any]:
    match = {
        f.name: _plain(getattr(rule.match, f.name))
        for f in fields(rule.match)
        if getattr(rule.match, f.name) not in (None, ())
    }
    out = {"id": rule.id, "match": match, "precision": rule.precision}
    return out | ({"why": rule.why} if rule.why is not None else {})


def _tolerance(tol: Tolerance) -> dict[str, Any]:
    """The keys that make this tolerance: the simple check's only where it applies."""
    out = {k: getattr(tol, k) for k in SIMPLE_KEYS if tol.simple and getattr(tol, k) is not None}
    out |= {k: getattr(tol, k) for k in METRIC_KEYS if getattr(tol, k) is not None}
    if tol.compare == "indices":
        out["compare"] = "indices"
        out |= {k: getattr(tol, k) for k in ("index_tolerance", "top_k") if getattr(tol, k)}
    return out


def _accuracy(a: AccuracySpec) -> dict[str, Any]:
    shapes = {}
    for point in a.shapes:
        entry: dict[str, Any] = {name: list(dims) for name, dims in point.dims}
        if point.file is not None:
            entry["data"] = {"file": str(point.file)}
        if point.skip is not None:
            entry["skip"] = point.skip
        shapes[point.name] = entry
    return {
        "samples": a.samples,
        "seed": a.seed,
        "divergence_threshold": a.divergence_threshold,
        "fp32_check": a.fp32_check,
        "emulation": a.emulation,
        **({"memory_budget": a.memory_budget} if a.memory_budget is not None else {}),
        "max_image_pixels": a.max_image_pixels,
        **({"shapes": shapes} if shapes else {}),
        "tolerances": {
            "default": _tolerance(a.default_tolerance),
            "outputs": {name: _tolerance(t) for name, t in a.output_tolerances},
        },
    }
