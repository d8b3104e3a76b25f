from __future__ import annotations

import pytest

from trtbuild.errors import UsageError
from trtbuild.policy import load_policy
from trtbuild.sizes import parse_size


def test_valid_policy_resolves_paths_and_defaults(write_policy, nafnet_path):
    policy = load_policy(write_policy())
    assert policy.model == nafnet_path.resolve()
    assert policy.precision.default == "fp16"
    assert [r.id for r in policy.precision.rules] == ["layernorm", "final-reduction"]
    assert policy.precision.rules[1].match.op == ("ReduceSum",)
    # YAML 1.1 reads 1e-2 as a string; the loader must take it as the number users meant.
    assert policy.accuracy.default_tolerance.atol == pytest.approx(0.01)
    assert policy.inputs[0].shape == (1, 3, 64, 64)


def test_bare_name_is_looked_up_in_policies_dir(tmp_path, monkeypatch, write_policy):
    (tmp_path / "policies").mkdir()
    write_policy(name="policies/mine.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_policy("mine.yaml").name == "mine"
    assert load_policy("mine").name == "mine"  # as `trtbuild build --policy nafnet`


def test_a_missing_policy_names_every_place_looked_at(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        load_policy("ghost")
    assert "ghost, policies/ghost, ghost.yaml, policies/ghost.yaml" in str(info.value.hint)


def _error(write_policy, text: str) -> str:
    with pytest.raises(UsageError) as info:
        load_policy(write_policy(text))
    return str(info.value)


def test_misspelt_key_names_line_and_suggests(write_policy, nafnet_path):
    msg = _error(write_policy, f"version: 1\nmodel: {nafnet_path}\nprecison:\n  default: fp16\n")
    assert "policy.yaml:3" in msg
    assert "unknown key 'precison'" in msg and "did you mean 'precision'" in msg


def test_nested_field_error_names_path(write_policy, nafnet_path):
    text = (
        f"version: 1\nmodel: {nafnet_path}\nprecision:\n  rules:\n"
        "    - id: a\n      match: {opp: [Pow]}\n      precision: fp32\n"
    )
    msg = _error(write_policy, text)
    assert "precision.rules[0].match.opp" in msg and "did you mean 'op'" in msg
    assert ":6" in msg


def test_a_key_holding_a_dot_is_quoted_in_the_field_path(write_policy, nafnet_path):
    """An input named `input.1` (a PyTorch export's): `inputs.input.1.shap` reads as four
    keys; the path quotes it."""
    text = f"version: 1\nmodel: {nafnet_path}\ninputs:\n  input.1: {{shap: [1, 3, 8, 8]}}\n"
    msg = _error(write_policy, text)
    assert 'inputs."input.1".shap' in msg and "did you mean 'shape'" in msg, msg


@pytest.mark.parametrize(
    "key, under",
    [
        ("data: {images: x/}", "inputs.<name>.data"),
        ("tolerances: {}", "accuracy.tolerances"),
        ("rules: []", "precision.rules"),
        ("backend: none", "build.backend"),
        ("images: x/", "inputs.<name>.data.images"),  # not "did you mean 'passes'?"
    ],
)
def test_a_key_of_another_level_names_where_it_goes(write_policy, nafnet_path, key, under):
    """The README refuses a top-level `data:`; the message said only which keys are allowed
    at the top, not where the key goes."""
    msg = _error(write_policy, f"version: 1\nmodel: {nafnet_path}\n{key}\n")
    name = key.split(":")[0]
    assert f"unknown key '{name}'; `{name}` goes under {under}" in msg, msg


def test_malformed_yaml_names_line(write_policy):
    msg = _error(write_policy, "version: 1\nmodel: [unclosed\n")
    assert "malformed YAML" in msg and "policy.yaml:" in msg


def test_an_integer_past_pythons_digit_limit_names_its_line(write_policy):
    """PyYAML's `int()` of 5000 digits raised a bare ValueError (exit 70, a traceback)."""
    msg = _error(
        write_policy, "version: 1\nmodel: m.onnx\naccuracy:\n  samples: " + "9" * 5000 + "\n"
    )
    assert "policy.yaml:4: malformed YAML: an integer of 5000 digits" in msg, msg


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("precision: {default: fp8}", "not one of 'fp16', 'bf16', 'fp32'"),
        ("accuracy: {samples: many}", "must be an integer"),
        ("accuracy: {samples: 0}", "at least 1"),
        ("build: {workspace: lots}", "write e.g. 4GiB"),
        (
            "precision: {rules: [{id: x, match: {name: '(unclosed'}, precision: fp32}]}",
            "invalid regular expression",
        ),
        (
            "precision: {rules: [{id: x, match: {pattern: lyernorm}, precision: fp32}]}",
            "did you mean 'layernorm'",
        ),
        (
            "precision: {rules: [{id: x, match: {op: Pow}, precision: fp32}, "
            "{id: x, match: {op: Add}, precision: fp32}]}",
            "duplicate rule id 'x'",
        ),
        ("precision: {rules: [{id: x, match: {}, precision: fp32}]}", "must not be empty"),
        ("inputs: {input: {min: [1], opt: [2]}}", "needs min, opt and max"),
        # a profile of several dynamic axes wrong in one: the dim and its values named
        (
            "inputs: {input: {min: [1, 3, 32, 48], opt: [2, 3, 64, 96], max: [3, 3, 128, 64]}}",
            "dim 3 is min 48, opt 96, max 64",
        ),
        (
            "inputs: {input: {min: [1, 3, 32], opt: [2, 3, 64, 96], max: [3, 3, 128, 128]}}",
            "equal ranks: min has 3, opt has 4, max has 4 dim(s)",
        ),
        # an empty cache's first step: refused, saying why and what to do
        (
            "inputs: {input: {min: [1, 3, 0, 64], opt: [1, 3, 64, 64], max: [1, 3, 64, 64]}}",
            "got 0 (a dim of 0 (an empty tensor",
        ),
        ("passes: {override_input_shapes: {input: [1, 0, 8, 8]}}", "start at 1, and run a"),
    ],
)
def test_bad_fields(write_policy, nafnet_path, snippet, expected):
    msg = _error(write_policy, f"version: 1\nmodel: {nafnet_path}\n{snippet}\n")
    assert expected in msg
    assert ("empty tensor" in msg) == ("empty tensor" in expected or "run a" in expected)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            "{mean: 3, std: 2}",
            "inputs.input.data.mean: 'mean' is read only by distribution: normal",
        ),
        ("{distribution: uniform, std: 2}", "inputs.input.data.std: 'std' is read only by"),
        ("{distribution: normal, low: 0, high: 5}", "data.high: 'high' is read only by a uniform"),
        ("{file: d.npz, high: 5}", "data.high: 'high' is read only by a distribution (a file's"),
        ("{images: imgs, low: -1}", "data.low: 'low' is read only by a distribution (images"),
    ],
)
def test_a_data_key_its_kind_does_not_read_is_refused(write_policy, nafnet_path, data, said):
    """Each was dropped without a word: `{mean: 3, std: 2}` without `distribution: normal`
    drew uniform [0, 1), and a normal distribution's `low`/`high` bounded nothing."""
    base = write_policy("").parent
    (base / "d.npz").write_bytes(b"")
    (base / "imgs").mkdir(exist_ok=True)
    snippet = f"inputs: {{input: {{shape: [1, 3, 64, 64], data: {data}}}}}"
    assert said in _error(write_policy, f"version: 1\nmodel: {nafnet_path}\n{snippet}\n")
    # at their defaults (what a written-out policy holds) they are no one's choice: read
    kept = "{distribution: normal, low: 0, high: 1, mean: 2}"
    ok = f"inputs: {{input: {{shape: [1, 3, 64, 64], data: {kept}}}}}"
    path = write_policy(f"version: 1\nmodel: {nafnet_path}\n{ok}\n")
    assert load_policy(path).inputs[0].data.mean == 2


def test_wrong_version_and_missing_model(write_policy):
    assert "must be 1" in _error(write_policy, "version: 2\nmodel: m.onnx\n")
    assert "missing required key 'model'" in _error(write_policy, "version: 1\n")


def test_parse_size():
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1000") == 1000


def test_a_policy_saved_as_utf16_says_to_save_it_as_utf8(tmp_path, capsys):
    """An editor's "Unicode" is UTF-16; a UTF-8 BOM (Windows' Notepad) is read as it is."""
    from trtbuild.cli import main

    text = "version: 1\nmodel: m.onnx\n"
    (tmp_path / "u16.yaml").write_bytes(text.encode("utf-16"))
    assert main(["check", "--policy", str(tmp_path / "u16.yaml")]) == 2
    err = capsys.readouterr().err
    assert "it is not UTF-8 text" in err and "save the policy as UTF-8" in err, err
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert load_policy(tmp_path / "bom.yaml").model == (tmp_path / "m.onnx").resolve()
