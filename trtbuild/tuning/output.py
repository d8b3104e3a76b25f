"""Writing what `tune` found: the tuned policy, its log, the progress bar, argument checks.

Why a readable policy rather than a list of node names: the user keeps and edits
the result, so it is the original policy with one commented rule per pinned
group, each comment saying the measured error that made the pin necessary.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TextIO

from trtbuild.accuracy.breakdown import QUANTIZED_WORDS, SplitWords
from trtbuild.accuracy.progress import StatusLine
from trtbuild.errors import UsageError
from trtbuild.front import Front
from trtbuild.policy import Policy
from trtbuild.policy.specs import Precision
from trtbuild.tuning.search import SearchResult, Trial
from trtbuild.words import percent

OBJECTIVES = ("nodes", "flops")


def tuned_policy(
    front: Front, result: SearchResult, out: Path | None, seed: int, objective: str, name: str
) -> tuple[str, Policy]:
    """The policy searched with the pins it needs, as text and as a new `Policy`.

    Rendered from the value searched (`front.policy`), not from a file read again: where
    the value is what its source text says, that text (every comment kept) with the pins
    after its rules; a policy made or changed in code is written from the value. Each pin
    has a comment saying the measured error that made it necessary; paths are relative to
    `out`'s folder (the source's where `out` is None). The `Policy` is the text read back
    (saved nowhere yet): its identity is its own, not the untuned file's.
    """
    from trtbuild.errors import printable
    from trtbuild.policy import parse_policy
    from trtbuild.policy.dump import flow, human_yaml, relative, rule_dict

    policy = front.policy
    source = policy.source
    folder = out.resolve().parent if out is not None else source.base_dir if source else None
    came = relative(policy.path, folder) if policy.path and folder else policy.where
    came = printable(str(came))  # a name's undecodable bytes (`\xfe`): YAML holds no such
    verdict = "passes" if result.passed else "DOES NOT PASS"
    verdict += " (budget exhausted)" if result.exhausted else ""
    header = (
        f"# Tuned by `trtbuild tune` from {came}: {verdict} with "
        f"{result.share} (of compute nodes),",
        f"# {len(result.pinned)} group(s) pinned after {len(result.trials)} evaluation(s) "
        f"(evaluator emulated-fp16, emulation {policy.accuracy.emulation}, "
        f"objective {objective}, seed {seed}).",
    )
    found = pins(front, result)
    rules = {r.id: r for r in result.policy.rules}
    lines = [x for rule, group, reason in found for x in (f"# {group}: {reason}", "")]
    lines[1::2] = [f"- {flow(rule_dict(rules[rule]))}" for rule, _, _ in found]
    where = out.resolve() if out is not None else (folder or Path.cwd()) / f"{name}.yaml"
    text = _edited(policy, folder, header, lines)
    if text is not None and not _holds(text, where, name, result.policy):
        text = None  # a layout the edit got wrong: the value, written anew, is the answer
    if text is None:
        notes = {rule: f"{group}: {reason}" for rule, group, reason in found}
        tuned = replace(policy, precision=result.policy)
        text = human_yaml(tuned, folder, header, notes)
    return text, parse_policy(text, where, name=name, file=False)


def _holds(text: str, where: Path, name: str, precision: Precision) -> bool:
    """Whether `text` reads back as a policy with the `precision` searched: an edited text
    that does not (a layout `policy.text` misplaced the pins in) must not be the answer."""
    from trtbuild.policy import parse_policy

    try:
        return parse_policy(text, where, name=name, file=False).precision == precision
    except UsageError:
        return False


def _edited(
    policy: Policy, folder: Path | None, header: tuple[str, ...], lines: list[str]
) -> str | None:
    """The policy's own text with `lines` after its rules and `header` after its `$schema`
    line, its paths re-based to `folder`; None where it has no such text (or its layout
    is not one `policy.text` edits)."""
    from trtbuild.policy.text import rebased_text, with_rules

    src = policy.current_source
    if src is None or src.text is None:
        return None
    text = rebased_text(policy, folder) if folder is not None else src.text
    text = with_rules(text, lines) if text is not None else None
    if text is None:
        return None
    rows = text.splitlines(keepends=True)
    at = 1 if rows and rows[0].startswith("# yaml-language-server:") else 0
    return "".join([*rows[:at], *(f"{h}\n" for h in header), *rows[at:]])


def pins(front: Front, result: SearchResult) -> list[tuple[str, str, str]]:
    """(rule id, group, reason) for each pin the search added, found by the rule id the
    search gave it (not by its regex or its position)."""
    own = {r.id for r in front.policy.precision.rules}
    found = []
    for rule in result.policy.rules:  # every rule the search added is written, found or not
        if rule.id in own:
            continue
        k = result.rule_groups.get(rule.id)
        group = result.groups[k].label if k is not None else f"nodes {rule.match.name}"
        reason = result.reasons.get(k, "pinned by tune") if k is not None else "pinned by tune"
        found.append((rule.id, group, reason))
    return found


def budget_warning(result: SearchResult) -> str:
    """What a search cut short by its budget may have missed, and the fix.

    Why it counts what it spent: while the search's passes are provisional (judged at
    some points), one evaluation is kept for the check of its answer at every point
    (`Search.left`); a search that reached no answer ends with it unspent, and "a budget
    of 2 ran out" after 1 evaluation read as a miscount.
    """
    spent, kept = len(result.trials), result.budget - len(result.trials)
    ran = f"tune's budget of {result.budget} evaluations ran out before the search ended"
    if kept > 0:
        ran += (
            f" ({spent} spent searching; the last {'one is' if kept == 1 else f'{kept} are'} "
            "kept to judge a passing answer at every point, and the search reached none)"
        )
    return (
        f"{ran}, so {'a smaller' if result.passed else 'a passing'} pin set may exist (a full "
        f"search of these {result.searched} groups needs at most "
        f"{result.full_search}); raise `budget`"
        + (
            f"; most of the judging time went to {result.costliest_point}"
            if result.costliest_point
            else ""
        )
    )


# Below this share in the low precision a passing answer says more of its tolerances than
# of the model: `tight_warning`
FEW_LOW = 0.1


def tight_warning(result: SearchResult, flat: bool = False) -> str | None:
    """Where the answer keeps almost nothing in the low precision: what that says of the
    tolerances, or (`flat`: an output does not move with the data, `evaluation.flat_outputs`)
    of the data; None where it keeps more, or does not pass.

    Why: a tolerance that FP16 storage cannot meet anywhere (trtbuild's default, every
    element within 1e-3, on a layout detector whose outputs reach a few units) ends with
    0.6% in FP16 after the whole budget, and a search cut short says "raise `budget`",
    which buys single-group unpins that fail one after another. Not where the first
    candidate already kept as little (`start_share`): range analysis pinned that much,
    because the model's values leave the low precision's range, whatever the tolerances.
    Nor where no pin was measured needed by a tolerance (`_by_tolerance`): a budget that
    ran out before the shrink unpinned single groups (7.7% FP16 with `--budget 9`, 38.5%
    with 100: "raise `budget`" and "more `budget` rarely helps" at once), or pins made by
    overflows, which no tolerance allows (loosened to atol 1000, the same 9.1%).
    """
    if not result.passed or result.low_share >= FEW_LOW or result.start_share < FEW_LOW:
        return None
    if not _by_tolerance(result):
        return None
    low = result.low.upper()
    if flat:  # tied or constant outputs: a classifier's top-k of equal logits moves at random
        return (
            f"tune kept only {percent(result.low_share)} of the model in {low}, on data that "
            "does not exercise the model (the warning above): where an output barely moves, "
            f"its tolerance holds only near FP32's own values; give real data before loosening "
            "the tolerances"
        )
    return (
        f"tune kept only {percent(result.low_share)} of the model in {low}: the tolerances are "
        f"likely tighter than {low} storage allows; loosen them where the task allows (boxes "
        f"within a pixel, an image by PSNR, a classifier by top-k): more `budget` rarely "
        f"keeps more in {low} then"
    )


def _by_tolerance(result: SearchResult) -> bool:
    """Whether a pin's own removal was judged and failed by a tolerance: the shrink's
    reason `without it: ...` on an error that is not a non-finite value (an overflow's)."""
    return any(
        why.startswith("without it: ") and "non-finite" not in why
        for why in result.reasons.values()
    )


def stuck_warning(
    result: SearchResult, quantized: int, words: SplitWords = QUANTIZED_WORDS, dequantized: int = 0
) -> str | None:
    """Where the search stopped because every suspect pinned still fails: what fails it
    then is not the low precision's storage (None where it passed or the budget ran out).

    `quantized`: the model's quantized ops (INT8 or FP8), which keep their quantization
    under a pin. Why: a ModelOpt INT8 ResNet-18 judged against its FP32 model pinned all
    of its 50 groups in 8 evaluations and said DOES NOT PASS, not why; it was the INT8.
    `words`: the reference model's, by whether the model holds Q/DQ (`Front.quantized`);
    `dequantized`: the ops the policy's `dequantize: true` rules take out of it (where
    there are some, `quantization_fails` measured nothing and the search ran).
    """
    if result.passed or result.exhausted:
        return None
    if result.quantization_fails:
        alone = f"{words.alone} ({words.graph} in FP32)" if words.quantized else words.alone
        return (
            f"{alone} fails the tolerances against the reference "
            f"model ({'; '.join(result.quantization_fails)}): no FP32 pin can fix that, so tune "
            f"judged the policy once and searched nothing; {words.fix}"
            f"{' (docs: Quantized models)' * words.quantized}, or loosen the tolerances where "
            "the task allows"
        )
    if result.ruled_overflow:
        return (
            f"{result.ruled_overflow}: no FP32 pin can change that node, so tune stopped "
            "there; let it run in FP32 (or make its values smaller) and tune again"
        )
    if result.kept_low:
        return _kept_low_warning(result)
    text = (
        "tune pinned every group on the failing outputs' paths to FP32 and the candidate "
        f"still fails, so {result.low.upper()} storage is not what fails it"
        if result.pinned
        else "tune found no group it may pin on the failing outputs' paths (the policy's own "
        "rules fix the precision of every node there), and the candidate fails"
    )
    if quantized:
        out = (
            f"the policy's `dequantize: true` rules take {dequantized} op(s) out of it; more "
            "may need to be"
            if dequantized
            else "a rule with `dequantize: true` takes an op out of it"
        )
        return text + (
            f": {quantized} quantized op(s) keep their quantization under a pin; where that "
            f"alone misses the tolerances, {out} (docs: Quantized models), or the tolerances "
            "are tighter than the quantization allows"
        )
    return text + (
        ": the policy's own rules (kept as they are) or the model's own low-precision "
        "inputs and outputs do, or the tolerances are tighter than FP32 allows"
    )


def _kept_low_warning(result: SearchResult) -> str:
    """The stuck search where the policy's own rules keep nodes on the failing paths in the
    low precision: those rules, not "storage is not what fails it" (it may be exactly
    that: the nodes those rules keep low, which no pin changes)."""
    low = result.low.upper()
    head = (
        "tune pinned every group on the failing outputs' paths to FP32 and the candidate "
        "still fails"
        if result.pinned
        else "tune found no group it may pin on the failing outputs' paths, and the candidate fails"
    )
    kept = "; ".join(
        f"the policy's rule {rule} keeps {len(nodes)} node(s) there in {low} "
        f"({', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''})"
        for rule, nodes in result.kept_low.items()
    )
    return (
        f"{head}, but {kept}: their {low} storage may be what fails it, and no pin changes "
        "it; let such a rule say fp32 (or leave those nodes to tune) and tune again"
    )


def write_log(path: Path, result: SearchResult) -> None:
    """One JSON line per evaluation, in the order they were recorded."""
    from trtbuild.fsutil import dumps_json, write_text

    rows = []
    ranked = {r.after + 1: r.note for r in result.rankings}
    for t in result.trials:
        rows.append(
            dumps_json(
                {
                    # the growing's ranking, on the first trial after it (where the error
                    # map ranked no suspect above another: `tuning.alone`)
                    **({"ranking": ranked[t.step]} if t.step in ranked else {}),
                    "step": t.step,
                    "action": t.action,
                    "pinned_groups": [result.groups[k].label for k in t.pinned],
                    "passed": t.passed,
                    "low_share": t.low_share,
                    "failing": t.failing,
                    "max_abs": t.worst,
                    "seconds": t.seconds,
                    # where it was judged, in order: a failure stops the walk, and a pass
                    # while growing leaves out the points larger than every point some
                    # trial failed at (`PointWalk.walking`) until it is verified
                    "points": list(t.points),
                }
            )
        )
    write_text(path, "\n".join(rows) + "\n")


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        self.line = StatusLine(stream)
        self.width = width

    def __call__(self, trial: Trial, budget: int) -> None:
        filled = min(self.width, round(self.width * trial.step / max(budget, 1)))
        bar = "#" * filled + "." * (self.width - filled)
        state = "pass" if trial.passed else "fail"
        self.line.write(
            f"tune [{bar}] {trial.step}/{budget} {state} {percent(trial.low_share)}  {trial.action[:60]}"
        )

    def done(self) -> None:
        self.line.done()


def check_args(budget: int, objective: str, jobs: int = 1) -> None:
    """Refuse arguments no search can use (exit 2, before any work)."""
    for name, value in (("budget", budget), ("jobs", jobs)):  # a bool is no count either
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"`{name}` must be a whole number, not {value!r}")
    if budget < 1:
        raise UsageError(f"`budget` must be at least 1, not {budget}")
    if not 1 <= jobs <= 256:
        raise UsageError(f"`jobs` must be between 1 and 256, not {jobs}")
    if objective not in OBJECTIVES:
        raise UsageError(f"`objective` must be one of {', '.join(OBJECTIVES)}, not {objective!r}")


def check_output(policy, output: Path, force: bool) -> None:
    """Refuse to overwrite the policy being tuned: its comments and rules would be lost."""
    if policy.path is not None and output.resolve() == policy.path and not force:
        raise UsageError(
            "-o names the policy being tuned; writing there would replace it and lose its comments",
            where=str(output),
            hint="write the tuned policy to another file, or pass --force to replace it",
        )


def check_policy(policy) -> None:
    """Tuning pins nodes to FP32, so it needs a policy whose default is a low precision."""
    if policy.precision.default == "fp32":
        raise UsageError(
            "precision.default: tune pins nodes to FP32, and this policy's default is already fp32",
            where=policy.where_of("precision", "default"),
            hint="set precision.default: fp16 (or bf16) and let tune find what must stay fp32",
        )
