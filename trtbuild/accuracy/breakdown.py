"""The error against the model before quantization, split into its two parts.

With `accuracy.reference_model`, the policy is judged against the unquantized model
(what was trained); its error then holds two parts that call for different fixes:
the quantization's own (the quantized graph run in FP32, as ONNX Runtime runs Q/DQ,
against the original), which no FP32 pin can remove, and the FP16 part (the policy
against the quantized graph in FP32), which pins do. Each part is measured by the same
compare function and tolerances as the verdict, so one can be read against the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtbuild.accuracy.reference import QUANTIZED_FP32, REFERENCE, ReferenceTensors
from trtbuild.accuracy.sessions import OutputMetrics

if TYPE_CHECKING:
    from trtbuild.accuracy.judge import Verdict
    from trtbuild.policy.specs import AccuracySpec


@dataclass(frozen=True)
class SplitWords:
    """How the split names its models, by whether the judged model holds Q/DQ nodes
    (`Front.quantized`).

    Why two sets: `accuracy.reference_model` also judges a model converted to FP16
    elsewhere (ModelOpt AutoCast) against its FP32 original, and "before quantization",
    "the quantization alone" said of a model that holds no quantization misled.
    """

    quantized: bool  # the judged model holds Q/DQ nodes
    reference: str  # what the outputs are judged against
    graph: str  # the judged model, run in FP32 (Q/DQ as ONNX Runtime runs them)
    alone: str  # that run against the reference: what no FP32 pin removes
    part: str  # `alone` as the comparison a report's table names
    fix: str  # what fixes an output `alone` fails, beside loosening its tolerance
    passed_by: str  # how a policy passes an output `alone` fails ("" where it cannot)


QUANTIZED_WORDS = SplitWords(
    True,
    "the model before quantization",
    "the quantized graph",
    "the quantization alone",
    "quantization alone (quantized graph in FP32 against the original)",
    "take the ops that lose most out of the quantization with `dequantize: true` rules, "
    "re-quantize",
    " (`dequantize: true` rules take ops out of the quantization)",
)
PLAIN_WORDS = SplitWords(
    False,
    "the reference model",
    "the model",
    "the model alone (before trtbuild's precision)",
    "model alone (the model in FP32, before trtbuild's precision, against the original)",
    "convert the model again",
    "",
)


def split_words(quantized: bool) -> SplitWords:
    return QUANTIZED_WORDS if quantized else PLAIN_WORDS


def unfixable_said(words: SplitWords, dequantized: int = 0) -> str:
    """What follows "... fails the tolerances on OUTPUTS" of an output both the graph's own
    run and the policy fail: no pin can fix it, and what does; or, where the policy's
    `dequantize: true` rules take `dequantized` ops out of the quantization, that the graph
    as given is not what the policy keeps quantized (its run does not measure those rules),
    so nothing is said unfixable. Why: "no FP32 pin can fix that, write `dequantize: true`
    rules" told a policy with such rules that pins were useless, on a measure its rules
    had changed."""
    if not (words.quantized and dequantized):
        return f": no FP32 pin can fix that ({words.fix}, or loosen the tolerances)"
    return (
        f" as given; the policy's `dequantize: true` rules take {dequantized} op(s) out of "
        "the quantization, which that run does not measure: take more of the ops that lose "
        "most out, pin the ops whose low-precision storage fails, re-quantize, or loosen "
        "the tolerances"
    )


# report.json's names for the three comparisons of each output, in the order shown; `{low}`
# is the policy's low precision (`PrecisionSummary.low_name`): a BF16 policy's part is BF16's;
# the others are `SplitWords`' fields
PARTS = {
    "policy_vs_original": "policy against the original",
    "quantized_vs_original": "{part}",
    "policy_vs_quantized": "{low} part (policy against {graph} in FP32)",
}
# What each part is compared with, in the words of a shape that differs from it
AGAINST = {
    "policy_vs_original": "the original model's",
    "quantized_vs_original": "the original model's",
    "policy_vs_quantized": "{graph}'s in FP32",
}


@dataclass
class ErrorSplit:
    """One point's outputs, each compared three ways (`PARTS`)."""

    reference_model: str
    evaluator: str  # of the policy's outputs: emulated-fp16 or tensorrt
    parts: dict[str, dict[str, OutputMetrics]]  # part -> output -> metrics
    quantized: bool = True  # the judged model holds Q/DQ nodes (`Front.quantized`)
    dequantized: int = 0  # ops the policy's `dequantize: true` rules take out of it

    @property
    def words(self) -> SplitWords:
        return split_words(self.quantized)

    def unfixable(self) -> str:
        """`unfixable_said` in this split's words."""
        return unfixable_said(self.words, self.dequantized)

    def label(self, part: str, low: str = "FP16") -> str:
        """`PARTS[part]` in this split's words."""
        return PARTS[part].format(low=low, part=self.words.part, graph=self.words.graph)

    def against(self, part: str) -> str:
        """`AGAINST[part]` in this split's words."""
        return AGAINST[part].format(graph=self.words.graph)

    def to_json(self) -> dict[str, Any]:
        names = list(self.parts["policy_vs_original"])
        return {
            "path": self.reference_model,
            "evaluator": self.evaluator,
            "quantized_evaluator": QUANTIZED_FP32,
            "outputs": {n: {part: self.parts[part][n].to_json() for part in PARTS} for n in names},
        }

    def quantization_fails(self, *, passed: bool | None = None) -> list[str]:
        """Outputs the quantization alone takes past the tolerances; with `passed`, only
        those the policy itself passes (True: a `dequantize: true` rule took what lost most
        out of the quantization) or fails (False: no FP32 pin can fix those)."""
        policy = self.parts["policy_vs_original"]
        return [
            n
            for n, m in self.parts["quantized_vs_original"].items()
            if not m.passed and (passed is None or policy[n].passed == passed)
        ]


