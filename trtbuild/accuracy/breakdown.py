"""The error against the model before quantization, split into its two parts.

With `accuracy.reference_model`, the policy is judged against the unquantized model
(what was trained); its error then holds two parts that call for different fixes:
the quantization's own (the quantized graph run in FP32, as ONNX Runtime runs Q/DQ,
against the original), which no FP32 pin can remove, and the FP16 part (the policy
against the quantized graph in FP32), which pins do. Each part is measured by the same
compare function and tolerances as the verdict, so one can be read against the other.
Where the policy's `dequantize: true` rules take ops out of the quantization, the
quantized graph is the one the policy keeps (`front.kept_quantization`): those rules
applied, everything in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trtbuild.accuracy.reference import QUANTIZED_FP32, REFERENCE, ReferenceTensors, session_runs
from trtbuild.accuracy.sessions import OutputMetrics

if TYPE_CHECKING:
    from trtbuild.accuracy.data import Feed
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
    kept: str = ""  # what `graph` holds where the policy's rules change it (`kept_words`)


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


def kept_words(dequantized: int) -> SplitWords:
    """The words of a split measured against the quantization the policy keeps: its
    `dequantize: true` rules take `dequantized` ops out of the graph as given (`split_error`'s
    `kept`). The quantization alone failing is then past any pin's reach again; taking more
    ops out is what may help."""
    return replace(
        QUANTIZED_WORDS,
        graph="the quantized graph as the policy keeps it",
        part="quantization alone (the quantized graph as the policy keeps it, in FP32, against "
        "the original)",
        fix="take more of the ops that lose most out of the quantization with `dequantize: "
        "true` rules, re-quantize",
        passed_by="",
        kept=f"the policy's `dequantize: true` rules take {dequantized} op(s) out of the "
        "quantization, which read the float values",
    )


def unfixable_said(words: SplitWords, dequantized: int = 0) -> str:
    """What follows "... fails the tolerances on OUTPUTS" of an output both the graph's own
    run and the policy fail: no pin can fix it, and what does; or, where the policy's
    `dequantize: true` rules take `dequantized` ops out of the quantization, that the graph
    as given is not what the policy keeps quantized (its run does not measure those rules),
    so nothing is said unfixable. Why: "no FP32 pin can fix that, write `dequantize: true`
    rules" told a policy with such rules that pins were useless, on a measure its rules
    had changed."""
    if words.kept:  # measured on what the rules keep: no pin reaches it
        return f" ({words.kept}): no FP32 pin can fix that ({words.fix}, or loosen the tolerances)"
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
    "policy_vs_quantized": "that of {graph} in FP32",
}


@dataclass
class ErrorSplit:
    """One point's outputs, each compared three ways (`PARTS`)."""

    reference_model: str
    evaluator: str  # of the policy's outputs: emulated-fp16 or tensorrt
    parts: dict[str, dict[str, OutputMetrics]]  # part -> output -> metrics
    quantized: bool = True  # the judged model holds Q/DQ nodes (`Front.quantized`)
    dequantized: int = 0  # ops the policy's `dequantize: true` rules take out of it
    kept: bool = False  # the quantized side is the graph with those rules applied

    @property
    def words(self) -> SplitWords:
        if self.kept and self.quantized:
            return kept_words(self.dequantized)
        return split_words(self.quantized)

    @property
    def alone(self) -> str:
        """`words.alone`, and where the quantized side is what the policy keeps, so said."""
        return self.words.alone + (" as the policy keeps it" if self.words.kept else "")

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
            "dequantized": self.dequantized if self.kept else 0,
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
    reference: ReferenceTensors,
    spec: AccuracySpec,
    verbose: bool = False,
    kept: Any = None,
) -> dict[str, OutputMetrics] | None:
    """The quantized graph's own FP32 run judged against the reference model, as a candidate
    is: what the quantization alone costs (None without a reference model). From the
    reference's runs alone (no candidate is run), or from `kept`: the runs of the graph as
    the policy keeps it (`kept_runs`)."""
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.judge import compare

    if reference.quantized is None or reference.original is None:
        return None
    # the graph's own FP32 run (or the kept one), judged as a candidate
    runs = (reference.graph_results if kept is None else kept)[REFERENCE]
    graph = [IterationResult(dict(it.items()), runner_name=QUANTIZED_FP32) for it in runs]
    return compare(reference, graph, QUANTIZED_FP32, spec, verbose)[0]


def split_error(
    reference: ReferenceTensors,
    verdict: Verdict,
    spec: AccuracySpec,
    verbose: bool = False,
    quantized: bool = True,
    dequantized: int = 0,
    kept: Any = None,
) -> ErrorSplit | None:
    """The policy's `verdict` (judged against the reference model) split in two; None where
    the policy has no reference model. `quantized`: the judged model holds Q/DQ nodes
    (`Front.quantized`), which decides the split's words; `dequantized`: the ops its
    `dequantize: true` rules take out of the quantization; `kept`: the runs of the graph
    with those rules applied (`kept_runs`), which both parts then compare with.

    Why `kept`: against the graph as given, an op the rules took out of INT8 showed its
    whole INT8 error as the FP16 part (0.13, where the policy's whole error was 0.0038);
    against the graph the policy keeps, the two parts are again those of its error.
    """
    from trtbuild.accuracy.judge import compare

    own = reference.quantized  # the judged graph's own FP32 run, quantized or not
    if own is not None and kept is not None:
        own = ReferenceTensors(reference.measures, kept)
    alone = quantization_alone(reference, spec, verbose, kept)
    if own is None or alone is None:
        return None
    policy_runs = list(verdict.run_results[verdict.evaluator])
    fp16, _ = compare(own, policy_runs, verdict.evaluator, spec, verbose)
    parts = {
        "policy_vs_original": verdict.outputs,
        "quantized_vs_original": alone,
        "policy_vs_quantized": fp16,
    }
    return ErrorSplit(
        str(reference.original), verdict.evaluator, parts, quantized, dequantized, kept is not None
    )


def kept_runs(session: Any, reference: ReferenceTensors, feeds: list[Feed]) -> Any:
    """The outputs of the graph as the policy keeps it (`front.kept_quantization`, in
    `session`: optimizations off, as the reference runs) on a point's `feeds`, as
    `ReferenceTensors.graph_results` holds the graph's own."""
    from polygraphy.comparator import RunResults

    results = RunResults()
    results.append((REFERENCE, session_runs(session, reference.measures.outputs, feeds)))
    return results
