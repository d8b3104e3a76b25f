"""A Policy is a value: its identity comes from it, it is made and changed in code without a
file, and it is written back as a person would write it."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from trtbuild.errors import UsageError
from trtbuild.policy import Policy, load_policy
from trtbuild.policy.dump import canonical_yaml
from trtbuild.policy.specs import Match, Rule

DOC = {
    "version": 1,
    "model": "m.onnx",
    "inputs": {"x": {"shape": [1, 4], "data": {"distribution": "normal"}}},
    "accuracy": {"samples": 2, "tolerances": {"default": {"atol": 0.01}}},
}


def test_a_policy_from_a_mapping_is_identified_by_its_canonical_yaml(tmp_path):
    policy = Policy.from_dict(DOC, base_dir=tmp_path, name="mine")
    assert policy.path is None and policy.where == "<policy mine>"
    assert policy.sha256 == hashlib.sha256(canonical_yaml(policy).encode()).hexdigest()
    (tmp_path / "policy.yaml").write_text("version: 1\nmodel: other.onnx\n")  # not read
    assert policy.sha256 == Policy.from_dict(DOC, base_dir=tmp_path, name="mine").sha256


def test_a_loaded_policy_is_its_file_until_it_is_changed(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(b"version: 1\r\nmodel: m.onnx\r\n")  # the bytes are hashed, not the text
    policy = load_policy(path)
    assert policy.name == "p" and policy.path == path.resolve()
    assert policy.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert policy.where == str(path.resolve())
    changed = dataclasses.replace(policy, accuracy=dataclasses.replace(policy.accuracy, seed=3))
    assert changed.path is None and changed.where == "<policy p>"
    assert changed.sha256 not in (policy.sha256, Policy.from_dict(DOC, base_dir=tmp_path).sha256)
    assert dataclasses.replace(changed, accuracy=policy.accuracy).path == path.resolve()


def test_where_of_names_the_line_of_a_field_while_the_policy_is_its_file(tmp_path):
    """Errors found after loading (against the model, the data) name the line of their field,
    or of the nearest enclosing one written; the lines are the file's, not the value's."""
    text = (
        "# mine\nversion: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [1, 4]\n    data: {low: 0}\n"
    )
    path = tmp_path / "p.yaml"
    path.write_text(text)
    policy, where = load_policy(path), str(path.resolve())
    assert policy.where_of("inputs", "x", "shape") == f"{where}:6"
    assert policy.where_of("inputs", "x", "data", "high") == f"{where}:7"  # a default: data's
    assert policy.where_of("inputs", "y") == f"{where}:4"
    assert policy.where_of("accuracy", "samples") == where  # nothing of it written: the path
    assert policy.where == where  # the identity build.json records
    (tmp_path / "q.yaml").write_text(text.replace("# mine\n", "\n\n"))
    moved = load_policy(tmp_path / "q.yaml")
    assert moved.where_of("inputs", "x", "shape").endswith("q.yaml:7")
    assert dataclasses.replace(moved, name="p") == policy  # lines are not the policy's value
    assert moved.fingerprint == policy.fingerprint
    changed = dataclasses.replace(policy, accuracy=dataclasses.replace(policy.accuracy, seed=3))
    assert changed.where_of("inputs", "x", "shape") == "<policy p>"  # not what the file says
    made = Policy.from_dict(yaml.safe_load(text), base_dir=tmp_path, name="mine")
    assert made.where_of("inputs", "x", "shape") == "<policy mine>"


def test_writes_tells_a_written_field_from_a_default_while_the_policy_is_its_text(tmp_path):
    """`samples: 4` written is the user's count even where the default is 4; a section
    around a field is not the field; a policy made in code writes nothing."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nmodel: m.onnx\naccuracy:\n  samples: 4\n")
    source = load_policy(path).current_source
    assert source is not None and source.writes(("accuracy", "samples"))
    assert not source.writes(("accuracy", "seed"))  # `accuracy` is written, `seed` is not
    assert source.writes(("accuracy",))
    made = Policy.from_dict(DOC, base_dir=tmp_path).current_source
    assert made is not None and not made.writes(("accuracy", "samples"))