def quantization_alone(
    reference: ReferenceTensors, spec: AccuracySpec, verbose: bool = False
) -> dict[str, OutputMetrics] | None:
    """The quantized graph's own FP32 run judged against the reference model, as a candidate
    is: what the quantization alone costs (None without a reference model). From the
    reference's runs alone: no candidate is run."""
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.judge import compare

    if reference.quantized is None or reference.original is None:
        return None
    runs = reference.graph_results[REFERENCE]  # the graph's own FP32 run, judged as a candidate
    graph = [IterationResult(dict(it.items()), runner_name=QUANTIZED_FP32) for it in runs]
    return compare(reference, graph, QUANTIZED_FP32, spec, verbose)[0]


def split_error(
    reference: ReferenceTensors,
    verdict: Verdict,
    spec: AccuracySpec,
    verbose: bool = False,
    quantized: bool = True,
    dequantized: int = 0,
) -> ErrorSplit | None:
    """The policy's `verdict` (judged against the reference model) split in two; None where
    the policy has no reference model. `quantized`: the judged model holds Q/DQ nodes
    (`Front.quantized`), which decides the split's words; `dequantized`: the ops its
    `dequantize: true` rules take out of the quantization."""
    from trtbuild.accuracy.judge import compare

    own = reference.quantized  # the judged graph's own FP32 run, quantized or not
    alone = quantization_alone(reference, spec, verbose)
    if own is None or alone is None:
        return None
    policy_runs = list(verdict.run_results[verdict.evaluator])
    fp16, _ = compare(own, policy_runs, verdict.evaluator, spec, verbose)
    parts = {
        "policy_vs_original": verdict.outputs,
        "quantized_vs_original": alone,
        "policy_vs_quantized": fp16,
    }
    return ErrorSplit(str(reference.original), verdict.evaluator, parts, quantized, dequantized)