def test_where_of_spells_the_path_as_loading_does(tmp_path, monkeypatch):
    """Loading's errors wrote `policies/p.yaml:12`, later ones the whole path: one file, two
    spellings in one session."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text("version: 1\nmodel: m.onnx\ninputs: {x: {}}\n")
    monkeypatch.chdir(tmp_path)
    policy = load_policy("policies/p.yaml")
    assert policy.where_of("inputs", "x") == "policies/p.yaml:3"
    assert policy.where_of("accuracy", "samples") == "policies/p.yaml"  # no line: spelled so
    assert policy.where == str(tmp_path / "policies" / "p.yaml")  # the identity stays whole


def test_from_dict_reads_what_python_and_yaml_safe_load_give(tmp_path):
    """Paths, tuples, numpy scalars, and YAML 1.1's strings for 1e-2 where a number goes."""
    doc = {
        "version": np.int64(1),
        "model": tmp_path / "m.onnx",
        "inputs": {"x": {"shape": (np.int32(1), 4), "data": {"low": "-1e0", "high": "1e0"}}},
        "accuracy": {"samples": np.int64(2), "tolerances": {"default": {"atol": "1e-2"}}},
        "precision": {"rules": [{"id": "1e3", "match": {"op": ("Pow",)}, "precision": "fp32"}]},
    }
    policy = Policy.from_dict(doc, base_dir=tmp_path)
    assert policy.inputs[0].shape == (1, 4) and policy.inputs[0].data.low == -1.0
    assert policy.accuracy.default_tolerance.atol == 0.01 and policy.accuracy.samples == 2
    assert policy.precision.rules[0].id == "1e3"  # a string where a string goes
    assert isinstance(doc["model"], Path)  # the mapping is left as it was
    with pytest.raises(UsageError, match=r"accuracy\.samples: .*must be an integer"):
        Policy.from_dict({**doc, "accuracy": {"samples": "1e-2"}}, base_dir=tmp_path)
    with pytest.raises(UsageError, match=r"atol.* must be a number") as info:
        Policy.from_dict(
            {**doc, "accuracy": {"tolerances": {"default": {"atol": "x"}}}}, name="mine"
        )
    assert info.value.where == "<policy mine>"


def test_rules_are_added_replaced_and_dropped_without_dict_surgery(tmp_path):
    policy = Policy.from_dict(DOC, base_dir=tmp_path)
    pow_ = Rule("pow", Match(op=("Pow",)), "fp32")
    one = policy.with_rules(
        pow_, {"id": "norm", "match": {"pattern": "layernorm"}, "precision": "fp32"}
    )
    assert [r.id for r in one.precision.rules] == ["pow", "norm"]
    two = one.with_rules({"id": "pow", "match": {"op": "Exp"}, "precision": "fp32"}, drop=["norm"])
    assert [(r.id, r.match.op) for r in two.precision.rules] == [("pow", ("Exp",))]
    assert policy.precision.rules == ()  # a new value each time
    with pytest.raises(UsageError, match=r"invalid regular expression"):
        policy.with_rules(Rule("bad", Match(name="(unclosed"), "fp32"))
    with pytest.raises(UsageError, match=r"precision\.rules\[0\]\.precision"):
        policy.with_rules({"id": "x", "match": {"op": "Pow"}, "precision": "fp8"})
    # one op as a str is that op, as in a file (not its letters: a rule matching nothing)
    assert Match(op="Exp").op == ("Exp",)
    with pytest.raises(UsageError, match=r"match\.op: must be a string, got int 5"):
        policy.with_rules(Rule("n", Match(op=5), "fp32"))  # was a bare TypeError


def test_to_yaml_writes_what_a_person_would(tmp_path):
    """Paths as the source had them (relative stays relative, from where it is saved;
    absolute stays absolute), only keys that are not defaults, and a rule's comment."""
    (tmp_path / "d.npz").write_bytes(b"")
    path = tmp_path / "p.yaml"
    path.write_text(
        f"version: 1\nmodel: m.onnx  # the export\n"
        f"build: {{timing_cache: {tmp_path}/t.cache, backend: auto, workspace: 1GiB}}\n"
        "inputs: {x: {shape: [1, 4], data: {file: d.npz}}}\n"
        "precision:\n  rules:\n    # the reason it is pinned\n"
        "    - {id: r, match: {op: Pow}, precision: fp32}\n"
    )
    policy = load_policy(path)
    assert policy.to_yaml() == path.read_text()  # unchanged: the file itself
    changed = policy.with_rules(Rule("s", Match(op=("Exp",)), "fp32"))
    text = changed.to_yaml(tmp_path / "sub" / "q.yaml")
    doc = yaml.safe_load(text)
    assert doc["model"] == "../m.onnx" and doc["inputs"]["x"]["data"] == {"file": "../d.npz"}
    assert doc["build"] == {"timing_cache": f"{tmp_path}/t.cache", "workspace": "1GiB"}
    assert "accuracy" not in doc and "passes" not in doc
    assert "    # the reason it is pinned\n    - {id: r," in text
    saved = changed.save(tmp_path / "sub" / "q.yaml")
    assert saved == changed and saved.path == (tmp_path / "sub" / "q.yaml").resolve()


def test_to_yaml_for_another_folder_keeps_the_comments_and_rebases_the_paths(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "# yaml-language-server: $schema=schema.json\n"
        "version: 1\nmodel: m.onnx  # the export\n"
        "precision:\n  rules:\n    # why r\n    - {id: r, match: {name: m.onnx}, precision: fp32}\n"
    )
    policy = load_policy(path)
    text = policy.to_yaml(tmp_path / "sub" / "q.yaml")
    assert text == (
        "# yaml-language-server: $schema=../schema.json\n"
        "version: 1\nmodel: ../m.onnx  # the export\n"  # a regex that names it too stays
        "precision:\n  rules:\n    # why r\n    - {id: r, match: {name: m.onnx}, precision: fp32}\n"
    )


def test_to_yaml_elsewhere_writes_a_linked_folder_as_the_link_not_its_target(tmp_path):
    """A project whose `models/` links to another disk wrote `../models/m.onnx`; saved
    elsewhere (tune's -o, to_yaml), a policy named the link's target. The link is kept,
    as the text's and as a changed policy's; `link/..`, which the file system reads as the
    target's parent, is re-based from what it names."""
    disk, project = tmp_path / "disk" / "models", tmp_path / "project"
    disk.mkdir(parents=True)
    (project / "policies").mkdir(parents=True)
    (project / "models").symlink_to(disk)
    (project / "policies" / "p.yaml").write_text("version: 1\nmodel: ../models/m.onnx\n")
    policy = load_policy(project / "policies" / "p.yaml")
    assert policy.model == disk / "m.onnx"
    out = project / "tuned" / "q.yaml"
    changed = policy.with_rules({"id": "r", "match": {"op": "Pow"}, "precision": "fp32"})
    for text in (policy.to_yaml(out), changed.to_yaml(out)):
        assert "model: ../models/m.onnx" in text, text
    (disk / "sub").mkdir()
    (project / "policies" / "link").symlink_to(disk / "sub")
    (project / "policies" / "p.yaml").write_text("version: 1\nmodel: link/../m.onnx\n")
    policy = load_policy(project / "policies" / "p.yaml")
    assert policy.model == disk / "m.onnx"
    out.parent.mkdir()
    out.write_text(policy.to_yaml(out))
    assert load_policy(out).model == disk / "m.onnx"


@pytest.mark.parametrize(
    "layout",
    [
        "precision:\n  rules:\n    - {id: a, match: {op: Pow}, precision: fp32}\n",
        "precision:\n  default: fp16\n  rules:\n    - id: a\n      match: {op: Pow}\n"
        "      precision: fp32\nbuild: {backend: none}\n",
        "precision:\n  rules: []  # none yet\n",
        "precision:\n  rules: [{id: a, match: {op: Pow}, precision: fp32}]\nbuild: {}\n",
        "precision:\n  default: fp16  # low\n",
        "build: {backend: none}\n",
    ],
)
def test_rules_are_added_to_the_text_where_it_keeps_them(tmp_path, layout):
    from trtbuild.policy import parse_policy
    from trtbuild.policy.text import with_rules

    text = f"version: 1\nmodel: m.onnx\n{layout}"
    added = with_rules(
        text, ["# pinned for a reason", "- {id: z, match: {op: Exp}, precision: fp32}"]
    )
    before = parse_policy(text, tmp_path / "p.yaml")
    after = parse_policy(added, tmp_path / "p.yaml")
    assert [r.id for r in after.precision.rules] == [*(r.id for r in before.precision.rules), "z"]
    assert after.source.notes[-1] == ("z", "pinned for a reason")
    assert after == before.with_rules(Rule("z", Match(op=("Exp",)), "fp32"))
    assert all(line[line.index("#") :] in added for line in text.splitlines() if "#" in line)


@pytest.mark.parametrize(
    ("one", "other"),
    [({"atol": 1}, {"atol": 1.0}), ({"atol": 0.0}, {"atol": -0.0}), ({"rtol": 0}, {"rtol": 0.0})],
)
def test_equal_policies_have_one_identity(tmp_path, one, other):
    """Equality is the value's (1 == 1.0, 0.0 == -0.0), and so is the identity: equal
    policies of two canonical texts were two sha256s (build.json's, the cache's keys)."""
    policies = [
        Policy.from_dict({**DOC, "accuracy": {"tolerances": {"default": tol}}}, base_dir=tmp_path)
        for tol in (one, other)
    ]
    pin = [Rule("r", Match(max_abs_above=v), "fp32") for v in (2, 2.0)]
    assert policies[0] == policies[1] and hash(policies[0]) == hash(policies[1])
    assert policies[0].sha256 == policies[1].sha256
    assert canonical_yaml(policies[0]) == canonical_yaml(policies[1])
    pinned = [policies[0].with_rules(r) for r in pin]
    assert pinned[0] == pinned[1] and pinned[0].sha256 == pinned[1].sha256
    assert Policy.from_dict(policies[0].to_dict()) == policies[0]


def test_a_mapping_may_hold_rules_as_values(tmp_path):
    """`Rule`s in `precision.rules`, as `with_rules` takes them (from_dict said `must be an
    object, got Rule`); the mapping is not changed."""
    rule = Rule("head", Match(name="^/head/", op=("Conv", "Gemm")), "fp32", why="the logits")
    doc = {**DOC, "precision": {"rules": [rule]}}
    policy = Policy.from_dict(doc, base_dir=tmp_path)
    assert policy.precision.rules == (rule,) and doc["precision"]["rules"] == [rule]
    assert policy == Policy.from_dict(DOC, base_dir=tmp_path).with_rules(rule)


def test_a_model_in_memory_is_refused_with_the_fix(tmp_path):
    """An export script holds a ModelProto (or its bytes): the message says to save it and
    give the path (the schema's said `must be a string, got ModelProto ModelProto(...`)."""
    import onnx

    from tests.helpers import F, model, node

    m = model([node("Identity", ["x"], "y", "id")], [("x", F, [1])], [("y", F, [1])])
    for given in (m, m.SerializeToString()):
        with pytest.raises(UsageError) as info:
            Policy.from_dict({"version": 1, "model": given}, base_dir=tmp_path)
        said = str(info.value)
        assert said.startswith("<policy policy>: model: must be the path of an .onnx file")
        assert 'onnx.save(model, "model.onnx")' in said and "ir_version" not in said
    onnx.save(m, tmp_path / "model.onnx")
    assert Policy.from_dict({"version": 1, "model": "model.onnx"}, base_dir=tmp_path)


def test_a_match_made_from_a_list_holds_its_own_tuple():
    """`Match(op=ops)` kept the caller's list: unhashable, and changed by the caller's
    `ops.append` after the rule was made."""
    ops = ["Conv"]
    match = Match(op=ops)
    ops.append("Gemm")
    assert match.op == ("Conv",) and hash(Rule("r", match, "fp32")) == hash(
        Rule("r", match, "fp32")
    )


def test_a_policy_read_back_for_its_check_keeps_where_its_ranges_came_from(tmp_path):
    """A policy changed in code with a list for a tuple is read back from `to_dict`, which
    writes every range: an input whose range the user never gave read back as given (a
    shape input's missing data was no longer exit 2)."""
    from trtbuild.policy.model import validated

    doc = {**DOC, "inputs": {"x": {"shape": [1, 4]}, "n": {"shape": [1], "data": {"high": 9}}}}
    policy = Policy.from_dict(doc, base_dir=tmp_path)
    read = validated(dataclasses.replace(policy, inputs=list(policy.inputs)))
    assert read == policy and isinstance(read.inputs, tuple)
    assert [s.data.range_given for s in read.inputs] == [False, True]
